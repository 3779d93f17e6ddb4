"""The roster under a committee: whose member records the swarm's member table holds, and how many keys
the swarm has.

Without a committee every peer reads every member record: its view of a round (round.view_of) counts
everyone. With a drawn committee a round waits for, and counts, its drawn keys and the newcomers that
announce in it only. So only their records go in the member table:

- A key lists its record there while it is drawn (a contributor or a witness) in a round it computes or
  decides, while it announces as a newcomer, and before it opened a round (a joiner, or a run's start).
- Every key also writes its record under a key of its own. A reader reads that one only to verify a record
  of a key it has not seen listed, or to dial it.
- Votes count from the keys a reader drew for its last rounds only (``sampled``): listing is a claim.

The member table then holds about ``contributors + witnesses + ANNOUNCE_MARGIN * newcomers`` records for
each round its records live, at any number of peers.

The roster's size is no longer the count of records in sight. It is estimated from the newcomers'
tickets (``outsiders``): the pool's size, plus the keys outside it that compute.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

from gradnode.protocol.committee import Committee, Role, seed, ticket

ROSTER_ROUNDS = 8  # the rounds of newcomer tickets the roster's size is estimated from (``Roster``)
ROSTER_RANK = 4  # the rank of the ticket that estimates a round's outsiders (``outsiders``)
VOTE_ROUNDS = 4  # the rounds whose drawn keys vote (``sampled``): about those whose records are in the table


def lists(key: str, drawn: Committee | None, announces: bool) -> bool:
    """Whether ``key`` lists its member record in the member table for the committee's round: always with no
    committee (everyone counts), when drawn to contribute or witness, or when it announces (as a newcomer:
    the round waits for the newcomers it admits; in a run's first rounds, with no pool, every key is one)."""
    return drawn is None or key in drawn.contributors or key in drawn.witnesses or announces


def listed(lists: Mapping[int, bool]) -> bool:
    """Whether a key lists its record now, from ``lists`` (round -> ``lists`` for the rounds it opened): for
    the newest round it opened (the one it computes) or the one before (the one it decides), and always
    before it opened any (a joiner, a restart, a run's start)."""
    if not lists:
        return True
    newest = max(lists)
    return lists[newest] or lists.get(newest - 1, False)


def sampled(voters: frozenset[str], committees: Iterable[Committee | None], senders: Iterable[str]) -> frozenset[str]:
    """Whose votes count (chains, weight reports, who holds a round open) under a committee: of ``voters``
    (protocol/votes.py), the keys drawn to contribute or witness in ``committees`` (the reader's last few
    rounds, drawn from its own chain) and the last round's ``senders``. Any key may list its record: an
    attacker's ledger keys, all listed, would outnumber the honest few listed in a round, where among the
    drawn they hold their share of the pool. ``voters`` as they are when no committee has a pool."""
    drawn = [c for c in committees if c is not None and c.pool]
    if not voters or not drawn:
        return voters
    keys = set(senders).union(*(c.contributors | c.witnesses for c in drawn))
    return voters & keys or voters


def outsiders(committee: Committee, base: str, announced: Iterable[str]) -> float | None:
    """The keys outside the pool that compute the committee's round, estimated from the newcomers that
    announced in it (on ``base``, the hash newcomers are ranked on). Every such key whose newcomer ticket
    falls within its announce share announces (committee.announces). The shares differ by each key's own
    estimate, but all of them hold the lowest tickets. The k-th lowest of them, as a fraction t of the
    ticket range, so gives (k - 1) / t: the k-minimum-values estimate, unbiased, with k = ROSTER_RANK (fewer
    when fewer announced). None: fewer than two announced."""
    s = seed(base, committee.round_)
    tickets = sorted(int.from_bytes(ticket(Role.NEWCOMER, s, k)[:8], "big") for k in set(announced)
                     if k not in committee.pool)
    k = min(len(tickets), ROSTER_RANK)
    if k < 2:
        return None
    return (k - 1) / ((tickets[k - 1] + 1) / 2.0**64)


class Roster:
    """A peer's estimate of the live keys, itself included: what its newcomer share and its holdings' part
    are sized on (committee.announce_share, gossip.holdings_part). The pool's size plus the median of the
    last ROSTER_ROUNDS rounds' ``outsiders``. Before it holds one, the records in its sight."""

    def __init__(self) -> None:
        self._outside: dict[int, float] = {}

    def observe(self, committee: Committee | None, base: str, announced: Iterable[str]) -> None:
        """Round ``committee.round_`` was decided: the newcomers that announced in it (seen, admitted or not)."""
        if committee is None:
            return
        found = outsiders(committee, base, announced)
        if found is not None:  # a new dict: other threads read the old one
            kept = {**self._outside, committee.round_: found}
            self._outside = {k: kept[k] for k in sorted(kept)[-ROSTER_ROUNDS:]}

    def size(self, pool: int | None, seen: int) -> int:
        """The roster: ``pool`` (the size of the newest pool drawn from; None: no committee) plus the keys
        outside it, and never fewer than ``seen`` (the live records in sight, its own included): the count while no
        estimate exists."""
        outside = self._outside
        if pool is None or not outside:
            return seen
        return max(seen, pool + round(statistics.median(outside.values())))
