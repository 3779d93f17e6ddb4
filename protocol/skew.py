"""How far this machine's clock is from the swarm's, from pings (pure).

The DHT stamps every record with wall-clock times: a member record expires at its writer's now + its ttl, and an
announcement's age is the reader's now less its writer's stamp. A reader whose clock runs ahead of the writers'
by a record's ttl sees every record expired: nobody in sight, a peer that waits for peers for good or trains
alone. hivemind refuses to start a DHT whose clock is more than ``MAX_SKEW_S`` off an initial peer's (its ping
carries the other side's time), but only at the start: a clock that jumps or drifts later goes unnoticed, and
so does one that is off by less than a ttl but more than a deadline window allows.

A ping gives one ``Sample``: this side's time when it asked, the other side's time in its answer, this side's
time when the answer came. The other side stamped its answer somewhere between the two, so a right clock's
offset lies in ``theirs - (sent + received) / 2`` +- half the round trip: an interval. The estimate is the
interval that the samples' intervals give by majority: its low end the median of their low ends, its high end
the median of their high ends (the lower and the upper median of an even count). Every right clock's interval
holds the truth, so when at least half the samples are right clocks, the estimate holds it too, whatever the
others answer and however fast (the other side's time is its own claim): wrong or lying clocks raise no alarm
unless they are more than half of those pinged, and when they are fewer than half the estimate lies within
the right clocks' own intervals (they cannot hide a real offset either). Whom to ping is the shell's choice
(node/swarm/peer.py: the initial peers and voting peers in sight, one sample per peer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

# hivemind's own bound at a DHT's start (hivemind.utils.timed_storage.MAX_DHT_TIME_DISCREPANCY_SECONDS)
MAX_SKEW_S = 3.0


@dataclass(frozen=True)
class Sample:
    sent: float  # this side's clock when it pinged
    theirs: float  # the other side's clock in its answer
    received: float  # this side's clock when the answer came

    @property
    def offset(self) -> float:
        """The other side's clock less this side's (positive: theirs runs ahead)."""
        return self.theirs - (self.sent + self.received) / 2

    @property
    def error(self) -> float:
        return max(0.0, self.received - self.sent) / 2


@dataclass(frozen=True)
class Estimate:
    ahead_s: float  # how far this side's clock runs ahead of the peers' (negative: behind), the interval's middle
    error_s: float  # half the interval's width
    peers: int  # the samples it rests on

    def off(self, limit_s: float = MAX_SKEW_S) -> bool:
        """Off by more than ``limit_s`` whatever the round trips hid."""
        return self.peers > 0 and abs(self.ahead_s) - self.error_s > limit_s


def estimate(samples: Sequence[Sample]) -> Estimate:
    """The majority interval of the samples' offsets (see the module's doc), as how far this clock runs ahead;
    samples with a negative round trip (a clock stepped between send and answer) or a time that is no number (an
    answer's NaN or infinity) are dropped."""
    ok = [s for s in samples if s.received >= s.sent and math.isfinite(s.offset)]
    if not ok:
        return Estimate(0.0, 0.0, 0)
    n = len(ok)
    low = sorted(s.offset - s.error for s in ok)[(n - 1) // 2]
    high = sorted(s.offset + s.error for s in ok)[n // 2]
    # low > high only when the samples' majority shares no point (more than half of them wrong): its middle
    return Estimate(-(low + high) / 2, abs(high - low) / 2, n)
