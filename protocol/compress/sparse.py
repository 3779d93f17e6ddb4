"""Sparse families: today's SparseLoCo codec, random-k from a shared seed, and DCT top-k (DeMo).

SparseLoCo is wrapped, not rewritten: its header fields and sections are exactly the codec's, so a
payload built from this entry is byte-identical to one built by `encode_update`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import torch
from torch import Tensor

from gradnode.protocol.bitpack import pack_bits, packed_nbytes, unpack_bits
from gradnode.protocol.chunking import Group, layout
from gradnode.protocol.codec import decode_tensor, encode_tensors, kept_per_tensor, section_sizes
from gradnode.protocol.compress.base import (MAX_META_INT, Code, Compressor, Family, MetaSpec, Options, Shape,
                                             check_padding, from_bytes, shared_seed, tensor_bytes)
from gradnode.protocol.errors import ProtocolError
from gradnode.protocol.indexcode import MAX_RICE_PARAM
from gradnode.protocol.params import CodecParams
from gradnode.protocol.topk import topk_group


# ---------------------------------------------------------------- SparseLoCo


@dataclass(frozen=True)
class SparseLoCo(Options):
    """Chunked top-k, `bits`-bit values on per-tensor levels, packed12 or Rice-coded indices (CodecParams)."""

    chunk: int = 4096
    topk: int = 64
    bits: int = 2
    index_coding: str = "rice"

    family: ClassVar[Family] = Family.SPARSELOCO

    def __post_init__(self) -> None:
        super().__post_init__()
        self.params  # noqa: B018 - CodecParams checks the rest

    @property
    def params(self) -> CodecParams:
        return CodecParams(chunk=self.chunk, topk=self.topk, bits=self.bits, index_coding=self.index_coding)

    def describe(self) -> str:
        return f" top{self.topk}/{self.chunk} {self.bits}b {self.index_coding}"


class SparseLoCoCompressor(Compressor):
    settings: SparseLoCo

    @property
    def sizes_known(self) -> bool:  # type: ignore[override]
        return self.settings.index_coding != "rice"

    def _spec(self, name: str, shape: Shape, round: int) -> MetaSpec:
        spec: dict[str, int | tuple[int, int]] = {"levels": 4 << (self.settings.bits - 1)}
        if self.settings.index_coding == "rice":
            spec |= {"r": (0, MAX_RICE_PARAM), "ubits": (0, MAX_META_INT)}
        return spec

    def _lengths(self, name: str, shape: Shape, round: int, meta: Mapping[str, int | bytes]) -> tuple[int, ...]:
        return section_sizes(shape, self.settings.params, dict(meta)).lengths

    def _encode(self, name: str, t: Tensor, round: int) -> tuple[Code, Tensor]:
        enc = encode_tensors([t], self.settings.params)[0]
        recon = torch.zeros(t.numel(), dtype=torch.float32, device=t.device)
        recon[enc.flat_index] = enc.values
        return Code(dict(enc.meta), tuple(tensor_bytes(s, torch.uint8) for s in enc.sections)), recon

    def _decode(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        params = self.settings.params
        sizes = section_sizes(shape, params, dict(code.meta))
        sections = [from_bytes(s, torch.uint8, "") for s in code.sections]
        index, values, _, _ = decode_tensor(shape, params, dict(code.meta), sizes, sections, torch.device("cpu"))
        if index is None:  # every position was sent
            return values.reshape(shape)
        dense = torch.zeros(math.prod(shape), dtype=torch.float32)
        dense[index] = values
        return dense.reshape(shape)


# ---------------------------------------------------------------- random-k


@dataclass(frozen=True)
class RandomK(Options):
    """A random `density` of each tensor's coordinates, the same for every peer: values only, no indices.

    bits: 16 sends bf16 values, 32 fp32. The positions come from a seed of the round and the tensor's name.
    """

    density: float = 0.05
    bits: int = 16

    family: ClassVar[Family] = Family.RANDOM_K

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.density <= 1.0:
            raise ProtocolError(f"random-k density must be in (0, 1], got {self.density}")
        if self.bits not in (16, 32):
            raise ProtocolError(f"random-k bits must be 16 or 32, got {self.bits}")

    def describe(self) -> str:
        return f" {self.density:g} {'bf16' if self.bits == 16 else 'fp32'}"


def _dtype(bits: int) -> torch.dtype:
    return torch.bfloat16 if bits == 16 else torch.float32


class RandomKCompressor(Compressor):
    settings: RandomK
    summable = True

    def kept(self, numel: int) -> int:
        return max(1, int(self.settings.density * numel))

    @staticmethod
    @lru_cache(maxsize=256)
    def _indices(name: str, numel: int, k: int, round: int) -> Tensor:
        g = torch.Generator().manual_seed(shared_seed("random-k", round, name))
        return torch.randperm(numel, generator=g)[:k].sort().values

    def indices(self, name: str, shape: Shape, round: int) -> Tensor:
        numel = math.prod(shape)
        return self._indices(name, numel, self.kept(numel), round)

    def _spec(self, name: str, shape: Shape, round: int) -> MetaSpec:
        return {}

    def _lengths(self, name: str, shape: Shape, round: int, meta: Mapping[str, int | bytes]) -> tuple[int, ...]:
        return (self.kept(math.prod(shape)) * self.settings.bits // 8,)

    def _encode(self, name: str, t: Tensor, round: int) -> tuple[Code, Tensor]:
        idx = self.indices(name, tuple(t.shape), round).to(t.device)
        values = t.reshape(-1)[idx].to(_dtype(self.settings.bits))
        recon = torch.zeros(t.numel(), dtype=torch.float32, device=t.device)
        recon[idx] = values.float()
        return Code({}, (tensor_bytes(values, values.dtype),)), recon

    def _compact(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        return from_bytes(code.sections[0], _dtype(self.settings.bits), f"{name}: values")

    def _expand(self, name: str, shape: Shape, round: int, compact: Tensor) -> Tensor:
        out = torch.zeros(math.prod(shape), dtype=torch.float32, device=compact.device)
        out[self.indices(name, shape, round).to(compact.device)] = compact.float()
        return out

    def _decode(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        return self._expand(name, shape, round, self._compact(name, shape, round, code))

    def sent(self, name: str, shape: Shape, round: int, code: Code) -> tuple[Tensor | None, Tensor]:
        """The shared positions and the values: a held update costs its values, not its tensor's size."""
        shape = self.check(name, shape, round, code)
        if self.is_dense(shape, round):
            return super().sent(name, shape, round, code)
        index = self.indices(name, shape, round)
        return index.to(torch.int32 if math.prod(shape) <= 2**31 else torch.int64), \
            self._compact(name, shape, round, code).float()


# ---------------------------------------------------------------- DCT top-k


@dataclass(frozen=True)
class DctTopK(Options):
    """DeMo-style: a 2-D DCT of every chunk (s x s tiles, contiguous runs for 1-D), top-k coefficients.

    sign: send each kept coefficient's sign (1 bit) and one fp32 scale per chunk (the mean |kept|),
    else bf16 values. Positions are fixed-width, ceil(log2(chunk)) bits each.
    """

    chunk: int = 4096
    topk: int = 64
    sign: bool = True

    family: ClassVar[Family] = Family.DCT_TOPK

    def __post_init__(self) -> None:
        super().__post_init__()
        CodecParams(chunk=self.chunk, topk=self.topk)  # the same bounds as SparseLoCo's chunks

    @property
    def index_width(self) -> int:
        return max(1, (self.chunk - 1).bit_length())

    def describe(self) -> str:
        return f" top{self.topk}/{self.chunk} {'sign' if self.sign else 'bf16'}"


@lru_cache(maxsize=64)
def dct_basis(n: int) -> Tensor:
    """Orthonormal DCT-II matrix [frequency, position], built in float64 and rounded once to fp32."""
    k = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    d = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d.float()


def _transform(groups: tuple[Group, ...], src: Tensor, inverse: bool) -> Tensor:
    """The 2-D DCT (or its inverse) of every chunk, written at the chunk's own positions."""
    out = torch.empty_like(src)
    for g in groups:
        dh, dw = dct_basis(g.h).to(src.device), dct_basis(g.w).to(src.device)
        pattern = "ph,apbq,qw->ahbw" if inverse else "ph,ahbw,qw->apbq"
        g.view(out).copy_(torch.einsum(pattern, dh, g.view(src), dw))
    return out


class DctTopKCompressor(Compressor):
    settings: DctTopK

    def _counts(self, shape: Shape) -> tuple[int, int]:
        """(chunks, kept coefficients) of a tensor."""
        groups = layout(shape, self.settings.chunk)
        return sum(g.n_chunks for g in groups), kept_per_tensor(shape, CodecParams(self.settings.chunk,
                                                                                     self.settings.topk))[0]

    def _spec(self, name: str, shape: Shape, round: int) -> MetaSpec:
        return {}

    def _lengths(self, name: str, shape: Shape, round: int, meta: Mapping[str, int | bytes]) -> tuple[int, ...]:
        n_chunks, n_sel = self._counts(shape)
        index = packed_nbytes(n_sel, self.settings.index_width)
        if self.settings.sign:
            return 4 * n_chunks, packed_nbytes(n_sel, 1), index
        return 2 * n_sel, index

    def _encode(self, name: str, t: Tensor, round: int) -> tuple[Code, Tensor]:
        s = self.settings
        shape, flat = tuple(t.shape), t.reshape(-1).contiguous()
        groups = layout(shape, s.chunk)
        coef = _transform(groups, flat, inverse=False)
        picks = [topk_group(coef, g, s.topk) for g in groups]
        pos = torch.cat([p.reshape(-1) for p, _ in picks])
        index = tensor_bytes(pack_bits(pos, s.index_width), torch.uint8)
        if s.sign:
            scales = torch.cat([v.abs().mean(dim=1) for _, v in picks])
            negative = torch.cat([(v < 0).reshape(-1) for _, v in picks])
            sections = (tensor_bytes(scales), tensor_bytes(pack_bits(negative, 1), torch.uint8), index)
        else:
            values = torch.cat([v.reshape(-1) for _, v in picks]).to(torch.bfloat16)
            sections = (tensor_bytes(values, torch.bfloat16), index)
        code = Code({}, sections)
        return code, self._decode(name, shape, round, code)

    def _decode(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        s = self.settings
        n_chunks, n_sel = self._counts(shape)
        groups = layout(shape, s.chunk)
        check_padding(code.sections[-1], n_sel * s.index_width, "positions")
        pos = unpack_bits(from_bytes(code.sections[-1], torch.uint8, ""), s.index_width, n_sel)
        if s.sign:
            scales = from_bytes(code.sections[0], torch.float32, f"{name}: chunk scales")
            if bool((scales < 0).any()):
                raise ProtocolError(f"{name}: chunk scales must be >= 0")
            check_padding(code.sections[1], n_sel, "signs")
            negative = unpack_bits(from_bytes(code.sections[1], torch.uint8, ""), 1, n_sel).bool()
            per_chunk = torch.cat([torch.full((g.n_chunks,), min(s.topk, g.chunk_numel)) for g in groups])
            magnitude = scales.repeat_interleave(per_chunk)
            values = torch.where(negative, -magnitude, magnitude)
        else:
            values = from_bytes(code.sections[0], torch.bfloat16, f"{name}: coefficients")
        coef = torch.zeros(math.prod(shape), dtype=torch.float32)
        coef[_flat_positions(groups, s.topk, pos, name)] = values
        return _transform(groups, coef, inverse=True)


def _flat_positions(groups: tuple[Group, ...], k: int, pos: Tensor, name: str) -> Tensor:
    """In-chunk positions -> flat indices; ProtocolError unless strictly increasing within each chunk."""
    parts, start = [], 0
    for g in groups:
        kg = min(k, g.chunk_numel)
        p = pos[start:start + g.n_chunks * kg].view(g.n_chunks, kg)
        start += g.n_chunks * kg
        if bool((p >= g.chunk_numel).any()) or (kg > 1 and not bool((p[:, 1:] > p[:, :-1]).all())):
            raise ProtocolError(f"{name}: positions out of range or not strictly increasing within a chunk")
        parts.append(g.flat_index(p).reshape(-1))
    return torch.cat(parts)
