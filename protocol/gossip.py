"""Gossip: how a sender's update spreads. The sender serves a few copies of its own update; the peers that
fetched one serve it on. The node's transport and the virtual simulator run the same rule."""

from __future__ import annotations

from typing import Callable


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
