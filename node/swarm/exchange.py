"""One round's exchange: announce, fetch and verify everyone's update, agree on the set, hand it back.

How every honest peer ends a round with the same set of updates (and so with identical weights):

1. Each peer announces its update for round r in the DHT (digest, size, tokens; signed) and serves
   the bytes; every peer fetches every announced update from any holder (gossip), checks digest,
   envelope, run, round, sender, signature and shapes, and counts rejections per sender.
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

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.agreement import POLL_S, Agreement
from gradnode.node.swarm.clock import deadline_from
from gradnode.node.swarm.identity import verify
from gradnode.node.swarm.membership import Membership
from gradnode.node.swarm.transport import Transport
from gradnode.protocol import ProtocolError, decode_update, signing_digest
from gradnode.protocol.records import Holdings, Proposal, UpdateAnnouncement, update_name

log = logging.getLogger(__name__)


class Rejections:
    """Rejected updates per sender and reason (unsigned, forged, replayed, malformed, oversized)."""

    def __init__(self) -> None:
        self._counts: dict[str, Counter] = defaultdict(Counter)
        self._lock = threading.Lock()

    def add(self, sender: str, reason: str) -> None:
        with self._lock:
            self._counts[sender][reason] += 1
        log.warning("update rejected sender=%s reason=%s", sender, reason)

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
    tokens: int


class RoundExchange(threading.Thread):
    """Runs round r's exchange in the background; ``result()`` blocks for the outcome."""

    def __init__(self, *, transport: Transport, membership: Membership, cfg: SwarmConfig, run_id: str,
                 round_: int, blob: bytes | None, tokens: int, round_seconds: float, shapes: dict[str, tuple[int, ...]],
                 rejections: Rejections, stop: threading.Event, eligible: list[str] | None = None,
                 leaving: threading.Event | None = None, lead: bool = True) -> None:
        super().__init__(name=f"exchange-{round_}", daemon=True)
        self.transport, self.members, self.cfg, self.run_id = transport, membership, cfg, run_id
        self.round, self.blob, self.tokens, self.round_seconds = round_, blob, tokens, round_seconds
        self.shapes, self.rejections, self.stop_event = shapes, rejections, stop
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
        self.members.write("updates", self.round, ann)
        decoded = self._decode(self.me, self.blob)
        if decoded is None:  # only a deliberately faulty peer (swarm.fault) gets here
            log.error("own update of round=%d fails verification", self.round)
        else:
            self.verified[self.me] = _Verified(self.digest, decoded, self.tokens)
        self.first_seen[self.me] = time.monotonic()
        if self.cfg.client_mode:
            self._push(name)

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
            # live trainers: fresh records that kept up (a silent peer's record stays at its last round)
            live = {p for p, m in self.members.members().items() if m.training and m.round >= self.round - 1}
            live = (live - {self.me}) | self._me_if_sender()
            deadline = deadline_from(self.first_seen, len(live), self.round_seconds, self.cfg)
            everyone = live <= set(self.verified)
            late = deadline is not None and time.monotonic() >= deadline
            if everyone or late or self.agreement.decided_elsewhere(live):
                log.info("collect done round=%d verified=%d live=%d why=%s", self.round, len(self.verified),
                         len(live), "everyone" if everyone else "deadline" if late else "decided elsewhere")
                return
            time.sleep(POLL_S)

    def _me_if_sender(self) -> set[str]:
        """{this peer} when it sent an update this round; an observer counts neither as live nor eligible."""
        return set() if self.observer else {self.me}

    def _assemble(self, chosen: Proposal | None, t0: float) -> Outcome:
        if chosen is None:
            return Outcome(self.round, [], [], [], False, None, False, time.monotonic() - t0)
        missing = [(s, d) for s, d in chosen.included if s not in self.verified or self.verified[s].digest != d]
        # what the decided set holds is normally in hand by now; what is not, within a few deadline windows,
        # is out of reach (a holder gone, a split network): apply without it, and the hash check repairs
        window = max(self.cfg.min_deadline_s, (self.cfg.deadline_slack - 1.0) * self.round_seconds)
        hard_stop = time.monotonic() + min(self.cfg.max_wait_s, max(10.0, 4 * window))
        for sender, digest in missing:
            self.verified.pop(sender, None)
            self._start_fetch(sender, digest, hard_stop)
        while any(s not in self.verified for s, _ in chosen.included) and time.monotonic() < hard_stop \
                and not self.stop_event.is_set():
            self._reap()
            if all(s in self.verified or s not in self._fetching for s, _ in chosen.included):
                break
            time.sleep(0.05)
        got = [s for s, d in chosen.included if s in self.verified and self.verified[s].digest == d]
        if len(got) != len(chosen.included):
            log.warning("round=%d leader=%s included %d updates, %d obtained: weights will diverge and re-sync",
                        self.round, chosen.proposer, len(chosen.included), len(got))
        updates = [self.verified[s].update for s in got]
        weights = [float(max(self.verified[s].tokens, 1)) for s in got]
        return Outcome(self.round, updates, weights, got, self.me in got, chosen.proposer, True,
                       time.monotonic() - t0)

    # --- announcements and fetches ----------------------------------------------------------------

    def _tick(self) -> None:
        """One poll of the fetch machinery: start fetches of new announcements, verify finished ones."""
        self._scan()
        self._reap()

    def _scan(self) -> None:
        for ann in self.members.read("updates", self.round, UpdateAnnouncement):
            if ann.round != self.round or ann.sender in self.announced:
                continue
            if ann.size > self.cfg.max_update_bytes:
                self._reject(ann.sender, "oversized")
                continue
            self.announced[ann.sender] = ann
            self.first_seen.setdefault(ann.sender, time.monotonic())
            if ann.sender != self.me:
                self._start_fetch(ann.sender, ann.digest, time.monotonic() + self.cfg.max_wait_s)

    def _holders(self, sender: str) -> Callable[[], list[tuple[str, list[str]]]]:
        def sources() -> list[tuple[str, list[str]]]:
            holders = {sender}
            for h in self.members.read("holdings", self.round, Holdings):
                if sender in h.senders:
                    holders.add(h.peer)
            return self.members.sources(sorted(holders))
        return sources

    def _start_fetch(self, sender: str, digest: str, deadline: float) -> None:
        if sender in self._fetching or sender in self.verified:
            return
        name = update_name(self.run_id, self.round, sender)
        check = lambda data: hashlib.sha256(data).hexdigest() == digest  # noqa: E731
        fut = self.transport.submit(self.transport.fetch_async(
            self._holders(sender), name, max_bytes=self.cfg.max_update_bytes, deadline=deadline, verify=check))
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
            self.verified[sender] = _Verified(digest, decoded, int(decoded.tokens))
            self.transport.blobs.put(update_name(self.run_id, self.round, sender), blob)
            grew = True
        if grew:
            senders = sorted(s for s in self.verified if s != self.me)
            self.members.write("holdings", self.round, Holdings(run_id=self.run_id, round=self.round,
                                                                peer=self.me, senders=senders))

    def _reject(self, sender: str, reason: str) -> None:
        if (sender, reason) not in self._rejected:
            self._rejected.add((sender, reason))
            self.rejections.add(sender, reason)

    def _decode(self, sender: str, blob: bytes) -> Any | None:
        """Schema and shapes, then signature, then run and round; None (and a count) if any fails."""
        upd, reason = check_update(blob, sender=sender, run_id=self.run_id, round_=self.round, shapes=self.shapes,
                                   members=self.members, max_bytes=self.cfg.max_update_bytes)
        if reason is not None:
            self._reject(sender, reason)
        return upd


def check_update(blob: bytes, *, sender: str, run_id: str, round_: int, shapes: dict[str, tuple[int, ...]],
                 members: Membership, max_bytes: int) -> tuple[Any | None, str | None]:
    """(update, None) when ``blob`` is ``sender``'s well-formed, signed update of this run and round;
    (None, reason) otherwise: 'malformed', 'unsigned', 'forged' or 'replayed'."""
    try:
        upd = decode_update(blob, max_bytes=max_bytes, expected=shapes)
    except ProtocolError as err:
        log.info("malformed update sender=%s round=%d error=%s", sender, round_, err)
        return None, "malformed"
    if not upd.signature:
        return None, "unsigned"
    key = members.public_key(sender)
    if upd.sender != sender or key is None or not verify(key, signing_digest(blob), upd.signature):
        return None, "forged"
    if upd.run_id != run_id or upd.round != round_:
        return None, "replayed"
    return upd, None
