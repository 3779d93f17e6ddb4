"""Getting level with the swarm, as pure rules (protocol/sync.py): which state offers a peer trusts, the order
it downloads them in, replay or download, and what a weight-hash check calls for."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from gradnode.protocol import sync


@dataclass(frozen=True)
class Offer:
    peer: str
    round: int
    param_hash: str


@dataclass(frozen=True)
class Chunked(Offer):
    chunks: tuple[str, ...]


def test_an_offer_no_other_trainer_vouches_for_is_beyond_reach() -> None:
    """One key can offer a state 'far ahead' whose hash only has to match itself; no key vouches for its own
    offer, and with nobody else reporting nothing is beyond reach."""
    reported = {"a": 20, "b": 21, "liar": 500}  # the voting trainers' records (the liar's claims 500)
    assert not sync.beyond_reach(Offer("a", 31, "h"), reported | {"liar": 5})  # b's 21 + RECORD_LAG
    assert sync.beyond_reach(Offer("a", 32, "h"), reported | {"liar": 5})
    assert sync.beyond_reach(Offer("liar", 500, "h"), reported)  # its own record's claim does not count
    assert not sync.beyond_reach(Offer("liar", 500, "h"), {"liar": 500})  # nobody else reports


def test_the_newest_offer_on_the_winning_chain_is_trusted_not_the_most_offered() -> None:
    """Three offers of round 9 on a chain the winners do not list, one of round 8 on theirs: the one on the
    winning chain is trusted (a fork's many offers must not pull a peer onto the losing chain)."""
    offers = [Offer("x", 9, "lost"), Offer("y", 9, "lost"), Offer("z", 9, "lost"), Offer("w", 8, "won"),
              Offer("v", 8, "other")]
    won = sync.trusted_offers(offers, links={(7, "won"), (6, "before")}, expected=lambda r: None)
    assert won == [Offer("w", 8, "won")]
    assert sync.trusted_offers(offers, links={(1, "nothing here")}, expected=lambda r: None) == []


def test_without_a_chain_the_reported_hash_then_the_most_offered_hash_is_trusted() -> None:
    offers = [Offer("x", 9, "a"), Offer("y", 9, "b"), Offer("z", 9, "b")]
    assert sync.trusted_offers(offers, links=None, expected={9: "a"}.get) == [Offer("x", 9, "a")]
    assert sync.trusted_offers(offers, links=None, expected={9: None}.get) == [Offer("y", 9, "b"), Offer("z", 9, "b")]
    # the reported hash nobody offers: an older round whose offers agree with its report
    older = offers + [Offer("w", 8, "c")]
    assert sync.trusted_offers(older, links=None, expected={9: "d", 8: "c"}.get) == [Offer("w", 8, "c")]
    # with no report either, one key's offer alone is its own word, whatever its round: two offerers at least
    lone = [Offer("liar", 500, "made-up"), Offer("a", 9, "h"), Offer("b", 9, "h")]
    assert sync.trusted_offers(lone, links=None, expected=lambda r: None) == [Offer("a", 9, "h"), Offer("b", 9, "h")]
    assert sync.trusted_offers(lone[:2], links=None, expected=lambda r: None) == []
    # chains published that vouch for no state (chain.adoptable's empty set) trust nothing: no fallback (a key
    # could empty the set on purpose, with honest records lagging, and then offer the most or the only state)
    assert sync.trusted_offers(offers, links=set(), expected={9: "a"}.get) == []


def test_a_look_takes_a_newer_state_at_a_start_its_own_round_on_after_a_mismatch_and_any_after_a_lost_fork() -> None:
    """The oldest offer a look may take (its round: the state after the round before it), for a peer at round 7:
    the node's Sync.level and the simulator's re-sync read the same rule."""
    assert sync.lowest_round(7, resync=False, fork=False) == 8  # a start or resume: only a newer state
    assert sync.lowest_round(7, resync=True, fork=False) == 7  # a hash mismatch: its own round's state on
    assert sync.lowest_round(7, resync=True, fork=True) == 0  # a lost fork: the winners' links decide


def test_the_largest_group_of_offers_with_the_same_chunks_is_downloaded_first() -> None:
    chunks = {"a": ("1", "2"), "b": ("1", "2"), "c": ("1", "3"), "d": ("1", "4")}
    offers = [Chunked(p, 9, "h", chunks[p]) for p in "cabd"]
    order = sync.download_order(offers)
    assert [[o.peer for o in g] for g in order] == [["a", "b"], ["c"], ["d"]]


@given(behind=st.integers(-3, 20), window=st.integers(0, 10), replay=st.integers(0, 10**6),
       state=st.integers(1, 10**6))
def test_a_peer_replays_only_missed_rounds_it_can_replay_more_cheaply(behind: int, window: int, replay: int,
                                                                     state: int) -> None:
    choice = sync.replay_or_download(behind=behind, window=window, replay_bytes=replay, state_bytes=state)
    assert (choice is sync.CatchUp.REPLAY) == (0 < behind <= window and replay < state)


@given(st.integers(0, 50), st.lists(st.integers(0, 60), max_size=8))
def test_a_starting_peer_looks_for_a_newer_state_only_when_a_record_names_a_later_round(own: int,
                                                                                        others: list[int]) -> None:
    assert sync.newer_in_sight(own, others) == (max(others, default=-1) > own)
    assert not sync.newer_in_sight(0, [0, 0, 0])  # a fresh run: nothing to look for
    assert sync.newer_in_sight(own, [*others, own + 1])  # one record past ours is enough (a record lags its peer)


def test_a_mismatch_counts_only_on_a_round_since_the_last_resync() -> None:
    """A mismatch on a round before the last re-sync is on weights replaced since: nothing to repair (the peer
    core's hash check reads it: tests/test_peer_core.py)."""
    assert sync.mismatch_counts(7, trusted_from=5) and not sync.mismatch_counts(4, trusted_from=5)
    assert not sync.mismatch_counts(None, trusted_from=0)


def test_the_run_is_over_only_when_most_of_the_peers_ledger_says_so() -> None:
    """A peer that comes back after its swarm finished sees nobody train: the run is over for it when more than
    half the contributors its ledger knows (itself aside) stored that they reached the run's last round."""
    A, B, C = "aa" * 8, "bb" * 8, "cc" * 8
    ledger = {"me": 9, "a": 9, "b": 9, "c": 8}
    done = {"a": (10, A, 500.0), "b": (10, A, 501.0)}
    assert sync.run_over(done, ledger, "me", 10) == (10, A)
    assert sync.run_over({"a": (10, A, 500.0)}, ledger, "me", 10) is None  # one of three: a liar, a split's side
    assert sync.run_over(done, ledger, "me", 12) is None  # they stopped before this peer's last round
    assert sync.run_over(done, {}, "me", 10) is None  # a fresh peer knows nobody's work: it believes nobody
    strangers = {f"s{i}": (10, B, 500.0) for i in range(50)}  # keys outside the ledger count for nothing
    assert sync.run_over({**strangers, "a": (10, A, 500.0)}, ledger, "me", 10) is None
    assert sync.run_over({"me": (10, C, 500.0), "a": (10, A, 500.0)}, {"me": 1, "a": 1}, "me", 10) == (10, A)
    # records older than this peer's newest state are an earlier run's under the same run id and keys
    assert sync.run_over(done, ledger, "me", 10, since=500.5) is None
    assert sync.run_over(done, ledger, "me", 10, since=499.0) == (10, A)
    # a record dated past the reader's clock (more than clocks disagree) would pass every later run's ``since``
    assert sync.run_over(done, ledger, "me", 10, now=501.0 - sync.FUTURE_S) == (10, A)
    assert sync.run_over(done, ledger, "me", 10, now=500.5 - sync.FUTURE_S) is None  # b's, 0.5 s past the bound
    # banned or revoked keys have no say, and do not count among those asked either
    assert sync.run_over(done, ledger, "me", 10, banned={"b"}) is None  # a of {a, c}: no majority
    assert sync.run_over(done, ledger, "me", 10, banned={"c"}) == (10, A)  # a and b of {a, b}
    # most name one end; a tie between ends goes to the lower round, then the lower hash (the same on every
    # peer; a liar's far round wins no tie)
    mixed = {"a": (10, A, 500.0), "b": (11, B, 500.0), "c": (11, B, 500.0)}
    assert sync.run_over(mixed, ledger, "me", 10) == (11, B)
    assert sync.run_over({"a": (2**40, B, 500.0), "b": (10, A, 500.0)}, {"a": 1, "b": 1}, "me", 10) == (10, A)


def test_who_asks_whether_the_run_is_over() -> None:
    """A peer that sees nobody asks; a resumed one asks before it trains with trainers short of the last round
    (others back after the run's end), never between rounds, never with a finisher in sight, never in a run
    without a last round."""
    assert sync.asks_if_over([], enough=False, resumed=False, target=10)
    assert sync.asks_if_over([3, 4], enough=True, resumed=True, target=10)  # two back after the end
    assert not sync.asks_if_over([3, 4], enough=True, resumed=False, target=10)  # between rounds: no DHT read
    assert not sync.asks_if_over([3, 10], enough=True, resumed=True, target=10)  # a finisher lingers: catch up
    assert not sync.asks_if_over([3], enough=False, resumed=True, target=10)  # too few: it waits with them
    assert not sync.asks_if_over([3, 4], enough=True, resumed=True, target=0)  # a run with no last round


@given(ledger=st.sets(st.sampled_from("abcdefgh"), max_size=8), banned=st.sets(st.sampled_from("abcxy")),
       told=st.dictionaries(st.sampled_from("abcdefghxyz"), st.tuples(
           st.integers(0, 12), st.sampled_from(["aa" * 8, "bb" * 8]), st.floats(0.0, 1000.0))))
def test_the_runs_end_needs_a_majority_of_the_ledger_whatever_the_others_say(ledger: set[str], banned: set[str],
                                                                          told) -> None:
    over = sync.run_over(told, dict.fromkeys(ledger, 0), "a", 10, since=500.0, now=800.0 - sync.FUTURE_S,
                         banned=banned)
    asked = ledger - {"a"} - banned
    backers = [p for p, (r, h, t) in told.items() if p in asked and r >= 10 and 500.0 <= t <= 800.0]
    assert (over is not None) == (2 * len(backers) > len(asked) > 0)
    assert over is None or over in [told[p][:2] for p in backers]


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.floats(0, 2_000), st.integers(0, 3)), max_size=20),
       st.floats(0, 1_000))
def test_each_keys_newest_record_whatever_their_order_none_dated_ahead_or_too_old(
        records: list[tuple[str, float, int]], oldest: float) -> None:
    """What a waiting peer reads of the run's end and what a bootstrap keeps of it (``newest_per_key``): one a key,
    its newest in range; a record dated ahead (a lie that would outlive every later one) hides nothing."""
    now = 1_000.0
    got = sync.newest_per_key(records, now, oldest=oldest)
    assert got == sync.newest_per_key(list(reversed(records)), now, oldest=oldest)
    in_range = [(k, t, v) for k, t, v in records if oldest <= t <= now + sync.FUTURE_S]
    assert got == {k: max((t, v) for q, t, v in in_range if q == k) for k, _, _ in in_range}
    assert sync.newest_per_key([*records, ("a", now + sync.FUTURE_S + 1, 9)], now, oldest=oldest) == got


def test_a_bootstrap_keeps_each_keys_newest_finished_record_within_its_life_and_the_cap() -> None:
    now, ttl = 10_000.0, 1_000.0
    seen = [("a", 9_500.0, b"a-old"), ("a", 9_900.0, b"a-new"), ("b", 8_000.0, b"b-expired"),
            ("c", now + sync.FUTURE_S + 1, b"c-ahead"), ("d", now + 30, b"d-slightly-ahead"), ("e", 9_000.0, b"e")]
    assert sync.kept_finished([], seen, now, ttl, cap=10) == [b"a-new", b"d-slightly-ahead", b"e"]
    assert sync.kept_finished([], seen, now, ttl, cap=2) == [b"a-new", b"e"]  # newcomers: the earliest dated
    assert sync.kept_finished([], reversed(seen), now, ttl, cap=10) == sync.kept_finished([], seen, now, ttl, cap=10)
    # what was kept stays when it is no longer in the DHT, but not past its life
    assert sync.kept_finished([("a", 9_900.0, b"a-new"), ("b", 8_000.0, b"b-expired")], [], now, ttl, 10) == [b"a-new"]


def test_a_flood_of_keys_dating_their_records_ahead_never_pushes_kept_finishers_out() -> None:
    now, ttl = 10_000.0, 1_000.0
    kept = [("a", 9_900.0, b"a"), ("b", 9_950.0, b"b")]
    flood = [(f"sybil{i:03d}", now + sync.FUTURE_S - 1, b"s%d" % i) for i in range(200)]
    after = sync.kept_finished(kept, [*flood, ("a", 9_990.0, b"a-again")], now, ttl, cap=3)
    assert after == [b"a-again", b"b", b"s0"]  # a kept key's newer record takes no room of its own


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.floats(500, 1_000 + sync.FUTURE_S)),
       st.lists(st.tuples(st.sampled_from("cdefghij"), st.floats(0, 2_000)), max_size=30), st.integers(0, 10))
def test_what_a_bootstrap_keeps_is_bounded_one_a_key_and_keeps_what_it_kept(kept_at: dict[str, float],
                                                                           seen_at: list[tuple[str, float]],
                                                                           cap: int) -> None:
    now, ttl = 1_000.0, 500.0
    kept = [(p, t, f"{p}@{t!r}".encode()) for p, t in kept_at.items()]  # alive, as a bootstrap kept them
    seen = [(p, t, f"{p}@{t!r}".encode()) for p, t in seen_at]
    after = sync.kept_finished(kept, seen, now, ttl, cap)
    assert after == sync.kept_finished(kept, list(reversed(seen)), now, ttl, cap)
    owners = [raw.split(b"@")[0].decode() for raw in after]
    assert len(owners) == len(set(owners))  # one a key
    alive = {p for p, t, _ in seen if now - ttl <= t <= now + sync.FUTURE_S} | set(kept_at)
    if len(kept) <= cap:
        assert set(kept_at) <= set(owners)  # what was kept stays, whatever came since
    assert len(after) == min(cap, len(alive))
    for p in owners:  # each key's newest alive record
        t = max(t for q, t, _ in [*kept, *seen] if q == p and now - ttl <= t <= now + sync.FUTURE_S)
        assert f"{p}@{t!r}".encode() in after
