"""The peer core (protocol/peer.py): a peer's rules between rounds, driven by events alone. Each test names the
rule it guards; the node (node/swarm/peer.py) and the simulator (node/sim/virtual.py) run these rules, and their
own tests (test_swarm.py, test_virtual.py) check that they carry the actions out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gradnode.protocol import chain
from gradnode.protocol import peer as pc
from gradnode.protocol.peer import Check, Reason, Why

ME = "me"
HONEST = ((4, "h4"), (5, "h5"), (6, "h6"), (7, "h7"))
FORKED = ((4, "h4"), (5, "h5"), (6, "m6"), (7, "m7"))


def chains(mine: tuple = FORKED, **tails: tuple) -> pc.Chains:
    return pc.Chains({ME: mine, **tails})


def check(core: pc.PeerCore, *, mine: str | None, reports: dict[str, str], looked: pc.Chains, round_: int = 6,
          now: float = 0.0, how: Check = Check.ROUND) -> pc.Action:
    return core.step(pc.HashChecked(now, round_, 8, mine, reports, looked, how))


def test_off_the_winning_chain_and_off_the_majority_a_peer_resyncs_at_once() -> None:
    """Both signals agree: a re-sync towards a state of its own round on, for max_wait_s (a state of an older
    round would have it redo rounds it may split again)."""
    core = pc.PeerCore(ME, pc.Params(max_wait_s=50.0))
    act = check(core, mine="m6", reports=dict.fromkeys("abc", "h6"), looked=chains(a=HONEST, b=HONEST, c=HONEST))
    assert act == pc.Resync(Reason.HASH_MISMATCH, lowest_round=8, look_s=50.0)


def test_off_the_majority_while_its_chain_wins_a_peer_stays() -> None:
    """The chain rule decides; the reports only hasten it (chain.Follow): the reports and the tails are read at
    different moments, and a healed 2|2 split stayed split when either signal alone moved a peer."""
    core = pc.PeerCore(ME)
    act = check(core, mine="m6", reports=dict.fromkeys("cxy", "h6"), looked=chains(a=FORKED, b=FORKED, c=HONEST))
    assert act == pc.Stay(Why.CHAIN_WINS)
    # the reports of allies holding our state of the round count for our hash: not off the majority at all
    act = check(core, mine="m6", reports=dict.fromkeys("abc", "h6"), looked=chains(a=FORKED, b=FORKED, c=HONEST))
    assert act == pc.Stay(Why.ON_WINNER)


def test_off_the_winning_chain_alone_a_peer_looks_again_after_two_looks_and_then_forks() -> None:
    """Off the winning chain with its hash on the majority: stay one look, look again at the second; a fresh look
    still off it adopts a state most of the winners' tails list, whatever its round, for FORK_SYNC_S at most."""
    core = pc.PeerCore(ME)
    looked = chains(a=HONEST, b=HONEST)
    assert check(core, mine="m6", reports={}, looked=looked) == pc.Stay(Why.LOOKING)
    assert check(core, mine="m6", reports={}, looked=looked) == pc.LookAgain()
    act = core.step(pc.ChainsLooked(1.0, 8, looked))
    assert act == pc.Resync(Reason.FORK, lowest_round=0, look_s=pc.FORK_SYNC_S, links=frozenset(HONEST))
    # a fresh look that finds it on the winner (the others merged onto its chain meanwhile): it stays
    assert core.step(pc.ChainsLooked(1.0, 8, chains(a=FORKED, b=FORKED))) == pc.Stay()


def test_a_fork_sync_takes_only_a_state_most_of_the_winners_list() -> None:
    """A tail is a claim: a key listing a made-up state after the honest chain's newest agrees with every honest
    tail; the fork adopts only links more than half of the winners list, and none at all while records lag."""
    core = pc.PeerCore(ME)
    made_up = HONEST[:3] + ((8, "made-up"),)
    act = core.step(pc.ChainsLooked(0.0, 8, chains(a=HONEST, b=HONEST, c=made_up)))
    assert isinstance(act, pc.Resync) and (8, "made-up") not in act.links and set(HONEST[:3]) <= act.links
    # a's record is of round 7, b just re-synced (one state), c's a round behind; x lists c's oldest and its own:
    # no state is listed by more than 2 of the 4
    lagging = chains(a=HONEST, b=HONEST[-1:], c=((3, "h3"),) + HONEST[:3], x=((3, "h3"), (9, "x")))
    assert core.step(pc.ChainsLooked(0.0, 8, lagging)) == pc.Stay(Why.NO_STATE_YET)


def test_a_check_of_a_round_before_the_adopted_state_is_moot() -> None:
    """A hash check read before a re-sync, of a round the adopted state replaced: nothing to repair (a peer
    re-synced twice in a row for one drift). One of the adopted state's round on counts again."""
    core = pc.PeerCore(ME)
    core.step(pc.StateAdopted(0.0, 7))
    looked = chains(a=HONEST, b=HONEST, c=HONEST)
    assert check(core, mine="m6", reports=dict.fromkeys("abc", "h6"), looked=looked) == pc.Stay(Why.LOOKING)
    act = check(core, mine="m7", reports=dict.fromkeys("abc", "h7"), looked=looked, round_=7)
    assert isinstance(act, pc.Resync) and act.reason is Reason.HASH_MISMATCH


def test_an_adopted_state_clears_the_looks_before_it() -> None:
    """Looks before a new state say nothing about it: one look off the winning chain, an adoption, then one more
    look off it is the first of two, not the second."""
    core = pc.PeerCore(ME)
    looked = chains(a=HONEST, b=HONEST)
    assert check(core, mine=None, reports={}, looked=looked) == pc.Stay(Why.LOOKING)
    core.step(pc.StateAdopted(1.0, 5))
    assert check(core, mine=None, reports={}, looked=looked) == pc.Stay(Why.LOOKING)
    assert check(core, mine=None, reports={}, looked=looked) == pc.LookAgain()


def test_with_no_verdict_a_peer_off_a_vouched_majority_resyncs_after_three_looks() -> None:
    """Two keys list one made-up round under two hashes after the honest chain's newest: every honest tail is
    unsure, no verdict stands, and nobody leaves its chain by the chain rule. Off the reports' majority in
    UNSETTLED_LOOKS looks, a majority whose state most tails list, the peer re-syncs; one no tail vouches for
    (an even split some keys tip) would find nothing to adopt: it waits."""
    unsure = chains(FORKED[:3], a=HONEST, b=HONEST, c=HONEST, x=HONEST + ((8, "x8"),), y=HONEST + ((8, "y8"),))
    assert not chain.standing(unsure.tails, ME).decided
    core = pc.PeerCore(ME)
    acts = [check(core, mine="m6", reports=dict.fromkeys("abc", "h6"), looked=unsure)
            for _ in range(chain.UNSETTLED_LOOKS)]
    assert acts[-1] == pc.Resync(Reason.HASH_MISMATCH, 8, 120.0) and set(acts[:-1]) == {pc.Stay(Why.CHAIN_WINS)}
    core = pc.PeerCore(ME)
    assert {check(core, mine="m6", reports=dict.fromkeys("abc", "nobody's"), looked=unsure)
            for _ in range(5)} == {pc.Stay(Why.CHAIN_WINS)}


def test_the_last_round_follows_the_reports_unless_the_chain_rule_says_ours_wins() -> None:
    """Nobody publishes a newer tail after the run's end, so a drift in the last round shows in the reports alone:
    off their majority, the peer re-syncs, even on the winning chain, when the majority's hash is on the winner's
    chain or on nobody's tail (a key's tail that disagrees with everyone must not switch the repair off). It stays
    when its chain wins over the chain the majority's hash is on."""
    last = lambda core, reports, looked: check(core, mine="m7", reports=reports, looked=looked,  # noqa: E731
                                               round_=7, how=Check.LAST)
    drifted = chains(HONEST[:3] + ((7, "m7"),), a=HONEST, b=HONEST)
    assert last(pc.PeerCore(ME), dict.fromkeys("ab", "h7"), drifted) == pc.Resync(Reason.LAST_ROUND, 8, 120.0)
    assert last(pc.PeerCore(ME), dict.fromkeys("ab", "m7"), drifted) == pc.Stay()
    # ours wins 3-2 by the tails, while two reports and a late third tip the hash count to the losers' hash
    ours = chains(FORKED, a=FORKED, b=FORKED, c=HONEST, d=HONEST)
    assert last(pc.PeerCore(ME), dict.fromkeys("cde", "h7"), ours) == pc.Stay(Why.CHAIN_WINS)
    # a majority's hash that no tail lists: the reports are followed
    assert last(pc.PeerCore(ME), dict.fromkeys("cde", "z7"), ours) == pc.Resync(Reason.LAST_ROUND, 8, 120.0)


def test_a_lingering_peer_serves_a_peer_behind_for_a_while_and_one_on_another_chain_longer() -> None:
    """Leaving at once left a contributor that ended on another hash alone (its re-sync found no state offer):
    a finished peer serves while others do not hold its state, a peer behind its round for BEHIND_S at most, one
    on another chain for LINGER_S at most, and leaves at once when everyone holds it."""
    core = pc.PeerCore(ME)
    core.step(pc.Finished(100.0))
    mine = HONEST
    other = HONEST[:3] + ((7, "o7"),)
    linger = lambda now, rounds, **tails: core.step(pc.Lingering(now, 8, pc.Chains({ME: mine, **tails}),  # noqa: E731
                                                                 rounds))
    assert linger(100.5, {"a": 8, "b": 6}, a=HONEST, b=HONEST[:2]) == pc.Linger(("b",))
    assert linger(100.0 + pc.BEHIND_S, {"a": 8, "b": 6}, a=HONEST, b=HONEST[:2]) == pc.Leave()
    assert linger(120.0, {"a": 8, "c": 8}, a=HONEST, c=other) == pc.Linger(("c",))
    assert linger(100.0 + pc.LINGER_S, {"a": 8, "c": 8}, a=HONEST, c=other) == pc.Leave(("c",))
    assert linger(101.0, {"a": 8}, a=HONEST) == pc.Leave()


def test_a_lingering_peer_off_the_winning_chain_follows_it_but_not_a_tie() -> None:
    """The run is over here, not for the chain rule: a finished peer whose last check came before the others
    settled on the other side of a merge ended alone on its hash. Off the winning chain in two looks (LOOK_S
    apart) it looks again; off it only by the lowest-id rule (at the end of a run those who agree with it may
    have left already) it stays."""
    core = pc.PeerCore(ME)
    core.step(pc.Finished(0.0))
    two = pc.Chains({ME: FORKED, "a": HONEST, "b": HONEST})
    acts = [core.step(pc.Lingering(t, 8, two, {"a": 8, "b": 8})) for t in (0.5, pc.LOOK_S, pc.LOOK_S + 0.5,
                                                                           2 * pc.LOOK_S)]
    assert acts == [pc.Linger(("a", "b"))] * 3 + [pc.LookAgain()]
    core = pc.PeerCore("b")  # 'b' loses a 1-1 tie to 'a' by the lowest id
    core.step(pc.Finished(0.0))
    tie = pc.Chains({"b": FORKED, "a": HONEST})
    assert {core.step(pc.Lingering(t, 8, tie, {"a": 8})) for t in range(2, 40, 2)} == {pc.Linger(("a",))}


def test_a_start_takes_only_a_newer_state_and_a_repair_its_own_round_on() -> None:
    """protocol/sync.py lowest_round, per reason: a start or a catch-up a state newer than its own, for a short
    look; a hash mismatch's or the last round's a state of its own round on; a fork's any state of its chain."""
    p = pc.Params(max_wait_s=90.0)
    assert pc.resync(Reason.JOIN, 5, p) == pc.Resync(Reason.JOIN, 6, pc.JOIN_LOOK_S)
    assert pc.resync(Reason.CATCH_UP, 5, p).lowest_round == 6
    assert pc.resync(Reason.LAST_ROUND, 5, p) == pc.Resync(Reason.LAST_ROUND, 5, 90.0)
    assert pc.resync(Reason.FORK, 5, pc.Params(max_wait_s=4.0), {(3, "h")}) == \
        pc.Resync(Reason.FORK, 0, 4.0, frozenset({(3, "h")}))


links = st.lists(st.tuples(st.integers(3, 8), st.sampled_from(["h", "m", "x"])), max_size=4, unique_by=lambda t: t[0])
tails_of = st.dictionaries(st.sampled_from(["a", "b", "c", "d", ME]),
                           links.map(lambda t: tuple(sorted((r, f"{h}{r}") for r, h in t))), max_size=5)
reports_of = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["h6", "m6", "x6"]), max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(tails_of, reports_of, st.sampled_from(["h6", "m6", None])), min_size=1, max_size=8))
def test_the_same_events_give_the_same_actions_and_a_resync_needs_a_cause(looks: list) -> None:
    """Pure: two cores fed the same events answer alike. A hash check's re-sync needs this peer off the reports'
    majority, and a look again needs it off the winning chain."""
    a, b = pc.PeerCore(ME), pc.PeerCore(ME)
    for i, (tails, reports, mine) in enumerate(looks):
        event = pc.HashChecked(float(i), 6, 8, mine, reports, pc.Chains(tails))
        act = a.step(event)
        assert act == b.step(event)
        if isinstance(act, pc.Resync):
            assert pc.off_majority(reports, mine, pc.Chains(tails), 6, ME) is not None
        if isinstance(act, pc.LookAgain):
            assert not chain.standing(tails, ME).on_winner


@given(st.integers(0, 50), st.integers(1, 60), st.booleans())
def test_a_late_round_is_sat_out_unless_it_is_the_last(round_: int, rounds: int, late: bool) -> None:
    """A round whose deadline is too near for the fewest steps is sat out and the next computed (its update
    would come after the others decided); the run's last round never is: no round comes after it."""
    got = pc.to_compute(round_, rounds, late)
    if late and round_ + 1 < rounds:
        assert got == pc.Compute(round_ + 1, sat_out=round_)
    else:
        assert got == pc.Compute(round_)


def test_a_hash_check_waits_for_the_next_round_except_after_the_last() -> None:
    """Behind the next round's inner steps, normally; after the run's last round nothing hides it: the pipeline
    drains and acts on it at once. A run with no set number of rounds never drains."""
    assert not pc.settle_at_once(8, 10) and pc.settle_at_once(9, 10) and pc.settle_at_once(10, 10)
    assert not pc.settle_at_once(10**6, float("inf"))
