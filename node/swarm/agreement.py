"""Agreement on one round's set of updates: witness reports, counted twice.

Witnesses. The eligible witnesses of round r are the recent contributors: the peers whose updates the
decided chain applied in the last ``WITNESS_WINDOW`` rounds (the contributors ledger is shared state, so
every peer on the chain, a joiner included, draws the same set), or the live trainers while nobody has
contributed yet. At its deadline every witness that sent an update this round publishes its *report*:
the updates it fetched and verified (records.Report, by fingerprint), on its chain (``seed``: the state
hash the previous round agreed on). The round's set is every update that a strict majority of the
counted reports lists (protocol/witness.py): the eligible witnesses' reports on this peer's chain, from
witnesses not caught equivocating. Nobody leads: no key, however ground, chooses the set, a minority of
witnesses can neither keep out an update the others verified nor put in one they did not, and when
everyone verified everything one report more or less changes nothing.

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
from dataclasses import dataclass
from typing import Callable

import msgpack

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import adversary
from gradnode.node.swarm.clock import window_s
from gradnode.node.swarm.equivocation import Equivocators
from gradnode.node.swarm.membership import Membership
from gradnode.protocol import round as core
from gradnode.protocol import witness
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
WITNESS_WINDOW = 8  # rounds: a peer whose update was applied this recently witnesses the next round


def eligible_witnesses(contributors: dict[str, int], round_: int) -> list[str]:
    """The eligible witnesses of ``round_``: the peers whose updates rounds ``round_ - WITNESS_WINDOW`` to
    ``round_ - 1`` applied, by the contributors ledger (Engine.contributors). Not the previous round's senders
    alone: a witness left out of one round (late, or its update censored) still counts in the next."""
    return sorted(p for p, r in contributors.items() if round_ - WITNESS_WINDOW <= r < round_)


@dataclass(frozen=True)
class Verdict:
    """A set of updates for the round: fingerprints (sorted) and the reports it was counted from."""

    fps: bytes
    witnesses: int


class Agreement:
    """Round ``round_``'s reports and the set they give, as seen by peer ``me``.

    ``eligible``: the round's eligible witnesses (``eligible_witnesses``); empty means "the live trainers,
    read when the decision starts". ``witness``: False for an observer (no update of its own this round),
    which reports nothing and never counts itself. ``seed``: the state hash the previous round agreed on
    (this peer's chain): only reports made on it count."""

    def __init__(self, *, members: Membership, cfg: SwarmConfig, run_id: str, round_: int, me: str,
                 eligible: list[str] | None, witness: bool, round_seconds: float, leaving: threading.Event,
                 seed: str, equivocators: Equivocators | None = None) -> None:
        self.members, self.cfg, self.run_id, self.round, self.me = members, cfg, run_id, round_, me
        self.seed, self.witness, self.round_seconds, self.leaving = seed, witness, round_seconds, leaving
        self.eligible = set(eligible or ()) - (set() if witness else {me})
        self.equivocators = equivocators or Equivocators(members, run_id)
        self.reported = False
        self.live_fallback = False  # no eligible witness reported: the live trainers' reports were counted
        # how the first count ended: 'all reported', 'grace' (counted what came by the grace period), 'asked'
        # (reports read from their witnesses), 'live fallback', 'passed by' (given up), 'max wait', 'stopped'
        self.ended = ""
        self._mine: Report | None = None
        self._first: dict[str, Report] = {}  # witness -> its first report on our chain seen: it is final
        self._direct: dict[str, Report] = {}  # reports read from their authors, not from the DHT (``ask``)
        self._elsewhere: set[str] = set()  # witnesses seen reporting on another chain (core.RoundCore.elsewhere)
        self._asked_at = 0.0

    # --- reports ----------------------------------------------------------------------------------

    def reports(self) -> dict[str, Report]:
        """This round's reports on this peer's chain, by witness, as they stand now, and the abstentions. A
        witness seen with two different ones (across reads too) is caught (equivocation.py) and dropped. A
        report on another chain is never counted: its author applied another previous round."""
        out: dict[str, Report] = {}
        read = self.members.read("reports", self.round, Report) + list(self._direct.values())
        if self._mine is not None:
            read.append(self._mine)  # our own, whether or not the DHT read returned it yet
        for p in read:
            if p.round == self.round and p.seed != self.seed and not p.abstain:
                self._elsewhere.add(p.witness)
            if p.round != self.round or (p.seed != self.seed and not p.abstain) or p.witness in self.equivocators:
                continue
            first = self._first.setdefault(p.witness, p)
            if report_digest(first) != report_digest(p):
                self.equivocators.caught(first, p)
                continue
            out[p.witness] = p
        return {w: p for w, p in out.items() if w not in self.equivocators}

    def report(self, verified: list[tuple[str, str]]) -> None:
        """Publish the (sender, digest) pairs this peer verified; nothing from an observer or once it
        announced its departure (the others stopped waiting for it)."""
        if not self.witness or self.leaving.is_set():
            return
        verified = adversary.reported(self.cfg, self.round, self.me, verified)
        # the pairs spelled out, served to whoever cannot resolve a fingerprint from the announcements it sees
        self.members.transport.blobs.put(report_list_name(self.run_id, self.round, self.me),
                                         msgpack.packb(sorted(verified)))
        self._mine = self.members.sign(Report(run_id=self.run_id, round=self.round, witness=self.me,
                                              seed=self.seed, included=pack(verified)))
        self.members.transport.blobs.put(report_record_name(self.run_id, self.round, self.me), self._mine.to_bytes())
        self.members.transport.store(dht_key(self.run_id, "reports", self.round), self._mine.to_bytes(),
                                     self.members.ttl)
        self.reported = True
        adversary.equivocate(self.cfg, self.round, self.members, self.run_id, self.me, self.seed, verified)

    def ask(self, witnesses: set[str], wait_s: float) -> None:
        """Read the reports of ``witnesses`` from the witnesses themselves (each serves its signed report,
        ``report_record_name``), within ``wait_s``: the DHT can hide a record stored once for a while (right
        after a healed split the lookups of the side that adopted the other's chain did not reach the nodes
        holding the winners' reports, and its peers waited out max_wait_s on a decided round). A report read
        so is checked like one from the DHT (author, round, signature) and counted the same way."""
        sources = self.members.sources(sorted(witnesses - {self.me}))
        jobs = [([src], report_record_name(self.run_id, self.round, src[0])) for src in sources]
        if not jobs:
            return

        def parsed(name: str, data: bytes) -> Report | None:  # no signature check here: it may read the DHT,
            try:                                                # and this runs on the transport's event loop
                p = Report.from_bytes(data)
            except RecordError:
                return None
            return p if name == report_record_name(self.run_id, p.round, p.witness) and p.round == self.round else None

        got = self.members.transport.fetch_many(jobs, max_bytes=MAX_RECORD_BYTES, deadline=time.monotonic() + wait_s,
                                                verify=lambda name, data: parsed(name, data) is not None)
        for name, data in got.items():
            p = parsed(name, data)
            if p is not None and self.members.verify_record(p):
                self._direct[p.witness] = p

    def majority_reported(self, live: set[str]) -> bool:
        """A strict majority of the other witnesses (eligible, else ``live``) reported already: the round is past
        their deadline, so collecting longer gains this peer nothing."""
        others = (self.eligible or live) - {self.me}
        if not others:
            return False
        done = sum(1 for w, p in self.reports().items() if w in others and not p.abstain)
        return 2 * done > len(others)

    def abstaining(self) -> set[str]:
        """Witnesses that said they sit this round out."""
        return {w for w, p in self.reports().items() if p.abstain}

    def _absent(self, reports: dict[str, Report]) -> set[str]:
        """Eligible witnesses nobody waits for: gracefully departed, abstaining from this round, caught
        equivocating, out of step, or seen reporting on another chain (its report on ours still counts if one
        comes)."""
        return self.members.leaving() | {w for w, p in reports.items() if p.abstain} | set(self.equivocators.peers()) \
            | self._out_of_step() | self._elsewhere

    def _out_of_step(self) -> set[str]:
        """Eligible witnesses without a member record in sight, or with one more than four rounds behind this
        round (a crashed peer's record stops moving; records lag a live peer by up to two rounds, and views
        of them differ, so the margin is twice that): waiting a grace period for each of them that is gone
        would slow the rounds after every crash or split. Their reports still count when they come in."""
        members = self.members.members()
        return {p for p in self.eligible if p != self.me and (p not in members or members[p].round < self.round - 4)}

    def _passed_by(self, reports: dict[str, Report]) -> bool:
        """Nobody will report on this round on our chain any more: every other live trainer is two or more rounds
        past it (it applied this round on its own chain, or adopted a newer state), sat it out, or reported on
        another chain; waiting out max_wait_s would only leave this peer further behind (both peers of one side
        of a healed split sat a round out, the other side's reports were of its own chain, and the pair waited
        60 s while the others ran on to the end). One peer claiming a far round is not enough: all must."""
        gone = {w for w, p in reports.items() if p.abstain} | self._elsewhere
        votes = self.members.votes()  # a key that never contributed holds nothing open (one fresh 'training'
        others = [(p, m) for p, m in self.members.members().items()  # record kept the laggards waiting)
                  if m.training and p != self.me and votes(p)]
        return bool(others) and all(m.round >= self.round + 2 or p in gone for p, m in others)

    def _live(self) -> set[str]:
        return {p for p, m in self.members.members().items() if m.training}

    def _counted(self, reports: dict[str, Report]) -> list[Report]:
        among = (self._live() | {self.me}) if self.live_fallback else self.eligible
        return [p for w, p in reports.items() if w in among and not p.abstain]

    # --- the two counts ---------------------------------------------------------------------------

    def decide(self, stop: threading.Event, tick: Callable[[], None]) -> Verdict | None:
        """The first count, at the deadline: wait for every eligible witness that is not absent, up to a grace
        period, then take what a strict majority of their reports lists. When no eligible witness reported in
        two windows (they are gone: crashed, or the network split us from them), the live trainers' reports
        count instead. ``tick`` runs every poll (the exchange keeps fetching meanwhile). None: no report came
        (the second count may still find some)."""
        window = window_s(self.cfg, self.round_seconds)
        grace_end = time.monotonic() + max(self.cfg.commit_grace_s, window) + POLL_S
        hard_stop = time.monotonic() + self.cfg.max_wait_s
        if not self.eligible:
            self.eligible = self._live() - {self.me} | ({self.me} if self.witness else set())
        while not stop.is_set():
            tick()
            reports = self.reports()
            counted = self._counted(reports)
            waiting = self.eligible - set(reports) - self._absent(reports) - {self.me}
            now = time.monotonic()
            if counted and (not waiting or now >= grace_end):
                return self._end("all reported" if not waiting else "grace", counted)
            if now >= grace_end and now - self._asked_at >= window:  # the DHT shows none: ask the witnesses
                self.ask(waiting or (self.eligible - {self.me}), wait_s=min(window, 5.0))
                self._asked_at = time.monotonic()
                counted = self._counted(self.reports())
                if counted:
                    return self._end("asked", counted)
            if not counted and now >= grace_end + window:
                self.live_fallback = True
                counted = self._counted(reports)
                if counted:
                    log.warning("round=%d: none of the %d eligible witnesses reported; counting %d live trainers'",
                                self.round, len(self.eligible), len(counted))
                    return self._end("live fallback", counted)
                self.live_fallback = False
                if self._passed_by(reports):
                    log.warning("round=%d: every other trainer is past it, sat it out or reported on another "
                                "chain, and nobody reported on ours; giving it up",
                                self.round)
                    return self._end("passed by", [])
            if now >= hard_stop:
                return self._end("max wait", counted)
            time.sleep(POLL_S)
        return self._end("stopped", [])

    def _end(self, how: str, counted: list[Report]) -> Verdict | None:
        self.ended = how
        return self._verdict(counted) if counted else None

    def settle(self, first: Verdict | None) -> Verdict | None:
        """The second count, just before the round is applied: the reports as they stand now, counted by the
        same rule. A report that came after the first count (late for this peer) is in, so every peer counts
        the same reports; ``first`` stands when they give the same set, or when none is counted now."""
        counted = self._counted(self.reports())
        if not counted:
            return first
        again = self._verdict(counted)
        if first is not None and again.fps == first.fps:
            return first
        log.warning("round=%d: the reports as they stand give %d updates from %d witnesses (at the deadline: %s)",
                    self.round, len(again.fps) // 16, again.witnesses,
                    "none" if first is None else f"{len(first.fps) // 16} from {first.witnesses}")
        return again

    def _verdict(self, counted: list[Report]) -> Verdict:
        return Verdict(witness.witnessed(p.included for p in counted), len(counted))

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
