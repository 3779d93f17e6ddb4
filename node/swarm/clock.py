"""The round clock: when a round's deadline falls, and when a peer cuts its inner steps short (the cut time).

The swarm has no shared clock. A round's deadline is read off the DHT: once half the live training
peers have announced their update for round r (the anchor), the round closes ``(slack - 1) x`` the
(lower) median peer's round time later (at least ``min_deadline_s``). Each peer times those announcements
on its own monotonic clock, from the age the DHT gives them. "Live training peers" are those that
work (protocol/round.py ``view_of``): the last round's senders and this round's announcers, so that member
records of keys made in bulk, which never send an update, cannot keep a deadline from starting.

A peer cuts its inner steps half a deadline window before that deadline, which leaves time to apply
the previous round and announce; a slow peer so runs fewer steps instead of stalling the others.
Before anyone has announced the round, its deadline is predicted as the previous round's plus one
median round (a slow peer must cut its steps in time, not notice the deadline once it has passed). A peer
whose next deadline is nearer than its fewest steps abstains from that round (``Clock.too_late_for``).

The DHT is read by a watcher thread every 0.5 s, never between two inner steps: inner steps only
compute.
"""

from __future__ import annotations

import logging
import threading
import time

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.membership import Membership
from gradnode.protocol import round as core
from gradnode.protocol.records import UpdateAnnouncement

log = logging.getLogger(__name__)


def params(cfg: SwarmConfig) -> core.Params:
    """The settings the round's rules read (protocol/round.py)."""
    return core.Params(min_deadline_s=cfg.min_deadline_s, deadline_slack=cfg.deadline_slack,
                       commit_grace_s=cfg.commit_grace_s, max_wait_s=cfg.max_wait_s)


def window_s(cfg: SwarmConfig, round_seconds: float) -> float:
    """A round's deadline window: (deadline_slack - 1) median rounds after its anchor, at least min_deadline_s."""
    return core.window_s(params(cfg), round_seconds)


def deadline_from(first_seen: dict[str, float], n_live: int, round_seconds: float, cfg: SwarmConfig) -> float | None:
    """Round deadline (monotonic seconds) once half the live training peers announced; None before."""
    return core.deadline_from(first_seen, n_live, window_s(cfg, round_seconds))


class Deadline:
    """The swarm's deadline of one round as peer ``me`` sees it, from the DHT's announcements; None until
    half the live training peers have announced. ``poll`` reads the DHT, calling the object does not."""

    def __init__(self, members: Membership, cfg: SwarmConfig, me: str, round_: int, round_s: float) -> None:
        self.members, self.cfg, self.me, self.round, self.round_s = members, cfg, me, round_, round_s
        self.seen: dict[str, float] = {}
        self.live = 1

    def __call__(self) -> float | None:
        return deadline_from(self.seen, self.live, self.round_s, self.cfg)

    def poll(self, now: float) -> tuple[dict[str, float], int]:
        """Read the DHT: the announcers' first-seen times and the live trainers; ``update`` applies them
        (the reads can be slow, the update is instant: callers hold no lock while reading)."""
        dht_now = self.members.transport.now()
        seen = dict(self.seen)
        for ann in self.members.read("updates", self.round, UpdateAnnouncement):
            # when it was announced, not when we first looked: a peer that joined or fell behind
            # sees the deadline already passed and cuts its round short to catch up
            age = min(max(0.0, dht_now - ann.time), 600.0)
            seen.setdefault(ann.sender, now - age)
        return seen, 1 + len(self.members.keeping_up(self.round, seen)[1])

    def update(self, seen: dict[str, float], live: int) -> None:
        self.seen, self.live = seen, live


class CutTime:
    """The cut time of a round: when a peer should have finished its inner steps (module docstring)."""

    def __init__(self, clock: "Clock", round_: int, predict: bool = True) -> None:
        round_s = clock.round_seconds()
        cfg = clock.cfg
        self.window = window_s(cfg, round_s)
        self.round_s = round_s
        self.current = Deadline(clock.members, cfg, clock.me, round_, round_s)
        self.previous = Deadline(clock.members, cfg, clock.me, round_ - 1, round_s) if predict and round_ > 0 \
            else None
        self._lock = threading.Lock()

    def refresh(self, now: float) -> None:
        """Re-read the DHT (the watcher thread does this every 0.5 s during inner steps). The reads hold no
        lock: a slow DHT (a split network) must never hold up an inner step asking for the cut time."""
        found = self.current.poll(now)
        with self._lock:
            self.current.update(*found)
            predict = self.previous is not None and self.current() is None
        if predict:
            found = self.previous.poll(now)
            with self._lock:
                self.previous.update(*found)

    def __call__(self, now: float) -> float | None:
        with self._lock:
            previous = (self.previous.seen, self.previous.live) if self.previous is not None else None
            return core.cut_at(self.current.seen, self.current.live, self.window, self.round_s, previous)


class RoundClock:
    """``should_stop`` of one inner round: end the steps on ``stop`` (the peer is stopping), or when one more
    step would end after the round's cut time; a thread keeps the cut time fresh from the DHT. ``close()`` when
    the round ends."""

    POLL_S = 0.5

    def __init__(self, clock: "Clock", cut_time: CutTime) -> None:
        self.clock, self.cut_time = clock, cut_time
        self.steps, self.last, self.step_s = 0, time.monotonic(), clock.step_s
        self._closed = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="round-clock", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._closed.is_set():
            try:
                self.cut_time.refresh(time.monotonic())
            except Exception as err:  # a DHT hiccup: keep the last view, try again
                log.debug("deadline poll failed: %r", err)
            self._closed.wait(self.POLL_S)

    def close(self) -> None:
        self._closed.set()

    def __call__(self) -> bool:
        cfg = self.clock.cfg
        now = time.monotonic()
        if self.steps:  # the step that just ran: from the end of the previous call to now
            compute = now - self.last
            # testing aid: a straggler, its steps stretched by sleeping. Not the process's first step: that one
            # is torch's start-up (allocations, first kernels, ~0.3 s here against ~4 ms a step after), and
            # stretched 100x it started a 5x straggler half a minute behind the others
            stretch = cfg.slowdown if self.clock.warm else 1.0
            if stretch > 1:
                time.sleep((stretch - 1) * compute)
                now = time.monotonic()
            self.step_s = compute * stretch
            self.clock.warm = True
        self.steps += 1
        end = self.clock.stop.is_set() or (self.steps > cfg.min_steps and self._past(now))
        self.last = time.monotonic()
        return end

    def _past(self, now: float) -> bool:
        return core.past_cut(now, self.step_s, self.cut_time(now))


class Clock:
    """One peer's view of the swarm's pace. ``step_s`` is the peer's own seconds per inner step, kept
    up to date by the peer loop."""

    def __init__(self, members: Membership, cfg: SwarmConfig, me: str, inner_steps: int,
                 stop: threading.Event) -> None:
        self.members, self.cfg, self.me, self.inner_steps, self.stop = members, cfg, me, inner_steps, stop
        self.step_s = 0.0
        self.warm = False  # an inner step ran in this process already (swarm.slowdown stretches only those)

    def round_seconds(self) -> float:
        """The (lower) median peer's full-round compute time (ours until others report theirs)."""
        return self.members.round_seconds(self.step_s * self.inner_steps or self.cfg.min_deadline_s)

    def for_round(self, round_: int) -> RoundClock:
        """``should_stop`` for the inner steps of ``round_``; close it when they end."""
        return RoundClock(self, CutTime(self, round_))

    def too_late_for(self, round_: int) -> bool:
        """True when round ``round_``'s deadline is already running and nearer than our fewest steps:
        our update would arrive after the others decided, so we had better compute for the next round."""
        if not self.step_s:
            return False
        now = time.monotonic()
        cut_time = CutTime(self, round_, predict=False)
        cut_time.refresh(now)
        return core.too_late(now, self.step_s, self.cfg.min_steps, cut_time(now))
