"""The run page's figures that the swarm watch and the run-folder reader share: who is behind, progress
against the run's rounds, and the ETA."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

# a member record lags its peer by up to two rounds (written after a round is applied, while the next computes):
# a peer is behind only past that
BEHIND_ROUNDS = 3
ETA_ROUNDS = 8  # the ETA paces the rounds left by the median length of this many recent rounds
MAX_EVENTS = 200  # events sent to the page (the newest)


def behind(round_: int, typical: int) -> bool:
    """``round_`` is behind the swarm's round ``typical`` by more than a record's lag."""
    return typical - round_ >= BEHIND_ROUNDS


def typical_round(rounds: list[int]) -> int:
    """The swarm's round: the median trainer's, so that one peer claiming a far round moves nothing."""
    return int(statistics.median_low(rounds)) if rounds else 0


def round_seconds(reached: Mapping[int, float]) -> float | None:
    """Median seconds per round over the last ETA_ROUNDS rounds of ``reached`` (round -> when the swarm got
    there); None with fewer than two rounds."""
    rs = sorted(reached)[-(ETA_ROUNDS + 1):]
    steps = [(reached[b] - reached[a]) / (b - a) for a, b in zip(rs, rs[1:]) if reached[b] >= reached[a]]
    return statistics.median(steps) if steps else None


def progress(round_: int, target: int | None, reached: Mapping[int, float], started: float | None,
             now: float, finished: bool) -> dict[str, Any]:
    """The swarm at round ``round_`` (rounds applied) of ``target`` (None: until stopped): the fraction done,
    seconds per round, the ETA (None when it cannot be told), seconds since ``started``."""
    per = round_seconds(reached)
    left = None if not target else max(0, target - round_)
    eta = 0.0 if finished or left == 0 else per * left if per is not None and left is not None else None
    last = max(reached.values()) if finished and reached else now
    return {"round": round_, "target": target or None,
            "fraction": min(1.0, round_ / target) if target else None,
            "round_s": None if per is None else round(per, 3), "eta_s": None if eta is None else round(eta, 1),
            "started": started, "elapsed_s": None if started is None else round(max(0.0, last - started), 1),
            "finished": finished}
