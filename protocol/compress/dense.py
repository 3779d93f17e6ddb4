"""Dense families: every coordinate is sent, in fewer bits.

- dense: fp32 (the reference: DiLoCo's payload) or bf16;
- quant: int8 or int4 with one fp32 scale per chunk of contiguous values (symmetric absmax);
- sign: one bit per value and one fp32 scale per chunk (the mean |x|, which minimises the error).

Chunks run over the flattened tensor; the last one may be shorter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from gradnode.protocol.bitpack import pack_bits, packed_nbytes, unpack_bits
from gradnode.protocol.compress.base import (Code, Compressor, Family, MetaSpec, Options, Shape, check_padding,
                                             from_bytes, tensor_bytes)
from gradnode.protocol.errors import ProtocolError

MAX_CHUNK = 1 << 16


@dataclass(frozen=True)
class Dense(Options):
    """Every value as fp32 (bits 32) or bf16 (bits 16)."""

    bits: int = 32

    family: ClassVar[Family] = Family.DENSE

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bits not in (16, 32):
            raise ProtocolError(f"dense bits must be 16 or 32, got {self.bits}")

    def describe(self) -> str:
        return " fp32" if self.bits == 32 else " bf16"


class DenseCompressor(Compressor):
    settings: Dense
    summable = True

    def _dtype(self) -> torch.dtype:
        return torch.float32 if self.settings.bits == 32 else torch.bfloat16

    def _spec(self, name: str, shape: Shape, round: int) -> MetaSpec:
        return {}

    def _lengths(self, name: str, shape: Shape, round: int, meta: Mapping[str, int | bytes]) -> tuple[int, ...]:
        return (math.prod(shape) * self.settings.bits // 8,)

    def _encode(self, name: str, t: Tensor, round: int) -> tuple[Code, Tensor]:
        values = t.to(self._dtype())
        return Code({}, (tensor_bytes(values, values.dtype),)), values.float()

    def _decode(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        return from_bytes(code.sections[0], self._dtype(), f"{name}: values")

    def _compact(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        return self._decode(name, shape, round, code)

    def _expand(self, name: str, shape: Shape, round: int, compact: Tensor) -> Tensor:
        return compact.clone()


def _chunks(numel: int, chunk: int) -> int:
    return -(-numel // chunk)


def _chunked(flat: Tensor, chunk: int) -> Tensor:
    """[n_chunks, chunk] view of flat, zero-padded at the end."""
    pad = (-flat.numel()) % chunk
    return torch.cat([flat, flat.new_zeros(pad)]).view(-1, chunk) if pad else flat.view(-1, chunk)


def _scales(section: bytes, name: str) -> Tensor:
    scales = from_bytes(section, torch.float32, f"{name}: chunk scales")
    if bool((scales < 0).any()):
        raise ProtocolError(f"{name}: chunk scales must be >= 0")
    return scales


@dataclass(frozen=True)
class Quant(Options):
    """Symmetric integers of `bits` bits (8 or 4): q in [-(2^(bits-1) - 1), 2^(bits-1) - 1], scale absmax / qmax."""

    bits: int = 8
    chunk: int = 64

    family: ClassVar[Family] = Family.QUANT

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bits not in (4, 8):
            raise ProtocolError(f"quant bits must be 4 or 8, got {self.bits}")
        if type(self.chunk) is not int or not 1 <= self.chunk <= MAX_CHUNK:
            raise ProtocolError(f"quant chunk must be an int in [1, {MAX_CHUNK}], got {self.chunk}")

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    def describe(self) -> str:
        return f" int{self.bits}/{self.chunk}"


class QuantCompressor(Compressor):
    """Codes are q + qmax, so 0 .. 2 qmax; the one code above (all ones) is never sent and is rejected."""

    settings: Quant

    def _spec(self, name: str, shape: Shape, round: int) -> MetaSpec:
        return {}

    def _lengths(self, name: str, shape: Shape, round: int, meta: Mapping[str, int | bytes]) -> tuple[int, ...]:
        numel = math.prod(shape)
        return 4 * _chunks(numel, self.settings.chunk), packed_nbytes(numel, self.settings.bits)

    def _encode(self, name: str, t: Tensor, round: int) -> tuple[Code, Tensor]:
        s = self.settings
        rows = _chunked(t.reshape(-1), s.chunk)
        scales = rows.abs().amax(dim=1) / s.qmax
        q = torch.round(rows / scales.clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(1))
        q = q.clamp(-s.qmax, s.qmax).reshape(-1)[:t.numel()].to(torch.int64)
        code = Code({}, (tensor_bytes(scales), tensor_bytes(pack_bits(q + s.qmax, s.bits), torch.uint8)))
        return code, self._values(q, scales, t.numel())

    def _values(self, q: Tensor, scales: Tensor, numel: int) -> Tensor:
        rows = _chunked(q.float(), self.settings.chunk)
        return (rows * scales.unsqueeze(1)).reshape(-1)[:numel]

    def _decode(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        s, numel = self.settings, math.prod(shape)
        scales = _scales(code.sections[0], name)
        check_padding(code.sections[1], numel * s.bits, "codes")
        codes = unpack_bits(from_bytes(code.sections[1], torch.uint8, ""), s.bits, numel)
        if bool((codes > 2 * s.qmax).any()):
            raise ProtocolError(f"{name}: integer code out of range")
        return self._values(codes - s.qmax, scales, numel)


@dataclass(frozen=True)
class Sign(Options):
    """One bit per value (its sign) and one fp32 scale per chunk: the chunk's mean |x|."""

    chunk: int = 256

    family: ClassVar[Family] = Family.SIGN

    def __post_init__(self) -> None:
        super().__post_init__()
        if type(self.chunk) is not int or not 1 <= self.chunk <= MAX_CHUNK:
            raise ProtocolError(f"sign chunk must be an int in [1, {MAX_CHUNK}], got {self.chunk}")

    def describe(self) -> str:
        return f" /{self.chunk}"


class SignCompressor(Compressor):
    settings: Sign

    def _spec(self, name: str, shape: Shape, round: int) -> MetaSpec:
        return {}

    def _lengths(self, name: str, shape: Shape, round: int, meta: Mapping[str, int | bytes]) -> tuple[int, ...]:
        numel = math.prod(shape)
        return 4 * _chunks(numel, self.settings.chunk), packed_nbytes(numel, 1)

    def _encode(self, name: str, t: Tensor, round: int) -> tuple[Code, Tensor]:
        flat = t.reshape(-1)
        rows = _chunked(flat, self.settings.chunk)
        counts = _chunked(torch.ones_like(flat), self.settings.chunk).sum(dim=1)
        scales = rows.abs().sum(dim=1) / counts
        negative = flat < 0
        code = Code({}, (tensor_bytes(scales), tensor_bytes(pack_bits(negative, 1), torch.uint8)))
        return code, self._values(negative, scales, flat.numel())

    def _values(self, negative: Tensor, scales: Tensor, numel: int) -> Tensor:
        mag = scales.repeat_interleave(self.settings.chunk)[:numel]
        return torch.where(negative, -mag, mag)

    def _decode(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        numel = math.prod(shape)
        scales = _scales(code.sections[0], name)
        check_padding(code.sections[1], numel, "signs")
        negative = unpack_bits(from_bytes(code.sections[1], torch.uint8, ""), 1, numel).bool()
        return self._values(negative, scales, numel)
