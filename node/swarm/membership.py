"""Who is in the swarm: signed, expiring membership records in the DHT, and signed record I/O.

A member record binds a peer id to its RSA public key (the peer id is the hash of that key, so a
record cannot claim someone else's id) and carries its addresses, round, speed and counters. Every
other record (announcements, witness reports, weight hashes, state manifests) is signed by its author and
verified here against the author's member record before anyone looks at its content.

Under a committee a record goes in the swarm's member table only while protocol/roster.py ``lists`` it,
and always under its writer's own key, which a reader reads for a key it has not seen listed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import TypeVar

from gradnode.node import __version__
from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.admission import Gate
from gradnode.node.swarm.identity import Identity, peer_id_from_public_der, verify
from gradnode.node.swarm.transport import Transport
from gradnode.protocol import round as core
from gradnode.protocol.records import (PROTOCOL_VERSION, Finished, MemberRecord, Record, RecordError, WeightHash,
                                       dht_key, member_key)

log = logging.getLogger(__name__)

SOFTWARE_VERSION = f"gradnode/{__version__}"[:32]
R = TypeVar("R", bound=Record)
ADDRESS_AGE_S = 5.0  # how old a member list may be to look up a fetch's sources' addresses in
_AUTHOR_FIELD = {"update": "sender", "report": "witness", "weights": "peer", "state": "peer", "member": "peer_id",
                 "holdings": "peer", "equivocation": "reporter", "finished": "peer"}


def kept_for_catchup(cfg: SwarmConfig, round_seconds: float) -> float:
    """Lifetime of a round's weight reports and update announcements: long enough for a peer that was away
    ``swarm.catchup_rounds`` rounds to read what it missed."""
    return max(cfg.record_ttl_s, 3.0 * cfg.catchup_rounds * max(round_seconds, cfg.min_deadline_s))


class Membership:
    """Publishes this peer's record and reads everyone's, verified and fresh."""

    def __init__(self, transport: Transport, identity: Identity, run_id: str, ttl: float, *,
                 gate: Gate | None = None, admission: bytes = b"") -> None:
        self.transport = transport
        self.identity = identity
        self.run_id = run_id
        self.ttl = ttl
        self.gate = gate or Gate(run_id, None, transport.now)  # open run unless told otherwise
        self.admission = admission  # this peer's certificate (permissioned runs), published in its record
        self._admitted: frozenset[str] = frozenset({identity.peer_id})
        self._refused: set[tuple[str, str]] = set()  # (peer, why) already logged
        self._revocations_at = 0.0
        self._keys: dict[str, bytes] = {identity.peer_id: identity.public_der}
        self._members: dict[str, MemberRecord] = {}
        self._read_at = 0.0
        self._leaving: set[str] = set()
        self._lock = threading.Lock()
        self.bad_records: dict[str, int] = {}
        # records are refreshed every heartbeat (a third of their lifetime, at most 10 s); one that stopped
        # changing for three heartbeats belongs to a peer gone or out of reach (a split network keeps its
        # last copy in the DHT until it expires). Timed on this peer's own clock: peers' clocks differ.
        self.heartbeat_s = min(10.0, ttl / 3)
        self.fresh_s = 3 * self.heartbeat_s
        self._changed: dict[str, tuple[float, float]] = {}  # peer -> (record time, our monotonic time it changed)
        # who showed work: the senders of the last round this peer applied (set by the peer); () before any
        self.workers: Callable[[], Iterable[str]] = tuple
        # who votes on hashes and chains: the recent contributors (set by the peer); empty: everyone
        self.voters: Callable[[], frozenset[str]] = frozenset
        # under a committee (set by the peer): its record under its own key too, in the member table only while
        # listed (protocol/roster.py), and the roster from the peer's estimate (roster.Roster.size of the count)
        self.own_key = False
        self.listed: Callable[[], bool] = lambda: True
        self.roster_size: Callable[[int], int] = lambda seen: seen
        self._own: dict[str, tuple[float, MemberRecord | None]] = {}  # peer -> (monotonic read time, its record)

    def sign(self, record: R) -> R:
        return record.signed(self.identity.sign(record.signing_bytes()))

    def publish(self, *, round_: int, training: bool, step_seconds: float, inner_steps: int, tokens_per_s: float,
                rejected: int, loss: float | None, leaving: bool = False, ignoring: list[str] | None = None,
                chain: list[tuple[int, str]] | None = None, scores: list[tuple[str, float]] | None = None) -> bool:
        rec = MemberRecord(run_id=self.run_id, peer_id=self.identity.peer_id, public_key=self.identity.public_der,
                           maddrs=self.transport.maddrs()[:16], round=round_, training=training,
                           step_seconds=min(step_seconds, 1e5), inner_steps=inner_steps,
                           tokens_per_s=tokens_per_s, bytes_up=self.transport.bytes_up,
                           bytes_down=self.transport.bytes_down, rejected=rejected,
                           loss=None if loss is None or not (0 <= loss <= 1e6) else loss,
                           software_version=SOFTWARE_VERSION, protocol_version=PROTOCOL_VERSION,
                           time=self.transport.now(), leaving=leaving, reachable=not self.transport.cfg.client_mode,
                           ignoring=sorted(ignoring or [])[:16], chain=list(chain or [])[-8:],
                           admission=self.admission, scores=list(scores or [])[:16])
        raw = self.sign(rec).to_bytes()
        ok = self.transport.store(member_key(self.run_id, rec.peer_id), raw, self.ttl) if self.own_key else True
        # a departure is listed: nobody waits for a key that said it left. A permissioned run lists every
        # record: a server admits a peer's streams by the records it read (``admitted`` never reads)
        if self.listed() or leaving or not self.gate.open:
            ok = self.transport.store(dht_key(self.run_id, "members"), raw, self.ttl) and ok
        return ok

    def _note_bad(self, who: str, why: str) -> None:
        self.bad_records[who] = self.bad_records.get(who, 0) + 1
        log.warning("record rejected author=%s reason=%s", who, why)

    def roster(self, me: str) -> int:
        """The live keys this peer counts, itself included: what the committee's share of newcomers and the
        holdings' parts are sized on. Under a committee, its estimate (``roster_size``)."""
        return self.roster_size(len(self.members().keys() | {me}))

    def members(self, max_age: float = 0.5, fresh: bool = False) -> dict[str, MemberRecord]:
        """Live members by peer id (cached for ``max_age`` seconds); expired and leaving peers dropped.
        ``fresh``: read the DHT now (Transport.get)."""
        with self._lock:
            if time.monotonic() - self._read_at < max_age:
                return dict(self._members)
        found: dict[str, MemberRecord] = {}
        leaving: set[str] = set()
        now = self.transport.now()
        if not self.gate.open and time.monotonic() - self._revocations_at > 5.0:
            self._revocations_at = time.monotonic()
            self.gate.take_revocations([raw for _, raw in self.transport.get(dht_key(self.run_id, "revocations"))])
        for owner, raw in self.transport.get(dht_key(self.run_id, "members"), fresh=fresh):
            rec = self._valid(owner, raw)
            if rec is None:
                continue
            if rec.leaving and now - rec.time <= self.ttl:  # an old departure says nothing about now
                leaving.add(rec.peer_id)
                self._keys.setdefault(rec.peer_id, rec.public_key)  # its last records still verify
            if rec.leaving or now - rec.time > self.ttl:
                continue
            found[rec.peer_id] = rec
        mono = time.monotonic()
        with self._lock:
            if not self.gate.open:  # keys of peers no longer admitted (revoked, expired) verify nothing more
                self._admitted = frozenset(found) | leaving | {self.identity.peer_id} | \
                    {p for p, (_, rec) in self._own.items() if rec is not None and not rec.leaving}  # own key's record
                for pid in [p for p in self._keys if p not in self._admitted]:
                    del self._keys[pid]
            for pid, rec in found.items():
                self._keys[pid] = rec.public_key
                if self._changed.get(pid, (None,))[0] != rec.time:
                    self._changed[pid] = (rec.time, mono)
            self._members = found
            self._leaving = leaving
            self._read_at = mono
        return dict(found)

    def _valid(self, owner: str | None, raw: bytes) -> MemberRecord | None:
        """A member record stored by ``owner`` if it is well formed, its own, signed and admitted; else None,
        counted as bad (a stranger to a permissioned run is logged once)."""
        try:
            rec = MemberRecord.from_bytes(raw)
        except RecordError as err:
            self._note_bad(owner or "?", str(err))
            return None
        if owner != rec.peer_id:  # a signed record replayed by another key (an old 'leaving' one, say)
            self._note_bad(owner or "?", f"record of {rec.peer_id[:12]} stored by another peer")
            return None
        if rec.peer_id in self.transport.blocked:  # testing aid: the other side of a simulated partition
            return None
        if rec.run_id != self.run_id or peer_id_from_public_der(rec.public_key) != rec.peer_id:
            self._note_bad(rec.peer_id, "peer id does not match its public key")
            return None
        if not verify(rec.public_key, rec.signing_bytes(), rec.signature):
            self._note_bad(rec.peer_id, "bad member signature")
            return None
        why = self.gate.why_not(rec.peer_id, rec.admission)
        if why is None and rec.protocol_version != PROTOCOL_VERSION:  # its hashes and rules are not ours
            why = f"protocol version {rec.protocol_version}, this peer speaks {PROTOCOL_VERSION}"
        if why is not None:  # a permissioned run: not one of us; once in the log, then silently
            if (rec.peer_id, why) not in self._refused:
                self._refused.add((rec.peer_id, why))
                log.warning("member ignored peer=%s reason=%s", rec.peer_id[:12], why)
            return None
        return rec

    def own_record(self, peer_id: str, max_age: float = ADDRESS_AGE_S) -> MemberRecord | None:
        """``peer_id``'s newest valid record under its own key (committee runs; None in others, or when it has
        none), live or not: for a key not listed in the member table, whose key verifies its records (a
        departed peer's last ones too) and whose live record gives its addresses. Read at most every
        ``max_age`` seconds for one key."""
        if not self.own_key:
            return None
        mono = time.monotonic()
        with self._lock:
            got = self._own.get(peer_id)
        if got is not None and mono - got[0] < max_age:
            return got[1]
        found = None
        for owner, raw in self.transport.get(member_key(self.run_id, peer_id)):
            if owner != peer_id:  # anyone may store a subkey under another's key: only its own counts
                continue
            found = self._valid(owner, raw) or found
        with self._lock:
            if len(self._own) > 4096:  # keys read once and never again (fetch sources of old rounds)
                self._own = {p: v for p, v in self._own.items() if mono - v[0] < self.fresh_s}
            self._own[peer_id] = (mono, found)
            if found is not None:  # _valid checked its admission
                self._keys[peer_id] = found.public_key
                if not self.gate.open and not found.leaving:
                    self._admitted |= {peer_id}
        return found

    def fresh(self, max_age: float = 0.5) -> dict[str, MemberRecord]:
        """Members whose record changed within the last three heartbeats, as this peer saw it (this peer's
        own record always counts): the ones actually in reach now."""
        found = self.members(max_age)
        mono = time.monotonic()
        with self._lock:
            return {p: m for p, m in found.items()
                    if p == self.identity.peer_id or mono - self._changed.get(p, (0.0, mono))[1] <= self.fresh_s}

    def leaving(self) -> set[str]:
        """Peers whose newest record announces their departure (graceful leave): nobody waits for them."""
        self.members()
        with self._lock:
            return set(self._leaving)

    def admitted(self, peer_id: str) -> bool:
        """May ``peer_id`` take part (open run: anyone; permissioned: an admitted member as last read)?
        Never blocks: the transport asks on its event loop."""
        return self.gate.open or peer_id in self._admitted

    def public_key(self, peer_id: str) -> bytes | None:
        with self._lock:
            key = self._keys.get(peer_id)
        if key is None and self.own_key:  # a key not listed (or not yet): its own key's record
            rec = self.own_record(peer_id)
            key = rec.public_key if rec is not None else None
        elif key is None:  # a member new to us, or a stranger: read the list again (permissioned: once a second)
            self.members(max_age=0.0 if self.gate.open else 1.0, fresh=self.gate.open)
            with self._lock:
                key = self._keys.get(peer_id)
        return key

    def verify_record(self, rec: Record) -> bool:
        author = getattr(rec, _AUTHOR_FIELD[rec.kind])
        if isinstance(rec, Finished):  # its author's member record is long gone: the key it carries, if it is its
            key = rec.public_key if peer_id_from_public_der(rec.public_key) == author else None
        else:
            key = self.public_key(author)
        return rec.run_id == self.run_id and key is not None and verify(key, rec.signing_bytes(), rec.signature)

    def read(self, what: str, round_: int | None, cls: type[R], fresh: bool = False,
             authors: Collection[str] | None = None, part: int | None = None) -> list[R]:
        """Verified records of one kind under one DHT key; malformed or forged ones are counted and dropped.
        ``fresh``: from a DHT read begun now, not one another thread began just before (Transport.get);
        ``authors``: only the records these keys stored (the others are skipped unread)."""
        out = []
        for owner, raw in self.transport.get(dht_key(self.run_id, what, round_, part), fresh=fresh):
            if authors is not None and owner not in authors:
                continue
            try:
                rec = cls.from_bytes(raw)
            except RecordError as err:
                self._note_bad(owner or "?", str(err))
                continue
            author = getattr(rec, _AUTHOR_FIELD[rec.kind])
            if owner != author:  # replayed by another key: only the author's key can write its subkey
                self._note_bad(owner or "?", f"{rec.kind} record of {author[:12]} stored by another peer")
                continue
            if author in self.transport.blocked:  # testing aid: the other side of a simulated partition
                continue
            if not self.verify_record(rec):
                self._note_bad(author, f"bad {rec.kind} signature or run")
                continue
            out.append(rec)
        return out

    def write(self, what: str, round_: int | None, rec: Record, ttl: float | None = None,
              part: int | None = None) -> bool:
        return self.transport.store(dht_key(self.run_id, what, round_, part), self.sign(rec).to_bytes(),
                                    ttl or self.ttl)

    def votes(self) -> Callable[[str], bool]:
        """Whose weight report or published chain counts: the recent contributors (RoundLog.voters), or
        everyone before this peer applied a round. A flood of keys that never contributed outvotes nobody."""
        voters = self.voters()
        return (lambda peer: True) if not voters else voters.__contains__

    def reports(self, round_: int, among: Collection[str] | None = None) -> list[WeightHash]:
        """Round ``round_``'s weight reports that count (``votes``): what every majority is taken over.
        ``among``: only these keys' (the round's drawn witnesses, committee.weighers)."""
        votes = self.votes()
        return [w for w in self.read("weights", round_, WeightHash, authors=among)
                if w.round == round_ and votes(w.peer)]

    def view(self, round_: int, announced: Iterable[str] = (), banned: Iterable[str] = ()) -> core.View:
        """What the member records in sight say about ``round_`` (who keeps up, counts, votes: the core's rule,
        protocol/round.py ``view_of``), read now."""
        members = self.members()
        return core.view_of({p: (m.round, m.training) for p, m in members.items()}, self.identity.peer_id, round_,
                            announced=announced, workers=tuple(self.workers()), voters=self.voters(),
                            leaving=self.leaving(), banned=banned)

    def keeping_up(self, round_: int, announced: Iterable[str] = ()) -> tuple[set[str], set[str]]:
        """The other training peers keeping up with ``round_``, and those of them that are counted
        (protocol/round.py ``view_of``)."""
        v = self.view(round_, announced)
        return set(v.trainers), set(v.counted)

    def round_seconds(self, own: float) -> float:
        """The swarm's round time from the counted live training peers' records (protocol/round.py ``pace``): the
        senders of the last round this peer applied. Before it applied one (the run's first round, a restart, a
        join) it knows no contributor and paces on its own round time: a record costs nothing to make, and keys
        claiming hours per step would stretch the round's window (and the first round's latest deadline,
        ``RoundCore.deadline``) as far as they like."""
        members = self.members()
        return core.pace({p: m.step_seconds * m.inner_steps for p, m in members.items() if m.training},
                         set(self.workers()), own)

    def serving(self) -> set[str]:
        """The members whose records say they accept streams (not client-mode peers), this one included when it does."""
        found = {p for p, m in self.members().items() if m.reachable}
        if not self.transport.cfg.client_mode:
            found.add(self.identity.peer_id)
        return found

    def sources(self, peer_ids: list[str]) -> list[tuple[str, list[str]]]:
        """(peer id, maddrs) to fetch from; client-mode peers are left out (nobody can dial them). Addresses
        change rarely, and every pass of every fetch asks: read from a list up to ``ADDRESS_AGE_S`` old (at the
        default 0.5 s, fetches made 38% of the member-list reads of an 8-peer swarm)."""
        members = self.members(max_age=ADDRESS_AGE_S)
        out, now = [], self.transport.now()
        for p in peer_ids:
            m = members.get(p) or self.own_record(p)
            if m is not None and (m.leaving or now - m.time > self.ttl):
                m = None  # gone: no address to dial
            if m is None or m.reachable:
                out.append((p, list(m.maddrs) if m is not None else []))
        return out
