"""One round's exchange: announce, fetch and verify everyone's update, agree on the set, hand it back.

How every honest peer ends a round with the same set of updates (and so with identical weights):

1. Each peer announces its update for round r in the DHT (digest, size, tokens; signed) and serves
   the bytes; every peer fetches every announced update from any holder (gossip), at most
   ``swarm.max_fetches`` at once (the rest wait in announcement order), checks its digest,
   then the run's rules (rules.py: signature first, then envelope and shapes, sender, run and round,
   codec, tokens), and counts rejections per sender.
2. The round's deadline comes from observed speeds: once half the live training peers have announced
   (the anchor), the window is ``(slack - 1) x`` the median peer's round time (at least
   ``min_deadline_s``). It ends early when every live training peer's update has been verified.
3. At the deadline every witness reports what it verified, and the round's set is what a strict majority
   of the reports lists (agreement.py); peers fetch whatever it holds that they lack. Just before a peer
   applies the round (``result``), it counts the reports again as they stand then.

The rules of steps 2 and 3 are the round's core (protocol/round.py), run by agreement.Agreement; this
module announces, fetches, verifies and serves, and hands the core what happened.

An update that misses the deadline is excluded by everyone alike; its sender gets ``own_included =
False`` and puts the content back into its local progress, so nothing is lost.

A peer too slow for round r (its deadline is nearer than the peer's fewest steps) *abstains*: it writes
an abstaining report at once (nobody waits for it), computes for round r+1 instead, and learns round
r's decision as an *observer* (``blob=None``: it announces and reports nothing, and decides on the
witnesses' reports like everyone else). So a 5x slower peer stays in phase and contributes every other round or
better, instead of announcing each update after its round was decided.
"""

from __future__ import annotations

import hashlib
import logging
import random
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import adversary, events
from gradnode.node.swarm.agreement import Agreement, Verdict, spelled_out
from gradnode.node.swarm.clock import window_s
from gradnode.node.swarm.equivocation import Equivocators
from gradnode.node.swarm.membership import Membership, kept_for_catchup
from gradnode.node.swarm.rules import JUDGEMENTS, UpdateRules
from gradnode.node.swarm.transport import Transport
from gradnode.protocol import round as core
from gradnode.protocol.committee import Committee, Fetches
from gradnode.protocol.gossip import holdings_part
from gradnode.protocol.records import (
    MAX_PEERS_PER_ROUND,
    Holdings,
    UpdateAnnouncement,
    fingerprint,
    pack,
    report_list_name,
    resolve,
    unpack,
    update_name,
)

log = logging.getLogger(__name__)


class Rejections:
    """Rejected updates per sender and reason (rules.REASONS), and who is ignored for it.

    A sender rejected ``ignore_after`` times (in separate rounds or for separate reasons) is ignored for
    the next ``ignore_rounds`` rounds (a loss-check verdict, rules.JUDGEMENTS, is counted but is no strike:
    it is a noisy judgement, and honest updates fail it at times): its announcements are not fetched and its pushes are refused. This
    only saves the receiver's bandwidth and CPU; the round's set is still what the witnesses' reports give, so
    peers whose views of an attacker differ never diverge because of it. ``banned``: peers ignored for
    good besides (set by the peer: the witnesses it caught equivocating, equivocation.py)."""

    def __init__(self, ignore_after: int = 3, ignore_rounds: int = 10) -> None:
        self.ignore_after, self.ignore_rounds = ignore_after, ignore_rounds
        self.banned: Callable[[], Iterable[str]] = tuple
        self._counts: dict[str, Counter] = defaultdict(Counter)
        self._strikes: Counter = Counter()
        self._until: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, sender: str, reason: str, round_: int) -> None:
        with self._lock:
            self._counts[sender][reason] += 1
            if reason in JUDGEMENTS:  # counted, and left out of this witness's report; never a strike
                return
            self._strikes[sender] += 1
            starts = self._strikes[sender] >= self.ignore_after and self.ignore_rounds > 0
            if starts:
                self._strikes[sender] = 0
                self._until[sender] = round_ + 1 + self.ignore_rounds
        log.warning("update rejected sender=%s reason=%s round=%d", sender, reason, round_)
        if starts:
            log.warning("ignoring sender=%s until round=%d: %d rejected updates", sender,
                        round_ + 1 + self.ignore_rounds, self.ignore_after,
                        extra=events.tag(events.Kind.BAN, peer=sender, round=round_))

    def ignored(self, round_: int) -> list[str]:
        """Senders ignored in round ``round_``."""
        with self._lock:
            ignored = {s for s, until in self._until.items() if round_ < until}
        return sorted(ignored.union(self.banned()))

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
    updates: list[Any]  # DecodedUpdate, sorted by sender
    weights: list[float]
    senders: list[str]
    own_included: bool
    witnesses: int  # reports the set was counted from (0: undecided)
    decided: bool  # False: no report arrived in time and nobody decided (the round is skipped by this peer)
    seconds: float  # from announcement to decision
    recounted: bool = False  # the reports counted again before applying gave another set than at the deadline


@dataclass
class _Verified:
    digest: str
    update: Any


class RoundExchange(threading.Thread):
    """Runs round r's exchange in the background; ``result()`` blocks for the outcome."""

    def __init__(self, *, transport: Transport, membership: Membership, cfg: SwarmConfig, run_id: str,
                 round_: int, blob: bytes | None, tokens: int, round_seconds: float, rules: UpdateRules,
                 rejections: Rejections, stop: threading.Event, base: str, eligible: list[str] | None = None,
                 leaving: threading.Event | None = None, witness: bool = False,
                 equivocators: Equivocators | None = None,
                 judge: Callable[[Any, float | None], str | None] | None = None,
                 committee: Committee | None = None) -> None:
        super().__init__(name=f"exchange-{round_}", daemon=True)
        self.transport, self.members, self.cfg, self.run_id = transport, membership, cfg, run_id
        self.round, self.blob, self.tokens, self.round_seconds = round_, blob, tokens, round_seconds
        self.rules, self.rejections, self.stop_event = rules, rejections, stop
        self.judge = judge  # the witness's loss check of another peer's update: a rejection reason, or None
        self.me = transport.peer_id
        self.observer = blob is None  # no update of its own: it counts the others' reports
        # ``witness``: whether it reports (the peer asks committee.reports)
        self.committee = committee  # the round's drawn committee (protocol/committee.py); None: everyone sends
        self.agreement = Agreement(members=membership, cfg=cfg, run_id=run_id, round_=round_, me=self.me,
                                   eligible=eligible, witness=witness,
                                   round_seconds=round_seconds, leaving=leaving or threading.Event(), base=base,
                                   equivocators=equivocators, sender=not self.observer, committee=committee)
        self._fetches = Fetches(base, witness)  # which updates this peer fetches before the count (``_scan``)
        self.digest = hashlib.sha256(blob).hexdigest() if blob is not None else ""
        self.verified: dict[str, _Verified] = {}
        self.announced: dict[str, UpdateAnnouncement] = {}
        self._fetching: dict[str, Any] = {}  # sender -> (future, digest): fetches in flight
        self._waiting: dict[str, tuple[str, float]] = {}  # sender -> (digest, deadline): fetches waiting their turn
        self._rejected: set[tuple[str, str]] = set()
        self.doubted: set[str] = set()  # senders whose update this witness's loss check judged harmful
        self.agreement.core.doubted = self.doubted  # left out of this witness's report by the core
        self._events: list[core.Event] = []  # what the fetches gave since the core's last turn
        self._claiming = False  # testing aid: the 'slowhold' adversary lists updates it does not hold
        # the part of the round's holdings this peer lists its copies under and reads (about 64 holders a part)
        self._part = holdings_part(self.me, membership.roster(self.me))
        self.verdict: Verdict | None = None  # the set this peer's reports gave
        self._outcome: Outcome | None = None
        self._t0 = time.monotonic()
        self._done = threading.Event()

    # --- public -----------------------------------------------------------------------------------

    def result(self, timeout: float) -> Outcome | None:
        """The round's outcome, counted again just before it is applied (agreement.settle): when the reports as
        they stand give another set than at the deadline (one reached this peer after its grace period), that
        one, with whatever it holds that this peer lacks fetched now."""
        if not self._done.wait(timeout):
            return self._outcome
        try:
            settled = self.agreement.settle()
            if settled is not None and settled is not self.verdict:
                self.verdict = settled
                self._outcome = self._assemble(settled, recounted=True)
        except Exception:  # a bug here must not kill the peer: the outcome of the first count stands
            log.exception("second count crashed round=%d", self.round)
        return self._outcome

    # --- the round, top to bottom -----------------------------------------------------------------

    def run(self) -> None:
        try:
            if not self.observer:
                self._announce()
            self.agreement.core.start = time.monotonic()  # collecting runs from here (a client's push is done)
            # the round's core collects, reports, waits for the witnesses and decides (protocol/round.py); this
            # thread feeds it what the fetches give, every poll
            self.verdict = self.agreement.decide(self.stop_event, tick=self._tick)
            ended, why = self.agreement.ended, self.agreement.core.collect_why
            log.info("round=%d decided how=%s collect=%s verified=%d", self.round,
                     "called off" if ended is None else ended.value, why.value if why else "", len(self.verified))
            self._outcome = self._assemble(self.verdict)
        except Exception:  # a bug here must not kill the peer; the round counts as undecided
            log.exception("exchange crashed round=%d", self.round)
            self._outcome = Outcome(self.round, [], [], [], False, 0, False, time.monotonic() - self._t0)
        finally:
            self._done.set()

    def _announce(self) -> None:
        name = update_name(self.run_id, self.round, self.me)
        self.transport.blobs.put(name, self.blob, pinned=True)  # the round's work: served until the window ends
        ann = UpdateAnnouncement(run_id=self.run_id, round=self.round, sender=self.me, digest=self.digest,
                                 size=len(self.blob), tokens=self.tokens, time=self.transport.now())
        self.members.write("updates", self.round, ann, ttl=kept_for_catchup(self.cfg, self.round_seconds))
        decoded = self._decode(self.me, self.blob)
        if decoded is None:  # only a deliberately faulty peer (swarm.fault) gets here
            log.error("own update of round=%d fails verification", self.round)
        else:
            self.verified[self.me] = _Verified(self.digest, decoded)
        now = time.monotonic()
        self._events.append(core.Announced(now, self.me, now))
        if decoded is not None:
            self._events.append(core.Verified(now, self.me, self.digest))
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

    def _spell_out(self, fps: bytes) -> tuple[list[tuple[str, str]], int]:
        """The (sender, digest) pairs ``fps`` name, and how many it names that stayed unknown: resolved against
        the round's signed announcements (read again if one is not known yet), else from the spelled-out report
        of a witness that listed it (announcements out of sight: a split network, a slow DHT), checked
        fingerprint for fingerprint against that witness's signed report."""
        known = lambda: [(s, a.digest) for s, a in self.announced.items()] + \
            [(s, v.digest) for s, v in self.verified.items()]  # noqa: E731
        pairs, unknown = resolve(fps, known())
        if unknown:
            self._scan()
            pairs, unknown = resolve(fps, known())
        if unknown:
            missing = set(unpack(fps)) - {fingerprint(s, d) for s, d in pairs}
            reports = self.agreement.reports()
            for w in self.agreement.witnesses_listing(sorted(missing), reports):
                listed = self._report_list(w, reports[w].included)
                found = {p for p in listed or () if fingerprint(*p) in missing}
                pairs = sorted(set(pairs) | found)
                missing -= {fingerprint(*p) for p in found}
                if not missing:
                    break
            unknown = len(missing)
        return pairs, unknown

    def _report_list(self, witness: str, included: bytes) -> list[tuple[str, str]] | None:
        """A witness's report spelled out, fetched from it and checked fingerprint for fingerprint."""
        data = self.transport.fetch(self.members.sources([witness]),
                                    report_list_name(self.run_id, self.round, witness),
                                    max_bytes=200 * MAX_PEERS_PER_ROUND,
                                    deadline=time.monotonic() + window_s(self.cfg, self.round_seconds),
                                    verify=lambda data: pack(spelled_out(data) or []) == included)
        return None if data is None else spelled_out(data)

    def _assemble(self, verdict: Verdict | None, recounted: bool = False) -> Outcome:
        if verdict is None:
            return Outcome(self.round, [], [], [], False, 0, False, time.monotonic() - self._t0)
        included, unknown = self._spell_out(verdict.fps)
        twice = {s for s, n in Counter(s for s, _ in included).items() if n > 1}
        if twice:  # a sender that announced two versions of its update, both listed by most witnesses
            log.warning("round=%d: left out, named with two updates each: %s", self.round,
                        ",".join(s[:12] for s in sorted(twice)))
            included = [(s, d) for s, d in included if s not in twice]
        missing = [(s, d) for s, d in included if s not in self.verified or self.verified[s].digest != d]
        # what the set holds is normally in hand by now (a majority of the witnesses verified it, and serves
        # it); what is not, within a few deadline windows, is out of reach (holders gone, a split network):
        # apply without it, and the hash check repairs
        window = window_s(self.cfg, self.round_seconds)
        give_up_at = time.monotonic() + min(self.cfg.max_wait_s, max(10.0, 4 * window))
        for sender, digest in missing:
            self.verified.pop(sender, None)
            self._fetching.pop(sender, None)
            self._waiting.pop(sender, None)
            self._start_fetch(sender, digest, give_up_at, first=True)
        while any(s not in self.verified for s, _ in included) and time.monotonic() < give_up_at \
                and not self.stop_event.is_set():
            self._reap()
            if all(s in self.verified or (s not in self._fetching and s not in self._waiting) for s, _ in included):
                break
            time.sleep(0.05)
        got = [s for s, d in included if s in self.verified and self.verified[s].digest == d]
        if len(got) != len(included) + unknown:
            log.warning("round=%d: the set holds %d updates (%d never announced here), %d obtained: weights will "
                        "diverge and re-sync", self.round, len(included) + unknown, unknown, len(got))
        updates = [self.verified[s].update for s in got]
        weights = [self.rules.weight(self.verified[s].update) for s in got]
        return Outcome(self.round, updates, weights, got, self.me in got, verdict.witnesses, True,
                       time.monotonic() - self._t0, recounted)

    # --- announcements and fetches ----------------------------------------------------------------

    def _tick(self) -> list[core.Event]:
        """One poll of the fetch machinery: start fetches of new announcements, verify finished ones; what
        happened, as the core's events."""
        self._scan()
        self._reap()
        events, self._events = self._events, []
        return events

    def _scan(self) -> None:
        """Read the round's announcements and start the fetches of the new ones this peer takes
        (``committee.Fetches.take``: at most the round's budget with a committee)."""
        ignored = set(self.rejections.ignored(self.round))
        new: list[UpdateAnnouncement] = []
        for ann in self.members.read("updates", self.round, UpdateAnnouncement):
            if ann.round != self.round or ann.sender in self.announced or ann.sender in ignored:
                continue
            if ann.size > self.cfg.max_update_bytes:
                self._reject(ann.sender, "oversized")
                continue
            self.announced[ann.sender] = ann
            now = time.monotonic()
            self._events.append(core.Announced(now, ann.sender, now))
            if ann.sender != self.me:
                new.append(ann)
        for sender in self._fetches.take(self.committee, [a.sender for a in new]):
            ann = self.announced[sender]
            self._start_fetch(sender, ann.digest, time.monotonic() + self.cfg.max_wait_s)
            if adversary.claim(self.cfg, self.round, self.transport.blobs,
                               update_name(self.run_id, self.round, sender), ann.size):
                self._claiming = True
                self._write_holdings()

    def _holders(self, sender: str, digest: str) -> Callable[[], list[tuple[str, list[str]]]]:
        """The sources of one fetch, read again at every pass (transport.fetch_async): the sender alone at the
        first, and from the second on every peer whose holdings (this peer's part of them) list the update. A
        fetch the sender serves, the common case, reads no holdings (each read returns every holder's record:
        with a read per pass, holdings were 15% of the records an 8-peer swarm read)."""
        fp = fingerprint(sender, digest)
        passes = 0

        def sources() -> list[tuple[str, list[str]]]:
            nonlocal passes
            passes += 1
            holders = {sender}
            if passes > 1:
                for h in self.members.read("holdings", self.round, Holdings, part=self._part):
                    if fp in unpack(h.held):
                        holders.add(h.peer)
            return self.members.sources(sorted(holders))
        return sources

    def _start_fetch(self, sender: str, digest: str, deadline: float, first: bool = False) -> None:
        """Fetch ``sender``'s update once a slot is free (``swarm.max_fetches`` in flight); ``first``: before the
        others waiting (the decided set's updates). Every update gets the link's full share in turn, so updates
        complete one by one, instead of all of them at the end of a round split N ways. To the round's core a
        waiting fetch is under way like one in flight."""
        if sender in self._fetching or sender in self.verified or sender in self._waiting:
            return
        self._waiting[sender] = (digest, deadline)
        if first:
            self._waiting = {sender: self._waiting.pop(sender), **self._waiting}
        self._events.append(core.FetchStarted(time.monotonic(), sender))
        self._fill_slots()

    def _fill_slots(self) -> None:
        """Start waiting fetches, oldest first, while fewer than ``swarm.max_fetches`` are in flight."""
        while self._waiting and len(self._fetching) < self.cfg.max_fetches:
            sender = next(iter(self._waiting))
            digest, deadline = self._waiting.pop(sender)
            if time.monotonic() >= deadline:
                self._events.append(core.FetchEnded(time.monotonic(), sender))
                continue
            name = update_name(self.run_id, self.round, sender)
            check = lambda data, digest=digest: hashlib.sha256(data).hexdigest() == digest  # noqa: E731
            fut = self.transport.submit(self.transport.fetch_async(
                self._holders(sender, digest), name, max_bytes=self.cfg.max_update_bytes, deadline=deadline,
                verify=check))
            self._fetching[sender] = (fut, digest)

    def _reap(self) -> None:
        """Verify finished fetches; serve what verified (gossip) and say so in the DHT."""
        grew = False
        for sender, (fut, digest) in list(self._fetching.items()):
            if not fut.done():
                continue
            del self._fetching[sender]
            blob = fut.result() if fut.exception() is None else None
            decoded = None if blob is None else self._decode(sender, blob)
            if decoded is None:
                self._events.append(core.FetchEnded(time.monotonic(), sender))
                continue
            self.verified[sender] = _Verified(digest, decoded)
            self._events.append(core.Verified(time.monotonic(), sender, digest))
            self.transport.blobs.put(update_name(self.run_id, self.round, sender), blob, pinned=True)
            grew = True
        self._fill_slots()
        if grew:
            self._write_holdings()

    def _write_holdings(self) -> None:
        """Say which updates of the round this peer holds and serves (the 'slowhold' adversary: every
        announced one, held or not)."""
        pairs = [(s, v.digest) for s, v in self.verified.items() if s != self.me]
        if self._claiming:
            pairs += [(s, a.digest) for s, a in self.announced.items() if s != self.me]
        self.members.write("holdings", self.round, Holdings(run_id=self.run_id, round=self.round, peer=self.me,
                                                            held=pack(pairs)), part=self._part)

    def _reject(self, sender: str, reason: str) -> None:
        if (sender, reason) not in self._rejected:
            self._rejected.add((sender, reason))
            self.rejections.add(sender, reason, self.round)

    def _decode(self, sender: str, blob: bytes) -> Any | None:
        """The update if it passes the run's rules (rules.py); None, and a count against the sender, if not.
        Until this witness has reported, another peer's update that passes is also put to its loss check
        (judged as the aggregate's clip will apply it: scaled down to the median norm of the updates verified
        so far): one judged harmful is left out of this witness's report (``doubted``), but is still held,
        served and, when a majority of the witnesses lists it, applied like any other. The check is one vote
        on noisy rows, not a proof of anything: it never makes a peer apply another set than the others."""
        upd, reason = self.rules.check(blob, sender=sender, round_=self.round, key_of=self.members.public_key)
        if reason is not None:
            self._reject(sender, reason)
            return None
        if self.judge is not None and sender != self.me and self.agreement.core.phase is core.Phase.COLLECT:
            norms = [v.update.norm for v in self.verified.values()]
            verdict = self.judge(upd, statistics.median(norms) if norms else None)
            if verdict is not None:
                self.doubted.add(sender)
                self._reject(sender, verdict)
        return upd

