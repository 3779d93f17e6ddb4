"""One tensor in, a wire spec plus byte sections out, and back. The envelope lives in wire.py.

Sparse body of a tensor: [values: n_sel codes of `bits` bits][indices], where indices are either
n_sel fixed-width positions (packed12) or the Rice low-bit stream then the unary stream (rice).
n_sel and every section length follow from the shape and the codec params (plus r and ubits for
rice), so a receiver knows all sizes before reading a byte of the body.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from gradnode.protocol.bitpack import pack_bits, packed_nbytes, unpack_bits
from gradnode.protocol.chunking import Group, layout
from gradnode.protocol.errors import ProtocolError
from gradnode.protocol.indexcode import MAX_RICE_PARAM, best_rice_param, gaps, rice_decode, rice_encode, undo_gaps
from gradnode.protocol.params import CodecParams
from gradnode.protocol.quant import dequantise, fit_levels, quantise
from gradnode.protocol.topk import topk_group

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass
class Encoded:
    """One tensor's wire spec (without name/shape/dtype), body sections, and exact reconstruction."""

    meta: dict[str, Any]
    sections: list[Tensor]  # uint8, in body order
    flat_index: Tensor  # int64 positions in the flattened tensor of the kept values
    values: Tensor  # fp32, what receivers will reconstruct at flat_index


@dataclass(frozen=True)
class SectionSizes:
    """Body layout of one tensor: section lengths in bytes, and the number of kept values."""

    n_sel: int
    lengths: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.lengths)


def kept_per_tensor(shape: tuple[int, ...], params: CodecParams) -> tuple[int, int]:
    """(values kept, sum over chunks of unkept values) for a tensor of this shape."""
    n_sel = slack = 0
    for g in layout(shape, params.chunk):
        k = min(params.topk, g.chunk_numel)
        n_sel += g.n_chunks * k
        slack += g.n_chunks * (g.chunk_numel - k)
    return n_sel, slack


def section_sizes(shape: tuple[int, ...], params: CodecParams, meta: dict[str, Any]) -> SectionSizes:
    """Section lengths implied by a (validated) spec; raises ProtocolError if meta is inconsistent."""
    numel = math.prod(shape)
    if params.dense:
        return SectionSizes(numel, (4 * numel,))
    n_sel, slack = kept_per_tensor(shape, params)
    values = packed_nbytes(n_sel, params.bits)
    if params.index_coding == "packed12":
        return SectionSizes(n_sel, (values, packed_nbytes(n_sel, params.index_width)))
    r, ubits = meta["r"], meta["ubits"]
    if not 0 <= r <= MAX_RICE_PARAM:
        raise ProtocolError(f"rice parameter {r} out of range")
    if not n_sel <= ubits <= n_sel + (slack >> r):
        raise ProtocolError(f"unary stream length {ubits} impossible for {n_sel} positions")
    return SectionSizes(n_sel, (values, packed_nbytes(n_sel, r), (ubits + 7) // 8))


class CpuKernel(Protocol):
    """A faster CPU encoder that writes exactly the bytes encode_tensor writes (registered by the runtime)."""

    name: str
    devices: tuple[str, ...]  # the device types whose tensors it takes: "cpu", and those it copies to the host

    def encode(self, flats: Sequence[Tensor], shapes: Sequence[tuple[int, ...]], params: CodecParams) -> list[Encoded]:
        """Flattened contiguous tensors (and their shapes) -> one Encoded each, its flat_index and values on the
        tensor's device; ProtocolError on NaN/Inf. CPU tensors come as fp32, the others of any float dtype."""
        ...


_cpu_kernel: CpuKernel | None = None


def set_cpu_kernel(kernel: CpuKernel | None) -> CpuKernel | None:
    """Route sparse encoding of CPU tensors through kernel (None: the torch ops below). Returns the previous one."""
    global _cpu_kernel
    previous, _cpu_kernel = _cpu_kernel, kernel
    return previous


def cpu_kernel() -> CpuKernel | None:
    return _cpu_kernel


def encode_tensors(tensors: Sequence[Tensor], params: CodecParams) -> list[Encoded]:
    """encode_tensor over a whole update; the tensors on a device the registered kernel takes go through it in one
    batch (the native kernel takes CUDA tensors too, in one copy to the host: on the GPU the torch ops below
    launch thousands of small kernels per update, README's Known limits)."""
    kernel = _cpu_kernel
    mine = [i for i, t in enumerate(tensors) if kernel is not None and t.device.type in kernel.devices]
    if params.dense or not mine:
        return [encode_tensor(t, params) for t in tensors]
    # on the CPU as contiguous fp32 (exact for bf16/fp16); a CUDA tensor as it is (the kernel copies it to the host)
    flats = [f.float().contiguous() if f.device.type == "cpu" else f
             for f in (tensors[i].detach().reshape(-1) for i in mine)]
    fast = dict(zip(mine, kernel.encode(flats, [tuple(tensors[i].shape) for i in mine], params)))
    return [fast[i] if i in fast else encode_tensor(t, params) for i, t in enumerate(tensors)]


def encode_tensor(t: Tensor, params: CodecParams) -> Encoded:
    flat = t.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    shape = tuple(t.shape)
    if params.dense:
        values = flat.float()
        if not bool(torch.isfinite(values).all()):
            raise ProtocolError("update holds NaN or Inf values")
        data = values.contiguous().view(torch.uint8)
        index = torch.arange(values.numel(), device=values.device)
        return Encoded({}, [data], index, values)
    groups = layout(shape, params.chunk)
    picks = [topk_group(flat, g, params.topk) for g in groups]
    values = torch.cat([v.reshape(-1) for _, v in picks]) if picks else flat.new_zeros(0, dtype=torch.float32)
    levels = fit_levels(values.abs(), 1 << (params.bits - 1))
    codes = quantise(values, levels, params.bits)
    recon = dequantise(codes, levels, params.bits)
    flat_index = (torch.cat([g.flat_index(p).reshape(-1) for g, (p, _) in zip(groups, picks)]) if picks
                  else torch.zeros(0, dtype=torch.int64, device=flat.device))
    meta: dict[str, Any] = {"levels": levels.cpu().numpy().tobytes()}
    sections = [pack_bits(codes, params.bits)]
    if params.index_coding == "packed12":
        pos = torch.cat([p.reshape(-1) for p, _ in picks]) if picks else flat_index
        sections.append(pack_bits(pos, params.index_width))
    else:
        g_flat = torch.cat([gaps(p).reshape(-1) for p, _ in picks]) if picks else flat_index
        r = best_rice_param(g_flat)
        low, unary, ubits = rice_encode(g_flat, r)
        meta["r"], meta["ubits"] = r, ubits
        sections += [low, unary]
    return Encoded(meta, sections, flat_index, recon)


def _positions(groups: tuple[Group, ...], k: int, flat_pos: Tensor) -> Tensor | None:
    """Flat in-chunk positions -> flat tensor indices; None if any row is not strictly increasing
    or points past its chunk."""
    parts, start = [], 0
    for g in groups:
        kg = min(k, g.chunk_numel)
        pos = flat_pos[start:start + g.n_chunks * kg].view(g.n_chunks, kg)
        start += g.n_chunks * kg
        if kg > 1 and not bool((pos[:, 1:] > pos[:, :-1]).all()):
            return None
        if not bool((pos[:, 0] >= 0).all()) or not bool((pos[:, -1] < g.chunk_numel).all()):
            return None
        parts.append(g.flat_index(pos).reshape(-1))
    return torch.cat(parts) if parts else flat_pos.new_zeros(0)


def _gap_positions(groups: tuple[Group, ...], k: int, g_flat: Tensor) -> Tensor:
    parts, start = [], 0
    for g in groups:
        kg = min(k, g.chunk_numel)
        parts.append(undo_gaps(g_flat[start:start + g.n_chunks * kg].view(g.n_chunks, kg)).reshape(-1))
        start += g.n_chunks * kg
    return torch.cat(parts) if parts else g_flat


def _check_padding(section: Tensor, nbits: int, what: str) -> None:
    """Canonical form: the unused high bits of a section's last byte are zero."""
    used = nbits % 8
    if used and int(section[-1].item()) >> used:
        raise ProtocolError(f"non-zero padding after the {what}")


def decode_tensor(shape: tuple[int, ...], params: CodecParams, meta: dict[str, Any], sizes: SectionSizes,
                  sections: list[Tensor], device: torch.device) -> tuple[Tensor | None, Tensor, list[int], Tensor]:
    """Body sections (uint8 CPU tensors) -> (flat positions sent, sorted int64, or None for all of them; their
    fp32 values; per-level counts; levels). What was sent, never a dense copy: receivers hold it until the round
    is applied.

    Raises ProtocolError for anything a well-behaved encoder cannot have produced.
    """
    if params.dense:
        values = sections[0].view(torch.float32).to(device)
        if not bool(torch.isfinite(values).all()):
            raise ProtocolError("dense tensor holds NaN or Inf")
        return None, values, [], values
    n_sel, bits = sizes.n_sel, params.bits
    levels = torch.frombuffer(bytearray(meta["levels"]), dtype=torch.float32)
    if not bool(torch.isfinite(levels).all()) or bool((levels < 0).any()):
        raise ProtocolError("quantisation levels must be finite and >= 0")
    _check_padding(sections[0], n_sel * bits, "value codes")
    codes = unpack_bits(sections[0].to(device), bits, n_sel)
    groups = layout(shape, params.chunk)
    if params.index_coding == "packed12":
        _check_padding(sections[1], n_sel * params.index_width, "indices")
        pos = unpack_bits(sections[1].to(device), params.index_width, n_sel)
        flat_index = _positions(groups, params.topk, pos)
    else:
        r = meta["r"]
        _check_padding(sections[1], n_sel * r, "rice low bits")
        g_flat = rice_decode(sections[1].to(device), sections[2].to(device), r, meta["ubits"], n_sel)
        if g_flat is None:
            raise ProtocolError("malformed rice unary stream")
        flat_index = _positions(groups, params.topk, _gap_positions(groups, params.topk, g_flat))
    if flat_index is None:
        raise ProtocolError("indices out of range or not strictly increasing within a chunk")
    levels = levels.to(device)
    counts = torch.bincount(codes & ((1 << (bits - 1)) - 1), minlength=levels.numel()).tolist()
    flat_index, order = flat_index.sort()
    if flat_index.numel() > 1 and not bool((flat_index[1:] > flat_index[:-1]).all()):
        raise ProtocolError("a position is sent twice")  # chunks are disjoint: a layout bug, never peer input
    return flat_index, dequantise(codes, levels, bits)[order], counts, levels
