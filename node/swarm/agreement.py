"""Agreement on one round's set of updates: witness reports, counted twice.

The rules below live in the round's core (protocol/round.py); this module is its shell on the real network
(``Agreement``: member records, reports and bans read into the core every poll, its actions carried out).

Witnesses. The eligible witnesses of round r are the recent contributors: the peers whose updates the
decided chain applied in the last ``WITNESS_WINDOW`` rounds (the contributors ledger is shared state, so
every peer on the chain, a joiner included, draws the same set), or the live trainers while nobody has
contributed yet. At its deadline every witness that sent an update this round publishes its *report*:
the updates it fetched and verified (records.Report, by fingerprint), on its chain (``base``: the state
hash the previous round agreed on, which the round builds on). The round's set is every update that a
strict majority of the counted reports lists (protocol/witness.py): the eligible witnesses' reports on this
peer's chain, from witnesses not caught equivocating. Nobody leads: no key, however ground, chooses the set,
a minority of witnesses can neither keep out an update the others verified nor put in one they did not, and
when everyone verified everything one report more or less changes nothing.

Counted twice. At the deadline (``decide``) a peer waits for the reports of the eligible witnesses that are
not absent (gone, abstaining, out of step, banned), up to a grace period, and takes the set they give: what
it fetches meanwhile. The round is applied a round later, behind the next round's inner steps, and just
before that (``settle``) the peer counts the reports again, as they stand then: a report that reached it
after its grace period, the one way honest views of a round differ, is in by then for every peer, so all
count the same reports and apply the same set. Only what the reports say is counted: no peer's claim about
what it decided moves anyone.

Reports are final once published: two different reports (an abstention included) a witness signed for
one round on one chain prove equivocation (equivocation.py). The second read makes a witness that rewrote
its report likely to be seen twice; it is then never counted again, and its updates are ignored. One
that rewrites it once and stops is counted as it stands at the second count, the same for everyone.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

import msgpack

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import adversary
from gradnode.node.swarm.clock import params
from gradnode.node.swarm.equivocation import Equivocators
from gradnode.node.swarm.membership import Membership
from gradnode.protocol import round as core
from gradnode.protocol.committee import Committee
from gradnode.protocol.records import (
    MAX_PEERS_PER_ROUND,
    MAX_RECORD_BYTES,
    RecordError,
    Report,
    dht_key,
    pack,
    report_digest,
    report_list_name,
    report_record_name,
    unpack,
)

log = logging.getLogger(__name__)

POLL_S = core.POLL_S
@dataclass(frozen=True)
class Verdict:
    """A set of updates for the round: fingerprints (sorted) and the reports it was counted from."""

    fps: bytes
    witnesses: int


class Agreement:
    """Round ``round_`` as peer ``me`` runs it: the round's core (protocol/round.py, where every rule lives)
    and the I/O it asks for. ``poll`` reads what the DHT holds now (member records, this round's reports,
    equivocation bans), turns it and the exchange's events into the core's events, and carries out the
    core's actions: publish this peer's report, ask witnesses for theirs, ban an equivocator. No rule is
    decided here.

    ``eligible``: the round's eligible witnesses (``eligible_witnesses``); empty means "the live trainers,
    read when the decision starts". ``witness``: False for an observer (no update of its own this round, or
    one that reported on the round before a restart), which reports nothing and never counts itself.
    ``sender``: it sent an update this round (it counts itself among the live trainers; default: ``witness``).
    ``base``: the state hash the previous round agreed on (this peer's chain): only reports made on it count.
    ``start``: when the round's exchange began (monotonic seconds)."""

    def __init__(self, *, members: Membership, cfg: SwarmConfig, run_id: str, round_: int, me: str,
                 eligible: list[str] | None, witness: bool, round_seconds: float, leaving: threading.Event,
                 base: str, equivocators: Equivocators | None = None, start: float | None = None,
                 sender: bool | None = None, committee: Committee | None = None) -> None:
        self.members, self.cfg, self.run_id, self.round, self.me = members, cfg, run_id, round_, me
        self.base, self.witness, self.leaving = base, witness, leaving
        self.equivocators = equivocators or Equivocators(members, run_id)
        self.core = core.RoundCore(params(cfg), round_, me, frozenset(eligible or ()),
                                   witness if sender is None else sender, base, round_seconds,
                                   time.monotonic() if start is None else start, witness=witness,
                                   committee=committee)
        self.verdict: Verdict | None = None  # the first count's set (None: undecided)
        # how the first count ended (core.Decided.how); None while undecided, and when called off (``decide``)
        self.ended: core.HowDecided | None = None
        self._mine: Report | None = None
        self._records: dict[tuple[str, bytes], Report] = {}  # (witness, digest) -> its signed record
        self._direct: dict[tuple[str, str], Report] = {}  # read from their authors, not the DHT (``ask``)
        self._wake = 0.0  # when the core wants the time again (core.Wake)
        self._asking: Future | None = None  # the ask in flight (``_ask_in_background``)

    # --- the core's events and actions --------------------------------------------------------------

    def poll(self, now: float, events: list[core.Event] = ()) -> bool:
        """One turn: what the member records say now (first: the core must never judge a round on an empty view),
        the exchange's ``events``, this round's reports as they stand, then the time; True once decided."""
        if self.leaving.is_set():
            if self.core.witness and self.me not in self.core.reports:  # a drawn witness says it reports nothing:
                abstain(self.members, self.run_id, self.round, self.me)  # else it held the round to GONE_WAITS
            self.core.stop_reporting()  # the others stopped waiting for us: nothing of ours to count
        if self._asking is not None and self._asking.done():  # what the ask brought, before this poll's reads
            asked, self._asking = self._asking, None
            got = self._found(asked.result() if asked.exception() is None else {})
            if self.core.phase is core.Phase.DECIDING:
                self._act(self.core.asked(now, [self._as_core(p) for p in got]))
        self._act(self.core.steps([core.Members(now, self.view()), *events,
                                   *(core.ReportSeen(now, r) for r in self._read()), core.Tick(now)]))
        return self.core.phase is core.Phase.DECIDED

    def decide(self, stop: threading.Event, tick: Callable[[], list[core.Event]]) -> Verdict | None:
        """Poll until the core decides (or ``stop``): ``tick`` runs the exchange's fetches and returns what
        they gave. None: no report came (the second count may still find some)."""
        while not stop.is_set():
            if self.poll(time.monotonic(), tick()):
                return self.verdict
            stop.wait(max(0.01, min(POLL_S, self._wake - time.monotonic())))
        return self.verdict

    def _act(self, actions: list[core.Action]) -> None:
        for a in actions:
            if isinstance(a, core.PublishReport):
                self.report(list(a.pairs))
                self.core.published(time.monotonic())
            elif isinstance(a, core.AskWitnesses):
                if self.core.reports and (held := self.core.unreported()):
                    log.info("round=%d: %d report(s) counted; the missing reports of %s could still move the set: "
                             "asking", self.round, len(self.core.reports), ",".join(sorted(w[:12] for w in held)))
                if self._asking is None:  # one ask at a time; the core asks again a window after it ended
                    self._asking = self._ask_in_background(set(a.witnesses), a.wait_s)
                    if self._asking is None:  # nobody to ask: it ended at once, with nothing
                        self._act(self.core.asked(time.monotonic(), []))
            elif isinstance(a, core.Equivocated):
                self.equivocators.caught(self._records[a.first.witness, a.first.digest],
                                         self._records[a.second.witness, a.second.digest])
            elif isinstance(a, core.Decided):
                self.ended = a.how
                self.verdict = None if a.fps is None else Verdict(a.fps, a.witnesses)
                if a.how is core.HowDecided.LIVE_FALLBACK:
                    log.warning("round=%d: none of the %d eligible witnesses reported; counted %d live trainers'",
                                self.round, len(self.core.eligible), a.witnesses)
                elif a.how is core.HowDecided.PASSED_BY:
                    log.warning("round=%d: every other trainer is past it, sat it out or reported on another "
                                "chain, and nobody reported on ours; giving it up", self.round)
            elif isinstance(a, core.Wake):
                self._wake = a.at

    def view(self) -> core.View:
        """What the member records say about this round (protocol/round.py's ``view_of``), read now."""
        return self.members.view(self.round, self.core.first_seen, banned=self.equivocators.peers())

    def _as_core(self, p: Report) -> core.Report:
        digest = report_digest(p).encode()  # what it says (two witnesses' may be alike)
        self._records.setdefault((p.witness, digest), p)
        return core.Report(p.witness, p.base, p.included, p.abstain, digest)

    def _read(self, fresh: bool = False) -> list[core.Report]:
        """This round's reports as the DHT holds them now, the ones read from their witnesses, and our own."""
        read = self.members.read("reports", self.round, Report, fresh) + list(self._direct.values())
        if self._mine is not None:
            read.append(self._mine)  # our own, whether or not the DHT read returned it yet
        return [self._as_core(p) for p in read if p.round == self.round]

    # --- reports ----------------------------------------------------------------------------------

    def reports(self) -> dict[str, Report]:
        """The reports the core counts from (this round's, on this peer's chain, from witnesses not caught
        equivocating), and the abstentions, by witness, as they stand now."""
        self._take_in()
        return {w: self._records[w, r.digest] for w, r in self.core.reports.items()}

    def _take_in(self, fresh: bool = False) -> None:
        """The bans and this round's reports as they stand, into the core, without deciding anything."""
        now = time.monotonic()
        self._act(self.core.note([core.Members(now, self.view()),
                                  *(core.ReportSeen(now, r) for r in self._read(fresh))]))

    def abstaining(self) -> set[str]:
        """Witnesses that said they sit this round out."""
        return {w for w, p in self.reports().items() if p.abstain}

    def report(self, verified: list[tuple[str, str]]) -> None:
        """Publish the (sender, digest) pairs this peer verified; nothing from an observer or once it
        announced its departure (the others stopped waiting for it)."""
        if not self.witness or self.leaving.is_set():
            self.core.reports.pop(self.me, None)  # nothing of ours for anyone to count
            return
        verified = adversary.reported(self.cfg, self.round, self.me, verified)
        # the pairs spelled out, served to whoever cannot resolve a fingerprint from the announcements it sees
        self.members.transport.blobs.put(report_list_name(self.run_id, self.round, self.me),
                                         msgpack.packb(sorted(verified)))
        self._mine = self.members.sign(Report(run_id=self.run_id, round=self.round, witness=self.me,
                                              base=self.base, included=pack(verified)))
        self.members.transport.blobs.put(report_record_name(self.run_id, self.round, self.me), self._mine.to_bytes())
        self.members.transport.store(dht_key(self.run_id, "reports", self.round), self._mine.to_bytes(),
                                     self.members.ttl)
        # what the core counts as ours: what was published (an adversary's edit included)
        self.core.reports[self.me] = self._as_core(self._mine)
        adversary.equivocate(self.cfg, self.round, self.members, self.run_id, self.me, self.base, verified)

    def ask(self, witnesses: set[str], wait_s: float) -> list[Report]:
        """Read the reports of ``witnesses`` from the witnesses themselves (each serves its signed report,
        ``report_record_name``), within ``wait_s``: the DHT can hide a record stored once for a while (right
        after a healed split the lookups of the side that adopted the other's chain did not reach the nodes
        holding the winners' reports, and its peers waited out max_wait_s on a decided round). A report read
        so is checked like one from the DHT (author, round, signature) and counted the same way."""
        asking = self._ask_in_background(witnesses, wait_s)
        return [] if asking is None else self._found(asking.result(wait_s + 5.0))

    def _ask_in_background(self, witnesses: set[str], wait_s: float) -> Future | None:
        """``ask`` without waiting for it: the rounds' loop goes on reading the DHT meanwhile (a report that comes
        that way ends the wait at once), and ``poll`` takes the answers once they are in. Waiting for the ask
        held every peer of an 8-peer swarm with a straggler up to a window in each round it waited on the
        straggler's report. None: nobody to ask."""
        sources = self.members.sources(sorted(witnesses - {self.me}))
        jobs = [([src], report_record_name(self.run_id, self.round, src[0])) for src in sources]
        if not jobs:
            return None
        return self.members.transport.submit(self.members.transport.fetch_many_async(
            jobs, max_bytes=MAX_RECORD_BYTES, deadline=time.monotonic() + wait_s,
            verify=lambda name, data: self._parsed(name, data) is not None))

    def _parsed(self, name: str, data: bytes) -> Report | None:
        """A served report, if it is the one asked for (no signature check here: it may read the DHT, and this
        runs on the transport's event loop)."""
        try:
            p = Report.from_bytes(data)
        except RecordError:
            return None
        return p if name == report_record_name(self.run_id, p.round, p.witness) and p.round == self.round else None

    def _found(self, got: dict[str, bytes]) -> list[Report]:
        """The reports an ask brought that check out (author, round, signature), kept with the DHT's."""
        found = [p for p in (self._parsed(name, data) for name, data in got.items())
                 if p is not None and self.members.verify_record(p)]
        self._direct.update(((p.witness, report_digest(p)), p) for p in found)
        return found

    # --- the second count -------------------------------------------------------------------------

    def settle(self) -> Verdict | None:
        """The second count, just before the round is applied: the reports as they stand now, counted by the
        same rule (core.RoundCore.settle). The first count's set stands when they give the same, or none."""
        # read (now: the reports that came since the first count are what it is for), not stepped: a round not
        # decided yet (a crashed exchange) must not move on now
        self._take_in(fresh=True)
        found = self.core.settle()
        if found is None:
            return None
        if self.verdict is not None and found[0] == self.verdict.fps:
            return self.verdict
        log.warning("round=%d: the reports as they stand give %d updates from %d witnesses (at the deadline: %s)",
                    self.round, len(found[0]) // 16, found[1],
                    "none" if self.verdict is None else f"{len(self.verdict.fps) // 16} from {self.verdict.witnesses}")
        return Verdict(*found)

    def witnesses_listing(self, fps: list[bytes], reports: dict[str, Report]) -> list[str]:
        """The witnesses whose ``reports`` list any of ``fps``: where to ask for their pairs spelled out."""
        wanted = set(fps)
        return [w for w, p in reports.items() if not p.abstain and wanted & set(unpack(p.included))]


def abstain(members: Membership, run_id: str, round_: int, me: str) -> None:
    """Say at once that peer ``me`` sits round ``round_`` out: nobody waits for its report, and it reports
    nothing else on the round (on any chain: it does not know yet which state the round starts from)."""
    members.write("reports", round_, Report(run_id=run_id, round=round_, witness=me, abstain=True))


def spelled_out(data: bytes) -> list[tuple[str, str]] | None:
    """A report spelled out (msgpack list of [sender, digest]) from the network; None if malformed or if it
    names a pair twice."""
    try:
        got = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if not isinstance(got, list) or len(got) > MAX_PEERS_PER_ROUND or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) and len(x) <= 128 for x in p)
            for p in got):
        return None
    pairs = [(s, d) for s, d in got]
    return pairs if len(set(pairs)) == len(pairs) else None
