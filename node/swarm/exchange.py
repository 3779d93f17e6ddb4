"""One round's exchange: announce, fetch and verify everyone's update, agree on the set, hand it back.

How every honest peer ends a round with the same set of updates (and so with identical weights):

1. Each peer announces its update for round r in the DHT (digest, size, tokens; signed) and serves
   the bytes; every peer fetches every announced update from any holder (gossip), checks its digest,
   then the run's rules (rules.py: signature first, then envelope and shapes, sender, run and round,
   codec, tokens), and counts rejections per sender.
2. The round's deadline comes from observed speeds: once half the live training peers have announced
   (the anchor), the window is ``(slack - 1) x`` the median peer's round time (at least
   ``min_deadline_s``). It ends early when every live training peer's update has been verified.
3. At the deadline the peers agree on the set (agreement.py: proposals and the round's leader), then
   fetch whatever the decided set holds that they lack.

An update that misses the deadline is excluded by everyone alike; its sender gets ``own_included =
False`` and puts the content back into its local progress, so nothing is lost.

A peer too slow for round r (its deadline is nearer than the peer's fewest steps) *abstains*: it writes
an abstaining proposal at once (nobody waits for it to lead), computes for round r+1 instead, and learns
round r's decision as an *observer* (``blob=None``: it announces and proposes nothing, and follows the
leader like everyone else). So a 5x slower peer stays in phase and contributes every other round or
better, instead of announcing each update after its round was decided.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import msgpack

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import adversary
from gradnode.node.swarm.agreement import POLL_S, Agreement
from gradnode.node.swarm.clock import deadline_from, window_s
from gradnode.node.swarm.membership import Membership, kept_for_catchup
from gradnode.node.swarm.rules import UpdateRules
from gradnode.node.swarm.transport import Transport
from gradnode.protocol.records import (
    MAX_PEERS_PER_ROUND,
    Holdings,
    Proposal,
    UpdateAnnouncement,
    fingerprint,
    pack,
    proposal_list_name,
    resolve,
    unpack,
    update_name,
)

log = logging.getLogger(__name__)


class Rejections:
    """Rejected updates per sender and reason (rules.REASONS), and who is ignored for it.

    A sender rejected ``ignore_after`` times (in separate rounds or for separate reasons) is ignored for
    the next ``ignore_rounds`` rounds: its announcements are not fetched and its pushes are refused. This
    only saves the receiver's bandwidth and CPU; the round's decision is still followed as it is, so
    peers whose views of an attacker differ never diverge because of it."""

    def __init__(self, ignore_after: int = 3, ignore_rounds: int = 10) -> None:
        self.ignore_after, self.ignore_rounds = ignore_after, ignore_rounds
        self._counts: dict[str, Counter] = defaultdict(Counter)
        self._strikes: Counter = Counter()
        self._until: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, sender: str, reason: str, round_: int) -> None:
        with self._lock:
            self._counts[sender][reason] += 1
            self._strikes[sender] += 1
            starts = self._strikes[sender] >= self.ignore_after and self.ignore_rounds > 0
            if starts:
                self._strikes[sender] = 0
                self._until[sender] = round_ + 1 + self.ignore_rounds
        log.warning("update rejected sender=%s reason=%s round=%d", sender, reason, round_)
        if starts:
            log.warning("ignoring sender=%s until round=%d: %d rejected updates", sender,
                        round_ + 1 + self.ignore_rounds, self.ignore_after)

    def ignored(self, round_: int) -> list[str]:
        """Senders ignored in round ``round_``."""
        with self._lock:
            return sorted(s for s, until in self._until.items() if round_ < until)

    def total(self) -> int:
        with self._lock:
            return sum(sum(c.values()) for c in self._counts.values())

    def by_sender(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {s: dict(c) for s, c in self._counts.items()}


@dataclass
class Outcome:
    """What round r's exchange decided."""

    round: int
    updates: list[Any]  # DecodedUpdate, in the leader's (sender-sorted) order
    weights: list[float]
    senders: list[str]
    own_included: bool
    leader: str | None
    decided: bool  # False: no proposal arrived in time (the round is skipped by this peer)
    seconds: float  # from announcement to decision


@dataclass
class _Verified:
    digest: str
    update: Any


class RoundExchange(threading.Thread):
    """Runs round r's exchange in the background; ``result()`` blocks for the outcome."""

    def __init__(self, *, transport: Transport, membership: Membership, cfg: SwarmConfig, run_id: str,
                 round_: int, blob: bytes | None, tokens: int, round_seconds: float, rules: UpdateRules,
                 rejections: Rejections, stop: threading.Event, eligible: list[str] | None = None,
                 leaving: threading.Event | None = None, lead: bool = True) -> None:
        super().__init__(name=f"exchange-{round_}", daemon=True)
        self.transport, self.members, self.cfg, self.run_id = transport, membership, cfg, run_id
        self.round, self.blob, self.tokens, self.round_seconds = round_, blob, tokens, round_seconds
        self.rules, self.rejections, self.stop_event = rules, rejections, stop
        self.me = transport.peer_id
        self.observer = blob is None  # no update of its own: it follows the decision, never leads
        self.agreement = Agreement(members=membership, cfg=cfg, run_id=run_id, round_=round_, me=self.me,
                                   eligible=eligible, may_lead=not self.observer and lead,
                                   round_seconds=round_seconds, leaving=leaving or threading.Event())
        self.digest = hashlib.sha256(blob).hexdigest() if blob is not None else ""
        self.verified: dict[str, _Verified] = {}
        self.first_seen: dict[str, float] = {}
        self.announced: dict[str, UpdateAnnouncement] = {}
        self._fetching: dict[str, Any] = {}
        self._rejected: set[tuple[str, str]] = set()
        self._claiming = False  # testing aid: the 'slowhold' adversary lists updates it does not hold
        self._outcome: Outcome | None = None
        self._done = threading.Event()

    # --- public -----------------------------------------------------------------------------------

    def result(self, timeout: float) -> Outcome | None:
        self._done.wait(timeout)
        return self._outcome

    # --- the round, top to bottom -----------------------------------------------------------------

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            if not self.observer:
                self._announce()
            self._collect()
            self.agreement.propose([(s, v.digest) for s, v in self.verified.items()])
            chosen = self.agreement.decide(self.stop_event, tick=self._tick)
            self._outcome = self._assemble(chosen, t0)
        except Exception:  # a bug here must not kill the peer; the round counts as undecided
            log.exception("exchange crashed round=%d", self.round)
            self._outcome = Outcome(self.round, [], [], [], False, None, False, time.monotonic() - t0)
        finally:
            self._done.set()

    def _announce(self) -> None:
        name = update_name(self.run_id, self.round, self.me)
        self.transport.blobs.put(name, self.blob)
        ann = UpdateAnnouncement(run_id=self.run_id, round=self.round, sender=self.me, digest=self.digest,
                                 size=len(self.blob), tokens=self.tokens, time=self.transport.now())
        self.members.write("updates", self.round, ann, ttl=kept_for_catchup(self.cfg, self.round_seconds))
        decoded = self._decode(self.me, self.blob)
        if decoded is None:  # only a deliberately faulty peer (swarm.fault) gets here
            log.error("own update of round=%d fails verification", self.round)
        else:
            self.verified[self.me] = _Verified(self.digest, decoded)
        self.first_seen[self.me] = time.monotonic()
        if self.cfg.client_mode:
            self._push(name)
        adversary.flood_pushes(self.cfg, self.round, self.blob, name, self._others(), self._push_to_all)

    def _others(self) -> list[str]:
        return [p for p in self.members.members() if p != self.me]

    def _push_to_all(self, name: str, data: bytes) -> int:
        """Testing aid (the 'pushflood' adversary): push ``data`` as ``name`` to every reachable member."""
        targets = self.members.sources(self._others())
        return self.transport.push(targets, name, data, deadline=time.monotonic() + 5.0)

    def _push(self, name: str) -> None:
        """Client mode: nobody can fetch from us, so hand the update to a few reachable peers, which verify,
        hold and serve it (and list it in their holdings, so it spreads from there like any other)."""
        reachable = [p for p, m in self.members.members().items() if m.reachable and p != self.me]
        targets = self.members.sources(random.sample(reachable, min(self.cfg.push_peers, len(reachable))))
        accepted = self.transport.push(targets, name, self.blob, deadline=time.monotonic() + self.cfg.max_wait_s / 4)
        log.info("update pushed round=%d to=%d accepted=%d", self.round, len(targets), accepted)

    def _collect(self) -> None:
        """Fetch announced updates until the deadline (or until every live trainer's update is in)."""
        hard_stop = time.monotonic() + self.cfg.max_wait_s
        while not self.stop_event.is_set() and time.monotonic() < hard_stop:
            self._tick()
            # live: the counted trainers keeping up (Membership.keeping_up: the last round's senders and this
            # round's announcers). Another trainer (a newcomer, or a key made in bulk) holds no deadline off,
            # but while one is in sight the round runs to its deadline: a newcomer's first update gets the
            # window to arrive in
            trainers, live = self.members.keeping_up(self.round, self.announced)
            live |= self._me_if_sender()
            deadline = deadline_from(self.first_seen, len(live), self.round_seconds, self.cfg)
            everyone = live <= set(self.verified) and trainers <= live
            late = deadline is not None and time.monotonic() >= deadline
            if everyone or late or self.agreement.decided_elsewhere(live):
                log.info("collect done round=%d verified=%d live=%d why=%s", self.round, len(self.verified),
                         len(live), "everyone" if everyone else "deadline" if late else "decided elsewhere")
                return
            time.sleep(POLL_S)

    def _me_if_sender(self) -> set[str]:
        """{this peer} when it sent an update this round; an observer counts neither as live nor eligible."""
        return set() if self.observer else {self.me}

    def _decided(self, chosen: Proposal) -> tuple[list[tuple[str, str]], int]:
        """The (sender, digest) pairs the leader's fingerprints name, resolved against the round's announcements
        (read again if one is not known yet), and how many named nothing announced."""
        known = lambda: [(s, a.digest) for s, a in self.announced.items()] + \
            [(s, v.digest) for s, v in self.verified.items()]  # noqa: E731
        pairs, unknown = resolve(chosen.included, known())
        if unknown:
            self._scan()
            pairs, unknown = resolve(chosen.included, known())
        if unknown:  # announcements out of sight (a split network, a slow DHT): ask the proposer for its list
            spelled = self._proposal_list(chosen)
            if spelled is not None:
                pairs, unknown = spelled, 0
        return pairs, unknown

    def _proposal_list(self, chosen: Proposal) -> list[tuple[str, str]] | None:
        """The leader's proposal spelled out, fetched from it and checked fingerprint for fingerprint."""
        data = self.transport.fetch(self.members.sources([chosen.proposer]),
                                    proposal_list_name(self.run_id, self.round, chosen.proposer),
                                    max_bytes=200 * MAX_PEERS_PER_ROUND,
                                    deadline=time.monotonic() + window_s(self.cfg, self.round_seconds),
                                    verify=lambda data: pack(_pairs(data) or []) == chosen.included)
        return None if data is None else _pairs(data)

    def _assemble(self, chosen: Proposal | None, t0: float) -> Outcome:
        if chosen is None:
            return Outcome(self.round, [], [], [], False, None, False, time.monotonic() - t0)
        included, unknown = self._decided(chosen)
        missing = [(s, d) for s, d in included if s not in self.verified or self.verified[s].digest != d]
        # what the decided set holds is normally in hand by now; what is not, within a few deadline windows,
        # is out of reach (a holder gone, a split network): apply without it, and the hash check repairs
        window = window_s(self.cfg, self.round_seconds)
        hard_stop = time.monotonic() + min(self.cfg.max_wait_s, max(10.0, 4 * window))
        for sender, digest in missing:
            self.verified.pop(sender, None)
            self._start_fetch(sender, digest, hard_stop)
        while any(s not in self.verified for s, _ in included) and time.monotonic() < hard_stop \
                and not self.stop_event.is_set():
            self._reap()
            if all(s in self.verified or s not in self._fetching for s, _ in included):
                break
            time.sleep(0.05)
        got = [s for s, d in included if s in self.verified and self.verified[s].digest == d]
        if len(got) != len(included) + unknown:
            log.warning("round=%d leader=%s included %d updates (%d never announced), %d obtained: weights will "
                        "diverge and re-sync", self.round, chosen.proposer, len(included) + unknown, unknown, len(got))
        updates = [self.verified[s].update for s in got]
        weights = [self.rules.weight(self.verified[s].update) for s in got]
        return Outcome(self.round, updates, weights, got, self.me in got, chosen.proposer, True,
                       time.monotonic() - t0)

    # --- announcements and fetches ----------------------------------------------------------------

    def _tick(self) -> None:
        """One poll of the fetch machinery: start fetches of new announcements, verify finished ones."""
        self._scan()
        self._reap()

    def _scan(self) -> None:
        ignored = set(self.rejections.ignored(self.round))
        for ann in self.members.read("updates", self.round, UpdateAnnouncement):
            if ann.round != self.round or ann.sender in self.announced or ann.sender in ignored:
                continue
            if ann.size > self.cfg.max_update_bytes:
                self._reject(ann.sender, "oversized")
                continue
            self.announced[ann.sender] = ann
            self.first_seen.setdefault(ann.sender, time.monotonic())
            if ann.sender != self.me:
                self._start_fetch(ann.sender, ann.digest, time.monotonic() + self.cfg.max_wait_s)
                if adversary.claim(self.cfg, self.round, self.transport.blobs,
                                   update_name(self.run_id, self.round, ann.sender), ann.size):
                    self._claiming = True
                    self._write_holdings()

    def _holders(self, sender: str, digest: str) -> Callable[[], list[tuple[str, list[str]]]]:
        fp = fingerprint(sender, digest)

        def sources() -> list[tuple[str, list[str]]]:
            holders = {sender}
            for h in self.members.read("holdings", self.round, Holdings):
                if fp in unpack(h.held):
                    holders.add(h.peer)
            return self.members.sources(sorted(holders))
        return sources

    def _start_fetch(self, sender: str, digest: str, deadline: float) -> None:
        if sender in self._fetching or sender in self.verified:
            return
        name = update_name(self.run_id, self.round, sender)
        check = lambda data: hashlib.sha256(data).hexdigest() == digest  # noqa: E731
        fut = self.transport.submit(self.transport.fetch_async(
            self._holders(sender, digest), name, max_bytes=self.cfg.max_update_bytes, deadline=deadline, verify=check))
        self._fetching[sender] = (fut, digest)

    def _reap(self) -> None:
        """Verify finished fetches; serve what verified (gossip) and say so in the DHT."""
        grew = False
        for sender, (fut, digest) in list(self._fetching.items()):
            if not fut.done():
                continue
            del self._fetching[sender]
            blob = fut.result() if fut.exception() is None else None
            if blob is None:
                continue
            decoded = self._decode(sender, blob)
            if decoded is None:
                continue
            self.verified[sender] = _Verified(digest, decoded)
            self.transport.blobs.put(update_name(self.run_id, self.round, sender), blob)
            grew = True
        if grew:
            self._write_holdings()

    def _write_holdings(self) -> None:
        """Say which updates of the round this peer holds and serves (the 'slowhold' adversary: every
        announced one, held or not)."""
        pairs = [(s, v.digest) for s, v in self.verified.items() if s != self.me]
        if self._claiming:
            pairs += [(s, a.digest) for s, a in self.announced.items() if s != self.me]
        self.members.write("holdings", self.round, Holdings(run_id=self.run_id, round=self.round, peer=self.me,
                                                            held=pack(pairs)))

    def _reject(self, sender: str, reason: str) -> None:
        if (sender, reason) not in self._rejected:
            self._rejected.add((sender, reason))
            self.rejections.add(sender, reason, self.round)

    def _decode(self, sender: str, blob: bytes) -> Any | None:
        """The update if it passes the run's rules (rules.py); None, and a count against the sender, if not."""
        upd, reason = self.rules.check(blob, sender=sender, round_=self.round, key_of=self.members.public_key)
        if reason is not None:
            self._reject(sender, reason)
        return upd


def _pairs(data: bytes) -> list[tuple[str, str]] | None:
    """A proposal spelled out (msgpack list of [sender, digest]) from the network; None if malformed."""
    try:
        got = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if not isinstance(got, list) or len(got) > MAX_PEERS_PER_ROUND or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) and len(x) <= 128 for x in p) for p in got):
        return None
    return [(s, d) for s, d in got]
