"""The rule every peer applies to tell chains apart and pick the one to follow (protocol/chain.py), and the
address book that lets a peer find its swarm again (node/swarm/addressbook.py)."""

from __future__ import annotations

import random
from pathlib import Path

from gradnode.node.swarm.addressbook import MAX_ENTRIES, AddressBook, with_peer_id
from gradnode.protocol.chain import agree, groups, winner


def tail(prefix: str, newest: int, n: int = 4) -> list[tuple[int, str]]:
    """A chain's newest n states, hashes named by chain: 'a' chain -> 'a0005...'."""
    return [(r, f"{prefix}{r:07x}") for r in range(newest - n + 1, newest + 1)]


def test_agree_on_the_newest_common_round() -> None:
    assert agree(tail("aa", 10), tail("aa", 11)) is True  # one round ahead, same chain
    assert agree(tail("aa", 10), tail("bb", 10)) is False  # a fork
    assert agree(tail("aa", 10), tail("aa", 20)) is None  # nothing in common: a laggard or a far fork
    # shared history, then a split: the newest common round decides
    forked = [(8, "aa0000008"), (9, "aa0000009"), (10, "bb000000a"), (11, "bb000000b")]
    assert agree(tail("aa", 10), forked) is False


def test_the_chain_more_peers_follow_wins_whatever_the_order_of_records() -> None:
    tails = {"p1": tail("aa", 30), "p2": tail("aa", 31), "p3": tail("aa", 30),  # 3 peers, one a round ahead
             "q1": tail("bb", 50), "q2": tail("bb", 50)}  # 2 peers, further in rounds
    for seed in range(5):
        shuffled = dict(random.Random(seed).sample(sorted(tails.items()), len(tails)))
        assert groups(shuffled) == [["p1", "p2", "p3"], ["q1", "q2"]]
        assert winner(shuffled) == ["p1", "p2", "p3"]


def test_a_tie_goes_to_the_group_with_the_lowest_peer_id_and_a_laggard_stands_alone() -> None:
    tails = {"b1": tail("aa", 7), "z1": tail("aa", 7), "a1": tail("bb", 9), "y1": tail("bb", 9),
             "lag": tail("aa", 2)}
    assert groups(tails) == [["a1", "y1"], ["b1", "z1"], ["lag"]]
    assert winner({"x": []}) == [] and winner({}) == []


def test_two_groups_reading_each_other_a_round_apart_reach_the_same_verdict() -> None:
    # group A (3 peers) and group B (2 peers) each read the others' records at a different moment
    seen_by_a = {"a1": tail("aa", 40), "a2": tail("aa", 40), "a3": tail("aa", 41), "b1": tail("bb", 18),
                 "b2": tail("bb", 18)}
    seen_by_b = {"a1": tail("aa", 41), "a2": tail("aa", 42), "a3": tail("aa", 42), "b1": tail("bb", 19),
                 "b2": tail("bb", 20)}
    assert winner(seen_by_a) == winner(seen_by_b) == ["a1", "a2", "a3"]


def test_a_peer_sees_whether_it_lost_to_a_larger_chain_or_only_to_the_tie_rule() -> None:
    from types import SimpleNamespace

    from gradnode.node.swarm.health import chain_view

    def members(**tails: list) -> dict:
        return {p: SimpleNamespace(training=True, chain=t) for p, t in tails.items()}

    # 3 peers: the drifted one ("a1", lowest id) is off the chain of the other two, not in a tie
    view = chain_view(members(b1=tail("aa", 5), c1=tail("aa", 5)), "a1", tail("zz", 5))
    assert (view.on_winner, view.tie, view.winners, view.groups) == (False, False, ["b1", "c1"], 2)
    # one of the two honest records looks stale for a moment: the honest peer sees a 1-1 tie it loses
    view = chain_view(members(a1=tail("zz", 5)), "c1", tail("aa", 5))
    assert (view.on_winner, view.tie, view.mine, view.winners) == (False, True, 1, ["a1"])
    # an even split of two groups of two: a tie, but not one of a peer alone
    view = chain_view(members(a1=tail("zz", 5), b1=tail("zz", 5), d1=tail("aa", 5)), "c1", tail("aa", 5))
    assert (view.on_winner, view.tie, view.mine) == (False, True, 2)
    # the winners see themselves on the winning chain
    assert chain_view(members(a1=tail("zz", 5)), "b1", tail("aa", 5)).on_winner is False
    assert chain_view(members(b1=tail("aa", 5), c1=tail("aa", 5)), "d1", tail("aa", 5)).on_winner is True


def test_address_book_keeps_the_newest_backs_off_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "addressbook.json"
    book = AddressBook(path, me="me")
    book.note([("me", ["/ip4/1.1.1.1/tcp/1"]), ("old", ["/ip4/10.0.0.1/tcp/5"])], now=100.0)
    book.note([("new", ["/ip4/10.0.0.2/tcp/5/p2p/new"])], now=200.0)
    assert "me" not in book.entries
    assert [p for p, _ in book.newest(5)] == ["new", "old"]
    assert book.due(["old", "new"], limit=8, now=0.0) == [("new", ["/ip4/10.0.0.2/tcp/5/p2p/new"]),
                                                        ("old", ["/ip4/10.0.0.1/tcp/5"])]
    book.dialled("old", ok=False, now=0.0)
    book.dialled("old", ok=False, now=0.0)
    assert [p for p, _ in book.due(["old"], limit=8, now=15.0)] == []  # backing off: 10 s, then 20 s
    assert [p for p, _ in book.due(["old"], limit=8, now=21.0)] == ["old"]
    book.save()
    again = AddressBook(path, me="me")
    assert {p: e.maddrs for p, e in again.entries.items()} == {p: e.maddrs for p, e in book.entries.items()}
    book.note(((f"p{i}", [f"/ip4/10.1.{i // 250}.{i % 250}/tcp/1"]) for i in range(MAX_ENTRIES + 10)), now=300.0)
    assert len(book.entries) == MAX_ENTRIES
    path.write_text("{ not json")
    assert AddressBook(path, me="me").entries == {}  # a damaged book costs the addresses, nothing else
    assert with_peer_id("Qm1", ["/ip4/1.2.3.4/tcp/5", "/ip4/1.2.3.4/tcp/5/p2p/Qm1"]) == \
        ["/ip4/1.2.3.4/tcp/5/p2p/Qm1", "/ip4/1.2.3.4/tcp/5/p2p/Qm1"]
