"""The 'robust' rule and reputation: bit-identical under permutation, honest rounds equal coord_mean, one
attacker's influence bounded, duplicates, replays and dilution screened, reputation deterministic."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradnode.node.bench.attacks import rewrite_header, zero_levels
from gradnode.protocol import CodecParams, aggregate, decode_update, encode_update
from gradnode.protocol.reputation import BAN_BELOW, Reputation
from gradnode.protocol.robust import RobustParams, fingerprint, robust_aggregate, screen

PARAMS = CodecParams(topk=32, chunk=256)
SHAPES = {"w": (48, 40), "b": (96,)}


def _direction(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}


def _payload(tensors: dict[str, torch.Tensor], sender: str, tokens: int = 100, round_: int = 0) -> bytes:
    return encode_update(tensors, params=PARAMS, sender=sender, tokens=tokens, round=round_)


def _honest_payloads(n: int, seed: int = 0, noise: float = 0.7, round_: int = 0) -> list[bytes]:
    """n updates sharing a common direction (what peers training one model send), each with its own noise."""
    base = _direction(seed)
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(1000 * seed + i + 1)
        t = {k: v + noise * torch.randn(v.shape, generator=g) for k, v in base.items()}
        out.append(_payload(t, f"peer{i:02d}", round_=round_))
    return out


def _honest(n: int, seed: int = 0, noise: float = 0.7, round_: int = 0) -> list:
    return [decode_update(p) for p in _honest_payloads(n, seed, noise, round_)]


def _flip(u, sender: str):
    return decode_update(_payload({n: -t for n, t in u.tensors.items()}, sender))


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[n], b[n]) for n in a)


def _norm(tensors: dict) -> float:
    return math.sqrt(sum(float(t.double().square().sum()) for t in tensors.values()))


def test_honest_round_is_bit_identical_to_coord_mean() -> None:
    updates = _honest(6)
    agg, screens = robust_aggregate(updates, [100.0] * 6)
    assert [s.reason for s in screens] == [""] * 6 and all(s.weight == 100.0 for s in screens)
    assert _same(agg, aggregate(updates, [100.0] * 6, rule="coord_mean"))


@settings(max_examples=25, deadline=None)
@given(st.permutations(list(range(7))), st.integers(0, 3))
def test_order_independent_bit_identical(order: list[int], seed: int) -> None:
    payloads = _honest_payloads(5, seed=seed)
    updates = [decode_update(p) for p in payloads] + [_flip(_honest(1, seed=seed + 7)[0], "zz-attacker")]
    updates.append(decode_update(rewrite_header(payloads[1], sender="copycat")))
    weights = [float(100 + 10 * i) for i in range(len(updates))]
    ref, ref_screens = robust_aggregate(updates, weights)
    agg, screens = robust_aggregate([updates[i] for i in order], [weights[i] for i in order])
    assert _same(agg, ref)
    assert screens == ref_screens


def test_a_sign_flipped_update_is_left_out_and_struck() -> None:
    honest = _honest(3)
    attacker = _flip(honest[0], "peer99")
    agg, screens = robust_aggregate(honest + [attacker])
    by = {s.sender: s for s in screens}
    assert by["peer99"].reason == "direction" and by["peer99"].weight == 0.0 and by["peer99"].strike
    assert by["peer99"].cos < 0 < min(by[u.sender].cos for u in honest)
    assert _same(agg, aggregate(honest, rule="coord_mean"))
    # coord_mean alone lets it through: the flipped update cancels and reverses coordinates
    plain = aggregate(honest + [attacker], rule="coord_mean")
    ref = aggregate(honest, rule="coord_mean")
    cos = sum(float((plain[n] * ref[n]).sum()) for n in ref) / (_norm(plain) * _norm(ref))
    assert cos < 0.95


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 50), st.sampled_from(["flip", "noise", "spike", "scaled"]), st.floats(0.5, 1e4))
def test_one_attacker_in_four_moves_the_aggregate_boundedly(seed: int, kind: str, scale: float) -> None:
    """Whatever one of four peers sends, the aggregate stays close to the honest peers' own aggregate."""
    honest = _honest(3, seed=seed)
    g = torch.Generator().manual_seed(seed)
    if kind == "flip":
        bad = {n: -scale * t for n, t in honest[0].tensors.items()}
    elif kind == "noise":
        bad = {n: scale * torch.randn(s, generator=g) for n, s in SHAPES.items()}
    elif kind == "spike":
        bad = {n: torch.zeros(s) for n, s in SHAPES.items()}
        bad["w"][seed % 48, seed % 40] = scale
    else:
        bad = {n: scale * t for n, t in honest[1].tensors.items()}
    attacker = decode_update(_payload(bad, "peer77"))
    agg, screens = robust_aggregate(honest + [attacker])
    ref = aggregate(honest, rule="coord_mean")
    diff = math.sqrt(sum(float((agg[n] - ref[n]).double().square().sum()) for n in ref))
    assert diff <= 0.5 * _norm(ref)
    top = max(float(t.abs().max()) for u in honest for t in u.tensors.values())
    assert max(float(t.abs().max()) for t in agg.values()) <= RobustParams().value_cap * top


def test_a_single_coordinate_is_capped() -> None:
    honest = _honest(3)
    spike = {n: torch.zeros(s) for n, s in SHAPES.items()}
    spike["w"][5, 7] = 1000.0
    attacker = decode_update(_payload(spike, "peer50"))
    screens, capped, _ = screen(honest + [attacker])
    by = {s.sender: s for s in screens}
    assert by["peer50"].capped and by["peer50"].weight == 0.0 and by["peer50"].reason == "direction"
    tops = sorted(float(u.tensors["w"].abs().max()) for u in honest + [attacker])
    bound = RobustParams().value_cap * (tops[1] + tops[2]) / 2  # cap x the median of the 4 largest magnitudes
    assert math.isclose(by["peer50"].norm, bound, rel_tol=1e-6)
    assert not any(by[u.sender].capped for u in honest)


def test_exact_and_near_duplicates_count_once() -> None:
    payloads = _honest_payloads(4)
    honest = [decode_update(p) for p in payloads]
    copy = decode_update(rewrite_header(payloads[2], sender="peer90"))
    assert fingerprint(copy) == fingerprint(honest[2]) and copy.digest != honest[2].digest
    g = torch.Generator().manual_seed(5)
    near = decode_update(_payload({n: t + 0.01 * torch.randn(t.shape, generator=g)
                                   for n, t in honest[3].tensors.items()}, "peer91"))
    agg, screens = robust_aggregate(honest + [copy, near])
    by = {s.sender: s for s in screens}
    assert by["peer90"].reason == "duplicate" and by["peer91"].reason == "duplicate"
    assert not by["peer90"].strike and not by["peer91"].strike
    assert all(by[u.sender].reason == "" for u in honest)
    assert _same(agg, aggregate(honest, rule="coord_mean"))


def test_a_replay_of_last_rounds_update_is_left_out() -> None:
    last_payloads = _honest_payloads(4, round_=0)
    last = [decode_update(p) for p in last_payloads]
    now = _honest(4, seed=1, round_=1)
    replay = decode_update(rewrite_header(last_payloads[1], sender="peer60", round=1))
    previous = Reputation().after(robust_aggregate(last)[1]).recent
    agg, screens = robust_aggregate(now + [replay], previous=previous)
    by = {s.sender: s for s in screens}
    assert by["peer60"].reason == "replay" and by["peer60"].strike
    assert _same(agg, aggregate(now, rule="coord_mean"))


def test_zeros_marked_as_sent_dilute_nothing() -> None:
    honest = _honest(3)
    mass = {n: sum(u.tensors[n].abs() for u in honest) for n in SHAPES}
    zeros = decode_update(zero_levels(_payload(mass, "peer40")))
    assert zeros.norm == 0.0 and all(bool(m.any()) for m in zeros.masks.values())
    agg, screens = robust_aggregate(honest + [zeros])
    assert {s.sender: s.reason for s in screens}["peer40"] == "direction"
    assert _same(agg, aggregate(honest, rule="coord_mean"))
    diluted = aggregate(honest + [zeros], rule="coord_mean")
    assert _norm(diluted) < 0.95 * _norm(agg)


def test_gram_is_exact_and_matches_float64() -> None:
    updates = _honest(4)
    screens, capped, items = screen(updates)
    from gradnode.protocol.robust import _cap_and_gram

    _, _, gram = _cap_and_gram(items, RobustParams().value_cap)
    for a in range(4):
        for b in range(4):
            ref = sum(float((capped[a][n].dense().double() * capped[b][n].dense().double()).sum()) for n in SHAPES)
            assert math.isclose(gram[a][b], ref, rel_tol=1e-12, abs_tol=1e-12)
    # the same inputs give the same floats, bit for bit
    assert _cap_and_gram(items, 2.0)[2] == gram


def test_reputation_bans_after_two_strikes_and_recovers() -> None:
    rep = Reputation()
    for r in range(2):
        honest = _honest(3, seed=20 + r)
        attacker = _flip(_honest(1, seed=10 + r)[0], "peer66")
        _, screens = robust_aggregate(honest + [attacker], reputation=rep.weights(), previous=rep.recent)
        rep = rep.after(screens)
    assert rep.weight("peer66") == 0.0 and rep.score("peer66") < BAN_BELOW and rep.banned() == ["peer66"]
    assert rep.weight("peer00") == 1.0
    # banned: even an update the others agree with gets weight 0, but its direction lifts the score again
    good = _honest(4, seed=3)
    good[3] = decode_update(_payload(good[3].tensors, "peer66"))
    _, screens = robust_aggregate(good, reputation=rep.weights(), previous=rep.recent)
    by = {s.sender: s for s in screens}
    assert by["peer66"].reason == "reputation" and by["peer66"].weight == 0.0 and not by["peer66"].strike
    rep = rep.after(screens)
    assert rep.weight("peer66") == 1.0


def test_a_newcomer_is_struck_only_once_an_update_of_its_counted() -> None:
    """Strikes count against senders in the contributors ledger (or already in the table): a new sender whose
    first updates point weakly is left out of those rounds, not banned; a contributor is banned as before."""
    rep_new, rep_old = Reputation(), Reputation()
    for r in range(2):
        honest = _honest(3, seed=20 + r)
        attacker = _flip(_honest(1, seed=10 + r)[0], "peer66")
        _, screens = robust_aggregate(honest + [attacker])
        assert {s.sender: s.reason for s in screens}["peer66"] == "direction"
        rep_new = rep_new.after(screens, established={"peer00", "peer01", "peer02"})
        rep_old = rep_old.after(screens, established={"peer00", "peer01", "peer02", "peer66"})
    assert rep_new.weight("peer66") == 1.0 and "peer66" not in rep_new.scores
    assert rep_old.weight("peer66") == 0.0 and rep_old.banned() == ["peer66"]
    # once in the table, it stays judged when it drops out of the ledger
    _, screens = robust_aggregate(_honest(3, seed=30) + [_flip(_honest(1, seed=31)[0], "peer66")])
    assert rep_old.after(screens, established=set()).score("peer66") < rep_old.score("peer66")


def test_reputation_table_round_trips_and_rejects_garbage() -> None:
    honest = _honest(3)
    _, screens = robust_aggregate(honest + [_flip(honest[0], "peer66")])
    rep = Reputation().after(screens)
    import json

    again = Reputation.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert again == rep and again.to_dict() == rep.to_dict()
    for bad in ({}, {"scores": {"a": 2.0}, "recent": []}, {"scores": {"a": 1}, "recent": []},
                {"scores": {}, "recent": ["zz" * 32]}, {"scores": [], "recent": []}):
        with pytest.raises(ValueError):
            Reputation.from_dict(bad)


def test_reputation_is_order_independent() -> None:
    honest = _honest(4)
    updates = honest + [_flip(honest[0], "peer66"), _flip(honest[1], "peer67")]
    ref = Reputation().after(robust_aggregate(updates)[1])
    rng = random.Random(1)
    for _ in range(5):
        rng.shuffle(updates)
        assert Reputation().after(robust_aggregate(updates)[1]) == ref


def test_nothing_accepted_gives_zeros() -> None:
    u = _honest(1)[0]
    zeros = decode_update(zero_levels(_payload(u.tensors, "peer01")))
    agg, screens = robust_aggregate([zeros])
    assert all(float(t.abs().sum()) == 0.0 for t in agg.values()) and screens[0].weight == 0.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        robust_aggregate([])
    with pytest.raises(ValueError):
        robust_aggregate(_honest(2), [1.0])
    with pytest.raises(ValueError):
        robust_aggregate(_honest(2), [1.0, -1.0])
    with pytest.raises(ValueError):
        RobustParams(value_cap=0.0)


def test_a_near_copy_with_a_twist_does_not_stand_for_the_original() -> None:
    """A near-duplicate whose name sorts first, twisted against the others, loses the group to the original."""
    honest = _honest(4)
    twisted = {n: t - 0.2 * honest[0].tensors[n] for n, t in honest[2].tensors.items()}
    copy = decode_update(_payload(twisted, "aaa-first"))
    _, screens = robust_aggregate(honest + [copy])
    by = {s.sender: s for s in screens}
    assert by["aaa-first"].reason == "duplicate" and by["peer02"].reason == ""
    assert _same(robust_aggregate(honest + [copy])[0], aggregate(honest, rule="coord_mean"))


def _cos_pair_by_pair(i: int, coef: dict[int, float], gram: list[list[float]]) -> float | None:
    """The direction screen's cosine as first written: the others' squared norm summed over every pair."""
    others = [j for j in coef if j != i and coef[j] > 0]
    if not others:
        return None
    num = math.fsum(coef[j] * gram[i][j] for j in others)
    sq = math.fsum(coef[j] * coef[k] * gram[j][k] for j in others for k in others)
    if gram[i][i] <= 0 or sq <= 0:
        return 0.0
    return num / (math.sqrt(gram[i][i]) * math.sqrt(sq))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9), st.data())
def test_the_others_norm_taken_out_of_the_whole_sum_is_the_pair_by_pair_sum_bit_for_bit(n: int, data) -> None:
    """protocol/screening.py keeps the whole sum of pair terms exactly and takes each update's row and column out
    of it (O(n) per update, which 512 peers need): every cosine has the bits of the sum over the others' pairs,
    for magnitudes far apart (cancellation), zero and negative coefficients, and a Gram matrix not symmetric."""
    from gradnode.protocol.screening import _cos_to_others

    value = st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, 1e-300, -1e-12])
    gram = [[data.draw(value) for _ in range(n)] for _ in range(n)]
    for i in range(n):
        if data.draw(st.booleans()):
            gram[i][i] = abs(gram[i][i])
    coef = {j: data.draw(value | st.just(1.0)) for j in sorted(data.draw(st.sets(st.integers(0, n - 1))))}
    expected = [_cos_pair_by_pair(i, coef, gram) for i in range(n)]
    got = _cos_to_others(coef, gram, n)
    assert [None if x is None else x.hex() for x in got] == [None if x is None else x.hex() for x in expected]
