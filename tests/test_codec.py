"""Codec pieces and whole-update round trips: bit packing, index codings, exact top-k, quantisation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradnode.protocol import CodecParams, ProtocolError, decode_update, encode_update
from gradnode.protocol.bitpack import pack_bits, pack_unary, packed_nbytes, unpack_bits, unpack_unary
from gradnode.protocol.chunking import layout
from gradnode.protocol.indexcode import gaps, rice_decode, rice_encode, undo_gaps
from gradnode.protocol.quant import dequantise, fit_levels, quantise
from gradnode.protocol.topk import topk_direct, topk_group

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = st.one_of(
    st.tuples(st.integers(1, 200), st.integers(1, 200)),
    st.tuples(st.integers(0, 9000)),
    st.tuples(st.integers(1, 4), st.integers(1, 30), st.integers(1, 30)),
    st.just(()),
)
PARAMS = st.builds(CodecParams, chunk=st.sampled_from([16, 100, 256, 1024, 4096]), topk=st.integers(1, 16),
                   bits=st.integers(1, 8), index_coding=st.sampled_from(["packed12", "rice"]))


@given(st.integers(1, 32), st.integers(0, 300), st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_pack_bits_round_trip(width: int, count: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 2**width, (count,), generator=g, dtype=torch.int64)
    packed = pack_bits(values, width)
    assert packed.dtype == torch.uint8 and packed.numel() == packed_nbytes(count, width)
    assert torch.equal(unpack_bits(packed, width, count), values)


def test_pack_bits_layout_is_lsb_first() -> None:
    assert pack_bits(torch.tensor([1, 2, 3, 0]), 2).tolist() == [0b00111001]
    assert pack_bits(torch.tensor([0xABC, 0x123]), 12).tolist() == [0xBC, 0x3A, 0x12]


@given(st.lists(st.integers(0, 40), max_size=200))
@settings(max_examples=60, deadline=None)
def test_unary_round_trip_and_strictness(q: list[int]) -> None:
    t = torch.tensor(q, dtype=torch.int64)
    data, nbits = pack_unary(t)
    assert nbits == sum(q) + len(q)
    assert torch.equal(unpack_unary(data, nbits, len(q)), t)
    if q:
        assert unpack_unary(data, nbits, len(q) + 1) is None
        assert unpack_unary(data, nbits + 1, len(q)) is None or (nbits + 1 + 7) // 8 != data.numel()


@given(st.integers(1, 4096), st.integers(1, 64), st.integers(0, 8), st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_rice_round_trip(chunk: int, k: int, r: int, seed: int) -> None:
    k = min(k, chunk)
    g = torch.Generator().manual_seed(seed)
    pos = torch.stack([torch.randperm(chunk, generator=g)[:k].sort().values for _ in range(3)])
    gp = gaps(pos)
    assert bool((gp >= 0).all())
    low, unary, nbits = rice_encode(gp.reshape(-1), r)
    back = rice_decode(low, unary, r, nbits, gp.numel())
    assert torch.equal(undo_gaps(back.view(3, k)), pos)


@pytest.mark.parametrize("shape", [(256, 320), (130, 70), (5000,), (3,), (64, 64), (2, 3, 500), (17, 4096)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_is_exact(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype)
    if len(shape) == 2 and shape[0] >= 128:
        x[:64] = 0  # zero tiles: every value ties
        x[64:128, :5] = 1.0  # massive ties above the rest
    flat = x.reshape(-1)
    for g in layout(shape, 4096):
        k = min(64, g.chunk_numel)
        pos, val = topk_group(flat, g, 64)
        chunks = g.view(flat).permute(0, 2, 1, 3).reshape(g.n_chunks, -1).float()
        ref = chunks.abs().topk(k, dim=1).values  # the simple reference: torch.topk on each chunk
        assert torch.equal(val.abs().sort(dim=1, descending=True).values, ref)
        assert torch.equal(chunks.gather(1, pos), val)
        assert bool((pos.diff(dim=1) > 0).all())


def test_topk_fast_path_matches_direct_on_heavy_tails() -> None:
    torch.manual_seed(1)
    x = torch.randn(512, 512) * torch.rand(512, 1) ** 4 * torch.rand(1, 512) ** 4  # row/col-correlated scales
    flat = x.reshape(-1)
    (g,) = layout((512, 512), 4096)
    pos, val = topk_group(flat, g, 64)
    dpos, dval = topk_direct(g.view(flat), 64)
    assert torch.equal(val.abs().sort(dim=1).values, dval.abs().sort(dim=1).values)


def test_topk_rejects_nan_and_inf() -> None:
    for bad in (float("nan"), float("inf")):
        x = torch.randn(128, 128)
        x[3, 5] = bad
        with pytest.raises(ProtocolError):
            encode_update({"w": x})


@given(st.integers(1, 8), st.integers(0, 500), st.integers(0, 2**31))
@settings(max_examples=40, deadline=None)
def test_quantise_is_sign_exact_table_lookup(bits: int, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, generator=g)
    levels = fit_levels(v.abs(), 1 << (bits - 1))
    assert bool((levels >= 0).all()) and bool(torch.isfinite(levels).all())
    codes = quantise(v, levels, bits)
    assert codes.dtype == torch.uint8 and (n == 0 or int(codes.max()) < 2**bits)
    back = dequantise(codes, levels, bits)
    assert bool(torch.isin(back.abs(), levels).all())
    assert bool(((back < 0) == (v < 0))[back != 0].all())
    if n and bits > 1:  # nearest level
        err = (back.abs() - v.abs()).abs()
        assert bool((err <= (v.abs().unsqueeze(1) - levels).abs().min(dim=1).values + 1e-6).all())


@given(st.data(), PARAMS, st.sampled_from(DTYPES))
@settings(max_examples=80, deadline=None)
def test_round_trip_property(data: st.DataObject, params: CodecParams, dtype: torch.dtype) -> None:
    shapes = data.draw(st.lists(SHAPES, min_size=1, max_size=3))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    update = {f"t{i}": torch.randn(s, generator=g).to(dtype) for i, s in enumerate(shapes)}
    payload = encode_update(update, params=params, run_id="r", round=5, sender="s", tokens=9)
    dec = decode_update(payload)
    assert (dec.run_id, dec.round, dec.sender, dec.tokens, dec.params) == ("r", 5, "s", 9, params)
    for name, t in update.items():
        out, mask = dec.tensors[name], dec.masks[name]
        assert out.shape == t.shape and out.dtype == torch.float32 and dec.dtypes[name] == str(dtype)[6:]
        ref = t.float().reshape(-1)
        sent = mask.reshape(-1)
        expect = sum(g.n_chunks * min(params.topk, g.chunk_numel) for g in layout(tuple(t.shape), params.chunk))
        assert int(sent.sum()) == expect
        assert bool((out.reshape(-1)[~sent] == 0).all())
        for gr in layout(tuple(t.shape), params.chunk):  # kept values are a top-k of each chunk
            k = min(params.topk, gr.chunk_numel)
            kept = gr.view(sent.to(torch.uint8)).permute(0, 2, 1, 3).reshape(gr.n_chunks, -1).bool()
            mags = gr.view(ref.abs()).permute(0, 2, 1, 3).reshape(gr.n_chunks, -1)
            kth = mags.topk(k, dim=1).values[:, -1:]
            assert bool((mags[kept].view(gr.n_chunks, k) >= kth).all())
        # signs survive unless the value rounds to the zero level
        o = out.reshape(-1)[sent]
        assert bool(((o < 0) == (ref[sent] < 0))[o != 0].all())


@pytest.mark.parametrize("coding", ["packed12", "rice"])
def test_round_trip_values_are_exact_levels(coding: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(300, 200)
    dec = decode_update(encode_update({"w": x}, params=CodecParams(index_coding=coding, bits=2)))
    levels = dec.levels["w"]
    vals = dec.tensors["w"][dec.masks["w"]]
    assert bool(torch.isin(vals.abs(), levels).all())
    rel = (dec.tensors["w"] - x * dec.masks["w"]).norm() / (x * dec.masks["w"]).norm()
    assert rel < 0.2


def test_dense_mode_is_lossless() -> None:
    torch.manual_seed(0)
    update = {"a": torch.randn(70, 33), "b": torch.randn(5).half(), "c": torch.randn(()).bfloat16()}
    dec = decode_update(encode_update(update, params=CodecParams(dense=True)))
    for name, t in update.items():
        assert torch.equal(dec.tensors[name], t.float()) and bool(dec.masks[name].all())


def test_compression_ratio_at_sparseloco_defaults() -> None:
    """Chunk 4096, top-64, 2-bit: rice >= 200x smaller than fp32 (packed12 ~146x), envelope included."""
    torch.manual_seed(0)
    update = {f"layer{i}.w": torch.randn(512, 512) for i in range(4)}
    update.update({f"layer{i}.b": torch.randn(512) for i in range(4)})
    fp32 = 4 * sum(t.numel() for t in update.values())
    ratios = {c: fp32 / len(encode_update(update, params=CodecParams(index_coding=c))) for c in ("packed12", "rice")}
    assert 140 < ratios["packed12"] < 147
    assert ratios["rice"] >= 200
    info_limit = 32 * 4096 / (64 * 2 + math.log2(math.comb(4096, 64)))
    assert ratios["rice"] < info_limit


def test_encode_rejects_bad_input() -> None:
    with pytest.raises(ProtocolError):
        encode_update({"w": torch.zeros(3, dtype=torch.int64)})
    with pytest.raises(ProtocolError):
        encode_update({"": torch.zeros(3)})
    with pytest.raises(ProtocolError):
        encode_update({"w": torch.zeros(3)}, round=-1)
    with pytest.raises(ValueError):
        CodecParams(topk=0)
    with pytest.raises(ProtocolError):
        CodecParams(chunk=64, topk=65)
    with pytest.raises(ProtocolError):
        CodecParams(bits=9)
    with pytest.raises(ProtocolError):
        CodecParams(index_coding="zip")


def test_non_contiguous_and_cuda_agnostic_inputs() -> None:
    torch.manual_seed(0)
    x = torch.randn(200, 300).t()  # non-contiguous view
    dec = decode_update(encode_update({"w": x}))
    assert dec.tensors["w"].shape == (300, 200)
    sent = dec.masks["w"]
    assert int(sent.sum()) > 0 and bool((dec.tensors["w"][~sent] == 0).all())
