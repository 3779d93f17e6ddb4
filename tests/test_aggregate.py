"""Aggregation: bit-identical whatever the arrival order, weights, median-norm clipping, both rules."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from gradnode.protocol import CodecParams, aggregate, decode_update, encode_update


def _peer(i: int, scale: float = 1.0, params: CodecParams = CodecParams(topk=16, chunk=256)):
    g = torch.Generator().manual_seed(100 + i)
    update = {"w": torch.randn(40, 50, generator=g) * scale, "b": torch.randn(30, generator=g) * scale}
    return decode_update(encode_update(update, params=params, sender=f"peer{i:02d}", tokens=100 * (i + 1)))


@pytest.mark.parametrize("rule", ["mean", "coord_mean"])
@pytest.mark.parametrize("clip", [True, False])
def test_order_invariant_bit_identical(rule: str, clip: bool) -> None:
    updates = [_peer(i, scale=1.0 + 3 * (i % 3)) for i in range(7)]
    weights = [float(u.tokens) for u in updates]
    ref = aggregate(updates, weights, rule=rule, clip_to_median=clip)
    rng = random.Random(0)
    for _ in range(10):
        order = list(range(len(updates)))
        rng.shuffle(order)
        out = aggregate([updates[i] for i in order], [weights[i] for i in order], rule=rule, clip_to_median=clip)
        for name in ref:
            assert torch.equal(out[name], ref[name])  # bit for bit


def test_mean_matches_formula() -> None:
    updates = [_peer(i) for i in range(4)]
    weights = [1.0, 2.0, 3.0, 4.0]
    out = aggregate(updates, weights, rule="mean", clip_to_median=False)
    expect = sum(w * u.tensors["w"].double() for w, u in zip(weights, updates)) / sum(weights)
    assert torch.allclose(out["w"].double(), expect, atol=1e-6)


def test_coord_mean_averages_over_senders_only() -> None:
    updates = [_peer(i) for i in range(3)]
    out = aggregate(updates, rule="coord_mean", clip_to_median=False)
    num = sum(u.tensors["w"] for u in updates)
    den = sum(u.masks["w"].float() for u in updates)
    expect = torch.where(den > 0, num / den.clamp(min=1), torch.zeros(()))
    assert torch.allclose(out["w"], expect, atol=1e-6)
    nobody = den == 0
    assert bool(nobody.any()) and bool((out["w"][nobody] == 0).all())


def test_clipping_bounds_an_outlier() -> None:
    honest = [_peer(i) for i in range(4)]
    attacker = _peer(9, scale=1e6)
    out = aggregate(honest + [attacker], clip_to_median=True)
    norms = sorted(u.norm for u in honest + [attacker])
    median = norms[2]
    total = math.sqrt(sum(float(t.double().square().sum()) for t in out.values()))
    assert total <= median * (1 + 1e-5)  # mean of vectors each of norm <= median
    unclipped = aggregate(honest + [attacker], clip_to_median=False)
    assert math.sqrt(sum(float(t.double().square().sum()) for t in unclipped.values())) > 1e4


def test_sparse_norm_is_exact_from_levels() -> None:
    u = _peer(0)
    direct = sum(float(t.double().square().sum()) for t in u.tensors.values())
    assert math.isclose(u.sq_norm, direct, rel_tol=1e-12)


def test_plain_tensor_dicts_are_accepted() -> None:
    updates = [_peer(i) for i in range(3)]
    out = aggregate([u.tensors for u in updates], clip_to_median=False)
    ref = aggregate(updates, clip_to_median=False)
    assert all(torch.allclose(out[n], ref[n], atol=1e-7) for n in ref)


def test_dense_updates_aggregate() -> None:
    params = CodecParams(dense=True)
    updates = [_peer(i, params=params) for i in range(3)]
    for perm in itertools.permutations(updates):
        out = aggregate(list(perm), clip_to_median=True)
        ref = aggregate(updates, clip_to_median=True)
        assert all(torch.equal(out[n], ref[n]) for n in ref)


def test_bad_arguments() -> None:
    u = _peer(0)
    with pytest.raises(ValueError):
        aggregate([])
    with pytest.raises(ValueError):
        aggregate([u], rule="median")
    with pytest.raises(ValueError):
        aggregate([u], weights=[1.0, 2.0])
    with pytest.raises(ValueError):
        aggregate([u], weights=[float("nan")])
    other = decode_update(encode_update({"w": torch.randn(3)}))
    with pytest.raises(ValueError):
        aggregate([u, other])
