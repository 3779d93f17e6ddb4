"""A peer's rules between rounds, as one peer applies them: a pure state machine (events in, actions out).

No threads, sockets, files, clocks or torch here: every event carries the time at which the shell saw it, and
the same events in give the same actions out. The node (node/swarm/peer.py, chores.py, sync.py) and the virtual
simulator (node/sim/virtual.py) are its two shells. They read the records, turn what they read into events, and
carry out the actions. protocol/round.py is the same for one round's agreement.

After applying a round, a peer checks the round before it (``HashChecked``). Two signals meet there:

hash check  its weight hash against the majority of the voting witnesses' weight reports; a report by a peer
            that moved to this peer's chain since counts for this peer's hash (``off_majority``);
chains      which chain the live trainers follow, by the tails of their member records (protocol/chain.py).

chain.Follow weighs the two. The answer is an action: ``Stay``, ``Resync`` (adopt the majority's state), or
``LookAgain``. A look again reads the records afresh (``ChainsLooked``) and, still off the winning chain, adopts
a state of that chain (a fork sync: ``Resync`` with its links).

The run's last round has no next round to check it. Once the others reported it, ``Check.LAST`` decides by the
reports, unless the chain rule says this peer's chain wins. Then the peer lingers (``Finished``, then
``Lingering`` at every poll): it serves its state until every live trainer holds it, and follows the winning
chain if it finds itself off it (``LookAgain``), for ``LINGER_S`` at most.

The pipeline: a peer computes round r + 1 while round r's exchange runs, and applies r before it announces
r + 1. ``to_compute`` says which round's inner steps come next, sitting out one whose deadline is too near;
``settle_at_once`` says when a hash check is acted on: behind the next round, or at once after the last.

Every state this peer adopts is reported back (``StateAdopted``): the looks before it say nothing about it, and
a hash check of a round before it was made on weights replaced since.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Union

from gradnode.protocol import chain
from gradnode.protocol import sync as sync_rules
from gradnode.protocol.chain import Link
from gradnode.protocol.records import majority_of

LINGER_S = 60.0  # at most this long a finished peer serves the others that are not on its state
BEHIND_S = 30.0  # of which a peer whose record is behind our round is waited for at most this long
LOOK_S = 2.0  # how often a lingering peer looks at the chains (chain.Follow acts on two looks in a row)
LINGER_POLL_S = 0.5  # how often a lingering peer's shell reads the member records and steps ``Lingering``
FORK_SYNC_S = 10.0  # how long a fork sync looks for the winning chain's state before the peer looks again
JOIN_LOOK_S = 3.0  # how long a starting peer looks for a newer state than its own


@dataclass(frozen=True)
class Params:
    """The settings these rules read (SwarmConfig's field of the same name)."""

    max_wait_s: float = 120.0


class Check(enum.Enum):
    """Which hash check: a round's, made after the next one is applied, or the run's last round's, at its end."""

    ROUND = "round"
    LAST = "last round"


class Reason(enum.Enum):
    """Why a peer looks for a state to adopt."""

    JOIN = "join"  # it starts or resumes: a newer state than its own, if one is in sight
    CATCH_UP = "catch up"  # it waits for peers mid-run: the swarm may simply be ahead of it
    HASH_MISMATCH = "hash mismatch"  # its hash of a round is off the majority, and its chain does not win
    FORK = "fork"  # it is off the winning chain: a state of that chain, whatever its round
    LAST_ROUND = "last round"  # its hash of the run's last round is off the majority

    @property
    def forced(self) -> bool:
        """A repair adopts a state even when it is not ahead of this peer's; a start or a catch-up only a newer one."""
        return self not in (Reason.JOIN, Reason.CATCH_UP)


class Why(enum.Enum):
    """Why a peer stays on its chain."""

    ON_WINNER = "on the winning chain"  # or on the majority's hash, with no verdict against it
    CHAIN_WINS = "off the majority, but its chain wins by the chain rule"
    LOOKING = "off the winning chain, not yet in enough looks in a row"
    NO_STATE_YET = "off the winning chain, whose tails vouch for no state yet"  # records lag: the next look may


@dataclass(frozen=True)
class Chains:
    """A look at the chains: the tails of the voting trainers in sight, this peer's own included, and the peers
    that serve streams (a tie goes to a chain with one of them; None: everyone serves)."""

    tails: Mapping[str, Sequence[Link]]
    serving: Collection[str] | None = None

    def others(self, me: str) -> dict[str, Sequence[Link]]:
        return {p: t for p, t in self.tails.items() if p != me}


# --- events ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HashChecked:
    """The weight reports of ``round`` were read, with a look at the chains. ``mine``: this peer's hash of it (None:
    it holds none); ``reports``: the voting witnesses' hashes of it; ``engine_round``: the round it computes next."""

    now: float
    round: int
    engine_round: int
    mine: str | None
    reports: Mapping[str, str]
    chains: Chains
    check: Check = Check.ROUND


@dataclass(frozen=True)
class ChainsLooked:
    """A fresh look at the chains, after ``LookAgain``."""

    now: float
    engine_round: int
    chains: Chains


@dataclass(frozen=True)
class StateAdopted:
    """This peer adopted (or replayed its way to) the state after applying ``round``."""

    now: float
    round: int


@dataclass(frozen=True)
class Finished:
    """The run's last round is applied and checked: the peer lingers from now."""

    now: float


@dataclass(frozen=True)
class Lingering:
    """A poll while lingering: the chains, and the rounds the other live trainers' records name (any record, a
    bulk key's too: a peer behind waits only ``BEHIND_S``)."""

    now: float
    engine_round: int
    chains: Chains
    rounds: Mapping[str, int]


Event = Union[HashChecked, ChainsLooked, StateAdopted, Finished, Lingering]


# --- actions --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stay:
    why: Why = Why.ON_WINNER


@dataclass(frozen=True)
class Resync:
    """Look for a state and adopt it: one of ``lowest_round`` on (an offer's round: the state after the round
    before it), for ``look_s`` at most; with ``links``, one of that chain (a fork sync)."""

    reason: Reason
    lowest_round: int
    look_s: float
    links: frozenset[Link] | None = None


@dataclass(frozen=True)
class LookAgain:
    """Read the chains afresh and step ``ChainsLooked``."""


@dataclass(frozen=True)
class Linger:
    """Keep serving: ``waiting`` (sorted) do not hold this peer's state yet."""

    waiting: tuple[str, ...]


@dataclass(frozen=True)
class Leave:
    """Stop lingering; ``waiting``: those still not on this peer's state (empty: every live trainer holds it)."""

    waiting: tuple[str, ...] = ()


Action = Union[Stay, Resync, LookAgain, Linger, Leave]


# --- the pipeline ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compute:
    """The round whose inner steps come next, and the round sat out to get there (None: none)."""

    round: int
    sat_out: int | None = None


def to_compute(round_: int, rounds: float, late: bool) -> Compute:
    """What a peer computes when round ``round_`` comes next (the one after those applied or announced). When
    that round's cut time is nearer than the peer's fewest steps (``late``: round.too_late), its update would
    come after the others decided: the peer sits it out and computes the next one. It says so at once, so that
    nobody waits for its report, and applies what the others decide. Never the run's last round: no round comes
    after it to compute for."""
    if late and round_ + 1 < rounds:
        return Compute(round_ + 1, sat_out=round_)
    return Compute(round_)


def settle_at_once(applied: int, rounds: float) -> bool:
    """Whether the hash check handed to the chores when round ``applied`` was applied is acted on at once: when
    that was the run's last round (the pipeline drains, no next round hides the check). Otherwise the peer acts
    on it at the next round's hand-off, behind that round's inner steps."""
    return applied >= rounds - 1


def off_majority(reports: Mapping[str, str], mine: str | None, chains: Chains, round_: int, me: str) -> str | None:
    """The majority's hash of ``round_`` when ``mine`` is off it, else None. One vote per reporting peer; a peer
    seen on our chain now, holding our state of ``round_`` or a later one (``chain.allies_since``), counts for our
    hash: its report is of a chain it left since. After a healed split the losers adopt the winners' chain, and
    their old reports tied 2-2 with the winners'; the tie went to the losers' old hash, the winners re-synced
    towards a state nobody offered any more, and the run ended split. A tie goes to a hash a serving peer holds,
    then to the lowest voter's (records.majority_of)."""
    if mine is None or not reports:
        return None
    moved = set(chain.allies_since(chains.tails, me, round_))
    found = majority_of({p: mine if p in moved else h for p, h in reports.items()}, chains.serving)
    return found[0] if found is not None and found[0] != mine else None


def resync(reason: Reason, engine_round: int, params: Params, links: Collection[Link] | None = None) -> Resync:
    """The look a ``reason`` calls for, for a peer whose engine is at ``engine_round``: a fork's takes any state of
    the winning chain and gives up after FORK_SYNC_S (the winner may have merged elsewhere meanwhile, and waiting
    out max_wait_s only left the peer behind); a repair's takes a state of its own round on, for max_wait_s; a
    start's or a catch-up's a newer state only, for JOIN_LOOK_S (protocol/sync.py ``lowest_round``)."""
    fork = links is not None
    low = sync_rules.lowest_round(engine_round, resync=reason.forced, fork=fork)
    look = min(params.max_wait_s, FORK_SYNC_S) if fork else params.max_wait_s if reason.forced else JOIN_LOOK_S
    return Resync(reason, low, look, frozenset(links) if fork else None)


@dataclass
class PeerCore:
    """One peer's between-round rules (see the module)."""

    me: str
    params: Params = Params()
    follow: chain.Follow = field(default_factory=chain.Follow)
    trusted_from: int = 0  # the first round held since the last state adopted: a check of one before it is moot
    linger_from: float | None = None  # when the peer finished (``Finished``)
    next_look: float = -math.inf  # when a lingering peer looks at the chains next

    def step(self, event: Event) -> Action:
        if isinstance(event, HashChecked):
            return self._last(event) if event.check is Check.LAST else self._checked(event)
        if isinstance(event, ChainsLooked):
            return self._looked(event)
        if isinstance(event, Lingering):
            return self._lingering(event)
        if isinstance(event, Finished):
            self.linger_from, self.next_look = event.now, event.now + LOOK_S
            return Stay()
        if isinstance(event, StateAdopted):
            self.follow.lost = self.follow.stuck = 0  # looks before a new state say nothing about it
            self.trusted_from = event.round
            return Stay()
        raise TypeError(f"not a peer event: {event!r}")

    def resync(self, reason: Reason, engine_round: int, links: Collection[Link] | None = None) -> Resync:
        return resync(reason, engine_round, self.params, links)

    def _checked(self, e: HashChecked) -> Action:
        """A round's hash check. Off the majority counts only on a round this peer's weights still descend from
        (``trusted_from``; sync.mismatch_counts). With no verdict of the chain rule, a majority whose state more
        than half of the others' tails list is one the re-sync can find (``vouched_elsewhere``)."""
        majority = off_majority(e.reports, e.mine, e.chains, e.round, self.me)
        off = sync_rules.mismatch_counts(e.round if majority is not None else None, self.trusted_from)
        st = chain.standing(e.chains.tails, self.me, e.chains.serving)
        elsewhere = off and (e.round, majority) in (chain.adoptable(e.chains.others(self.me)) or ())
        move = self.follow.step(st, off, elsewhere)
        if move is chain.Move.RESYNC:
            return self.resync(Reason.HASH_MISMATCH, e.engine_round)
        if move is chain.Move.LOOK_AGAIN:
            return LookAgain()
        return Stay(Why.CHAIN_WINS if off else Why.ON_WINNER if st.on_winner else Why.LOOKING)

    def _last(self, e: HashChecked) -> Action:
        """The last round's check: nobody publishes a newer tail after the end, so a drift in the last round shows
        in the reports alone. They are followed unless the chain rule says ours wins over the chain the majority's
        hash is on: a tail that disagrees with everyone (one key's) must not switch this repair off."""
        majority = off_majority(e.reports, e.mine, e.chains, e.round, self.me)
        if majority is None:
            return Stay()
        tails = {p: t for p, t in e.chains.tails.items() if t}
        found = chain.groups(tails, e.chains.serving)
        st = chain.standing(tails, self.me, e.chains.serving)
        winner_links = {link for p in (found[0] if found else ()) for link in tails[p]}
        listed = any((e.round, majority) in set(map(tuple, t)) for t in tails.values())
        if st.on_winner and len(found) > 1 and (e.round, majority) not in winner_links and listed:
            return Stay(Why.CHAIN_WINS)
        return self.resync(Reason.LAST_ROUND, e.engine_round)

    def _looked(self, e: ChainsLooked) -> Action:
        """Still off the winning chain on a fresh look (the look of a hash check is a round old: while the others
        merge it can show a winner that has just given its chain up): adopt a state more than half the winners'
        tails list (``chain.vouched``: a key's made-up state is no such link). None listed yet: stay this look."""
        st = chain.standing(e.chains.tails, self.me, e.chains.serving)
        if not chain.Follow.confirm(st):
            return Stay()
        links = chain.vouched(e.chains.tails, st.winners)
        if not links:
            return Stay(Why.NO_STATE_YET)
        return self.resync(Reason.FORK, e.engine_round, links)

    def _lingering(self, e: Lingering) -> Action:
        """Serve until every live trainer holds our newest state (``chain.unsettled``): one behind our round is
        waited for BEHIND_S at most, one on another chain LINGER_S. Leaving at once left a contributor that ended
        on another hash alone: its re-sync found no state offer. Every LOOK_S the peer looks at the chains: the
        run is over here, not for the chain rule, so off the winning chain in two looks in a row it follows it (a
        peer whose last check came before the others settled on the other side of a merge ended alone on its
        hash). A chain that wins only by the lowest-id rule is no majority that settled elsewhere: at the end of a
        run those who agree with us may have left already."""
        start = e.now if self.linger_from is None else self.linger_from
        if e.now >= start + min(self.params.max_wait_s, LINGER_S):
            return Leave(self._waiting(e, behind=False))
        waiting = self._waiting(e, behind=e.now < start + min(self.params.max_wait_s, BEHIND_S))
        if not waiting:
            return Leave()
        if e.now >= self.next_look:
            self.next_look = e.now + LOOK_S
            st = chain.standing(e.chains.tails, self.me, e.chains.serving)
            if self.follow.step(replace(st, on_winner=True) if st.tie else st, False) is chain.Move.LOOK_AGAIN:
                return LookAgain()
        return Linger(waiting)

    def _waiting(self, e: Lingering, behind: bool) -> tuple[str, ...]:
        mine = e.chains.tails.get(self.me, ())
        rounds = {p: r for p, r in e.rounds.items() if p != self.me} if behind else {}
        return tuple(chain.unsettled(mine, e.chains.others(self.me), e.engine_round, rounds))
