"""Adversarial peers as real processes with their own keys (`simulate --faults tokens:P,dense:P`): the
honest peers stay on one hash, keep their own updates in every round, learn, and give the attackers no
weight at all; after swarm.ignore_after rejections an attacker is ignored (its updates no longer fetched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import explain


def summary_dir(summary: dict) -> Path:
    return Path(summary["out_dir"])

pytestmark = pytest.mark.swarm


def test_inflated_tokens_and_a_dense_codec_get_no_weight(run_swarm, metrics_of) -> None:
    summary = run_swarm(peers=5, rounds=5, faults="tokens:3,dense:4")
    peers = summary["peers"]
    assert [p["role"] for p in peers] == ["honest"] * 3 + ["tokens", "dense"]
    honest = peers[:3]
    assert summary["live_peers"] == 3 and summary["identical_hashes"], explain(summary)
    for r in range(5):
        assert len({p["hashes"][str(r)] for p in honest}) == 1, f"round {r} diverged\n{explain(summary)}"
    inflator, densifier = peers[3]["peer"], peers[4]["peer"]
    for i, p in enumerate(honest):
        by = p["rejected_by_sender"]
        # rejected in rounds 0, 1 and 2 (swarm.ignore_after=3), then ignored: nothing more fetched from them
        assert by.get(inflator) == {"inflated_tokens": 3} and by.get(densifier) == {"wrong_codec": 3}, by
        log = (summary_dir(summary) / f"peer-{i}.log").read_text()
        assert f"ignoring sender={inflator}" in log and f"ignoring sender={densifier}" in log
        rows = metrics_of(summary, i)
        # the attackers' influence: zero weight in every round; the honest peers' own updates: in every round
        assert all(inflator not in row["senders"] and densifier not in row["senders"] for row in rows)
        assert sum(row["own_included"] for row in rows) >= 4, rows
    assert summary["val_loss_last"] < summary["val_loss_first"]
