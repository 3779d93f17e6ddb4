"""Gossip: how a sender's update spreads. The sender serves a few copies of its own update; the peers that
fetched one serve it on. The node's transport and the virtual simulator run the same rule."""

from __future__ import annotations

import functools
import hashlib
from typing import Callable

HOLDERS_PER_PART = 64  # the holdings records one read returns, about, at any roster size (``holdings_part``)


def copy_window_s(min_deadline_s: float) -> float:
    """The window of a sender's copy budget: half the shortest deadline, at most 2 s (a round's fetchers come
    within its first window, and later ones find holders by then)."""
    return min(2.0, 0.5 * min_deadline_s)


class CopyBudget:
    """The copies of its own update a peer serves: at most ``cap`` in any ``window_s`` (0: no cap).

    Past the budget the peer answers 'busy', and fetchers turn to the peers that already hold a copy
    (gossip). The budget refills each window, for the whole round, so the sender's upload is at most
    ``cap`` copies per window whatever the number of fetchers. A fetcher that takes a copy and serves
    none holds the others up for one window, never for the round."""

    def __init__(self, cap: int, window_s: float) -> None:
        self.cap, self.window_s = cap, window_s
        self.windows: dict[str, tuple[int, float]] = {}  # blob name -> (copies in its window, window start)

    def take(self, name: str, now: float) -> bool:
        """Whether a copy of ``name`` may be served at ``now``; a copy allowed is counted."""
        if not self.cap:
            return True
        copies, start = self.windows.get(name, (0, now))
        if now - start >= self.window_s:
            copies, start = 0, now
        if copies >= self.cap:
            return False
        self.windows[name] = (copies + 1, start)
        return True

    def forget(self, gone: Callable[[str], bool]) -> None:
        self.windows = {n: v for n, v in self.windows.items() if not gone(n)}


def holdings_parts(roster: int) -> int:
    """How many DHT keys a round's holdings are spread over: the least power of two that puts at most
    HOLDERS_PER_PART of the ``roster``'s keys under each. One key would return every holder's record to every
    read, N per read."""
    parts = 1
    while parts * HOLDERS_PER_PART < roster:
        parts *= 2
    return parts


def holdings_part(peer: str, roster: int) -> int | None:
    """The part of the round's holdings ``peer`` lists its copies under and reads its sources from: a hash of its
    key, over ``holdings_parts(roster)``; None while one key holds them all. A fetcher learns about 64 holders
    besides the sender, enough for the copies to spread; peers whose rosters differ may read apart, and then
    fetch from the sender or the holders they do see."""
    return part_of(peer, holdings_parts(roster))


def part_of(peer: str, parts: int) -> int | None:
    """``peer``'s part of ``parts`` (``holdings_part``): None for one part."""
    return None if parts == 1 else _number(peer) % parts


@functools.lru_cache(maxsize=1 << 16)
def _number(peer: str) -> int:
    return int.from_bytes(hashlib.sha256(peer.encode()).digest()[:8], "big")
