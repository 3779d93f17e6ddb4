"""Shared fixtures. Swarm tests spawn real peers (bootstrap + `gradnode join` processes on 127.0.0.1)
through gradnode.node.sim.simulate, which stops every process it started by PID, also on failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

# A model small enough for several peers per core; 4 inner steps per round.
TINY_SWARM = ["model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.seq_len=32", "inner.batch_size=4",
              "inner.steps=4", "inner.warmup_steps=2", "swarm.min_deadline_s=2.0", "swarm.max_wait_s=60",
              "checkpoint.every_rounds=2"]


@pytest.fixture
def run_swarm(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    from gradnode.node.sim import simulate as sim

    def run(peers: int, rounds: int, peer_overrides: dict[int, list[str]] | None = None, on_swarm: Any = None,
            timeout_s: float = 240.0, faults: str | None = None, extra: list[str] | None = None) -> dict[str, Any]:
        settings = sim.SimSettings(peers=peers, rounds=rounds, config=None, out_dir=tmp_path / "swarm",
                                   overrides=[*TINY_SWARM, *(extra or [])], peer_overrides=peer_overrides or {},
                                   timeout_s=timeout_s, eval_peers=1, faults=faults)
        return sim.run(settings, live=False, on_swarm=on_swarm)

    return run


def swarm_metrics(summary: dict[str, Any], index: int) -> list[dict[str, Any]]:
    from gradnode.node.sim import simulate as sim

    return sim.read_metrics(Path(summary["out_dir"]) / f"peer-{index}" / "metrics.jsonl")


@pytest.fixture
def metrics_of() -> Callable[[dict[str, Any], int], list[dict[str, Any]]]:
    return swarm_metrics
