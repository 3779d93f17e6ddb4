"""The rule every peer applies to tell chains apart and pick the one to follow (protocol/chain.py), and the
address book that lets a peer find its swarm again (node/swarm/addressbook.py)."""

from __future__ import annotations

import random
from pathlib import Path

from gradnode.node.swarm.addressbook import MAX_ENTRIES, AddressBook, with_peer_id
from gradnode.protocol.chain import (UNSETTLED_LOOKS, Follow, Move, Standing, adoptable, agree, allies_since, groups,
                                     split, standing, unsettled, vouched, winner)

STAY, RESYNC, LOOK = Move.STAY, Move.RESYNC, Move.LOOK_AGAIN


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


def test_a_laggard_from_before_a_fork_never_bridges_its_two_sides_nor_decides_between_them() -> None:
    """A peer whose newest published rounds predate a fork agrees with both sides of it. Grouped transitively,
    it made the two sides one chain: nobody saw the fork, and nobody left the losing side (found by the
    simulator: a peer stuck rounds behind, its record still fresh, hid a split for the rest of the run). It
    is in no group; and while such peers could still tip the count, no verdict stands."""
    forked = lambda side: [(8, "aa0000008"), (9, f"{side}000009"), (10, f"{side}00000a")]  # noqa: E731
    lag = [(6, "aa0000006"), (7, "aa0000007"), (8, "aa0000008")]
    tails = {"a1": forked("x"), "a2": forked("x"), "b1": forked("y"), "b2": forked("y"), "b3": forked("y"), "lag": lag}
    assert split(tails) == ([["b1", "b2", "b3"], ["a1", "a2"]], ["lag"])
    assert groups(tails) == [["b1", "b2", "b3"], ["a1", "a2"], ["lag"]]
    # 3 to 2 with one peer that cannot tell: it could make 3-3, so nobody moves yet
    assert standing(tails, "a1").on_winner and winner(tails) == []
    # a round later it has told: 4 to 2, the pair loses, the laggard is on the winning chain
    tails["lag"] = forked("y")
    assert standing(tails, "a1") == Standing(False, False, ("b1", "b2", "b3", "lag"), 2)
    assert standing(tails, "lag").on_winner and winner(tails) == ["b1", "b2", "b3", "lag"]
    # without the laggard the verdict stands at once
    del tails["lag"]
    assert not standing(tails, "a2").on_winner and standing(tails, "b2").on_winner


def test_records_a_round_behind_and_a_made_up_round_split_no_honest_chain() -> None:
    """Records lag: two honest peers published round 10, three still show round 9. A key publishing round 10
    with a made-up hash makes the three agree with two tails that disagree. Given a group of their own, they
    outnumbered the two ahead, which then rolled back a round by a state download (found in review); the
    same came of an honest drifted peer. They count for nobody until they publish round 10."""
    a = [(8, "aa0000008"), (9, "aa0000009"), (10, "aa000000a")]
    behind = a[:2]
    tails = {"p1": a, "p2": a, "p3": behind, "p4": behind, "p5": behind, "key": a[:2] + [(10, "made-up")]}
    assert split(tails) == ([["p1", "p2"], ["key"]], ["p3", "p4", "p5"])
    assert all(standing(tails, p).on_winner for p in ("p1", "p2", "p3", "p4", "p5"))
    # a drifted honest peer instead of the key: nobody moves until the three tell, then the drifted one does
    tails["key"] = a[:2] + [(10, "drifted")]
    assert all(standing(tails, p).on_winner for p in tails)
    tails.update(p3=a, p4=a, p5=a)
    assert not standing(tails, "key").on_winner and all(standing(tails, p).on_winner for p in ("p1", "p3"))


def test_a_state_one_key_lists_ahead_of_the_chain_is_never_adoptable() -> None:
    """A key whose tail is the honest chain's plus a made-up state after its newest agrees with every honest tail
    (they share the rounds before it): the chain rule counts it on the winning chain. A state only some winners list
    is not adoptable; one more than half of them list is. Found by the simulator's 'futurestate' liars (a joiner took
    a state claimed 5 rounds ahead in 40 of 40 runs before; docs/notes/swarm.md)."""
    honest = {p: tail("aa", 20) for p in ("p1", "p2", "p3")}
    liar = tail("aa", 20) + [(25, "made-up")]
    tails = {**honest, "liar": liar}
    assert winner(tails) == ["liar", "p1", "p2", "p3"]  # one chain, by the rule
    assert adoptable(tails) == set(tail("aa", 20)) and (25, "made-up") not in adoptable(tails)
    # records lag: one honest peer a round ahead lists a state nobody else does yet; the others' newest is adoptable
    ahead = {**tails, "p3": tail("aa", 21)}
    assert (21, "aa0000015") not in adoptable(ahead) and (20, "aa0000014") in adoptable(ahead)
    # a lone peer on the chain (a run of two) vouches for its own states, as before
    assert adoptable({"p1": tail("aa", 20)}) == set(tail("aa", 20))
    assert vouched(tails, ["p1", "liar"]) == set(tail("aa", 20))  # 1 of 2 is not more than half
    assert adoptable({}) is None and adoptable({"p1": []}) is None  # no chain published: the reports decide
    # honest records lagging and one just re-synced (a tail of one state): a verdict stands, and nothing is listed
    # by more than half of the four; the key's made-up state, 5 rounds on, is not adoptable, nor is anything else
    lagging = {"h1": tail("aa", 20), "h2": tail("aa", 20, 1), "h3": tail("aa", 19), "x": [(16, "aa0000010"),
                                                                                      (25, "made-up")]}
    assert winner(lagging) == ["h1", "h2", "h3", "x"] and adoptable(lagging) == set()


def test_with_no_verdict_only_what_most_tails_list_is_adoptable() -> None:
    """Two keys listing one made-up round under two hashes after the honest chain's newest: every honest tail agrees
    with both, so every honest peer is unsure (``split``) and no verdict stands. Before, the look then fell back to
    the hash most offerers give, and the made-up states were the newest offered: every joiner took one in 40 of 40
    simulated runs. Now it takes what more than half of all tails list."""
    honest = {p: tail("aa", 20) for p in ("p1", "p2", "p3", "p4")}
    tails = {**honest, "x": tail("aa", 20) + [(21, "x-made")], "y": tail("aa", 20) + [(21, "y-made")]}
    assert winner(tails) == []
    assert adoptable(tails) == set(tail("aa", 20))
    # a healed even split (2|2, no verdict yet while a laggard cannot tell): only the rounds before it
    side = lambda s: [(8, "aa0000008"), (9, f"{s}000009"), (10, f"{s}00000a")]  # noqa: E731
    even = {"a1": side("x"), "a2": side("x"), "b1": side("y"), "b2": side("y"),
            "lag": [(7, "aa0000007"), (8, "aa0000008")]}
    assert winner(even) == [] and adoptable(even) == {(8, "aa0000008")}


def test_the_chain_rule_decides_and_the_reports_only_hasten_it() -> None:
    """chain.Follow: off the winning chain in two looks in a row, look again and follow it; off it and off the
    reports' majority at once, re-sync now; off the majority while the chain rule says ours wins, stay (acting
    on the reports alone let both sides of a healed 2|2 split adopt each other's chain); a peer that lost a
    1-1 tie alone waits four looks."""
    lost, won, tie = Standing(False, False, ("b",), 2), Standing(True, False, ("a",), 2), Standing(False, True, ("b",), 2)
    f = Follow()
    assert [f.step(won, True), f.step(won, True)] == [STAY, STAY]  # the reports say we lost: the chain rule not
    assert [f.step(lost, False), f.step(lost, False)] == [STAY, LOOK]
    assert Follow.confirm(lost) and not Follow.confirm(won)
    assert Follow().step(lost, True) == RESYNC
    f = Follow()
    assert [f.step(tie, False) for _ in range(4)] == [STAY, STAY, STAY, LOOK]
    f = Follow()
    assert [f.step(lost, False), f.step(won, False), f.step(lost, False)] == [STAY, STAY, STAY]  # not in a row


def test_with_no_verdict_for_three_looks_a_peer_off_the_reports_majority_re_syncs() -> None:
    """While no verdict stands, everybody counts as on the winning chain (``standing``). A split's laggards tell
    within a round or two; two keys listing one made-up round under two hashes keep every honest tail unsure for
    good, and a peer off the chain stayed off it (the simulator: 2 of 40 seeds ended on two hashes). Off the
    reports' majority in UNSETTLED_LOOKS looks in a row with no verdict, the majority's state one more than half
    of all tails list, it re-syncs; a verdict or a look on the majority in between starts the count again. Off a
    majority whose state the tails do not vouch for (an even split; reports a few keys tip), it waits: a re-sync
    would find nothing to adopt and hold its main loop for max_wait_s (a reviewer's find)."""
    honest = {p: tail("aa", 20) for p in ("p1", "p2", "p3", "p4")}
    tails = {**honest, "x": tail("aa", 20) + [(21, "x-made")], "y": tail("aa", 20) + [(21, "y-made")],
             "me": tail("aa", 17) + [(18, "forked"), (19, "forked")]}
    st = standing(tails, "me")
    assert st.on_winner and not st.decided
    assert UNSETTLED_LOOKS == 3
    f = Follow()
    assert [f.step(st, True, True) for _ in range(3)] == [STAY, STAY, RESYNC]
    assert [f.step(st, False, True) for _ in range(4)] == [STAY] * 4  # on the majority: nothing, however long
    assert [f.step(st, True, False) for _ in range(4)] == [STAY] * 4  # a majority no tails vouch for: nothing
    won = Standing(True, False, ("a",), 2)
    f = Follow()
    assert [f.step(st, True, True), f.step(st, True, True), f.step(won, True, True), f.step(st, True, True)] == \
        [STAY] * 4  # not in a row
    assert [f.step(st, True, True), f.step(st, True, True)] == [STAY, RESYNC]
    # three keys whose tails agree and disagree in a cycle with the honest one leave every tail unsure, found
    # by none of the groups: no verdict either (a reviewer's find: it read as a verdict, and nobody ever moved)
    h = [(9, "h9"), (10, "h10")]
    cycle = {"h": h, "x": h + [(11, "a")], "y": [(9, "y"), (11, "a"), (12, "c")], "z": h + [(11, "b"), (12, "c")]}
    assert split(cycle) == ([], ["h", "x", "y", "z"])
    assert not standing(cycle, "h").decided and standing({"h": h}, "h").decided


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
    # a 1-1 tie whose lowest id is a client-mode peer (its record: reachable False) goes to the peer that serves:
    # nobody could download the client's state; the client (it can dial out) is the one off the winning chain
    assert chain_view(members(a1=tail("zz", 5)), "c1", tail("aa", 5), serving={"c1"}).on_winner is True
    assert chain_view(members(c1=tail("aa", 5)), "a1", tail("zz", 5), serving={"c1"}).on_winner is False
    assert winner({"a1": tail("zz", 5), "c1": tail("aa", 5)}, serving={"c1"}) == ["c1"]
    assert winner({"a1": tail("zz", 5), "c1": tail("aa", 5)}) == ["a1"]  # no word of who serves: as before


def off_majority(reports: list, mine: str | None, view, round_: int, serving: set[str] | None = None) -> str | None:
    """The peer core's hash check (protocol/peer.py) of weight reports against a look at the chains."""
    from gradnode.protocol import peer as peer_core

    return peer_core.off_majority({w.peer: w.param_hash for w in reports}, mine,
                                  peer_core.Chains(view.tails, serving), round_, view.me)


def test_a_weight_report_of_a_chain_its_author_has_left_counts_for_the_chain_it_follows() -> None:
    """After a 2-2 split heals, the losing pair adopts the winners' chain; its weight reports of the rounds
    before the merge still name its old chain, tie 2-2 with the winners', and the tie (the lowest peer id)
    can go to the old chain. In CI the winners then re-synced towards a state nobody offered any more,
    stalled max_wait_s, and the run ended split 2|2. A report's author seen following our chain now counts
    for our hash; one still on its old chain (or out of sight) counts as it reported."""
    from types import SimpleNamespace

    from gradnode.node.swarm.health import chain_view
    from gradnode.protocol.records import WeightHash

    def members(**tails: list) -> dict:
        return {p * 10: SimpleNamespace(training=True, chain=t) for p, t in tails.items()}

    def reports(**hashes: str) -> list:  # peer ids of 20 base58 characters, hashes in hex
        return [WeightHash(run_id="r", round=12, peer=p * 10, param_hash=h) for p, h in hashes.items()]

    # round 12: c3, c4 ("a" chain) against a1, b2 (the "f" chain, a1 the lowest id): the tie goes to "f"
    old = reports(a1="f" * 8, b2="f" * 8, c3="a" * 8, c4="a" * 8)
    # a1 and b2 adopted the "a" chain at round 13: their tails now end on it
    adopted = [(10, "zz000000a"), (11, "zz000000b"), (12, "zz000000c"), (13, "aa000000d")]
    merged = chain_view(members(a1=adopted, b2=adopted, c4=tail("aa", 13)), "c3" * 10, tail("aa", 13))
    assert sorted(merged.allies) == ["a1" * 10, "b2" * 10, "c4" * 10]
    assert not off_majority(old, "a" * 8, merged, 12)
    # before the merge (a1, b2 still on "f") the tie stands, and the "a" pair is off the majority: the hash
    # check repairs a split this way when the chains are not in sight yet
    split = chain_view(members(a1=tail("zz", 13), b2=tail("zz", 13), c4=tail("aa", 13)), "c3" * 10, tail("aa", 13))
    assert split.allies == ["c4" * 10] and off_majority(old, "a" * 8, split, 12)
    # ... unless the "f" pair are client-mode peers and the "a" pair serve: nobody could download "f"'s state,
    # so the tie goes to "a" and the "f" pair (which can dial out) repair instead
    assert not off_majority(old, "a" * 8, split, 12, serving={"c3" * 10, "c4" * 10})
    # a peer that drifted alone has no ally to count for it; without a hash of the round nothing is checked
    drifted = chain_view(members(a1=tail("aa", 12), b2=tail("aa", 12)), "c3" * 10, tail("aa", 11, 3) + [(12, "x")])
    assert drifted.allies == [] and off_majority(reports(a1="a" * 8, b2="a" * 8, c3="e" * 8), "e" * 8, drifted, 12)
    assert not off_majority(old, None, merged, 12)


def test_an_ally_by_an_older_round_does_not_vote_for_our_hash_of_a_newer_one() -> None:
    """A peer that drifted alone in the run's last round (12) sees its partners' records a round old (ending
    on 11, where it agrees with them): they are its allies by chain, but they say nothing about its hash of
    round 12, and their reports of 12 name another hash: it is off the majority and re-syncs."""
    from types import SimpleNamespace

    from gradnode.node.swarm.health import chain_view
    from gradnode.protocol.records import WeightHash

    others = {p * 10: SimpleNamespace(training=True, chain=tail("aa", 11)) for p in ("a1", "b2", "c3")}
    view = chain_view(others, "d4" * 10, tail("aa", 11, 3) + [(12, "x")])
    assert sorted(view.allies) == ["a1" * 10, "b2" * 10, "c3" * 10] and view.allies_since(12) == []
    assert view.allies_since(11) == sorted(view.allies)
    reports = [WeightHash(run_id="r", round=12, peer=p, param_hash="a" * 8) for p in others]
    assert off_majority(reports, "e" * 8, view, 12)


def test_allies_since_are_the_peers_on_our_chain_holding_our_state_of_the_round() -> None:
    """chain.allies_since, which the node's hash check (protocol/peer.py off_majority) and the simulator's both read: the
    other peers of our group by the chain rule whose tail shares our state of the round or a later one; a peer
    on another chain, one a round behind, and a peer with no tail of its own have none."""
    tails = {"a": tail("aa", 12), "b": tail("aa", 12), "c": tail("aa", 11), "d": tail("zz", 12), "me": tail("aa", 12)}
    assert allies_since(tails, "me", 12) == ["a", "b"]
    assert allies_since(tails, "me", 11) == ["a", "b", "c"]
    assert allies_since({**tails, "me": []}, "me", 11) == [] and allies_since(tails, "nobody", 11) == []
    assert allies_since(tails, "d", 10) == []  # alone on its chain


def test_a_finished_peer_waits_for_the_peers_behind_or_off_its_state() -> None:
    mine = tail("aa", 12)
    others = {"behind": tail("aa", 11), "level": tail("aa", 12), "forked": tail("aa", 11, 3) + [(12, "x")],
              "far": [(10 ** 6, "f")]}
    rounds = {"behind": 12, "level": 13, "forked": 13, "far": 10 ** 6 + 1}
    # behind by its record's round; forked by its hash of round 12; a tail sharing no round is not waited for
    assert unsettled(mine, others, 13, rounds) == ["behind", "forked"]
    assert unsettled(mine, {"level": others["level"]}, 13, {"level": 13}) == []
    # a trainer that is no contributor yet (a joiner) is waited for while behind; its chain is not looked at
    assert unsettled(mine, {}, 13, {"joiner": 0, "level": 13}) == ["joiner"]


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
