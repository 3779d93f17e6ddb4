"""Which chain of rounds the swarm follows, when peers disagree (after a network split, a restart
against an empty bootstrap, or any fork): a rule every peer applies to the same records the same way.

Every training peer publishes the tail of its chain in its member record: the last few states it
holds, each a (round, weight hash) pair, "the weights after applying round r". Two peers follow the
same chain when their tails agree on a round both list; they follow different chains when they
disagree on one. Peers are grouped by that relation (transitively: a peer one round ahead links to
the others through the rounds they share), and

    the chain followed by more peers wins; a tie goes to the group holding the lowest peer id.

Peer counts do not move while two groups merge, so both groups reach the same verdict even when they
read each other's records a round apart (the cumulative work of a chain changes every round: two
groups comparing it a round apart can each find the other heavier, and both re-sync). A peer whose
tail shares no round with anybody (it lags, or is far ahead alone) forms a group of one. Counting
peers makes the rule as strong as the membership it counts: one vote per key is open to keys made in
bulk, which the trust layer bounds (votes by recent contributors only, admission).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Link = tuple[int, str]  # (round r, hash of the shared weights after applying round r)
TAIL = 4  # states a peer publishes: peers of one chain are at most a round or two apart


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


def groups(tails: Mapping[str, Sequence[Link]]) -> list[list[str]]:
    """Peers grouped by chain, each group sorted, the winning group first (see the module docstring)."""
    parent = {p: p for p in tails}

    def root(p: str) -> str:
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    peers = sorted(tails)
    for i, a in enumerate(peers):
        for b in peers[i + 1:]:
            if agree(tails[a], tails[b]):
                ra, rb = root(a), root(b)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    found: dict[str, list[str]] = {}
    for p in peers:
        found.setdefault(root(p), []).append(p)
    return sorted(found.values(), key=lambda g: (-len(g), g[0]))


def winner(tails: Mapping[str, Sequence[Link]]) -> list[str]:
    """The peers of the winning chain ([] when nobody published a tail)."""
    found = groups({p: t for p, t in tails.items() if t})
    return found[0] if found else []


def unsettled(mine: Sequence[Link], others: Mapping[str, Sequence[Link]], my_round: int,
              rounds: Mapping[str, int]) -> list[str]:
    """The peers that do not hold our newest state yet, at the end of a run: behind our round (``rounds``,
    what their records say), or on another chain (``others``: their tail lists another hash for a round ours
    lists). A tail sharing no round with ours (it claims a far state) is not waited for. Sorted."""
    behind = {p for p, r in rounds.items() if r < my_round}
    return sorted(behind | {p for p, t in others.items() if agree(mine, t) is False})
