"""The witness rule (protocol/witness.py): a round's set is what a strict majority of the reports lists."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gradnode.protocol.records import fingerprint, pack, unpack
from gradnode.protocol.witness import Counts, quorum, witnessed

UPDATES = [(f"peer{i}", f"{i:064x}") for i in range(12)]


def _report(indices: set[int]) -> bytes:
    return pack([UPDATES[i] for i in sorted(indices)])


def _set(fps: bytes) -> set[int]:
    index = {fingerprint(*u): i for i, u in enumerate(UPDATES)}
    return {index[fp] for fp in unpack(fps)}


def test_an_update_needs_a_strict_majority_of_the_reports() -> None:
    assert [quorum(n) for n in range(1, 7)] == [1, 2, 2, 3, 3, 4]
    reports = [_report({0, 1, 2}), _report({0, 1}), _report({0, 3})]
    assert _set(witnessed(reports)) == {0, 1}  # 0: 3 of 3, 1: 2 of 3; 2 and 3: 1 of 3
    assert _set(witnessed(reports[:2])) == {0, 1}  # 2 of 2 needed
    assert _set(witnessed([reports[0]])) == {0, 1, 2}  # a lone witness decides alone
    assert witnessed([]) == b""
    # a report listing an update twice counts once (pack drops duplicates; raw bytes with a repeat too)
    twice = reports[2] + reports[2][:16]
    assert _set(witnessed([twice, _report(set()), _report(set())])) == set()


def test_a_censoring_witness_keeps_out_nothing_the_others_verified() -> None:
    """Under the rule before witnesses the leader's list was the set: a censor leading a round left every
    other update out. As one witness of four it moves nothing."""
    honest = [_report({0, 1, 2, 3})] * 3
    censor = _report({3})
    assert _set(censor) == {3}  # its list, which used to be the round's set whenever it led
    assert _set(witnessed(honest + [censor])) == {0, 1, 2, 3}
    # a minority stuffing in an update nobody else verified moves nothing either
    assert _set(witnessed(honest + [_report({0, 1, 2, 3, 9}), _report({9})])) == {0, 1, 2, 3}


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9), st.integers(0, 8), st.data())
def test_a_minority_of_reports_can_neither_remove_nor_add_an_update(honest: int, liars: int, data) -> None:
    """Whatever a minority of witnesses reports (any sets, any order), every update listed by all honest
    reports is in and every update listed by none of them is out; the order of reports never matters."""
    liars = min(liars, honest - 1) if honest > 1 else 0  # a strict minority of the reports
    agreed = data.draw(st.sets(st.integers(0, 11)))
    honest_reports = [agreed | data.draw(st.sets(st.integers(0, 11))) for _ in range(honest)]
    lies = [data.draw(st.sets(st.integers(0, 11))) for _ in range(liars)]
    reports = [_report(r) for r in honest_reports + lies]
    got = _set(witnessed(reports))
    assert agreed <= got
    assert not got & ({*range(12)} - set().union(*honest_reports))
    shuffled = reports[:]
    random.Random(len(reports)).shuffle(shuffled)
    assert witnessed(shuffled) == witnessed(reports)


def test_when_everyone_verified_everything_any_majority_of_reports_gives_the_same_set() -> None:
    """What makes a late report harmless in a healthy round: a peer that counted 3 reports of 5 and one that
    counted all 5 decide the same set."""
    reports = [_report({0, 1, 2, 3, 4})] * 5
    assert {witnessed(reports[:k]) for k in range(1, 6)} == {witnessed(reports)}


def _ids(n: int, salt: str) -> list[str]:
    """Peer-id-like strings (a real id is the base58 multihash of a key: the rules only see the string)."""
    import hashlib

    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    out = []
    for i in range(n):
        x = int.from_bytes(hashlib.sha256(f"{salt}/{i}".encode()).digest(), "big")
        out.append("Qm" + "".join(alphabet[(x >> (6 * j)) % 58] for j in range(44)))
    return out


def test_over_200_rounds_a_ground_key_weighs_what_any_key_weighs() -> None:
    """Trust II: a volunteer grinds 10^4 keys and keeps the lowest id. Under the first rule (the lowest id
    leads, its list is the set) it set all 200 rounds and, censoring, left every honest update out. Under
    witnesses nobody leads: each round's set is a function of the reports alone, blind to who made them
    (the same set with the ground key's id swapped for an honest one), so K keys weigh K votes of N, whatever
    ids they chose. 20 honest witnesses each verified each of 21 updates with probability 0.9; the ground key
    reports only its own; so do 5 ground keys of 20 in the second run."""
    rng = random.Random(13)
    honest = _ids(20, "honest")
    ground = min(_ids(10_000, "grinder"))
    assert ground < min(honest)
    updates = [(p, f"{i:064x}") for i, p in enumerate(honest + [ground])]

    def rounds(attackers: list[str], witnesses: list[str]) -> tuple[int, int]:
        """(rounds whose set lost an update all honest witnesses listed, honest updates kept of all rounds')"""
        lost = kept = 0
        for _ in range(200):
            reports = {w: pack([u for u in updates if rng.random() < 0.9]) for w in witnesses}
            reports.update({a: pack([u for u in updates if u[0] == a]) for a in attackers})
            fps = witnessed(reports.values())
            # blind to ids: the same reports under other names give the same set
            assert witnessed(reports[w] for w in sorted(reports, key=lambda w: w[::-1])) == fps
            listed_by_all = set.intersection(*(set(unpack(reports[w])) for w in witnesses))
            lost += not listed_by_all <= set(unpack(fps))
            kept += len(set(unpack(fps)) & {fingerprint(*u) for u in updates if u[0] in witnesses})
        return lost, kept

    lowest_id_rule = sum(min(honest + [ground]) == ground for _ in range(200))
    assert lowest_id_rule == 200  # the old rule: it led, and so chose the set, in every round
    lost, kept = rounds([ground], honest)
    assert lost == 0 and kept >= 0.95 * 200 * 20, (lost, kept)  # honest updates listed by 90% of 20 witnesses
    sybils = sorted(_ids(10_000, "sybil"))[:5]  # 5 ground keys among 15 honest: a quarter of the witnesses
    lost, kept = rounds(sybils, honest[:15])
    assert lost == 0 and kept >= 0.9 * 200 * 15, (lost, kept)


@given(st.lists(st.sets(st.integers(0, 11)), max_size=12), st.integers(0, 3))
def test_identical_reports_count_as_often_as_they_were_made(sets: list[set[int]], copies: int) -> None:
    """The rule counted report by report, as written: the same set whichever order and however many copies
    of a report there are (the rule counts identical reports together)."""
    reports = [_report(s) for s in sets] + [_report(sets[0])] * copies if sets else []
    need = len(reports) // 2 + 1
    expected = {i for i in range(12) if sum(1 for r in reports if i in _set(r)) >= need}
    assert _set(witnessed(reports)) == expected
    assert witnessed(list(reversed(reports))) == witnessed(reports)


# reports that differ a little and a lot, one listing an update twice (raw bytes), one empty
POOL = [_report({0, 1, 2, 3}), _report({0, 1, 2}), _report({1, 2, 3, 4}), _report({5}), _report(set()),
        _report(set(range(12))), _report({0, 1}) + _report({0}), _report({6, 7, 8, 9})]


@settings(max_examples=300)
@given(st.lists(st.lists(st.integers(0, len(POOL) - 1), max_size=12), max_size=25), st.integers(1, 4))
def test_counts_derived_from_earlier_ones_give_the_rule_s_set(multisets: list[list[int]], keep: int) -> None:
    """``Counts`` (each count derived from the nearest of the last ``keep`` made: what the simulator's peers
    use, every one counting nearly the same reports) gives ``witnessed``'s bytes for any sequence of report
    multisets: reports added, gone, copied, in any order."""
    counts = Counts(keep)
    for picked in multisets:
        reports = [POOL[i] for i in picked]
        assert counts(reports) == witnessed(reports)


def test_counts_forget_fingerprints_that_no_counted_report_lists() -> None:
    """A window of 50 reports sliding by one report of 20 new updates a count: each count is derived from the
    last, and a fingerprint whose reports are all gone leaves the counts (kept at zero, they grew by 20 a
    count, 60,000 after 3,000 counts, each one copied into the next)."""
    rng = random.Random(5)
    counts, window = Counts(), []
    for _ in range(3000):
        window = window[-49:] + [b"".join(sorted(rng.randbytes(16) for _ in range(20)))]
        assert counts(window) == witnessed(window)
    assert max(len(kept) for _, kept in counts._made) <= 50 * 20
