"""The roster under a committee (protocol/roster.py): whose member records the member table lists, and the
swarm's size from the newcomers' tickets."""

from __future__ import annotations

import random
import statistics

import pytest

from gradnode.protocol import committee as cm
from gradnode.protocol import roster


def test_a_key_lists_its_record_while_drawn_or_announcing_and_always_without_a_committee() -> None:
    pool = frozenset(f"k{i:02d}" for i in range(40))
    c = cm.draw(cm.Budget(4, 8, 2), 9, "h7", pool)
    drawn = sorted(c.contributors | c.witnesses)
    idle = sorted(pool - c.contributors - c.witnesses)[0]
    assert all(roster.lists(k, c, announces=False) for k in drawn)
    assert not roster.lists(idle, c, announces=False)  # in the pool, undrawn: under its own key only
    assert roster.lists("newcomer", c, announces=True) and not roster.lists("newcomer", c, announces=False)
    assert roster.lists(idle, None, announces=False)  # no committee: every view counts everyone
    first = cm.draw(cm.Budget(4, 8, 2), 0, cm.GENESIS, frozenset())  # no pool: the announcers are the round
    assert roster.lists("a", first, announces=True) and not roster.lists("b", first, announces=False)


def test_a_key_lists_for_the_round_it_computes_and_the_one_it_decides() -> None:
    assert roster.listed({})  # a joiner, a restart, a run's start: nobody's view would count it otherwise
    assert roster.listed({4: True, 5: False}) and roster.listed({4: False, 5: True})
    assert not roster.listed({3: True, 4: False, 5: False})  # drawn two rounds back: out of the table


def _announcers(c: cm.Committee, base: str, outside: list[str], roster_size: int) -> list[str]:
    return [k for k in outside if cm.announces(c, base, k, roster_size)]


@pytest.mark.parametrize("outside_n", [30, 400, 10_000])
def test_the_newcomers_tickets_estimate_the_keys_outside_the_pool_within_a_third(outside_n: int) -> None:
    """Every key outside a pool of 200 announces by the committee's rule, on the roster the estimate gives:
    after a few rounds the estimate is within a third of the true count, from 30 keys outside to 10,000."""
    pool = frozenset(f"k{i}" for i in range(200))
    outside = [f"n{i}" for i in range(outside_n)]
    est = roster.Roster()
    sizes = []
    for r in range(30):
        c = cm.draw(cm.Budget(8, 16, 2), r, f"h{r}", pool)
        base = f"b{r}"
        seen = est.size(len(pool), len(pool) + 1)  # before any estimate: what a peer's sight holds
        est.observe(c, base, _announcers(c, base, outside, seen))
        sizes.append(est.size(len(pool), 1))
    late = statistics.median(sizes[10:])
    assert abs(late - (len(pool) + outside_n)) <= (len(pool) + outside_n) / 3, (outside_n, sizes)


def test_peers_that_start_from_other_estimates_converge_on_one_roster() -> None:
    """A joiner's first estimate is its sight (low), another peer's high: both count the tickets, not the
    shares, so each ends within a third of 5,000 keys outside the pool, whoever announced on which share."""
    pool = frozenset(f"k{i}" for i in range(100))
    outside = [f"n{i}" for i in range(5_000)]
    rng = random.Random(0)
    low, high = roster.Roster(), roster.Roster()
    for r in range(20):
        c = cm.draw(cm.Budget(8, 16, 2), r, f"h{r}", pool)
        base = f"b{r}"
        claims = [low.size(len(pool), 150), high.size(len(pool), 20_000)]  # each announcer sizes on one of these
        announced = [k for k in outside if cm.announces(c, base, k, claims[rng.randrange(2)])]
        low.observe(c, base, announced)
        high.observe(c, base, announced)
    for est in (low, high):
        assert abs(est.size(len(pool), 1) - 5_100) <= 5_100 / 3, est.size(len(pool), 1)


def test_the_estimate_needs_two_newcomers_and_never_falls_below_the_sight() -> None:
    pool = frozenset(f"k{i}" for i in range(10))
    c = cm.draw(cm.Budget(2, 3, 1), 4, "h", pool)
    est = roster.Roster()
    est.observe(c, "b", ["n0"])
    assert est.size(len(pool), 7) == 7  # one announcer says nothing: the sight's count
    est.observe(c, "b", ["n0", "n1", "n2", *pool])  # the pool's own keys are not outsiders
    assert est.size(len(pool), 1) > len(pool) and est.size(len(pool), 10_000) == 10_000
    assert est.size(None, 12) == 12  # no committee: the records in sight


def test_a_committee_swarm_reads_about_as_many_member_records_at_128_peers_as_at_32(monkeypatch) -> None:
    """30 s rounds at a 60 s record lifetime, budget 4,8,1, 10 rounds, seed 0: a peer reads 1,162 member records
    a round at 32 peers and 1,362 at 128 (1.17x). With every record listed, 1,499 and 5,689 (3.8x): each read
    of the one member table returned every record."""
    from gradnode.node.config import Config
    from gradnode.node.sim import scenario, virtual

    def members(n: int) -> float:
        out = virtual.run(scenario.of_config(Config(), peers=n, rounds=10, seed=0, committee=(4, 8, 1), compute_s=30.0))
        assert out["violations"] == [] and out["final_hashes"] == 1 and not out["stalled"], (n, out)
        return out["traffic"]["records_read_by_table"]["members"]

    assert members(128) <= 1.3 * members(32)
    monkeypatch.setattr(roster, "lists", lambda key, drawn, announces: True)
    assert members(128) > 2 * members(32)


def test_under_a_committee_only_the_keys_drawn_for_the_last_rounds_vote() -> None:
    """Listing is a claim: an attacker's ledger keys may all list their records, and outnumber the few
    honest keys listed in a round. Votes so count from the keys the reader drew for its last rounds and
    the last round's senders, where the attacker holds its share of the pool."""
    pool = frozenset(f"k{i:03d}" for i in range(200))
    rounds = [cm.draw(cm.Budget(8, 16, 2), r, f"h{r}", pool) for r in range(roster.VOTE_ROUNDS)]
    drawn = set().union(*(c.contributors | c.witnesses for c in rounds))
    got = roster.sampled(pool, rounds, ["newcomer", "k199"])
    assert got == (drawn | {"k199"}) & pool and len(got) < len(pool) // 2
    assert roster.sampled(pool, [None], ["x"]) == pool  # no committee: every voter
    first = cm.draw(cm.Budget(8, 16, 2), 0, cm.GENESIS, frozenset())
    assert roster.sampled(pool, [first], []) == pool  # no pool to draw from yet
    assert roster.sampled(frozenset(), rounds, []) == frozenset()  # before any round: everyone (votes.voters)
