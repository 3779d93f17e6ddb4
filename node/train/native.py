"""The native CPU encoder: build protocol/native_kernels.c at first use, load it, register it with protocol/.

protocol/ stays pure (it never compiles or loads code); this module finds the system C compiler, builds
a shared library into a cache keyed by source, compiler and flags (atomic rename, so concurrent peers
are safe), loads it with ctypes, and calls gradnode.protocol.codec.set_cpu_kernel. Anything missing or
failing (no compiler, a build error, a wrong ABI) is logged once and the torch path stays in charge:
slower, same bytes. It encodes CUDA updates too, after one copy to the host (torch's ops on the GPU are 12-19x
slower on an H100). GRADNODE_NATIVE=0 turns it off; GRADNODE_CACHE moves the cache.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

from gradnode.protocol.bitpack import packed_nbytes
from gradnode.protocol.chunking import Group, layout
from gradnode.protocol.codec import Encoded, kept_per_tensor, set_cpu_kernel
from gradnode.protocol.errors import ProtocolError
from gradnode.protocol.indexcode import MAX_RICE_PARAM
from gradnode.protocol.params import CodecParams

log = logging.getLogger(__name__)

ABI = 1
SOURCE = "native_kernels.c"
ARENAS_KEPT = 2  # per thread: the caller may still hold the previous call's outputs
BASE_FLAGS = ("-O3", "-std=c99", "-ffp-contract=off", "-fPIC", "-shared")
_NONFINITE = 1
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


class _Tensor(ctypes.Structure):
    """Mirrors gn_tensor in native_kernels.c."""

    _fields_ = [("x", _PTR), ("groups", _PTR), ("n_groups", _I64), ("n_sel", _I64), ("flat_index", _PTR),
                ("values", _PTR), ("pos", _PTR), ("levels", _PTR), ("out", _PTR), ("out_cap", _I64),
                ("section_len", _I64 * 3), ("n_sections", _I64), ("rice_r", _I64), ("rice_ubits", _I64),
                ("status", _I64)]


class NativeKernel:
    """gradnode.protocol.codec.CpuKernel backed by the compiled library."""

    name = "native"

    devices = ("cpu", "cuda")  # a CUDA update is copied to the host in one transfer, encoded, and its kept
    # indices and values copied back: 6.7-9.4 GB/s on an H100 with 16 threads, 0.47-0.58 with torch's ops there

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.lib, self.path = lib, path
        self.openmp = bool(lib.gn_openmp())
        self._local = threading.local()
        self._batch = lib.gn_encode_batch
        self._batch.restype = ctypes.c_int
        self._batch.argtypes = [ctypes.POINTER(_Tensor), _I64, _I64, _I64, _I64, _I64, _I64, _PTR,
                                ctypes.POINTER(_I64)]

    def _scratch(self, name: str, numel: int, dtype: torch.dtype) -> Tensor:
        """A per-thread buffer kept between calls: fresh pages for megabytes each round cost page faults."""
        buf = getattr(self._local, name, None)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(max(numel, 1), dtype=dtype)
            setattr(self._local, name, buf)
        return buf

    def _staged(self, flats: Sequence[Tensor]) -> list[Tensor]:
        """The flats as contiguous fp32 CPU tensors: those on another device in one copy into pinned memory this
        thread reuses (pinned: 54 GB/s on an H100 against 11 from pageable memory; pinning it costs more)."""
        remote = [i for i, f in enumerate(flats) if f.device.type != "cpu"]
        if not remote:
            return list(flats)
        big = torch.cat([flats[i].float() for i in remote])
        buf = getattr(self._local, "pinned", None)
        if buf is None or buf.numel() < big.numel():
            try:
                buf = torch.empty(big.numel(), dtype=torch.float32, pin_memory=True)
            except RuntimeError as err:  # the driver refused to pin that much: pageable memory, slower
                log.warning("pinned memory unavailable, staging in pageable memory error=%s", err)
                buf = torch.empty(big.numel(), dtype=torch.float32)
            self._local.pinned = buf
        host = buf[:big.numel()]
        host.copy_(big)
        out = list(flats)
        for i, part in zip(remote, host.split([flats[i].numel() for i in remote])):
            out[i] = part
        return out

    def _arena(self, nbytes: int) -> Tensor:
        """Memory for flat indices and values (which escape to the caller), reused once nothing refers to it.

        Fresh megabytes every call cost a page fault per 4 KiB (a quarter of the encode time, measured).
        torch.frombuffer keeps its bytearray referenced while any tensor or view of it lives, so a
        reference count of 2 (the pool's list and getrefcount's argument) means it is free.
        """
        pool = getattr(self._local, "arenas", None)
        if pool is None:
            pool = self._local.arenas = []
        for i in range(len(pool)):
            if len(pool[i]) >= nbytes and sys.getrefcount(pool[i]) == 2:
                return torch.frombuffer(pool[i], dtype=torch.uint8)
        pool.append(bytearray(nbytes))
        del pool[:-ARENAS_KEPT]
        return torch.frombuffer(pool[-1], dtype=torch.uint8)

    def encode(self, flats: Sequence[Tensor], shapes: Sequence[tuple[int, ...]], params: CodecParams) -> list[Encoded]:
        devices = [flat.device for flat in flats]
        plans = [_plan(flat, shape, params) for flat, shape in zip(self._staged(flats), shapes)]
        n, n_levels, total_sel = len(plans), 1 << (params.bits - 1), sum(p.n_sel for p in plans)
        rows = [[g.offset, g.stride, g.a, g.h, g.b, g.w] for p in plans for g in p.groups]
        geometry = torch.tensor(rows or [[0] * 6], dtype=torch.int64)
        arena = self._arena(12 * total_sel + 16)
        flat_index = arena[:8 * total_sel].view(torch.int64)
        values = arena[8 * total_sel:12 * total_sel].view(torch.float32)
        levels = torch.empty(n * n_levels, dtype=torch.float32)
        pos = self._scratch("pos", total_sel, torch.int32)
        out = self._scratch("out", sum(p.out_cap for p in plans), torch.uint8)
        specs = (_Tensor * n)()
        sel = cap = group = 0
        for i, (spec, plan) in enumerate(zip(specs, plans)):
            spec.x, spec.n_groups = plan.flat.data_ptr(), len(plan.groups)
            spec.groups = geometry.data_ptr() + 48 * group
            spec.n_sel, spec.out, spec.out_cap = plan.n_sel, out.data_ptr() + cap, plan.out_cap
            spec.flat_index = flat_index.data_ptr() + 8 * sel
            spec.values, spec.pos = values.data_ptr() + 4 * sel, pos.data_ptr() + 4 * sel
            spec.levels = levels.data_ptr() + 4 * n_levels * i
            sel, cap, group = sel + plan.n_sel, cap + plan.out_cap, group + len(plan.groups)
        body_len = _I64(0)
        rc = self._batch(specs, n, params.topk, params.bits, int(params.index_coding == "rice"), params.index_width,
                         torch.get_num_threads(), out.data_ptr(), ctypes.byref(body_len))
        if rc == _NONFINITE:
            raise ProtocolError("update holds NaN or Inf values")
        if rc != 0:
            raise RuntimeError(f"native encoder failed with status {rc}")
        lengths = [spec.section_len[j] for spec in specs for j in range(spec.n_sections)]
        sections = iter(out[:body_len.value].clone().split(lengths))  # out is reused by the next call
        n_sels = [p.n_sel for p in plans]
        level_bytes = levels.numpy().tobytes()
        encoded = []
        for i, (spec, index, vals) in enumerate(zip(specs, flat_index.split(n_sels), values.split(n_sels))):
            meta: dict = {"levels": level_bytes[4 * n_levels * i:4 * n_levels * (i + 1)]}
            if params.index_coding == "rice":
                meta["r"], meta["ubits"] = spec.rice_r, spec.rice_ubits
            if devices[i].type != "cpu":
                index, vals = index.to(devices[i]), vals.to(devices[i])
            encoded.append(Encoded(meta, [next(sections) for _ in range(spec.n_sections)], index, vals))
        return encoded


@dataclass(frozen=True)
class _Plan:
    flat: Tensor
    groups: tuple[Group, ...]
    n_sel: int
    out_cap: int  # bytes the tensor's sections can take at most


def _plan(flat: Tensor, shape: tuple[int, ...], params: CodecParams) -> _Plan:
    assert flat.dtype == torch.float32 and flat.is_contiguous() and flat.device.type == "cpu"
    n_sel, slack = kept_per_tensor(shape, params)
    if params.index_coding == "rice":  # r <= 16 low bits each, unary bits <= n_sel + sum of gaps
        index_cap = packed_nbytes(n_sel, MAX_RICE_PARAM) + (n_sel + slack + 7) // 8
    else:
        index_cap = packed_nbytes(n_sel, params.index_width)
    return _Plan(flat, layout(shape, params.chunk), n_sel, packed_nbytes(n_sel, params.bits) + index_cap)


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu_flags() -> tuple[str, ...]:
    """-mavx2 only where this CPU has it; the flags are part of the cache key, so a cache shared by
    machines of one image never hands a build to a CPU that cannot run it."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return ("-mavx2",) if "avx2" in flags else ()


def _cache_dir() -> Path:
    root = os.environ.get("GRADNODE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gradnode")
    return Path(root) / "native"


def _build(source: bytes, cc: str, flags: tuple[str, ...]) -> Path:
    """Compile into the cache unless an identical build is there; returns the library's path."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(b"\0".join([source, cc.encode(), version.encode(), " ".join(flags).encode()])).hexdigest()
    cache = _cache_dir()
    target = cache / f"gradnode-native-{key[:24]}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src, lib = Path(tmp) / SOURCE, Path(tmp) / "lib.so"
        src.write_bytes(source)
        proc = subprocess.run([cc, *flags, str(src), "-o", str(lib), "-lm"], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise OSError(f"{cc} failed: {proc.stderr.strip()[-2000:]}")
        os.replace(lib, target)
    return target


def load(portable: bool = False) -> NativeKernel:
    """Build (or reuse) and load the library; raises OSError/RuntimeError if that is impossible here.

    portable: plain C only (no SIMD extensions, no OpenMP), the build a CPU without AVX2 gets.
    """
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (cc, gcc, clang) on PATH")
    source = resources.files("gradnode.protocol").joinpath(SOURCE).read_bytes()
    if portable:
        path = _build(source, cc, BASE_FLAGS)
    else:
        base = (*BASE_FLAGS, *_cpu_flags())
        try:
            path = _build(source, cc, (*base, "-fopenmp"))
        except OSError as err:
            log.info("native build without OpenMP error=%s", err)
            path = _build(source, cc, base)
    lib = ctypes.CDLL(str(path))
    if lib.gn_abi_version() != ABI:
        raise RuntimeError(f"native library {path} has ABI {lib.gn_abi_version()}, expected {ABI}")
    return NativeKernel(lib, path)


_state: dict[str, NativeKernel | None] = {}


def install() -> NativeKernel | None:
    """Register the native encoder once per process (unless GRADNODE_NATIVE=0); None means the torch path."""
    if "kernel" in _state:
        return _state["kernel"]
    kernel = None
    if os.environ.get("GRADNODE_NATIVE", "1") == "0":
        log.info("native encoder disabled by GRADNODE_NATIVE=0")
    else:
        try:
            kernel = load()
            set_cpu_kernel(kernel)
            log.info("native encoder loaded path=%s openmp=%s", kernel.path, kernel.openmp)
        except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as err:  # AttributeError: symbol
            log.warning("native encoder unavailable, torch path in use error=%s", err)
    _state["kernel"] = kernel
    return kernel
