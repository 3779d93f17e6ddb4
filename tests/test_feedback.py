"""Error feedback: beta*e_before + delta == e_after + decoded, with decoded exactly what receivers get."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradnode.protocol import CodecParams, ErrorFeedback, ProtocolError, compress_with_feedback, decode_update

SHAPES = st.sampled_from([(64, 64), (130, 70), (5000,), (7,), (3, 4, 50), ()])


@given(st.lists(SHAPES, min_size=1, max_size=3), st.sampled_from([0.0, 0.5, 0.95, 1.0]),
       st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       st.builds(CodecParams, chunk=st.sampled_from([64, 256, 4096]), topk=st.integers(1, 32),
                 bits=st.integers(1, 4), index_coding=st.sampled_from(["packed12", "rice"]),
                 dense=st.sampled_from([False, False, True])),
       st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_feedback_identity(shapes: list, beta: float, dtype: torch.dtype, params: CodecParams, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    names = [f"p{i}" for i in range(len(shapes))]
    buffers = {n: torch.randn(s, generator=g) for n, s in zip(names, shapes)}
    for _ in range(2):  # twice: the second round starts from a non-trivial buffer
        delta = {n: torch.randn(s, generator=g).to(dtype) for n, s in zip(names, shapes)}
        before = {n: e.clone() for n, e in buffers.items()}
        payload = compress_with_feedback(buffers, delta, beta, params, round=1, sender="me")
        dec = decode_update(payload)
        for n in names:
            target = beta * before[n] + delta[n].float()
            assert torch.allclose(buffers[n] + dec.tensors[n], target, rtol=1e-5, atol=1e-6)
            # unsent coordinates keep the whole accumulated value, bit for bit
            unsent = ~dec.masks[n]
            expect = before[n].mul(beta).add(delta[n].float())
            assert torch.equal(buffers[n][unsent], expect[unsent])
            if params.dense:
                assert bool((buffers[n] == 0).all())


def test_decoded_is_exactly_what_was_subtracted() -> None:
    torch.manual_seed(0)
    ef = ErrorFeedback(beta=0.9)
    delta = {"w": torch.randn(256, 256), "b": torch.randn(100)}
    accumulated = {n: t.clone() for n, t in delta.items()}
    payload = ef.step(delta, round=0)
    dec = decode_update(payload)
    for n in delta:
        sent = dec.masks[n]
        assert torch.equal(ef.buffers[n][sent], accumulated[n][sent] - dec.tensors[n][sent])


def test_feedback_carries_unsent_mass_to_later_rounds() -> None:
    """Sum of everything sent + what remains == sum of deltas (beta = 1): nothing is lost."""
    torch.manual_seed(0)
    ef = ErrorFeedback(beta=1.0, params=CodecParams(topk=8, chunk=256))
    total_delta = torch.zeros(64, 64)
    total_sent = torch.zeros(64, 64)
    for r in range(5):
        d = torch.randn(64, 64)
        total_delta += d
        total_sent += decode_update(ef.step({"w": d}, round=r)).tensors["w"]
    assert torch.allclose(total_sent + ef.buffers["w"], total_delta, atol=1e-5)


def test_feedback_rejects_bad_state() -> None:
    with pytest.raises(ProtocolError):
        compress_with_feedback({}, {"w": torch.ones(3)}, beta=1.5)
    with pytest.raises(ProtocolError):
        compress_with_feedback({"w": torch.ones(4)}, {"w": torch.ones(3)}, beta=0.9)
