"""The swarm as its own records show it, kept over time: what the status page (`gradnode status --serve`,
`gradnode bootstrap --status-port`) draws.

Everything here comes from signed DHT records (member records, weight reports), verified by ``Membership``.
Each is a peer's claim about itself: the page shows them as claims. "Last seen" and the time of each point
are timed on this process's own clock, from when a peer's record changed, never from the time a peer wrote
in it. The watch also tells what it saw happen (peers coming and going, falling behind or off the majority,
being ignored, the swarm splitting) as events.

Given this machine's run folder (runfolder.py: a simulate run's, or a peer's own), the page adds what no
record carries: the peers' folder names, validation losses, utilisation, contributed, excluded and
abstained rounds, and the peers' own event logs.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from gradnode.node.status import figures
from gradnode.node.status.runfolder import RunFolder
from gradnode.node.swarm.events import Kind
from gradnode.node.swarm.membership import Membership
from gradnode.protocol import chain
from gradnode.protocol.records import MemberRecord, WeightHash

log = logging.getLogger(__name__)

MAX_PEERS = 512  # rows kept: the newest records win (a flood of keys cannot grow this process's memory)
MAX_ROUNDS = 400  # rounds kept in the curves
MAX_POINTS = 100  # loss points per trainer sent to the page (the newest)
MAX_BYTES_PER_ROUND = 2**34  # one peer's traffic in one round above this is a counter's jump, not charted
FRESH_S = 30.0  # a record unchanged this long is stale (Membership.fresh_s at the default record lifetime)
FOLDER_FIELDS = ("name", "val_loss", "val_losses", "utilization", "contributed", "excluded", "abstained", "resyncs")


@dataclass
class _Seen:
    """One peer as this process followed it."""

    record: MemberRecord
    changed: float  # monotonic time its record last changed
    losses: deque = field(default_factory=lambda: deque(maxlen=MAX_ROUNDS))  # (round, loss, wall time seen)
    counted: tuple[int, int, int] | None = None  # (round, bytes up, bytes down) last attributed to a round


@dataclass(frozen=True)
class _Flags:
    """What the events compare from one poll to the next, per peer."""

    live: bool
    agrees: bool | None
    behind: bool
    ignored_by: int
    banned: bool
    round: int


class SwarmWatch:
    """Polls the swarm's records every ``interval`` seconds on a thread of its own; ``snapshot()`` is the
    JSON the page renders. ``target_rounds``: the run's rounds (swarm.rounds; None: until stopped, or what the
    peers' start events in ``folder`` say); ``fresh_s``: how long a record counts as live (Membership.fresh_s)."""

    def __init__(self, membership: Membership | None, run_id: str, interval: float = 2.0, *,
                 target_rounds: int | None = None, folder: RunFolder | None = None,
                 fresh_s: float | None = None) -> None:
        self.membership, self.run_id, self.interval = membership, run_id, interval
        self.fresh_s = fresh_s or (membership.fresh_s if membership is not None else FRESH_S)
        self.target_rounds, self.folder = target_rounds or None, folder
        self.peers: dict[str, _Seen] = {}
        self.rounds: dict[int, dict[str, Any]] = {}  # round -> traffic and weight reports
        self.reached: dict[int, float] = {}  # swarm round -> wall time this process first saw it there
        self.events: deque[dict[str, Any]] = deque(maxlen=figures.MAX_EVENTS)
        self.polls = 0
        self.typical = 0  # the median live trainer's round, as last polled
        self.started = time.time()
        self._flags: dict[str, _Flags] = {}
        self._chains = 1
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
        """Read the member records and the weight reports of the swarm's last rounds, and take them in."""
        members = self.membership.members(max_age=0)
        typical = figures.typical_round([m.round for m in members.values() if _trains(m)])
        reports = {r: [w for w in self.membership.read("weights", r, WeightHash) if w.round == r]
                   for r in range(max(0, typical - 3), typical + 1)}
        self.observe(members, reports)

    def observe(self, members: dict[str, MemberRecord], reports: dict[int, list[WeightHash]],
                wall: float | None = None) -> None:
        """Take in one poll's records (``reports``: round -> its weight reports), seen at ``wall`` (now)."""
        mono, wall = time.monotonic(), time.time() if wall is None else wall
        # the swarm's round: the median trainer's, so that one record claiming a far round moves nothing; with
        # none in sight (the run is over, or everyone left), the last one seen
        rounds = [m.round for m in members.values() if _trains(m)]
        self.typical = figures.typical_round(rounds) if rounds else self.typical
        with self._lock:
            self.reached.setdefault(self.typical, wall)
            for pid, rec in members.items():
                seen = self.peers.get(pid)
                if seen is None:
                    seen = self.peers[pid] = _Seen(rec, mono)
                elif rec.time != seen.record.time:
                    seen.record, seen.changed = rec, mono
                self._note_progress(seen, rec, wall)
            if len(self.peers) > MAX_PEERS:
                for pid in sorted(self.peers, key=lambda p: self.peers[p].changed)[:len(self.peers) - MAX_PEERS]:
                    del self.peers[pid]
            # weight reports of the last rounds: their hashes (one chain or several) and agreed update bytes
            for r, found in reports.items():
                self._note_reports(r, found)
            for r in sorted(self.rounds)[:-MAX_ROUNDS]:
                del self.rounds[r]
            for r in sorted(self.reached)[:-MAX_ROUNDS]:
                del self.reached[r]
            peers, groups = self._view(mono)
            self._note_events(peers, len(groups), wall)
            self.polls += 1

    def _round(self, r: int) -> dict[str, Any]:
        return self.rounds.setdefault(r, {"round": r, "sent_bytes": 0, "received_bytes": 0, "reports": 0,
                                          "hashes": {}, "update_bytes": None})

    def _note_progress(self, seen: _Seen, rec: MemberRecord, wall: float) -> None:
        """A trainer's loss at its round, and the bytes it moved since the round we last saw it at, counted
        to the rounds it went through meanwhile, evenly (what its own counters claim)."""
        if not rec.training or rec.round > self.typical + 8:  # far ahead of the swarm: a claim we do not chart
            return
        if rec.loss is not None and (not seen.losses or seen.losses[-1][0] < rec.round):
            seen.losses.append((rec.round, rec.loss, wall))
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

    def _view(self, mono: float) -> tuple[list[dict[str, Any]], list[list[str]]]:
        """The peers' rows as the records tell them (caller holds the lock), and the chains among the live
        trainers, the winning one first."""
        live = {p: s for p, s in self.peers.items() if mono - s.changed <= self.fresh_s}
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
            score = reputation(pid, held)
            peers.append({
                "peer": pid, "role": "train" if _trains(m) else "serve", "round": m.round,
                "tokens_per_s": m.tokens_per_s, "loss": m.loss, "bytes_up": m.bytes_up,
                "bytes_down": m.bytes_down, "rejected": m.rejected, "ignored_by": ignoring.get(pid, 0),
                "reputation": score, "banned": score < 0.5,
                "hash": head[1][:16] if head else None, "hash_round": head[0] if head else None,
                "agrees": None if head is None or pid not in live else pid in winners,
                "behind": pid in live and m.training and figures.behind(m.round, self.typical),
                "lag": max(0, self.typical - m.round) if m.training else 0,
                "last_seen_s": round(mono - s.changed, 1), "live": pid in live, "leaving": m.leaving,
                "state": "running" if pid in live and not m.leaving else "left" if m.leaving else "gone",
                "version": m.software_version, "admitted": bool(m.admission),
                "losses": [list(x) for x in list(s.losses)[-MAX_POINTS:]] if pid in live else []})
        return peers, found

    def _note_events(self, peers: list[dict[str, Any]], chains: int, wall: float) -> None:
        """Events from what changed since the last poll (caller holds the lock); the first poll only says how
        many peers it found."""
        first = not self.polls
        if first:
            trainers = sum(p["live"] and p["role"] == "train" for p in peers)
            self._event(wall, Kind.PEER, None, f"watching: {trainers} trainer(s) and "
                                               f"{sum(p['live'] for p in peers) - trainers} other peer(s) in sight")
        for p in peers:
            now = _Flags(p["live"], p["agrees"], p["behind"], p["ignored_by"], p["banned"], p["round"])
            was = self._flags.get(p["peer"])
            self._flags[p["peer"]] = now
            if not first:
                self._peer_events(p, was, now, wall)
        for pid in [q for q in self._flags if q not in self.peers]:
            del self._flags[pid]
        if chains > 1 and self._chains <= 1:
            self._event(wall, Kind.FORK, None, f"the swarm follows {chains} chains of weights (a split)")
        elif chains <= 1 < self._chains and not first:
            self._event(wall, Kind.FORK, None, "one chain of weights again")
        self._chains = chains

    def _peer_events(self, p: dict[str, Any], was: _Flags | None, now: _Flags, wall: float) -> None:
        pid, what = p["peer"], p["role"]
        if was is None or (now.live and not was.live):
            if now.live:
                self._event(wall, Kind.PEER, pid, f"{'came into sight' if was is None else 'back'} ({what}, round "
                                                  f"{now.round})")
            return
        if was.live and not now.live:
            self._event(wall, Kind.PEER, pid, "left the run" if p["leaving"] else
                        f"went quiet (no new record for {p['last_seen_s']:.0f} s)")
            return
        if now.round < was.round and what == "train":
            self._event(wall, Kind.RESYNC, pid, f"back from round {was.round} to {now.round} (re-synced)")
        if now.agrees is False and was.agrees is not False:
            self._event(wall, Kind.FORK, pid, f"off the majority: its weights at round {p['hash_round']} follow "
                                              f"another chain than most peers'")
        elif now.agrees and was.agrees is False:
            self._event(wall, Kind.FORK, pid, "back on the majority's chain")
        if now.behind and not was.behind:
            self._event(wall, Kind.BEHIND, pid, f"{p['lag']} rounds behind the swarm (round {now.round})")
        elif was.behind and not now.behind:
            self._event(wall, Kind.BEHIND, pid, f"caught up (round {now.round})")
        if now.ignored_by > was.ignored_by:
            self._event(wall, Kind.BAN, pid, f"ignored by {now.ignored_by} peer(s) for invalid updates")
        if now.banned and not was.banned:
            self._event(wall, Kind.BAN, pid, f"reputation {p['reputation']:.2f}: its updates count for nothing")

    def _event(self, wall: float, kind: Kind, peer: str | None, message: str) -> None:
        self.events.append({"time": wall, "kind": kind.value, "peer": peer, "round": self.typical,
                            "message": message, "source": "watch"})

    def snapshot(self) -> dict[str, Any]:
        mono, wall = time.monotonic(), time.time()
        extra, folder_events, told = self.folder.extras(wall) if self.folder is not None else ({}, [], None)
        with self._lock:
            peers, found = self._view(mono)
            rounds = [{**row, "time": self.reached.get(r)} for r, row in sorted(self.rounds.items())]
            evs = list(self.events)
            reached = dict(self.reached)
            polls = self.polls
        for p in peers:
            mine = extra.get(p["peer"], {})
            p.update({k: mine.get(k) for k in FOLDER_FIELDS})
            p["val_losses"] = (p["val_losses"] or [])[-MAX_POINTS:]
        peers.sort(key=_by_name)
        names = {pid: f["name"] for pid, f in extra.items()}
        evs = [dict(e) for e in sorted([*evs, *folder_events], key=lambda e: e["time"])[-figures.MAX_EVENTS:]]
        for e in evs:
            e.setdefault("name", names.get(e["peer"]) if e.get("peer") else None)
        trainers = [p for p in peers if p["state"] == "running" and p["role"] == "train"]
        target = self.target_rounds or told
        return {"run": self.run_id, "source": "swarm", "polls": polls, "interval_s": self.interval,
                "peers": peers, "rounds": rounds, "events": evs,
                "live_trainers": len(trainers), "round": self.typical, "chains": len(found), "time": wall,
                "progress": figures.progress(self.typical, target, reached, self.started, wall,
                                             bool(target) and self.typical >= target and not trainers)}


def _by_name(p: dict[str, Any]) -> tuple[int, int, str, str]:
    """Named peers first, in their folders' order (peer-2 before peer-10), then by id."""
    name = p.get("name") or ""
    head, _, tail = name.rpartition("-")
    return (0 if name else 1, int(tail) if tail.isdigit() else -1, head if tail.isdigit() else name, p["peer"])


def _trains(m: MemberRecord) -> bool:
    """A trainer's record: training, or leaving with a chain of states behind it (a trainer's last record; a
    serve-only peer holds no chain)."""
    return m.training or (m.leaving and bool(m.chain))


def reputation(peer: str, held: list[dict[str, float]]) -> float:
    """``peer``'s score in the run's reputation table as the live trainers hold it (each record lists the
    lowest scores of its table; an unlisted peer scores 1.0): the median, so a minority of records that
    lie about it moves nothing."""
    return statistics.median_low([h.get(peer, 1.0) for h in held]) if held else 1.0
