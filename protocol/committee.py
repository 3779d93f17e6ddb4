"""A round's committee: the few peers that contribute to a round and the few that witness it.

With a committee, a peer's cost per round is set by the run's budget, not by the number of peers N: it
fetches at most ``contributors + newcomers`` updates and counts at most ``witnesses`` reports
(docs/design/scale.md). The rules:

- The committee of round r is drawn from the state after round r - LAG. That state's hash seeds the draw
  and its contributors ledger (Engine.contributors: who had a counted update in the last 64 rounds) is the
  pool. Every honest peer of a chain holds that state, so every one draws the same committee.
- A key's ticket is sha256 of the role, the seed and the key. The ``contributors`` lowest contributor
  tickets contribute; the ``witnesses`` lowest witness tickets witness. A pool no larger than a role's
  budget fills the role whole.
- The seed is unknown until round r - LAG is decided, and the pool is fixed by the same decision. A key
  cannot choose to enter the pool once it knows its ticket; a contributor can only try variants of its
  update to move the hash, and each try is a fresh draw (the design doc gives the odds against that).
- A key outside the pool is a newcomer. A round takes at most ``newcomers`` of them, plus the contributor
  slots a pool smaller than the budget leaves empty (a run's first rounds fill the pool this way): those
  whose tickets on the round's base (the hash of round r - 1) are lowest among the newcomers a peer saw announce. The
  base is unknown while the newcomer computes, one round less ahead than a drawn contributor's seed.
- A newcomer announces only when its ticket on the base is in the round's draw: the lowest share of
  tickets that gives ``ANNOUNCE_MARGIN`` announcers per open slot, among the keys outside the pool of the
  roster it sees (``announces``). The newcomers admitted are still the lowest tickets, so the rule changes
  who is admitted only when fewer announce than there are slots. It keeps a round's announcements at
  about ``contributors + ANNOUNCE_MARGIN * slots`` at any N.
- A round's weight hashes count from its witnesses only (its senders, before a pool exists), and only
  they publish one (``weighers``).
- LAG is two because a peer computes round r while round r - 1 is decided: at the start of round r's
  compute it holds round r - 2's state, so a drawn peer knows it is drawn before it computes.

An undrawn peer in the pool sends nothing: its pseudo-gradient stays in its error feedback until a round
draws it. It still fetches the round's updates and applies the set the witnesses decide. A peer that does
not witness the round fetches the newcomers' updates the set lists only once it is decided (``Fetches``).
"""

from __future__ import annotations

import bisect
import enum
import functools
import hashlib
import heapq
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from math import comb, expm1, log1p

from gradnode.protocol.records import MAX_PEERS_PER_ROUND

ANNOUNCE_MARGIN = 4  # newcomers expected to announce per open slot (``announces``)
LAG = 2  # the committee of round r is drawn from the state after round r - LAG
GENESIS = "genesis"  # the hash a draw reads for a round before the run's first: no state, an empty pool


class Role(enum.Enum):
    CONTRIBUTOR = b"contributor"
    WITNESS = b"witness"
    NEWCOMER = b"newcomer"


@dataclass(frozen=True)
class Budget:
    """A round's budget (SwarmConfig's committee fields): how many pool keys contribute, how many witness,
    and how many newcomers may contribute besides. 0 contributors: no committee (everyone contributes and
    every eligible peer witnesses, the all-to-all round)."""

    contributors: int = 0
    witnesses: int = 0
    newcomers: int = 0

    def __post_init__(self) -> None:
        if min(self.contributors, self.witnesses, self.newcomers) < 0 or \
                (self.contributors > 0) != (self.witnesses > 0):
            raise ValueError(f"committee budget {self}: all >= 0, contributors and witnesses both set or both 0")
        if self.contributors + self.newcomers > MAX_PEERS_PER_ROUND:
            # a report lists the round's updates, at most the contributors and newcomers (a small pool's empty
            # contributor slots go to newcomers), and a report listing more fails every reader's validation
            raise ValueError(f"committee budget {self}: contributors + newcomers at most {MAX_PEERS_PER_ROUND}, "
                             "the updates a report may list")

    @property
    def drawn(self) -> bool:
        return self.contributors > 0


@dataclass(frozen=True)
class Committee:
    """Round ``round_``'s committee: the drawn ``contributors`` and ``witnesses`` of ``pool`` (the ledger of the
    state it was drawn from), and the ``newcomers`` slots open to keys outside the pool."""

    round_: int
    pool: frozenset[str]
    contributors: frozenset[str]
    witnesses: frozenset[str]
    newcomers: int

    def sends(self, key: str) -> bool:
        """Whether ``key`` may announce an update this round: drawn, or outside the pool (a newcomer, ranked
        against the others by ``admitted``)."""
        return key in self.contributors or key not in self.pool


def reports(key: str, drawn: Committee | None, sends: bool, observes: bool) -> bool:
    """Whether ``key`` witnesses a round (publishes a report on it). Without a drawn committee: when it sends an
    update. With one: when the committee drew it as a witness, whether it sends or not (an undrawn contributor
    still witnesses). Never when it observes the round: it sat the round out and said it abstains, or it
    reported on the chain it left since."""
    if observes:
        return False
    if drawn is not None and drawn.pool:
        return key in drawn.witnesses
    return sends


def weighers(drawn: Committee | None, senders: Collection[str] | None) -> frozenset[str] | None:
    """Whose weight hashes of a round count, and so who publishes one. A drawn committee's round: its
    witnesses, the majority that decided the set confirming the weights it makes. A committee's round with
    no pool to draw from (a run's first rounds, whose senders witness them): the ``senders`` of the set
    applied. None (every voter) without a committee, or when the senders are unknown (a round replayed or
    adopted). A round's weight reports so stay at the budget at any N. Readers count these keys' reports
    only: else pool keys that are not witnesses (20% of the pool, an attacker's) would outnumber the W."""
    if drawn is None:
        return None
    if drawn.pool:
        return drawn.witnesses
    return None if senders is None else frozenset(senders)


def seed(state_hash: str, round_: int) -> bytes:
    """The draw's seed for round ``round_``: the hash of the state it is drawn from, and the round."""
    return hashlib.sha256(f"gradnode/committee/{round_}/{state_hash}".encode()).digest()


def ticket(role: Role, seed_: bytes, key: str) -> bytes:
    """A key's ticket for a role: the lowest tickets are drawn. Nothing a key holder chooses after it knows
    the seed goes in (a signature is randomised, RSA-PSS: never part of a ticket)."""
    return hashlib.sha256(role.value + b"/" + seed_ + b"/" + key.encode()).digest()


def lowest(role: Role, seed_: bytes, keys: Iterable[str], n: int) -> frozenset[str]:
    """The ``n`` keys of ``keys`` with the lowest tickets for ``role`` (all of them when they are no more)."""
    keys = set(keys)
    if len(keys) <= n:
        return frozenset(keys)
    return frozenset(heapq.nsmallest(n, keys, key=lambda k: ticket(role, seed_, k)))


def draw(budget: Budget, round_: int, state_hash: str, ledger: Collection[str]) -> Committee | None:
    """Round ``round_``'s committee, drawn from the state after round ``round_ - LAG``: its hash and its
    contributors ledger. None without a committee budget: everyone contributes."""
    if not budget.drawn:
        return None
    s, pool = seed(state_hash, round_), frozenset(ledger)
    contributors = lowest(Role.CONTRIBUTOR, s, pool, budget.contributors)
    return Committee(round_, pool, contributors, lowest(Role.WITNESS, s, pool, budget.witnesses),
                     budget.newcomers + budget.contributors - len(contributors))


def of_round(budget: Budget, round_: int, hashes: Mapping[int, str],
             ledgers: Mapping[int, frozenset[str]]) -> Committee | None:
    """Round ``round_``'s committee as a peer draws it from what it holds: ``hashes[k]`` and ``ledgers[k]`` are
    the hash and the contributors ledger of its state after round k. Before round LAG no such state exists,
    so the draw reads GENESIS and an empty pool (every early contributor is a newcomer). One draw per state
    is kept: every peer of a chain asks for the same one."""
    k = round_ - LAG
    return drawn_from(budget, round_, hashes.get(k, GENESIS), ledgers.get(k, frozenset()))


@functools.lru_cache(maxsize=1024)
def drawn_from(budget: Budget, round_: int, state_hash: str, ledger: frozenset[str]) -> Committee | None:
    """``draw``, kept for the last states drawn from: a shell asks for one round's committee many times."""
    return draw(budget, round_, state_hash, ledger)


def base(round_: int, hashes: Mapping[int, str]) -> str:
    """The hash newcomers of round ``round_`` are ranked on: the state after the round before (GENESIS for
    the run's first round)."""
    return hashes.get(round_ - 1, GENESIS)


def admitted(committee: Committee, base: str, announced: Iterable[str]) -> frozenset[str]:
    """Who of ``announced`` contributes to the committee's round: the drawn contributors, and the
    ``committee.newcomers`` newcomers whose tickets on ``base`` (the hash of the round before) are lowest."""
    announced = set(announced)
    newcomers = {k for k in announced if k not in committee.pool}
    s = seed(base, committee.round_)
    return frozenset(announced & committee.contributors) | lowest(Role.NEWCOMER, s, newcomers, committee.newcomers)


def announce_share(committee: Committee, roster: int) -> float:
    """The share of newcomer tickets in a round's draw: ANNOUNCE_MARGIN announcers per open slot, among the
    ``roster - len(pool)`` keys outside the pool (at least one). Announcers are Poisson with a mean of
    ANNOUNCE_MARGIN * slots: with 2 slots, fewer than 2 announce in 3e-3 of rounds, and a slot left empty
    only delays a newcomer by a round."""
    outside = max(1, roster - len(committee.pool))
    return min(1.0, ANNOUNCE_MARGIN * committee.newcomers / outside)


def announces(committee: Committee | None, base: str, key: str, roster: int) -> bool:
    """Whether ``key`` announces its update of the committee's round: always without a committee, when drawn
    as a contributor, never as an undrawn key of the pool, and as a newcomer when its ticket on ``base`` is
    within ``announce_share`` of the roster it sees (``roster``: the live keys it counts, itself included).
    The base is the hash of the round before, known once that round is applied and not while the newcomer
    computed, so a key cannot be made to fall within the share."""
    if committee is None or key in committee.contributors:
        return True
    if key in committee.pool or committee.newcomers == 0:
        return False
    share = announce_share(committee, roster)
    if share >= 1.0:
        return True
    t = ticket(Role.NEWCOMER, seed(base, committee.round_), key)
    return int.from_bytes(t[:8], "big") < share * 2.0**64


class Ranking:
    """The newcomers of one round seen so far, ranked as they come (``admitted``'s rule, one ticket each): the
    ``committee.newcomers`` lowest tickets on ``base`` are in."""

    def __init__(self, committee: Committee, base: str) -> None:
        self.seed, self.slots = seed(base, committee.round_), committee.newcomers
        self._ranked: list[tuple[bytes, str]] = []

    def add(self, key: str) -> tuple[bool, str | None]:
        """Rank a newcomer seen for the first time: whether it is in, and who it displaced (None: nobody)."""
        entry = (ticket(Role.NEWCOMER, self.seed, key), key)
        at = bisect.bisect(self._ranked, entry)
        self._ranked.insert(at, entry)
        if at >= self.slots:
            return False, None
        return True, self._ranked[self.slots][1] if len(self._ranked) > self.slots else None


class Fetches:
    """Which announced updates of one round a peer fetches before the round is decided: with no committee,
    every one; with one, a drawn contributor's, and, at a witness (``reports``), a newcomer's ranked among the
    admitted when it is seen (``Ranking`` on ``base``). An undrawn key of the pool costs nothing but its
    announcement. A peer that does not witness the round fetches no newcomer's update before the count: it
    verifies nothing for anyone, and a newcomer a lower ticket displaces later was fetched for nothing (at 16
    peers, 2.5 wasted updates a round). It fetches the newcomers the set lists once decided. The node's
    exchange and the virtual simulator both ask this."""

    def __init__(self, base: str, witness: bool = True) -> None:
        self.base, self.witness = base, witness
        self._ranking: Ranking | None = None

    def __call__(self, committee: Committee | None, sender: str) -> bool:
        if committee is None or sender in committee.contributors:
            return True
        if sender in committee.pool or not self.witness:
            return False
        if self._ranking is None:
            self._ranking = Ranking(committee, self.base)
        return self._ranking.add(sender)[0]

    def take(self, committee: Committee | None, senders: Iterable[str]) -> list[str]:
        """Of the senders one read found announcing, those to fetch, in the read's order. The read's newcomers
        are ranked best ticket first, so that none of them displaces another of the same read: a round's
        exchange begins with one read that holds most of its announcements."""
        senders = list(senders)
        if committee is None:
            return senders
        s = seed(self.base, committee.round_)
        best_first = sorted(senders, key=lambda k: b"" if k in committee.pool else ticket(Role.NEWCOMER, s, k))
        chosen = {k for k in best_first if self(committee, k)}
        return [k for k in senders if k in chosen]


# --- the odds ----------------------------------------------------------------------------------------


def at_least(w: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(w, p): the chance that ``k`` or more of ``w`` witnesses are the attackers',
    who hold a share ``p`` of the pool. A draw with replacement: it overstates the chance of a draw without
    replacement from a finite pool."""
    return sum(comb(w, i) * p**i * (1 - p) ** (w - i) for i in range(k, w + 1))


def attacker_majority(w: int, share: float, rounds: int = 1) -> float:
    """The chance that attackers holding ``share`` of the pool hold a strict majority of ``w`` witnesses in at
    least one of ``rounds`` rounds (1 - (1 - q)^rounds, without rounding to 0)."""
    q = at_least(w, w // 2 + 1, share)
    return -expm1(rounds * log1p(-q))
