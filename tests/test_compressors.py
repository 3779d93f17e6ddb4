"""The compressor families: byte identity with today's codec, round trips, exact sizes, error feedback,
summing without decoding, and strict decoding of hostile codes (hypothesis fuzz per family)."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradnode.protocol import CodecParams, ProtocolError, compress_with_feedback, decode_update
from gradnode.protocol.codec import encode_tensor
from gradnode.protocol.compress import (KINDS, Code, DctTopK, Dense, Family, PowerSGD, Quant, RandomK, Sign,
                                        SparseLoCo, compressor)
from gradnode.protocol.compress.sparse import dct_basis
from gradnode.protocol.wire import encode_with_reconstruction

SETTINGS = [SparseLoCo(), SparseLoCo(chunk=256, topk=8, bits=3, index_coding="packed12"), RandomK(),
            RandomK(density=0.2, bits=32), PowerSGD(), PowerSGD(rank=1, bits=16, warm_start=False), Sign(),
            Sign(chunk=7), DctTopK(chunk=256, topk=8), DctTopK(chunk=100, topk=5, sign=False), Quant(),
            Quant(bits=4, chunk=10), Dense(), Dense(bits=16), Sign(warmup_rounds=2, small_numel=500)]
IDS = [s.label for s in SETTINGS]
SHAPES = [(), (1,), (7,), (300,), (64, 64), (65, 130), (3, 5, 7), (100, 1), (0,), (2, 0)]
MODEL = {"a.w": (70, 90), "a.b": (70,), "c": (4, 9, 11), "d": (1000,)}


def update(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in shapes.items()}


def test_every_family_has_settings_and_a_compressor():
    assert set(KINDS) == set(Family)
    for family, (kind, make) in KINDS.items():
        c = compressor(kind())
        assert type(c) is make and c.family is family and kind().label.startswith(family.value)
    with pytest.raises(ProtocolError):
        compressor(object())  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [lambda: RandomK(density=0), lambda: RandomK(bits=8), lambda: PowerSGD(rank=0),
                                 lambda: Quant(bits=2), lambda: Sign(chunk=0), lambda: Dense(bits=8),
                                 lambda: DctTopK(topk=0), lambda: SparseLoCo(bits=9), lambda: Sign(warmup_rounds=-1)])
def test_settings_are_checked(bad):
    with pytest.raises(ProtocolError):
        bad()


# --- today's codec, wrapped -----------------------------------------------------------------------------


@pytest.mark.parametrize("coding", ["packed12", "rice"])
def test_the_sparseloco_entry_writes_the_codecs_bytes(coding):
    """Header fields and sections equal encode_tensor's, and the wire's body is the sections in order."""
    s = SparseLoCo(chunk=256, topk=8, index_coding=coding)
    c = compressor(s)
    x = update(MODEL, 1)
    for name, t in x.items():
        enc = encode_tensor(t, s.params)
        code = c.encode(name, t, 0)
        assert code.meta == enc.meta
        assert code.sections == tuple(sec.numpy().tobytes() for sec in enc.sections)
    _, wire = encode_with_reconstruction(x, params=s.params)
    codes = {n: c.encode(n, t, 0) for n, t in x.items()}
    assert all(b"".join(codes[n].sections) == b"".join(sec.numpy().tobytes() for sec in wire[n].sections)
               for n in x)


def test_the_sparseloco_entry_keeps_todays_error_feedback():
    """Same buffers after every round as compress_with_feedback, and receivers decode the same tensors."""
    s = SparseLoCo(chunk=256, topk=8)
    c = compressor(s)
    ours: dict[str, torch.Tensor] = {}
    theirs: dict[str, torch.Tensor] = {}
    for r in range(3):
        delta = update(MODEL, r)
        codes = c.compress(ours, delta, 0.9, r)
        payload = compress_with_feedback(theirs, delta, 0.9, s.params, round=r)
        decoded = decode_update(payload)
        for n in MODEL:
            assert torch.equal(ours[n], theirs[n])
            assert torch.equal(c.decode(n, MODEL[n], r, codes[n]), decoded.tensors[n])


# --- round trips and sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("s", SETTINGS, ids=IDS)
def test_round_trip_gives_what_error_feedback_subtracts(s):
    """decode(encode(x)) is bit-identical to the encoder's own reconstruction, and the buffer keeps the rest."""
    c = compressor(s)
    x = update({f"t{i}": shape for i, shape in enumerate(SHAPES)}, 2)
    buffers: dict[str, torch.Tensor] = {}
    codes = c.compress(buffers, x, 1.0, 3)
    for name, code in codes.items():
        out = c.decode(name, tuple(x[name].shape), 3, code)
        assert out.dtype == torch.float32 and out.shape == x[name].shape
        assert torch.equal(buffers[name], x[name] - out)


@pytest.mark.parametrize("s", SETTINGS, ids=IDS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.one_of(st.tuples(st.integers(0, 3000)), st.tuples(st.integers(1, 90), st.integers(1, 90)),
                                 st.tuples(st.integers(1, 5), st.integers(1, 9), st.integers(1, 40))),
                       min_size=1, max_size=4), round=st.integers(0, 4))
def test_the_size_function_is_exact(s, shapes, round):
    c = compressor(s)
    model = {f"t{i}": shape for i, shape in enumerate(shapes)}
    codes = {n: c.encode(n, t, round) for n, t in update(model, round).items()}
    metas = {n: code.meta for n, code in codes.items()}
    assert c.nbytes(model, round, metas) == sum(code.nbytes for code in codes.values())
    if c.sizes_known:
        assert c.nbytes(model, round) == sum(code.nbytes for code in codes.values())


def test_rice_sizes_need_the_header():
    with pytest.raises(ProtocolError):
        compressor(SparseLoCo()).nbytes({"w": (64, 64)})
    assert compressor(SparseLoCo(index_coding="packed12")).nbytes({"w": (64, 64)}) == 8 + 16 + 96


def test_nominal_costs():
    """Bytes for one 4096 x 4096 matrix: the field's figures for each family."""
    big = {"w": (4096, 4096)}
    n = 4096 * 4096
    assert compressor(Dense()).nbytes(big) == 4 * n
    assert compressor(Dense(bits=16)).nbytes(big) == 2 * n
    assert compressor(Quant(bits=4, chunk=64)).nbytes(big) == n // 2 + 4 * n // 64
    assert compressor(Sign(chunk=4096)).nbytes(big) == n // 8 + 4 * 4096
    assert compressor(RandomK(density=0.05)).nbytes(big) == 2 * int(0.05 * n)
    assert compressor(PowerSGD(rank=4)).nbytes(big) == 4096 * 4 * 4  # one factor a round: 1024x at fp32
    assert compressor(DctTopK()).nbytes(big) == 4096 * 4 + 4096 * 64 // 8 + 4096 * 64 * 12 // 8


@pytest.mark.parametrize("s", [Sign(warmup_rounds=2), Quant(bits=4, warmup_rounds=2), PowerSGD(warmup_rounds=2)])
def test_warm_up_rounds_send_fp32(s):
    c = compressor(s)
    x = update({"w": (40, 50)})["w"]
    for r in range(3):
        code = c.encode("w", x, r)
        dense = r < 2
        assert (code.nbytes == 4 * x.numel()) is dense
        assert torch.equal(c.decode("w", (40, 50), r, code), x) is dense


@pytest.mark.parametrize("s", [Sign(small_numel=1000), RandomK(small_numel=1000), DctTopK(chunk=64, topk=4,
                                                                                                small_numel=1000)])
def test_small_tensors_and_vectors_go_as_fp32(s):
    c = compressor(s)
    x = update({"bias": (5000,), "small": (20, 30), "big": (40, 50)})
    sizes = {n: c.encode(n, t, 0).nbytes for n, t in x.items()}
    assert sizes["bias"] == 4 * 5000 and sizes["small"] == 4 * 600 and sizes["big"] < 4 * 2000
    off = compressor(type(s)(**{**s.__dict__, "small_numel": 0}))
    assert off.encode("bias", x["bias"], 0).nbytes < 4 * 5000


# --- what each family promises ---------------------------------------------------------------------------------


def test_dense_fp32_is_exact_and_bf16_rounds_once():
    x = update({"w": (33, 17)})["w"]
    assert torch.equal(compressor(Dense()).decode("w", (33, 17), 0, compressor(Dense()).encode("w", x, 0)), x)
    c = compressor(Dense(bits=16))
    assert torch.equal(c.decode("w", (33, 17), 0, c.encode("w", x, 0)), x.bfloat16().float())


@pytest.mark.parametrize("bits", [8, 4])
def test_quant_error_is_at_most_half_a_step(bits):
    s = Quant(bits=bits, chunk=16)
    c = compressor(s)
    x = update({"w": (50, 21)})["w"]
    out = c.decode("w", (50, 21), 0, c.encode("w", x, 0))
    flat = torch.cat([x.reshape(-1), x.new_zeros((-x.numel()) % 16)]).view(-1, 16)
    step = (flat.abs().amax(dim=1) / s.qmax).repeat_interleave(16)[:x.numel()]
    assert bool(((out.reshape(-1) - x.reshape(-1)).abs() <= step / 2 * (1 + 1e-5)).all())


def test_sign_sends_signs_and_the_chunk_mean():
    c = compressor(Sign(chunk=8))
    x = update({"w": (3, 7)})["w"]
    out = c.decode("w", (3, 7), 0, c.encode("w", x, 0)).reshape(-1)
    flat = x.reshape(-1)
    assert torch.equal(out < 0, flat < 0)
    for i in range(0, 21, 8):
        assert torch.allclose(out[i:i + 8].abs(), flat[i:i + 8].abs().mean().expand(len(flat[i:i + 8])))


def test_random_k_shares_positions_per_round_and_name():
    c1, c2 = compressor(RandomK(density=0.1)), compressor(RandomK(density=0.1))
    assert torch.equal(c1.indices("w", (100, 10), 5), c2.indices("w", (100, 10), 5))
    assert not torch.equal(c1.indices("w", (100, 10), 5), c1.indices("w", (100, 10), 6))
    assert not torch.equal(c1.indices("w", (100, 10), 5), c1.indices("v", (100, 10), 5))
    x = update({"w": (100, 10)})["w"]
    out = c1.decode("w", (100, 10), 5, c1.encode("w", x, 5)).reshape(-1)
    idx = c1.indices("w", (100, 10), 5)
    assert idx.numel() == 100 and torch.equal(out[idx], x.reshape(-1)[idx].bfloat16().float())
    assert int((out != 0).sum()) == 100


def test_the_dct_is_orthonormal_and_all_coefficients_recover_the_tensor():
    for n in (1, 5, 64):
        d = dct_basis(n)
        assert torch.allclose(d @ d.T, torch.eye(n), atol=1e-5)
    c = compressor(DctTopK(chunk=64, topk=64, sign=False))
    x = update({"w": (20, 30)})["w"]
    assert torch.allclose(c.decode("w", (20, 30), 0, c.encode("w", x, 0)), x, atol=0.03)


def test_dct_top_k_keeps_a_smooth_tensor_in_few_coefficients():
    """A smooth tile lives in its low frequencies: top-4 of 64 keeps it far better than top-4 values would."""
    i = torch.arange(32, dtype=torch.float32)
    x = torch.cos(i / 9).unsqueeze(1) * torch.sin(i / 13).unsqueeze(0)
    c = compressor(DctTopK(chunk=64, topk=4, sign=False))
    out = c.decode("w", (32, 32), 0, c.encode("w", x, 0))
    assert float((out - x).norm() / x.norm()) < 0.1


def test_powersgd_recovers_a_matrix_in_the_rounds_basis_and_warm_starts_onto_a_low_rank_update():
    c = compressor(PowerSGD(rank=2))
    side, q = c.basis("w", (30, 40), 0)
    m = torch.randn(30, 2) @ q.T
    assert torch.allclose(c.decode("w", (30, 40), 0, c.encode("w", m, 0)), m, atol=1e-5)
    target = torch.randn(30, 2) @ torch.randn(2, 40)
    errors = []
    for r in range(4):
        out = c.decode("w", (30, 40), r, c.encode("w", target, r))
        errors.append(float((out - target).norm() / target.norm()))
        c.observe(r, {"w": out})
    assert errors[0] > 0.3 and errors[-1] < 1e-4, errors
    cold = compressor(PowerSGD(rank=2, warm_start=False))
    cold.observe(0, {"w": target})
    assert float((cold.decode("w", (30, 40), 1, cold.encode("w", target, 1)) - target).norm() / target.norm()) > 0.3


@pytest.mark.parametrize("s", SETTINGS, ids=IDS)
def test_error_feedback_delivers_a_steady_update_over_rounds(s):
    """With beta 1 and a steady delta, what the rounds sent approaches what they put in: the buffer stays
    bounded, so the relative shortfall falls with the rounds (a PowerSGD basis stuck on one subspace fails)."""
    c = compressor(s)
    shapes = {"w": (64, 64), "v": (300,)}
    delta = update(shapes, 7)
    buffers: dict[str, torch.Tensor] = {}
    sent = {n: torch.zeros(shape) for n, shape in shapes.items()}
    shortfall = {}
    for r in range(80):
        codes = c.compress(buffers, delta, 1.0, r)
        decoded = {n: c.decode(n, shapes[n], r, code) for n, code in codes.items()}
        for n in shapes:
            sent[n] += decoded[n]
        c.observe(r, decoded)
        if r + 1 in (20, 80):
            shortfall[r + 1] = max(float((sent[n] - (r + 1) * delta[n]).norm() / ((r + 1) * delta[n]).norm())
                                   for n in shapes)
    assert shortfall[80] < 0.8 * shortfall[20] or shortfall[80] < 1e-3, shortfall


# --- summing without decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("s", [RandomK(), RandomK(bits=32), PowerSGD(), PowerSGD(rank=3, bits=16), Dense(),
                               Dense(bits=16), RandomK(small_numel=100)], ids=lambda s: s.label)
def test_summing_codes_equals_decoding_and_summing(s):
    c = compressor(s)
    shapes = {"w": (40, 50), "b": (50,)}
    peers = [update(shapes, seed) for seed in range(3)]
    codes = [{n: c.encode(n, t, 4) for n, t in p.items()} for p in peers]
    for n, shape in shapes.items():
        summed = c.expand(n, shape, 4, sum(c.compact(n, shape, 4, cs[n]) for cs in codes))
        decoded = sum(c.decode(n, shape, 4, cs[n]) for cs in codes)
        assert torch.allclose(summed, decoded, atol=1e-5), n
        compact = c.compact(n, shape, 4, codes[0][n])
        assert compact.numel() * compact.element_size() <= max(4 * math.prod(shape) if c.is_dense(shape, 4) else 0,
                                                              2 * codes[0][n].nbytes)


@pytest.mark.parametrize("s", [SparseLoCo(), Sign(), Quant(), DctTopK()], ids=lambda s: s.label)
def test_codes_of_per_peer_choices_cannot_be_summed(s):
    c = compressor(s)
    assert not c.summable
    code = c.encode("w", torch.randn(64, 64), 0)
    with pytest.raises(ProtocolError):
        c.compact("w", (64, 64), 0, code)


# --- strict decoding -------------------------------------------------------------------------------------------

FUZZ_SHAPES = {"w": (64, 70), "v": (130,)}


def _valid(s, name: str) -> Code:
    return compressor(s).encode(name, update(FUZZ_SHAPES, 3)[name], 1)


def _decode_or_reject(c, name: str, code: object) -> None:
    try:
        out = c.decode(name, FUZZ_SHAPES[name], 1, code)
    except ProtocolError:
        return
    assert out.shape == FUZZ_SHAPES[name] and out.dtype == torch.float32 and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("s", SETTINGS, ids=IDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_codes_raise_protocol_error_only(s, data):
    """Flipped, cut and grown sections, wrong header fields, random bytes: a finite tensor or ProtocolError."""
    c = compressor(s)
    name = data.draw(st.sampled_from(sorted(FUZZ_SHAPES)))
    code = _valid(s, name)
    sections = list(code.sections)
    meta = dict(code.meta)
    how = data.draw(st.sampled_from(["flip", "cut", "grow", "meta", "random", "type"]))
    if how == "flip" and sections and any(sections):
        i = data.draw(st.sampled_from([i for i, x in enumerate(sections) if x]))
        buf = bytearray(sections[i])
        for _ in range(data.draw(st.integers(1, 8))):
            buf[data.draw(st.integers(0, len(buf) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        sections[i] = bytes(buf)
    elif how == "cut" and sections:
        i = data.draw(st.integers(0, len(sections) - 1))
        sections[i] = sections[i][:data.draw(st.integers(0, max(0, len(sections[i]) - 1)))]
    elif how == "grow" and sections:
        i = data.draw(st.integers(0, len(sections) - 1))
        sections[i] += data.draw(st.binary(min_size=1, max_size=16))
    elif how == "meta":
        key = data.draw(st.sampled_from(sorted(meta) + ["extra"]))
        meta[key] = data.draw(st.one_of(st.integers(-2**70, 2**70), st.binary(max_size=40), st.none(), st.text()))
    elif how == "random":
        sections = data.draw(st.lists(st.binary(max_size=3000), max_size=4))
    else:
        _decode_or_reject(c, name, data.draw(st.sampled_from([None, b"", "code", 3, (b"",)])))
        sections = [bytearray(x) for x in sections]  # not bytes
    _decode_or_reject(c, name, Code(meta, tuple(sections)))  # type: ignore[arg-type]


@pytest.mark.parametrize("s", [Quant(bits=8, chunk=64), Quant(bits=4, chunk=64)], ids=["int8", "int4"])
def test_a_finite_scale_whose_values_overflow_is_rejected(s) -> None:
    """The fuzz test found it: flipped exponent bits made a chunk's scale about 3e38, a finite fp32, and the
    chunk's largest code times it decoded to inf."""
    code = _valid(s, "v")
    scales = bytearray(code.sections[0])
    scales[0:4] = struct.pack("<f", 3.0e38)
    with pytest.raises(ProtocolError, match="NaN or Inf"):
        compressor(s).decode("v", FUZZ_SHAPES["v"], 1, Code(code.meta, (bytes(scales), *code.sections[1:])))


@pytest.mark.parametrize("s,section,patch", [
    (Quant(bits=8, chunk=64), 1, lambda b: b"\xff" + b[1:]),  # code 255 lies outside [-127, 127]
    (Quant(bits=4, chunk=64), 1, lambda b: b"\xff" + b[1:]),  # code 15 lies outside [-7, 7]
    (Quant(), 0, lambda b: b[:-4] + b"\x00\x00\x80\xbf"),  # a negative chunk scale
    (Sign(), 0, lambda b: b[:-4] + b"\x00\x00\xc0\x7f"),  # a NaN scale
    (Sign(chunk=7), 1, lambda b: b[:-1] + bytes([b[-1] | 0x80])),  # padding after 130 signs
    (DctTopK(chunk=256, topk=8), 2, lambda b: bytes(len(b))),  # every position 0: not strictly increasing
    (DctTopK(chunk=256, topk=8), 0, lambda b: b"\x00\x00\x80\xbf" + b[4:]),  # negative chunk scale
    (RandomK(), 0, lambda b: b"\x80\x7f" + b[2:]),  # bf16 inf
    (PowerSGD(), 0, lambda b: b"\x00\x00\x80\x7f" + b[4:]),  # fp32 inf in a factor
    (SparseLoCo(index_coding="packed12", chunk=256, topk=8), 1, lambda b: bytes(len(b))),  # duplicate positions
], ids=lambda x: getattr(x, "label", ""))
def test_each_check_rejects_what_an_encoder_never_writes(s, section, patch):
    c = compressor(s)
    name = "v" if isinstance(s, Sign) else "w"
    code = _valid(s, name)
    assert c.decode(name, FUZZ_SHAPES[name], 1, code) is not None
    sections = list(code.sections)
    sections[section] = patch(sections[section])
    with pytest.raises(ProtocolError):
        c.decode(name, FUZZ_SHAPES[name], 1, Code(code.meta, tuple(sections)))


def test_declared_sizes_are_checked_before_anything_is_allocated():
    """A rice header claiming 2^62 unary bits, or sections far longer than the shape allows, fail at once."""
    c = compressor(SparseLoCo())
    code = _valid(SparseLoCo(), "w")
    with pytest.raises(ProtocolError):
        c.decode("w", (64, 70), 1, Code({**code.meta, "ubits": 2**62}, code.sections))
    with pytest.raises(ProtocolError):
        compressor(Dense()).decode("w", (64, 70), 1, Code({}, (bytes(1 << 24),)))
    with pytest.raises(ProtocolError):
        compressor(Dense()).decode("w", (1 << 20, 1 << 20), 1, Code({}, (b"",)))
