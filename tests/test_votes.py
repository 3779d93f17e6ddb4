"""Whose votes count (protocol/votes.py): the contributors ledger, the senders this peer verified, no bans."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gradnode.protocol.votes import CONTRIBUTOR_ROUNDS, voters, workers_after

keys = st.sampled_from([f"k{i}" for i in range(8)])
rounds = st.integers(min_value=0, max_value=200)


def test_the_ledger_and_the_recently_verified_vote_the_banned_do_not() -> None:
    ledger = {"a": 9, "b": 3}
    verified = {"c": 10, "d": 10 - CONTRIBUTOR_ROUNDS, "e": 7}  # d: a round out of the window
    assert voters(ledger, verified, 10) == {"a", "b", "c", "e"}
    assert voters(ledger, verified, 10, banned=["b", "e"]) == {"a", "c"}
    assert voters({}, verified, 10) == frozenset()  # before any round applied: everyone counts
    assert voters(ledger, {}, 10, banned=["a", "b"]) == {"a", "b"}  # never empty while the ledger is not


@given(st.dictionaries(keys, rounds), st.dictionaries(keys, rounds), rounds, st.sets(keys))
def test_voters_are_drawn_from_the_ledger_and_the_window_only(ledger, verified, round_, banned) -> None:
    out = voters(ledger, verified, round_, banned)
    assert bool(out) == bool(ledger)  # empty (everyone) exactly while the ledger is
    recent = {p for p, r in verified.items() if r > round_ - CONTRIBUTOR_ROUNDS}
    assert out <= set(ledger) | recent
    if out - set(ledger) or not set(ledger) <= set(banned):  # not the all-banned fallback
        assert out == (set(ledger) | recent) - set(banned)


def test_a_sender_verified_outside_the_set_votes_once_the_screens_count_it() -> None:
    """Outside the set, the ledger and itself, a verified sender joins the workers when the screens count it
    (not 'x': screened out); workers older than CONTRIBUTOR_ROUNDS are forgotten; with no such sender the
    screens never run (they cost what an apply does)."""
    old = {"w": 10 - CONTRIBUTOR_ROUNDS, "v": 9}
    got = workers_after(old, 10, ["me", "a", "b", "l", "x"], "me", decided=["a"], ledger=["l"],
                        kept=lambda: {"a", "b", "l", "me"})
    assert got == {"v": 9, "b": 10} and old == {"w": 10 - CONTRIBUTOR_ROUNDS, "v": 9}  # a new dict

    def never() -> set[str]:
        raise AssertionError("screens run with nobody to judge")

    assert workers_after(old, 10, ["me", "a", "l"], "me", decided=["a"], ledger=["l"], kept=never) == old
