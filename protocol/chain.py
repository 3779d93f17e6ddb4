"""Which chain of rounds the swarm follows, when peers disagree (after a network split, a restart
against an empty bootstrap, or any fork): a rule every peer applies to the same records the same way.

Every training peer publishes the tail of its chain in its member record: the last few states it
holds, each a (round, weight hash) pair, "the weights after applying round r". Two peers follow the
same chain when their tails agree on a round both list; they follow different chains when they
disagree on one. Peers are grouped by that relation (transitively: a peer one round ahead links to
the others through the rounds they share; but never through a laggard that agrees with both sides of a
fork), and

    the chain followed by more peers wins; a tie goes to the group holding the lowest peer id (given
    ``serving``, the peers that accept streams, first to a group holding one of them: the losers must
    download the winners' state, and nobody can dial a client-mode peer).

Peer counts do not move while two groups merge, so both groups reach the same verdict even when they
read each other's records a round apart (the cumulative work of a chain changes every round: two
groups comparing it a round apart can each find the other heavier, and both re-sync). A peer whose
tail shares no round with anybody (it lags, or is far ahead alone), or only rounds from before a fork,
forms a group of one. Which chain a peer then follows, and when it leaves its own: ``Follow``. Counting
peers makes the rule as strong as the membership it counts: one vote per key is open to keys made in
bulk, which the trust layer bounds (votes by recent contributors only, admission).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

Link = tuple[int, str]  # (round r, hash of the shared weights after applying round r)
TAIL = 4  # states a peer publishes: peers of one chain are at most a round or two apart
UNSETTLED_LOOKS = 3  # looks in a row with no verdict and off the reports' majority before a peer re-syncs (Follow)


def agree(a: Sequence[Link], b: Sequence[Link]) -> bool | None:
    """True when ``a`` and ``b`` list the same hash for their newest common round, False when they list
    different ones, None when they have no round in common."""
    left = dict(a)
    common = [r for r, _ in b if r in left]
    if not common:
        return None
    r = max(common)
    return left[r] == dict(b)[r]


def newest_common(a: Sequence[Link], b: Sequence[Link]) -> int:
    """The newest round that ``a`` and ``b`` list with the same hash; -1 when none."""
    left = dict(a)
    return max((r for r, h in b if left.get(r) == h), default=-1)


def split(tails: Mapping[str, Sequence[Link]],
          serving: Collection[str] | None = None) -> tuple[list[list[str]], list[str]]:
    """The peers that can tell which chain they follow, grouped by chain (each group sorted, the largest first,
    a tie to the group holding the lowest id), and the ones that cannot yet (sorted): a peer whose tail agrees
    with two tails that disagree with each other, a laggard holding only rounds from before a fork (records
    lag a round or two, so honest ones are common). Such a peer is in no group: joined transitively it made
    the two sides one chain, which hid the fork from everyone (found by the simulator); standing alone it made
    a group of its own that could win, and a key publishing a made-up newer round split one honest chain
    into the peers a round behind and the ones ahead (found in review)."""
    distinct = sorted({tuple(t) for t in tails.values()})  # peers of one chain mostly publish the same tail
    n = len(distinct)
    verdict = {(i, j): agree(distinct[i], distinct[j]) for i in range(n) for j in range(i + 1, n)}
    agrees = {i: [j for j in range(n) if j != i and verdict[min(i, j), max(i, j)]] for i in range(n)}
    ambiguous = {i for i in range(n) if any(verdict[min(j, k), max(j, k)] is False
                                            for a, j in enumerate(agrees[i]) for k in agrees[i][a + 1:])}
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for (i, j), same in verdict.items():
        if same and i not in ambiguous and j not in ambiguous:
            ri, rj = root(i), root(j)
            parent[max(ri, rj)] = min(ri, rj)
    index = {t: i for i, t in enumerate(distinct)}
    found: dict[int, list[str]] = {}
    unsure = []
    for peer in sorted(tails):
        i = index[tuple(tails[peer])]
        if i in ambiguous:
            unsure.append(peer)
        else:
            found.setdefault(root(i), []).append(peer)
    served = (lambda g: True) if serving is None else (lambda g: any(p in serving for p in g))
    return sorted(found.values(), key=lambda g: (-len(g), not served(g), g[0])), unsure


def groups(tails: Mapping[str, Sequence[Link]], serving: Collection[str] | None = None) -> list[list[str]]:
    """Peers grouped by chain, the winning group first (``split``); the peers that cannot tell yet last, one
    per group."""
    found, unsure = split(tails, serving)
    return found + [[p] for p in unsure]


def decided(found: Sequence[Sequence[str]], unsure: Sequence[str]) -> bool:
    """The largest group wins only by more than the peers that cannot tell yet: they could all turn out to be
    on the runner-up's chain (with none of them, a tie goes to the lowest id, as always). Undecided, nobody
    leaves its chain this look; the laggards publish a newer round within a round or two."""
    if not found or not unsure:
        return True
    return len(found[0]) - (len(found[1]) if len(found) > 1 else 0) > len(unsure)


def winner(tails: Mapping[str, Sequence[Link]], serving: Collection[str] | None = None) -> list[str]:
    """The peers of the winning chain ([] when nobody published a tail, or no verdict stands yet)."""
    found, unsure = split({p: t for p, t in tails.items() if t}, serving)
    return found[0] if found and decided(found, unsure) else []


def allies_since(tails: Mapping[str, Sequence[Link]], me: str, round_: int) -> list[str]:
    """The other peers on ``me``'s chain (its group by ``groups``), sorted, that hold its state of ``round_`` or a
    later one (their tail and its own agree on a round at or after it): a weight report of ``round_`` one of them
    made before it moved to this chain counts for this chain's hash (records.majority_hash's ``moved``). None
    ([]) while ``me`` published no tail; one whose newest round in common is older says nothing of its hash of
    ``round_``; with ``round_`` -1, the whole group but ``me``."""
    mine = tails.get(me)
    if not mine:
        return []
    group = next((g for g in groups(tails) if me in g), [])
    return [p for p in group if p != me and newest_common(tails.get(p, ()), mine) >= round_]


def vouched(tails: Mapping[str, Sequence[Link]], peers: Collection[str]) -> set[Link]:
    """The states (links) that the tails of more than half of ``peers`` list. A tail is a claim: a key that lists
    a made-up state after the honest chain's newest agrees with every honest tail (they share the rounds before
    it), so the chain rule counts it on the honest chain, and a state only it lists must not be adopted."""
    counts = Counter(link for p in peers for link in set(tails.get(p, ())))
    return {link for link, n in counts.items() if 2 * n > len(peers)}


def adoptable(tails: Mapping[str, Sequence[Link]], serving: Collection[str] | None = None) -> set[Link] | None:
    """The states a peer looking for one may adopt, by the tails of the others' member records: those more than
    half of the winning chain's peers list (``vouched``); while no verdict stands, those more than half of all
    the tails list (two keys listing one made-up round under two hashes leave every honest tail unsure: no
    verdict, and a state one of them lists must not win then either). None when no tail is given (nobody
    published a chain: protocol/sync.py ``trusted_offers`` falls back on the weight reports); an empty set when
    the tails vouch for no state (records lag, or keys list what nobody else does): nothing is adopted then."""
    tails = {p: t for p, t in tails.items() if t}
    return vouched(tails, winner(tails, serving) or list(tails)) if tails else None


def unsettled(mine: Sequence[Link], others: Mapping[str, Sequence[Link]], my_round: int,
              rounds: Mapping[str, int]) -> list[str]:
    """The peers that do not hold our newest state yet, at the end of a run: behind our round (``rounds``,
    what their records say), or on another chain (``others``: their tail lists another hash for a round ours
    lists). A tail sharing no round with ours (it claims a far state) is not waited for. Sorted."""
    behind = {p for p, r in rounds.items() if r < my_round}
    return sorted(behind | {p for p, t in others.items() if agree(mine, t) is False})


@dataclass(frozen=True)
class Standing:
    """Where peer ``me`` stands among the chains of ``tails`` (its own tail included): on the winning chain or
    not, and whether it lost only by the lowest-id rule while alone on its chain (a 1-1 tie)."""

    on_winner: bool
    tie_alone: bool
    winners: tuple[str, ...]
    groups: int
    tie: bool = False  # off the winning chain only by the lowest-id rule (as many peers on ours)
    decided: bool = True  # a verdict stands (``decided``); else on_winner is True for everyone


def standing(tails: Mapping[str, Sequence[Link]], me: str, serving: Collection[str] | None = None) -> Standing:
    """``me``'s standing by the chain rule. On the winning chain: in its group, or with no tail yet, or unable
    to tell yet while agreeing with it (a round or more behind), or while no verdict stands (``decided``)."""
    found, unsure = split({p: t for p, t in tails.items() if t}, serving)
    if not found:  # every tail unsure (keys can list tails that agree and disagree in a cycle): no verdict either
        return Standing(True, False, (), len(unsure), decided=not unsure)
    win, own = found[0], tails.get(me)
    if not decided(found, unsure):
        return Standing(True, False, tuple(win), len(found) + len(unsure), decided=False)
    mine = next((g for g in found if me in g), [me])
    on = me in win or not own or (me in unsure and any(agree(own, tails[w]) for w in win))
    tie = not on and len(mine) == len(win)
    return Standing(on, tie and len(win) == 1, tuple(win), len(found) + len(unsure), tie)


class Move(enum.Enum):
    """What a look at the chains calls for: stay on this peer's chain, re-sync to the majority's state, or look
    again on fresh records and adopt the winning chain's state if still off it (``Follow.confirm``)."""

    STAY = "stay"
    RESYNC = "resync"
    LOOK_AGAIN = "look again"


@dataclass
class Follow:
    """When a peer leaves its chain for another's: one rule over the two signals it has after a round, the
    chain rule over the member records' tails (``Standing``) and its weight hash against the majority of a
    round's weight reports (``off_majority``).

    The chain rule decides; the reports only hasten it. Off the winning chain in two looks in a row (four
    when it lost only a 1-1 tie alone: one record of a 2-1 majority looking stale for a moment makes one),
    the peer looks again on fresh records and, still off it, adopts the winner's state (``Move.LOOK_AGAIN``,
    then ``confirm``). Off the winning chain and off the reports' majority in one look: both signals agree,
    it re-syncs at once (``Move.RESYNC``). Off the majority while the chain rule says its chain wins: it stays
    (``Move.STAY``). The two signals are read from different records at different moments; acting on either
    alone let the two sides of a healed 2|2 split each adopt the other's chain within seconds (one side's
    re-sync, whose report count missed one of its own allies, and the other side's fork sync), and the swarm
    stayed split.

    While no verdict stands (``Standing.decided`` False: peers that cannot tell yet could tip it), nobody leaves
    its chain by the chain rule; a peer off the reports' majority in UNSETTLED_LOOKS looks in a row, the
    majority's state being one more than half of all tails list (``vouched_elsewhere``: the state its re-sync
    then looks for, ``adoptable``), re-syncs (``Move.RESYNC``). A split's laggards tell within a round or two;
    two keys listing one made-up round under two hashes after the honest chain's newest keep every honest peer
    unsure for as long as they like, and a peer off the chain stayed off it. Off a majority whose state the
    tails do not vouch for (an even split, reports a few keys tip), a re-sync would find nothing to adopt: it
    waits."""

    lost: int = 0  # looks in a row that found this peer off the winning chain
    stuck: int = 0  # looks in a row with no verdict that found it off the reports' majority

    def step(self, s: Standing, off_majority: bool, vouched_elsewhere: bool = False) -> Move:
        """What this look calls for (see the class)."""
        if not s.decided and off_majority and vouched_elsewhere:
            self.lost, self.stuck = 0, self.stuck + 1
            if self.stuck >= UNSETTLED_LOOKS:
                self.stuck = 0
                return Move.RESYNC
            return Move.STAY
        self.stuck = 0
        if s.on_winner:
            self.lost = 0
            return Move.STAY
        self.lost += 1
        if off_majority:
            self.lost = 0
            return Move.RESYNC
        if self.lost >= (4 if s.tie_alone else 2):
            self.lost = 0
            return Move.LOOK_AGAIN
        return Move.STAY

    @staticmethod
    def confirm(fresh: Standing) -> bool:
        """After ``Move.LOOK_AGAIN``: adopt the winner's state when the fresh look still finds this peer off it."""
        return not fresh.on_winner
