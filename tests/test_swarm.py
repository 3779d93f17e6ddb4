"""Real swarms on 127.0.0.1: honest peers agree bit-for-bit every round while bad updates are rejected."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.swarm


def test_honest_peers_agree_and_bad_updates_are_rejected(run_swarm, metrics_of) -> None:
    # peers 0-2 honest; peer 3 corrupts its update bytes, peer 4 signs with a key that is not its own
    summary = run_swarm(peers=5, rounds=4, peer_overrides={3: ["swarm.fault=corrupt"], 4: ["swarm.fault=forge"]})
    honest = [p for p in summary["peers"] if p.get("index") in (0, 1, 2)]
    assert len(honest) == 3, summary
    assert all(p["rounds"] == 4 for p in honest)
    # identical weights every round, not only at the end
    for r in range(4):
        assert len({p["hashes"][str(r)] for p in honest}) == 1, f"round {r} diverged"
    assert summary["val_loss_last"] < summary["val_loss_first"]
    # the faulty peers are named per reason by every honest peer, from round 1 on
    corrupt = summary["peers"][3]["peer"]
    forger = summary["peers"][4]["peer"]
    for p in honest:
        assert p["rejected_by_sender"].get(corrupt, {}).get("malformed", 0) >= 1, p["rejected_by_sender"]
        assert p["rejected_by_sender"].get(forger, {}).get("forged", 0) >= 1, p["rejected_by_sender"]
    for row in metrics_of(summary, 0)[1:]:
        assert corrupt not in row["senders"] and forger not in row["senders"]
        assert {honest[1]["peer"], honest[2]["peer"]} <= set(row["senders"])
