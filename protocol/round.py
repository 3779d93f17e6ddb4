"""One round's rules, as one peer applies them: a pure state machine (events in, actions out).

No threads, sockets, files or clocks here: every event carries the time at which the shell saw it
(seconds on that peer's own monotonic clock), and the same events in give the same actions out. The
shell (node/swarm/) turns DHT reads, stream fetches and timers into events and carries out the actions;
the virtual simulator (node/sim/virtual.py) drives many cores on one virtual clock.

A round, as the node runs it (node/swarm/agreement.py is the shell: it feeds the core one poll's events at a
time, ``steps``, and carries out its actions):

collect   Every announced update is fetched and verified (the shell does that; ``Verified``/``FetchEnded``
          say how it went). The round's deadline falls once half the live trainers announced (the
          anchor): ``window`` seconds after the k-th first sighting, k = ceil(live / 2); in the run's first
          round, where every 'training' record counts, a round and a window after the first sighting at
          the latest (keys that cost nothing and never announce would hold it open). Collecting ends
          (``CollectEnd``) when every live trainer's update is verified ('everyone'), when a strict majority
          of the other witnesses reported and no fetch is under way ('others reported'), once the updates
          announced by the deadline are verified or failed ('deadline'), or at most one window after the
          deadline and at the latest ``max_wait_s`` after the round began ('deadline and a window').
report    A witness publishes what it verified (``PublishReport``); an observer reports nothing.
decide    The set is what a strict majority of the counted reports lists (protocol/witness.py); ``HowDecided``
          names the rule that ended the wait. The peer waits for every eligible witness that is not absent,
          up to a grace period (``max(commit_grace_s, window)``); past it, it asks the missing witnesses for
          their reports directly (``AskWitnesses``), then counts what it has ('asked', 'grace') if the
          reports still missing cannot move the set (``unmoved``); else, or with nothing to count yet, it
          asks again once a window; with no eligible witness heard two
          windows past the grace, the live trainers' reports count instead ('live fallback'); with none of
          those either and every other trainer two rounds ahead, the round is given up ('passed by'), as it
          is at the grace's end by a peer that is leaving with no report to count and no other trainer in
          sight ('all left'); ``max_wait_s`` after the report, whatever was counted stands ('max wait').
settle    Just before applying, the reports are counted again as they stand (``settle``): a report that came
          after the grace period is in by then for every peer that received it.

Reports are final: a witness seen with two different reports on one chain is an equivocator (the shell
proves and bans it; ``ReportSeen`` of a second, different report returns ``Equivocated``).
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Mapping, Union

from gradnode.protocol import committee as committee_rule
from gradnode.protocol import witness as witness_rule
from gradnode.protocol.records import pack, unpack

POLL_S = 0.2  # the shell's poll of the DHT while deciding: a grace period ends one poll late at most
ASK_S = 5.0  # the longest an ask of the missing witnesses waits (a window, if shorter)
GONE_WAITS = 2  # past this many max_wait_s a drawn round takes every gone witness as listing nothing


@dataclass(frozen=True)
class Params:
    """The settings a round's rules read (SwarmConfig's fields of the same names)."""

    min_deadline_s: float = 2.0
    deadline_slack: float = 1.5
    commit_grace_s: float = 3.0
    max_wait_s: float = 120.0


def window_s(p: Params, round_seconds: float) -> float:
    """A round's deadline window: (deadline_slack - 1) median rounds after its anchor, at least min_deadline_s."""
    return max(p.min_deadline_s, (p.deadline_slack - 1.0) * round_seconds)


def deadline_from(first_seen: dict[str, float], n_live: int, window: float) -> float | None:
    """The round's deadline once half the live training peers announced (the k-th first sighting plus the
    window); None before."""
    k = max(1, math.ceil(n_live / 2))
    if len(first_seen) < k:
        return None
    return sorted(first_seen.values())[k - 1] + window


def cut_at(first_seen: dict[str, float], n_live: int, window: float, round_seconds: float,
           previous: tuple[dict[str, float], int] | None = None) -> float | None:
    """The round's cut time, when a peer should have finished its inner steps of a round: half way from the
    round's first announcement to its deadline, which leaves time to apply the previous round and announce (a
    slow peer so runs fewer steps instead of stalling the others). Before the round's deadline is known it is
    predicted from ``previous`` (that round's first sightings and live trainers): its deadline plus one median
    round, less half a window (a slow peer must cut its steps in time, not notice the deadline once it has
    passed). None: nothing to go by yet."""
    deadline = deadline_from(first_seen, n_live, window)
    if deadline is not None:
        return deadline - 0.5 * (deadline - min(first_seen.values()))
    before = deadline_from(*previous, window) if previous is not None else None
    return None if before is None else before + round_seconds - 0.5 * window


def past_cut(now: float, step_s: float, cut: float | None) -> bool:
    """One more inner step, started now, would end after the cut time."""
    return cut is not None and now + step_s > cut


def too_late(now: float, step_s: float, min_steps: int, cut: float | None) -> bool:
    """The round's cut time (its deadline running, ``cut_at`` without a prediction) is nearer than the
    peer's fewest steps: its update would arrive after the others decided, so it abstains from the round
    and computes for the next one."""
    return step_s > 0 and cut is not None and now + min_steps * step_s > cut


# --- what a peer sees --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """A witness's report as the core needs it: its chain (``base``: the state hash the round builds on), the
    fingerprints it lists (packed, records.pack), or an abstention. ``digest`` identifies the report
    (records.report_digest)."""

    witness: str
    base: str
    fps: bytes = b""
    abstain: bool = False
    digest: bytes = b""


@dataclass(frozen=True)
class View:
    """What the member records say right now (the shell reads them; the core never does).

    ``trainers``: other training peers keeping up with the round; ``counted``: those of them whose records
    hold a deadline off (Membership.keeping_up); ``leaving``: announced departures; ``present``: eligible
    witnesses with a record in sight no more than four rounds behind; ``live``: every training member;
    ``ahead``: training members two or more rounds past this round; ``voting``: the training members whose
    vote holds a round open (Membership.votes: the recent contributors; None: every live one); ``banned``:
    witnesses proven to equivocate (by this peer or another: never counted again); ``fresh``: the run's first round
    (round 0, nobody contributed yet), so every 'training' record counted; ``based``: members whose record names
    this round or the next (they applied the round before, the state its reports are made on, and none past it: a
    record further on is of a peer that adopted a newer state, or of one whose reports this peer reads anyway)."""

    trainers: frozenset[str] = frozenset()
    counted: frozenset[str] = frozenset()
    leaving: frozenset[str] = frozenset()
    present: frozenset[str] = frozenset()
    live: frozenset[str] = frozenset()
    ahead: frozenset[str] = frozenset()
    voting: frozenset[str] | None = None
    banned: frozenset[str] = frozenset()
    fresh: bool = False
    based: frozenset[str] = frozenset()


def view_of(records: Mapping[str, tuple[int, bool]], me: str, round_: int, *, announced: Iterable[str] = (),
            workers: Collection[str] = (), voters: Collection[str] = (), leaving: Iterable[str] = (),
            banned: Iterable[str] = ()) -> View:
    """What the member records in sight say about round ``round_``, to peer ``me``: who is keeping up, who
    counts, who votes. ``records``: peer -> (the round its record names, whether it trains); ``announced``:
    who announced an update in the round; ``workers``: the senders of the last round ``me`` applied (empty
    before any: then everyone counts); ``voters``: the recent contributors (empty: everyone votes).

    Keeping up (``trainers``): a record of round ``round_ - 1`` or later (a silent peer's record stays at its
    last round), or a sender of the last round whatever its record says (records go out after a round's
    chores, and in rounds of a fraction of a second they lag two rounds); not one two or more rounds past it
    (it will never announce in it: a peer left behind after a healed split waited out max_wait_s on each round
    for them), unless it announced here (a key claiming a far round while announcing would otherwise anchor
    the deadline without being waited for). Counted: the last round's senders and this round's announcers
    among them (a key costs nothing to make: a flood of 'training' records of keys that never sent an update
    would otherwise keep every deadline from starting)."""
    return Views(records, me, round_, announced=announced, workers=workers, voters=voters).view(leaving, banned)


class Views:
    """``view_of``, kept for one round and brought up to date one record at a time. The simulator's computing
    peer makes a view at every poll, and most polls come after a few records changed: at 512 peers, making
    each anew from every record took a fifth of the run. ``moved`` and ``announced`` take the changes; the
    view is the one ``view_of`` makes from the records as they are now."""

    def __init__(self, records: Mapping[str, tuple[int, bool]], me: str, round_: int, *,
                 announced: Iterable[str] = (), workers: Collection[str] = (), voters: Collection[str] = ()) -> None:
        self.me, self.round_, self.voters = me, round_, voters
        self.here, self.workers = set(announced), set(workers)
        self.anyone = not self.workers
        self.present: set[str] = set()
        self.based: set[str] = set()
        self.training: set[str] = set()
        self.ahead: set[str] = set()
        self.trainers: set[str] = set()
        self._made: View | None = None
        for p, record in records.items():
            self._place(p, record)

    def _place(self, p: str, record: tuple[int, bool]) -> None:
        """Put writer ``p``, whose record names round ``record[0]`` (training: ``record[1]``), in its sets."""
        r, t = record
        round_ = self.round_
        if r >= round_ - 4:
            self.present.add(p)
            if round_ <= r <= round_ + 1:
                self.based.add(p)
        if t:
            self.training.add(p)
            if r >= round_ + 2:
                self.ahead.add(p)
            if p != self.me and (r >= round_ - 1 or self.anyone or p in self.workers) and \
                    (r < round_ + 2 or p in self.here):
                self.trainers.add(p)

    def moved(self, records: Mapping[str, tuple[int, bool]], writers: Iterable[str]) -> None:
        """The records of ``writers`` changed or left ``records``: each placed again."""
        for p in writers:
            for kind in (self.present, self.based, self.training, self.ahead, self.trainers):
                kind.discard(p)
            record = records.get(p)
            if record is not None:
                self._place(p, record)
        self._made = None

    def announced(self, records: Mapping[str, tuple[int, bool]], announced: Iterable[str]) -> None:
        """The round's announcers now (they only grow): the new ones placed again."""
        new = set(announced) - self.here
        if new:
            self.here |= new
            self.moved(records, new)

    def view(self, leaving: Iterable[str] = (), banned: Iterable[str] = ()) -> View:
        if self._made is not None and not leaving and not banned:
            return self._made
        live, keeping_up, workers = frozenset(self.training), frozenset(self.trainers), self.workers
        made = View(trainers=keeping_up, counted=keeping_up & (workers | self.here) if workers else keeping_up,
                    leaving=frozenset(leaving), present=frozenset(self.present), live=live,
                    ahead=frozenset(self.ahead), voting=live & set(self.voters) if self.voters else live,
                    banned=frozenset(banned), fresh=self.anyone and self.round_ == 0, based=frozenset(self.based))
        if not leaving and not banned:
            self._made = made
        return made


def pace(times: Mapping[str, float], counted: Collection[str], own: float) -> float:
    """The swarm's round time: the lower median of the counted trainers' full-round compute times (``own``
    when none is in sight). The lower median: of two middle peers the faster, so that a swarm left with one
    fast peer and one straggler paces its rounds on the fast one (the mean of the two made the fast peer wait
    for the straggler every round). A counted trainer whose record claims no time yet (written before its first
    step: early in a run, every honest record but this peer's own) counts at ``own``: else the first peer to
    apply a round paced on its own time and any claims a liar made from the start, and two contributors of
    eight claiming an hour held its round open (the simulator, ``stretch``)."""
    got = sorted(t if t > 0 else own for p, t in times.items() if p in counted)
    return got[(len(got) - 1) // 2] if got else own


@dataclass(frozen=True)
class Announced:
    now: float
    sender: str
    first_seen: float  # when it was announced, on this peer's clock (the DHT gives the age)


@dataclass(frozen=True)
class Verified:
    now: float
    sender: str
    digest: str


@dataclass(frozen=True)
class FetchEnded:
    """A fetch ended without a verified update (failed, rejected, timed out)."""

    now: float
    sender: str


@dataclass(frozen=True)
class FetchStarted:
    now: float
    sender: str


@dataclass(frozen=True)
class ReportSeen:
    now: float
    report: Report


@dataclass(frozen=True)
class Members:
    now: float
    view: View


@dataclass(frozen=True)
class Tick:
    now: float


Event = Union[Announced, Verified, FetchEnded, FetchStarted, ReportSeen, Members, Tick]


# --- what the shell must do --------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishReport:
    pairs: tuple[tuple[str, str], ...]  # (sender, digest) verified, doubted senders left out


@dataclass(frozen=True)
class AskWitnesses:
    witnesses: tuple[str, ...]
    wait_s: float


class HowDecided(enum.Enum):
    """Which rule ended a round's decision (the module docstring tells each)."""

    ALL_REPORTED = "all reported"
    GRACE = "grace"
    ASKED = "asked"
    LIVE_FALLBACK = "live fallback"
    PASSED_BY = "passed by"
    ALL_LEFT = "all left"
    MAX_WAIT = "max wait"
    SETTLED = "settled"  # a drawn committee's set that the reports still missing cannot change


@dataclass(frozen=True)
class Decided:
    fps: bytes | None  # None: no report counted (the round is undecided for now)
    witnesses: int
    how: HowDecided


@dataclass(frozen=True)
class Equivocated:
    first: Report
    second: Report


@dataclass(frozen=True)
class Wake:
    """Call ``step(Tick(at))`` then, or earlier with any event."""

    at: float


Action = Union[PublishReport, AskWitnesses, Decided, Equivocated, Wake]


class Phase(enum.Enum):
    """Where a round's core stands: collecting updates, deciding on the reports, or decided."""

    COLLECT = "collect"
    DECIDING = "deciding"
    DECIDED = "decided"


class CollectEnd(enum.Enum):
    """Why collecting ended (the module docstring tells each)."""

    EVERYONE = "everyone"
    OTHERS_REPORTED = "others reported"
    DEADLINE = "deadline"
    DEADLINE_AND_WINDOW = "deadline and a window"


def _fixed(counted: list[Report], need: int, missing: int) -> bool:
    """Whether every update ``counted`` lists keeps its side of ``need`` whatever ``missing`` more reports list:
    in even if none of them lists it, or out even if all of them do."""
    counts = Counter(fp for r in counted for fp in set(unpack(r.fps)))
    return all(n >= need or n + missing < need for n in counts.values())


@dataclass
class RoundCore:
    """Round ``round_`` as peer ``me`` runs it. ``eligible``: its eligible witnesses (empty: the live trainers
    when deciding starts); ``sender``: this peer sent an update (it counts itself among the live trainers;
    else it observes); ``witness``: it reports (None: as ``sender``; False for a sender that reported on the
    round before a restart: a report is final); ``base``: the state hash the previous round agreed on, which
    this round builds on (only reports on it count); ``committee``: the round's drawn committee
    (protocol/committee.py; None: everyone contributes). With one, only the drawn contributors and the
    admitted newcomers are in the round: the core takes no other announcement, waits for no other trainer,
    and reports no other update, and the shell fetches only what ``admits``."""

    params: Params
    round_: int
    me: str
    eligible: frozenset[str]
    sender: bool
    base: str
    round_seconds: float
    start: float
    phase: Phase = Phase.COLLECT
    view: View = field(default_factory=View)
    first_seen: dict[str, float] = field(default_factory=dict)
    verified: dict[str, str] = field(default_factory=dict)
    fetching: set[str] = field(default_factory=set)
    reports: dict[str, Report] = field(default_factory=dict)
    banned: set[str] = field(default_factory=set)
    elsewhere: set[str] = field(default_factory=set)  # witnesses that reported on another chain (another base)
    doubted: set[str] = field(default_factory=set)  # senders this witness's loss check judged harmful
    awaited: frozenset[str] | None = None
    finish_by: float = math.inf
    collect_why: CollectEnd | None = None  # None while collecting
    reported_at: float = 0.0
    asked_at: float = -math.inf
    ask_until: float = -math.inf  # when an ask of the missing witnesses is given up
    live_fallback: bool = False
    leaving: bool = False  # this peer announced its departure (stop_reporting)
    decided: Decided | None = None
    witness: bool | None = None
    committee: committee_rule.Committee | None = None
    newcomers: dict[str, float] = field(default_factory=dict)  # newcomers seen -> first sighting (committee)
    gone_out: bool = False  # a drawn round past max_wait_s: the missing reports of witnesses gone list nothing
    long_gone: bool = False  # past GONE_WAITS times max_wait_s: those of witnesses once seen on the base too
    based: set[str] = field(default_factory=set)  # every key a view showed holding this round's base (View.based)
    _ranking: committee_rule.Ranking | None = field(default=None, repr=False, compare=False)
    # the witness rule (protocol/witness.py); the simulator passes one that remembers its counts, as every peer of
    # a round counts the same reports
    witnessed: Callable[..., bytes] = field(default=witness_rule.witnessed, repr=False, compare=False)
    # what _live() and deadline() last gave, with what they were computed from (every event changes one of
    # these counts or the view; many rules ask again before the next event does)
    _memo: dict[str, tuple] = field(default_factory=dict, repr=False, compare=False)
    no_ledger: bool = field(default=False, init=False)  # eligible from the view (set when deciding starts)
    # this peer is an eligible witness that reports no more: a report it made before (back from a restart within a
    # round it reported on) stands, and it counts that report as every other peer does
    counts_own: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.no_ledger = not self.eligible
        if self.witness is None:
            self.witness = self.sender
        if not self.witness:
            self.counts_own = self.me in self.eligible
            self.eligible = self.eligible - {self.me}

    def stop_reporting(self) -> None:
        """The peer announced its departure: it publishes no report from now on (one published stands)."""
        self.witness, self.leaving = False, True

    def published(self, now: float) -> None:
        """The shell finished publishing this peer's report at ``now`` (a slow DHT store can take seconds): the
        grace period for the other witnesses runs from then."""
        self.reported_at = max(self.reported_at, now)

    def note(self, events: list[Event]) -> list[Action]:
        """Take events without deciding anything (the second count reads the reports as they stand, and a
        round not decided yet must not move on at apply time); only ``Equivocated`` can come out."""
        out: list[Action] = []
        for event in events:
            out += self._absorb(event)
        return out

    @property
    def window(self) -> float:
        return window_s(self.params, self.round_seconds)

    # --- events ----------------------------------------------------------------------------------

    def step(self, event: Event) -> list[Action]:
        """Take one event; return what to do now (a ``Wake`` last when the core waits for time)."""
        return self.steps([event])

    def steps(self, events: list[Event]) -> list[Action]:
        """Take events that happened together (one poll of the shell's), then decide once, at the latest one's
        time: a batch is judged as a whole (a deadline that fell before this poll must not end collecting
        between an announcement and the verification that came with it)."""
        out: list[Action] = []
        for event in events:
            out += self._absorb(event)
        now = max([e.now for e in events])
        if self.phase is Phase.COLLECT:
            out += self._collect(now)
        if self.phase is Phase.DECIDING:
            out += self._decide(now)
        wake = self._next_wake(now)
        if wake is not None:
            out.append(Wake(wake))
        return out

    def admits(self, sender: str) -> bool:
        """Whether ``sender``'s update is in this round (the shell fetches it): always without a committee;
        with one, a drawn contributor, or a newcomer ranked among the admitted by the announcements so far."""
        return self.committee is None or sender in self.first_seen

    def _announced(self, sender: str, first_seen: float) -> None:
        c = self.committee
        if c is None or sender in c.contributors:
            self.first_seen.setdefault(sender, first_seen)
        elif c.sends(sender) and sender not in self.newcomers:
            # a newcomer: the lowest tickets of those seen so far are in, and one that a lower ticket displaced
            # is out again (ranked on the base: unknown while it computed, so no key is made to win it)
            if self._ranking is None:
                self._ranking = committee_rule.Ranking(c, self.base)
            self.newcomers[sender] = first_seen
            admitted, displaced = self._ranking.add(sender)
            if admitted:
                self.first_seen.setdefault(sender, first_seen)
            if displaced is not None:
                self.first_seen.pop(displaced, None)

    def _absorb(self, event: Event) -> list[Action]:
        if isinstance(event, Announced):
            self._announced(event.sender, event.first_seen)
        elif isinstance(event, FetchStarted):
            if event.sender not in self.verified and self.admits(event.sender):
                self.fetching.add(event.sender)
        elif isinstance(event, Verified):
            if not self.admits(event.sender):  # out of the round (undrawn, or a newcomer displaced)
                self.fetching.discard(event.sender)
                return []
            self.verified[event.sender] = event.digest
            self.fetching.discard(event.sender)
        elif isinstance(event, FetchEnded):
            self.fetching.discard(event.sender)
        elif isinstance(event, ReportSeen):
            return self._seen(event.report)
        elif isinstance(event, Members):
            self.view = event.view
            self.based |= event.view.based
            for w in event.view.banned - self.banned:
                self.banned.add(w)
                self.reports.pop(w, None)
        return []

    def own_update(self, now: float, digest: str) -> list[Action]:
        """This peer announced (and verified) its own update."""
        self._announced(self.me, now)
        if self.admits(self.me):
            self.verified[self.me] = digest
        return self.step(Tick(now))

    def _seen(self, r: Report) -> list[Action]:
        if r.base != self.base and not r.abstain:
            self.elsewhere.add(r.witness)
        if r.witness in self.banned or (r.base != self.base and not r.abstain):
            return []
        first = self.reports.get(r.witness)
        if first is None:
            self.reports[r.witness] = r
            return []
        if r.witness == self.me:  # our own report is the one we published (a stale replica says nothing)
            return []
        if first.digest != r.digest or first.fps != r.fps or first.abstain != r.abstain:
            self.banned.add(r.witness)
            del self.reports[r.witness]
            return [Equivocated(first, r)]
        return []

    # --- collect ---------------------------------------------------------------------------------

    def _abstaining(self) -> frozenset[str]:
        return self._remembered("abstaining", lambda: frozenset(w for w, r in self.reports.items() if r.abstain))

    def _state(self) -> tuple:
        """What the live trainers, the deadline, the abstainers and the counted reports are computed from: the view
        (the same object until a Members event replaces it), the sizes of what only grows, or shrinks with a ban,
        the newcomers seen (one newcomer can displace another: the same count of sightings, other keys), and this
        peer's own report (the shell replaces it with the one it published, or drops it: agreement.report)."""
        return self.view, len(self.first_seen), len(self.newcomers), len(self.verified), len(self.reports), \
            len(self.banned), self.reports.get(self.me)

    def _live(self) -> tuple[frozenset[str], frozenset[str]]:
        """The trainers the round waits for, and those of them that anchor the deadline: not those two or more
        rounds past it (they applied it, or adopted a newer state, and will never announce in it: a peer left
        behind after a healed split waited out max_wait_s on every round for their announcements)."""
        return self._remembered("live", self._live_now)

    def _live_now(self) -> tuple[frozenset[str], frozenset[str]]:
        # a key that announced in this round is in it, whatever its record claims (else a far claim plus an
        # announcement would anchor the deadline without being waited for)
        view = self.view
        gone_past = frozenset(view.ahead).difference(self.first_seen)
        trainers = frozenset(view.trainers) - gone_past
        live = frozenset(view.counted) - gone_past
        if self.committee is not None and self.committee.pool:  # the drawn and the admitted newcomers only
            expected = self.committee.contributors | self.first_seen.keys()
            trainers, live = trainers & expected, live & expected
        if self.sender and self.admits(self.me):
            live |= {self.me}
        if not live <= self.verified.keys():
            sitting_out = self._abstaining()
            trainers, live = trainers - sitting_out, live - sitting_out
        return trainers, live

    def majority_reported(self, live: Collection[str]) -> bool:
        others = (self.eligible or live) - {self.me}
        if not others:
            return False
        done = sum(1 for w, r in self.reports.items() if w in others and not r.abstain)
        return 2 * done > len(others)

    def deadline(self) -> float | None:
        return self._remembered("deadline", self._deadline_now)

    def _deadline_now(self) -> float | None:
        # a newcomer left out still announced: the round paces on every sighting (a run's first rounds, all
        # newcomers, would never see half their trainers among the admitted few). Free keys announcing early can
        # so pull the deadline in: docs/design/scale.md, "Open points"
        seen = {**self.newcomers, **self.first_seen} if self.newcomers else self.first_seen
        deadline = deadline_from(seen, len(self._live()[1]), self.window)
        if self.view.fresh and self.first_seen:
            # before anyone contributed every 'training' record counts toward the anchor, and a record costs
            # nothing to make: keys that never announce would hold the run's first round open until max_wait_s.
            # It falls at the latest a round and a window after the first announcement (an honest peer that
            # started up to a round and a window after the first one, its record in sight by then, is still in)
            latest = min(self.first_seen.values()) + self.round_seconds + self.window
            deadline = latest if deadline is None else min(deadline, latest)
        return deadline

    def _remembered(self, name: str, compute: Callable[[], Any], *more: Any) -> Any:
        """``compute()``, or what it gave last while ``_state()`` and ``more`` are the same. Reports only come
        (the count grows) or go with a ban (the count of bans grows): the same counts, the same reports."""
        state = (self._state(), *more)
        got = self._memo.get(name)
        if got is None or got[0] != state:
            got = self._memo[name] = (state, compute())
        return got[1]

    def _collect(self, now: float) -> list[Action]:
        trainers, live = self._live()
        deadline = self.deadline()
        everyone = live <= self.verified.keys() and trainers <= live
        moved_on = not self.fetching and self.majority_reported(live)
        if self.awaited is None and deadline is not None and now >= deadline:
            self.awaited = frozenset(s for s in self.first_seen if self.committee is not None or not self.eligible
                                     or s in self.eligible)
            self.finish_by = now + self.window
        fetched = self.awaited is not None and not (self.awaited & self.fetching)
        if everyone or moved_on or fetched:
            self.collect_why = CollectEnd.EVERYONE if everyone else CollectEnd.OTHERS_REPORTED if moved_on \
                else CollectEnd.DEADLINE
        elif now >= min(self.start + self.params.max_wait_s, self.finish_by):
            self.collect_why = CollectEnd.DEADLINE_AND_WINDOW
        else:
            return []
        self.phase, self.reported_at = Phase.DECIDING, now
        if not self.eligible:  # no ledger yet: the live trainers, and every peer whose update this round announced
            # (a late member record hid an announcer from some peers' view: their count left its report out)
            self.eligible = frozenset((self.view.live | self.first_seen.keys()) - {self.me}) | \
                ({self.me} if self.witness else frozenset())
        if not self.witness:
            return []
        pairs = tuple(sorted((s, d) for s, d in self.verified.items() if s not in self.doubted and self.admits(s)))
        fps = pack(pairs)
        self.reports.setdefault(self.me, Report(self.me, self.base, fps, digest=fps))
        return [PublishReport(pairs)]

    # --- decide ----------------------------------------------------------------------------------

    def _absent(self) -> set[str]:
        """Eligible witnesses nobody waits for: leaving, abstaining, banned, out of sight, or on another chain (a
        report is final: one made on another chain says this witness applied another previous round; its report
        on ours still counts if one comes)."""
        return set(self.view.leaving) | self._abstaining() | self.banned | self.elsewhere | \
            {p for p in self.eligible if p != self.me and p not in self.view.present and p not in self.first_seen}

    def _counted(self) -> list[Report]:
        return self._remembered("counted", self._counted_now, self.live_fallback, self.eligible)

    def _drawn(self) -> bool:
        """A drawn committee names this round's witnesses (a pool to draw from: not a run's first rounds)."""
        return self.committee is not None and bool(self.committee.pool)

    def _counted_now(self) -> list[Report]:
        if self._drawn():  # a strict majority of the drawn witnesses, or nothing: a side of a split that holds
            # fewer decides nothing (two peers of one side counting two and three of its three reports applied
            # two sets of one round), and no other key's report stands in for theirs. This peer's own report
            # counts even when it reports no more (made before a restart: a report is final)
            witnesses = self.committee.witnesses
            got = [r for w, r in sorted(self.reports.items()) if w in witnesses and not r.abstain]
            return got if 2 * len(got) > len(witnesses) else []
        if self.no_ledger:  # every report on this chain: no ledger says who may witness (the view differs by what
            # records reached each peer), and a key that reports could as well publish a 'training' record
            return [r for _, r in sorted(self.reports.items()) if not r.abstain]
        among = (set(self.view.live) | {self.me}) if self.live_fallback else \
            self.eligible | ({self.me} if self.counts_own else frozenset())
        return [r for w, r in sorted(self.reports.items()) if w in among and not r.abstain]

    def count(self) -> tuple[bytes, int] | None:
        counted = self._counted()
        if not counted:
            return None
        if self._drawn():  # an update is in when a strict majority of the drawn witnesses lists it: two sides of a
            # split, each short of one, cannot each put their own updates in, whatever reports reach a peer
            return self.witnessed((r.fps for r in counted), witness_rule.quorum(len(self.committee.witnesses))), \
                len(counted)
        return self.witnessed(r.fps for r in counted), len(counted)

    def _end(self, how: HowDecided) -> list[Action]:
        found = self.count()
        self.decided = Decided(found[0] if found else None, found[1] if found else 0, how)
        self.phase = Phase.DECIDED
        return [self.decided]

    def _grace_end(self) -> float:
        """How long the missing eligible witnesses are waited for, from this peer's report on."""
        return self.reported_at + max(self.params.commit_grace_s, self.window) + POLL_S

    def _settled(self) -> bool:
        """A drawn committee's set can no longer change: every update that a strict majority of its witnesses
        lists is in, and every other one could not reach that count with all the reports still missing (the
        set ``count`` gives, by the committee's majority)."""
        return self._remembered("settled", self._settled_now, self.gone_out, self.long_gone)

    def _settled_now(self) -> bool:
        counted = self._counted()
        if not counted:  # fewer than a majority of the witnesses' reports
            return False
        witnesses = self.committee.witnesses
        need = witness_rule.quorum(len(witnesses))
        # past max_wait_s, a witness gone from sight (its record expired, or it announced its departure) that no
        # view showed holding this round's base lists nothing: it never held the state a counted report is made
        # on. A majority of the witnesses reported (``counted``), so a side of a split that holds fewer still
        # decides nothing. One seen on the base may have reported to others: an 8|8 split saw a peer count two
        # of them and settle on 9 updates, and its side settle on 7 once their records expired. It is waited
        # for until GONE_WAITS times max_wait_s: one killed before it reported would hold the round for good
        # (a split lasting longer can still apply a round two ways on one side: docs/design/scale.md)
        gone = (lambda w: (w in self.view.leaving or w not in self.view.present)
                and (self.long_gone or w not in self.based)) if self.gone_out else (lambda w: False)
        missing = sum(1 for w in witnesses if w not in self.reports and w not in self.banned and not gone(w))
        return _fixed(counted, need, missing)

    def _decide_drawn(self, now: float) -> list[Action]:
        """A drawn committee's round is decided once its set is settled, whatever the missing witnesses report:
        two peers that count different reports then still apply one set (a peer that counted a majority of the
        reports early applied another set than one that counted them all, in a split that healed). Past the
        grace period the missing witnesses are asked again every window. An unsettled set never stands: with
        ``max_wait_s`` as the end, two peers of a healed split counted ten and twelve reports of one round and
        applied two sets. The peer waits, or its peer core re-syncs it once the others are ahead."""
        if now >= self.reported_at + self.params.max_wait_s:
            # a witness stopped or killed is drawn for up to 64 rounds more: when the honest reports differ on one
            # update, its missing report held the round open for good (a 16-peer run with a stop stalled)
            self.gone_out = True
        if now >= self.reported_at + GONE_WAITS * self.params.max_wait_s:
            self.long_gone = True
        waiting = set(self.eligible) - set(self.reports) - {self.me}
        if self._settled():
            return self._end(HowDecided.ALL_REPORTED if not waiting else HowDecided.SETTLED)
        grace_end = self._grace_end()
        if not self._counted() and self.leaving and now >= grace_end and not set(self.view.live) - {self.me}:
            return self._end(HowDecided.ALL_LEFT)
        if now >= grace_end and now - self.asked_at >= self.window and waiting:
            self.asked_at = now
            return [AskWitnesses(tuple(sorted(waiting)), min(self.window, ASK_S))]
        return []

    def _decide(self, now: float) -> list[Action]:
        if self._drawn():
            return self._decide_drawn(now)
        grace_end = self._grace_end()
        max_wait_end = self.reported_at + self.params.max_wait_s
        counted = self._counted()
        waiting = self._waiting()
        if counted and not waiting:
            return self._end(HowDecided.ALL_REPORTED)
        if counted and now >= grace_end:
            # the missing witnesses are asked for their reports once before the count: a report the DHT hid from
            # this reader (a record late by seconds) would move an update listed by half the others across the
            # majority, and this peer would apply another set than the peers that read it
            if self.asked_at < self.reported_at:
                self.asked_at, self.ask_until = now, now + min(self.window, ASK_S) + POLL_S  # a poll to answer in
                return [AskWitnesses(tuple(sorted(waiting)), min(self.window, ASK_S))]
            if now < self.ask_until:
                return []
            if self.unmoved(len(self.unreported(waiting))):  # the ask never came back, and what it would bring
                return self._end(HowDecided.GRACE)  # cannot change the set
            # else the missing reports could move the set: the peer waits on (asking again every window) up to
            # max_wait_s, or its peer core re-syncs it once the others are ahead
        if not counted and self.leaving and now >= grace_end and not set(self.view.live) - {self.me}:
            # leaving, and so is every other trainer in sight (a whole swarm stopped at once: Ctrl+C on `gradnode
            # simulate`, `docker compose down`): nobody is left to report on this round. Waiting out max_wait_s
            # outlasted the grace a supervisor gives before it kills (10 s), and the checkpoint was lost
            return self._end(HowDecided.ALL_LEFT)
        if not counted and now >= grace_end + self.window:
            self.live_fallback = True
            if self._counted():
                return self._end(HowDecided.LIVE_FALLBACK)
            self.live_fallback = False
            # nobody will report on this round on our chain: every other trainer is past it, sat it out, or
            # reported on another chain (the two peers of one side of a healed split both sat a round out, the
            # other side's reports were on its own chain, and both waited out max_wait_s while it ran on)
            others = set(self.view.live if self.view.voting is None else self.view.voting) - {self.me}
            if others and others <= set(self.view.ahead) | self._abstaining() | self.elsewhere:
                return self._end(HowDecided.PASSED_BY)
        if now >= max_wait_end:
            return self._end(HowDecided.MAX_WAIT)
        if now >= grace_end and now - self.asked_at >= self.window:  # only while the round goes on
            self.asked_at = now
            return [AskWitnesses(tuple(sorted(waiting or (set(self.eligible) - {self.me}))), min(self.window, ASK_S))]
        return []

    def asked(self, now: float, got: list[Report]) -> list[Action]:
        """The reports the witnesses served when asked (``AskWitnesses``); counted like the DHT's. The count
        ends here only if the reports still missing cannot move it. The next ask comes a window after this one
        ended: an ask of an unreachable witness takes its whole wait, and asking again from here at once kept the
        shell from ever reading the DHT again (a cut witness stayed in sight, and held the round to max_wait_s)."""
        self.asked_at = max(self.asked_at, now)
        out: list[Action] = []
        for r in got:
            out += self._seen(r)
        if self.phase is Phase.DECIDING and self._counted() and not self._drawn() and \
                self.unmoved(len(self.unreported())):
            return out + self._end(HowDecided.ASKED)
        return out + self.step(Tick(now))

    def _waiting(self) -> set[str]:
        """The eligible witnesses not heard from that the count waits for (not absent; not this peer)."""
        return set(self.eligible) - set(self.reports) - self._absent() - {self.me}

    def unreported(self, waiting: set[str] | None = None) -> frozenset[str]:
        """Which of ``waiting`` (default: every witness the count waits for) will report on this round: those
        that announced an update in it and are still in sight, less those two rounds past it (they moved on,
        and a report they never made would hold a peer left behind until max_wait_s)."""
        waiting = self._waiting() if waiting is None else waiting
        return frozenset((waiting & self.first_seen.keys() & set(self.view.present)) - set(self.view.ahead))

    def unmoved(self, missing: int) -> bool:
        """Whether ``missing`` more reports, whatever they list, leave the set that ``count`` gives unchanged:
        every update counted is listed by a strict majority of all the reports even if none of the missing
        lists it, and every other one misses that majority even if all of them do. Ending the count before
        that split a round two ways: 31 peers counted 31 reports of their own update only and applied none,
        while one that counted its own report alone applied its update."""
        return self._remembered("unmoved", lambda: self._unmoved_now(missing), missing, self.live_fallback,
                                self.eligible)

    def _unmoved_now(self, missing: int) -> bool:
        if missing == 0:
            return True
        counted = self._counted()
        need = witness_rule.quorum(len(counted) + missing)
        if missing >= need:  # the missing alone could put in an update nobody counted lists
            return False
        return _fixed(counted, need, missing)

    def settle(self) -> tuple[bytes, int] | None:
        """The second count, just before the round is applied: the reports as they stand now. The first
        count's set stands when this one gives the same, or none."""
        found = self.count()
        if found is None:
            return None if self.decided is None or self.decided.fps is None else \
                (self.decided.fps, self.decided.witnesses)
        if self.decided is not None and self.decided.fps == found[0]:
            return self.decided.fps, self.decided.witnesses
        return found

    def _next_wake(self, now: float) -> float | None:
        if self.phase is Phase.COLLECT:
            deadline = self.deadline()
            times = [self.start + self.params.max_wait_s, self.finish_by]
            if deadline is not None and self.awaited is None:
                times.append(deadline)
            return max(now, min(times))
        if self.phase is Phase.DECIDING:  # the next moment a rule can change its mind: never now (no busy loop)
            grace_end = self._grace_end()
            times = [self.reported_at + self.params.max_wait_s, grace_end, grace_end + self.window,
                     self.asked_at + self.window, self.ask_until,
                     self.reported_at + GONE_WAITS * self.params.max_wait_s]
            return min((t for t in times if t > now), default=now + POLL_S)
        return None
