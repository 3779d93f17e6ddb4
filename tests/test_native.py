"""The native CPU encoder writes exactly the torch path's bytes, and the torch path takes over without it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from gradnode.node.train import native
from gradnode.protocol import CodecParams, ProtocolError, decode_update, encode_update, encode_with_reconstruction
from gradnode.protocol.codec import cpu_kernel, set_cpu_kernel

SHAPES = [(192, 130), (130, 70), (64, 64), (3, 4096), (5000,), (4096,), (3,), (1,), (0,), (), (2, 3, 500), (65, 1)]


@pytest.fixture(scope="module")
def kernel() -> native.NativeKernel:
    try:
        k = native.load()
    except (OSError, RuntimeError) as err:  # no compiler here: the fallback tests still run
        pytest.skip(f"native encoder unavailable: {err}")
    return k


@pytest.fixture
def use(kernel: native.NativeKernel) -> Iterator[native.NativeKernel]:
    previous = set_cpu_kernel(kernel)
    yield kernel
    set_cpu_kernel(previous)


def _torch_bytes(update: dict[str, torch.Tensor], params: CodecParams) -> bytes:
    previous = set_cpu_kernel(None)
    try:
        return encode_update(update, params=params, run_id="r", round=3, sender="s")
    finally:
        set_cpu_kernel(previous)


def _update(seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    update = {}
    for i, shape in enumerate(SHAPES):
        x = torch.randn(shape, generator=g)
        if x.numel() > 8:
            kind = (seed + i) % 5
            if kind == 1:  # heavy tails and scales spanning many binades
                x = x * torch.rand(shape, generator=g) ** 8 * 10.0 ** torch.randint(-30, 30, (), generator=g).item()
            elif kind == 2:  # ties: few distinct magnitudes, signed zeros
                x = torch.randint(-2, 3, shape, generator=g).float()
                x.view(-1)[::7] = -0.0
            elif kind == 3:  # all equal magnitudes
                x = torch.where(x > 0, 1.5, -1.5)
            elif kind == 4:  # subnormals next to normal values
                x = x * 1e-39
                x.view(-1)[::5] *= 1e30
        x = x.to(dtype)
        update[f"t{i}"] = torch.where(torch.isfinite(x), x, torch.zeros_like(x))  # fp16 overflows
    return update


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("coding", ["rice", "packed12"])
def test_native_bytes_equal_torch(use: native.NativeKernel, dtype: torch.dtype, coding: str) -> None:
    for seed in range(3 if dtype == torch.float32 else 1):  # every seed covers each kind of data
        update = _update(seed, dtype)
        for params in (CodecParams(index_coding=coding), CodecParams(index_coding=coding, bits=[1, 3, 8][seed % 3],
                                                                     topk=[5, 64, 100][seed % 3],
                                                                     chunk=[4096, 1000, 256][seed % 3])):
            native_bytes = encode_update(update, params=params, run_id="r", round=3, sender="s")
            assert native_bytes == _torch_bytes(update, params), (seed, params)


def test_native_bytes_equal_torch_random_updates(use: native.NativeKernel) -> None:
    g = torch.Generator().manual_seed(11)
    for _ in range(12):
        update = {}
        for i in range(int(torch.randint(1, 4, (), generator=g))):
            dims = torch.randint(1, 60, (int(torch.randint(1, 4, (), generator=g)),), generator=g).tolist()
            x = torch.randn(dims, generator=g)
            if i == 1:
                x = x.round()  # ties
            update[f"t{i}"] = x
        chunk = [16, 100, 256, 1024, 4096][int(torch.randint(0, 5, (), generator=g))]
        params = CodecParams(chunk=chunk, topk=int(torch.randint(1, min(chunk, 70) + 1, (), generator=g)),
                             bits=int(torch.randint(1, 9, (), generator=g)),
                             index_coding=["rice", "packed12"][int(torch.randint(0, 2, (), generator=g))])
        assert encode_update(update, params=params, run_id="r", round=3, sender="s") == _torch_bytes(update, params)


def test_portable_build_bytes_equal_torch(kernel: native.NativeKernel) -> None:
    portable = native.load(portable=True)  # the scalar code paths CPUs without AVX2 run
    previous = set_cpu_kernel(portable)
    try:
        for seed, coding in ((0, "rice"), (1, "packed12"), (2, "rice")):
            update, params = _update(seed, torch.float32), CodecParams(index_coding=coding)
            assert encode_update(update, params=params, run_id="r", round=3, sender="s") == _torch_bytes(update, params)
    finally:
        set_cpu_kernel(previous)


def test_native_reconstruction_equals_torch(use: native.NativeKernel) -> None:
    update = _update(7, torch.float32)
    _, fast = encode_with_reconstruction(update)
    previous = set_cpu_kernel(None)
    try:
        _, slow = encode_with_reconstruction(update)
    finally:
        set_cpu_kernel(previous)
    for name in update:
        assert torch.equal(fast[name].flat_index, slow[name].flat_index)
        assert torch.equal(fast[name].values.view(torch.int32), slow[name].values.view(torch.int32))
        assert fast[name].meta == slow[name].meta


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (runs on a GPU machine)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cuda_update_is_encoded_on_the_host_into_the_devices_bytes(use: native.NativeKernel,
                                                                     dtype: torch.dtype) -> None:
    """A CUDA update goes to the host in one copy and through the kernel: the bytes the torch ops write on the
    device (and on the CPU), and the kept indices and values back on the device, where the error feedback
    subtracts them."""
    update = {name: t.cuda() for name, t in _update(11, dtype).items()}
    data, fast = encode_with_reconstruction(update, run_id="r", round=3, sender="s")
    previous = set_cpu_kernel(None)
    try:
        slow_data, slow = encode_with_reconstruction(update, run_id="r", round=3, sender="s")
    finally:
        set_cpu_kernel(previous)
    assert data == slow_data == _torch_bytes({name: t.cpu() for name, t in update.items()}, CodecParams())
    for name, t in update.items():
        assert fast[name].flat_index.device == fast[name].values.device == t.device, name
        assert torch.equal(fast[name].flat_index, slow[name].flat_index)
        assert torch.equal(fast[name].values.view(torch.int32), slow[name].values.view(torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (runs on a GPU machine)")
def test_a_cuda_update_is_staged_in_pageable_memory_when_pinning_is_refused(use: native.NativeKernel,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    empty = torch.empty

    def refuse_pinning(*args, pin_memory: bool = False, **kwargs):  # type: ignore[no-untyped-def]
        if pin_memory:
            raise RuntimeError("pinning refused")
        return empty(*args, **kwargs)

    use._local.__dict__.pop("pinned", None)  # this thread's staging memory, if an earlier test made it
    monkeypatch.setattr(torch, "empty", refuse_pinning)
    update = _update(12, torch.float32)
    data = encode_update({name: t.cuda() for name, t in update.items()}, run_id="r", round=3, sender="s")
    assert data == _torch_bytes(update, CodecParams())
    assert not use._local.pinned.is_pinned()
    use._local.__dict__.pop("pinned")


def test_outputs_survive_later_calls(use: native.NativeKernel) -> None:
    """Output memory is recycled only once the caller has dropped every tensor that views it."""
    _, kept = encode_with_reconstruction(_update(4, torch.float32))
    snapshot = {name: (enc.flat_index.clone(), enc.values.clone(), [s.clone() for s in enc.sections])
                for name, enc in kept.items()}
    only_view = kept["t0"].values[1:]
    whole = kept["t3"]
    del kept
    for seed in (5, 6, 7):
        encode_with_reconstruction(_update(seed, torch.float32))
    assert torch.equal(only_view, snapshot["t0"][1][1:])
    assert torch.equal(whole.flat_index, snapshot["t3"][0]) and torch.equal(whole.values, snapshot["t3"][1])
    assert all(torch.equal(a, b) for a, b in zip(whole.sections, snapshot["t3"][2]))


def test_native_empty_tensors_only(use: native.NativeKernel) -> None:
    update = {"e": torch.zeros(0), "f": torch.zeros(3, 0)}
    assert encode_update(update, run_id="r", round=3, sender="s") == _torch_bytes(update, CodecParams())


def test_native_on_non_contiguous_and_threads(use: native.NativeKernel) -> None:
    x = torch.randn(300, 200).t()
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert encode_update({"w": x}, run_id="r", round=3, sender="s") == _torch_bytes({"w": x}, CodecParams())
    finally:
        torch.set_num_threads(threads)


def test_native_rejects_nan_and_inf(use: native.NativeKernel) -> None:
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.randn(128, 128)
        x[70, 3] = bad
        with pytest.raises(ProtocolError):
            encode_update({"a": torch.randn(10), "w": x})


def test_round_trip_through_native(use: native.NativeKernel) -> None:
    update = _update(3, torch.float32)
    dec = decode_update(encode_update(update))
    for name, t in update.items():
        assert dec.tensors[name].shape == t.shape


def test_torch_fallback_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADNODE_NATIVE", "0")
    monkeypatch.setattr(native, "_state", {})
    previous = set_cpu_kernel(None)
    try:
        assert native.install() is None and cpu_kernel() is None
        update = _update(1, torch.float32)
        assert decode_update(encode_update(update)).params == CodecParams()
    finally:
        set_cpu_kernel(previous)


def test_missing_compiler_keeps_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADNODE_NATIVE", "1")
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_compiler", lambda: None)
    previous = set_cpu_kernel(None)
    try:
        assert native.install() is None and cpu_kernel() is None
    finally:
        set_cpu_kernel(previous)
