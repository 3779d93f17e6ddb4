"""The swarm as its own records show it, kept over time: what the status page (`gradnode status --serve`,
`gradnode bootstrap --status-port`) draws.

Everything here comes from signed DHT records (member records, weight reports), verified by ``Membership``.
Each is a peer's claim about itself: the page shows them as claims. "Last seen" is timed on this
process's own clock, from when a peer's record last changed, never from the time a peer wrote in it.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from gradnode.node.swarm.membership import Membership
from gradnode.protocol import chain
from gradnode.protocol.records import MemberRecord, WeightHash

log = logging.getLogger(__name__)

MAX_PEERS = 512  # rows kept: the newest records win (a flood of keys cannot grow this process's memory)
MAX_ROUNDS = 400  # rounds kept in the curves
MAX_POINTS = 100  # loss points per trainer sent to the page (the newest)
MAX_BYTES_PER_ROUND = 2**34  # one peer's traffic in one round above this is a counter's jump, not charted


@dataclass
class _Seen:
    """One peer as this process followed it."""

    record: MemberRecord
    changed: float  # monotonic time its record last changed
    losses: deque = field(default_factory=lambda: deque(maxlen=MAX_ROUNDS))  # (round, loss)
    counted: tuple[int, int, int] | None = None  # (round, bytes up, bytes down) last attributed to a round


class SwarmWatch:
    """Polls the swarm's records every ``interval`` seconds on a thread of its own; ``snapshot()`` is the
    JSON the page renders."""

    def __init__(self, membership: Membership, run_id: str, interval: float = 2.0) -> None:
        self.membership, self.run_id, self.interval = membership, run_id, interval
        self.peers: dict[str, _Seen] = {}
        self.rounds: dict[int, dict[str, Any]] = {}  # round -> traffic and weight reports
        self.polls = 0
        self.typical = 0  # the median live trainer's round, as last polled
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.poll()
        self._thread = threading.Thread(target=self._run, name="swarm-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception as err:  # a DHT hiccup: the page shows the last view, the next poll tries again
                log.warning("status poll failed: %r", err)

    def poll(self) -> None:
        members = self.membership.members(max_age=0)
        mono = time.monotonic()
        # the swarm's round: the median trainer's, so that one record claiming a far round moves nothing
        self.typical = int(statistics.median_low([m.round for m in members.values() if m.training] or [0]))
        with self._lock:
            for pid, rec in members.items():
                seen = self.peers.get(pid)
                if seen is None:
                    seen = self.peers[pid] = _Seen(rec, mono)
                elif rec.time != seen.record.time:
                    seen.record, seen.changed = rec, mono
                self._note_progress(seen, rec)
            if len(self.peers) > MAX_PEERS:
                for pid in sorted(self.peers, key=lambda p: self.peers[p].changed)[:len(self.peers) - MAX_PEERS]:
                    del self.peers[pid]
        # weight reports of the last rounds: their hashes (one chain or several) and agreed update bytes
        for r in range(max(0, self.typical - 3), self.typical + 1):
            reports = self.membership.read("weights", r, WeightHash)
            with self._lock:
                self._note_reports(r, [w for w in reports if w.round == r])
        with self._lock:
            for r in sorted(self.rounds)[:-MAX_ROUNDS]:
                del self.rounds[r]
            self.polls += 1

    def _round(self, r: int) -> dict[str, Any]:
        return self.rounds.setdefault(r, {"round": r, "sent_bytes": 0, "received_bytes": 0, "reports": 0,
                                          "hashes": {}, "update_bytes": None})

    def _note_progress(self, seen: _Seen, rec: MemberRecord) -> None:
        """A trainer's loss at its round, and the bytes it moved since the round we last saw it at, counted
        to the rounds it went through meanwhile, evenly (what its own counters claim)."""
        if not rec.training or rec.round > self.typical + 8:  # far ahead of the swarm: a claim we do not chart
            return
        if rec.loss is not None and (not seen.losses or seen.losses[-1][0] < rec.round):
            seen.losses.append((rec.round, rec.loss))
        if seen.counted is None or rec.round < seen.counted[0]:  # first sight, or re-synced back
            seen.counted = (rec.round, rec.bytes_up, rec.bytes_down)
            return
        r0, up0, down0 = seen.counted
        if rec.round > r0 and rec.bytes_up >= up0 and rec.bytes_down >= down0:
            n = rec.round - r0  # several rounds between two looks: spread evenly over them
            if (rec.bytes_up - up0) // n > MAX_BYTES_PER_ROUND or (rec.bytes_down - down0) // n > MAX_BYTES_PER_ROUND:
                seen.counted = (rec.round, rec.bytes_up, rec.bytes_down)  # a counter's jump: not charted
                return
            for r in range(max(r0 + 1, rec.round - MAX_ROUNDS + 1), rec.round + 1):
                row = self._round(r)
                row["sent_bytes"] += (rec.bytes_up - up0) // n
                row["received_bytes"] += (rec.bytes_down - down0) // n
            seen.counted = (rec.round, rec.bytes_up, rec.bytes_down)
        elif rec.bytes_up < up0 or rec.bytes_down < down0:  # a restarted process: its counters began again
            seen.counted = (rec.round, rec.bytes_up, rec.bytes_down)

    def _note_reports(self, r: int, reports: list[WeightHash]) -> None:
        if not reports:
            return
        row = self._round(r)
        hashes = Counter(w.param_hash for w in reports)
        row["reports"] = len({w.peer for w in reports})
        row["hashes"] = {h[:16]: n for h, n in hashes.most_common(8)}
        top = hashes.most_common(1)[0][0]
        row["update_bytes"] = next(w.update_bytes for w in reports if w.param_hash == top)

    def snapshot(self) -> dict[str, Any]:
        mono = time.monotonic()
        with self._lock:
            live = {p: s for p, s in self.peers.items() if mono - s.changed <= self.membership.fresh_s}
            # peers a round apart follow one chain: group them as the peers do (protocol/chain.py), a tie to a
            # chain some peer serves (a client-mode peer's state nobody can download), then to the lowest id
            found = chain.groups({p: list(s.record.chain) for p, s in live.items()
                                  if s.record.training and s.record.chain},
                                 serving={p for p, s in live.items() if s.record.reachable})
            winners = set(found[0]) if found else set()
            ignoring = Counter(p for s in live.values() for p in s.record.ignoring)
            held = [dict(s.record.scores) for s in live.values() if s.record.training]
            peers = []
            for pid, s in sorted(self.peers.items()):
                m = s.record
                head = m.chain[-1] if m.chain else None
                peers.append({
                    "peer": pid, "role": "train" if m.training else "serve", "round": m.round,
                    "tokens_per_s": m.tokens_per_s, "loss": m.loss, "bytes_up": m.bytes_up,
                    "bytes_down": m.bytes_down, "rejected": m.rejected, "ignored_by": ignoring.get(pid, 0),
                    "reputation": reputation(pid, held),
                    "hash": head[1][:16] if head else None, "hash_round": head[0] if head else None,
                    "agrees": None if head is None or pid not in live else pid in winners,
                    "last_seen_s": round(mono - s.changed, 1), "live": pid in live,
                    "version": m.software_version, "admitted": bool(m.admission),
                    "losses": [list(x) for x in list(s.losses)[-MAX_POINTS:]] if pid in live else []})
            rounds = [dict(row) for _, row in sorted(self.rounds.items())]
            trainers = [p for p in peers if p["live"] and p["role"] == "train"]
            return {"run": self.run_id, "polls": self.polls, "interval_s": self.interval,
                    "peers": peers, "rounds": rounds,
                    "live_trainers": len(trainers), "round": self.typical,
                    "chains": len(found), "time": time.time()}


def reputation(peer: str, held: list[dict[str, float]]) -> float:
    """``peer``'s score in the run's reputation table as the live trainers hold it (each record lists the
    lowest scores of its table; an unlisted peer scores 1.0): the median, so a minority of records that
    lie about it moves nothing."""
    return statistics.median_low([h.get(peer, 1.0) for h in held]) if held else 1.0

