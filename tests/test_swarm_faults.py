"""Fault injection on a real swarm: a 5x straggler runs fewer steps instead of stalling the others,
and a peer killed mid-run is left behind without the others losing agreement."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.swarm


def test_straggler_and_dropout(run_swarm, metrics_of) -> None:
    def kill_peer_1(swarm) -> None:
        # kill -9 peer 1 (its whole process group) once it has applied round 1
        path = swarm.s.out_dir / "peer-1" / "metrics.jsonl"
        end = time.monotonic() + 180
        while time.monotonic() < end:
            if path.exists() and path.read_text().count("\n") >= 2:
                swarm.kill("peer-1")
                return
            time.sleep(0.2)

    # steps stretched by sleeping (cheap on CPU) so that compute dominates the round, as in real runs; rounds of
    # ~1.5 s for the fast peer: the round clock reads the DHT every 0.5 s, and with rounds of 0.5 s (16 steps)
    # whether the straggler learnt its stop time in time was left to chance (it failed about half the runs)
    common = ["inner.steps=48", "swarm.min_deadline_s=0.5"]
    summary = run_swarm(peers=3, rounds=8, on_swarm=kill_peer_1,
                        peer_overrides={0: [*common, "swarm.slowdown=20"], 1: [*common, "swarm.slowdown=20"],
                                        2: [*common, "swarm.slowdown=100"]})
    fast, dead, slow = summary["peers"]
    assert "error" in dead  # killed: no summary
    assert fast["rounds"] == slow["rounds"] == 8
    assert fast["param_hash"] == slow["param_hash"]
    for r in range(8):
        assert fast["hashes"][str(r)] == slow["hashes"][str(r)]
    fast_rows, slow_rows = metrics_of(summary, 0), metrics_of(summary, 2)
    # the fast peer's own update makes every round; the straggler cut rounds short (fewer tokens)
    assert all(row["own_included"] for row in fast_rows)
    assert any(row["steps"] < 48 for row in slow_rows[1:])
    # the straggler stays in phase (abstaining from a round it cannot make, see exchange.py) and so
    # contributes to most rounds, its updates weighted by the fewer tokens they carry
    made = [slow["peer"] in row["senders"] for row in fast_rows]
    assert sum(made[2:]) >= 4, made
    assert summary["val_loss_last"] < summary["val_loss_first"]
