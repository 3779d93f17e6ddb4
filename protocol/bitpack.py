"""Vectorised bit packing: fixed-width fields and unary streams, LSB first, in uint8 tensors.

Field i of width w occupies stream bits [i*w, (i+1)*w); stream bit j is bit (j % 8) of byte j // 8.
Everything is torch ops so the same code runs on CPU and CUDA.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def packed_nbytes(count: int, width: int) -> int:
    return (count * width + 7) // 8


def _shifts(n: int, step: int, device: torch.device) -> Tensor:
    return torch.arange(0, n * step, step, dtype=torch.int64, device=device)


def pack_bits(values: Tensor, width: int) -> Tensor:
    """Pack non-negative ints < 2**width (any int dtype) into a uint8 tensor of packed_nbytes bytes."""
    assert 1 <= width <= 32
    count = values.numel()
    nbytes = packed_nbytes(count, width)
    device = values.device
    if count == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    if width == 8:
        return values.reshape(-1).to(torch.uint8)
    # group g fields into one word of g*width bits = whole bytes, if that fits in 63 bits
    group = math.lcm(width, 8) // width
    if group * width <= 56:
        v = values.reshape(-1).to(torch.int64)
        pad = (-count) % group
        if pad:
            v = torch.cat([v, v.new_zeros(pad)])
        v = v.view(-1, group)
        if group == 1:
            word = v[:, 0]
        else:
            word = (v << _shifts(group, width, device)).sum(dim=1)
        nb = group * width // 8
        out = ((word.unsqueeze(1) >> _shifts(nb, 8, device)) & 0xFF).to(torch.uint8).reshape(-1)
        return out[:nbytes]
    bits = ((values.reshape(-1, 1).to(torch.int64) >> torch.arange(width, device=device)) & 1).reshape(-1)
    return _pack_bitvector(bits, nbytes)


def _pack_bitvector(bits: Tensor, nbytes: int) -> Tensor:
    pad = nbytes * 8 - bits.numel()
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    return (bits.view(-1, 8) << torch.arange(8, device=bits.device)).sum(dim=1).to(torch.uint8)


def unpack_bits(data: Tensor, width: int, count: int) -> Tensor:
    """Inverse of pack_bits: int64 tensor of count fields. data must hold packed_nbytes(count, width) bytes."""
    assert 1 <= width <= 32 and data.dtype == torch.uint8
    assert data.numel() == packed_nbytes(count, width)
    device = data.device
    if count == 0:
        return torch.empty(0, dtype=torch.int64, device=device)
    if width == 8:
        return data.to(torch.int64)
    group = math.lcm(width, 8) // width
    if group * width <= 56:
        nb = group * width // 8
        d = data.to(torch.int64)
        pad = (-d.numel()) % nb
        if pad:
            d = torch.cat([d, d.new_zeros(pad)])
        word = (d.view(-1, nb) << _shifts(nb, 8, device)).sum(dim=1)
        fields = (word.unsqueeze(1) >> _shifts(group, width, device)) & ((1 << width) - 1)
        return fields.reshape(-1)[:count]
    bits = unpack_bitvector(data)[: count * width].view(count, width)
    return (bits.to(torch.int64) << torch.arange(width, device=device)).sum(dim=1)


def unpack_bitvector(data: Tensor) -> Tensor:
    """uint8 bytes -> uint8 tensor of 0/1, 8 per byte, LSB first."""
    return ((data.unsqueeze(1) >> torch.arange(8, dtype=torch.uint8, device=data.device)) & 1).reshape(-1)


def pack_unary(q: Tensor) -> tuple[Tensor, int]:
    """Unary-code non-negative ints: q zeros then a one each. Returns (bytes, number of bits)."""
    count = q.numel()
    if count == 0:
        return torch.empty(0, dtype=torch.uint8, device=q.device), 0
    ends = torch.cumsum(q.reshape(-1).to(torch.int64) + 1, dim=0) - 1  # position of each terminating one
    nbits = int(ends[-1].item()) + 1
    nbytes = (nbits + 7) // 8
    out = torch.zeros(nbytes, dtype=torch.int64, device=q.device)
    # ones sit at distinct bit positions, so adding the byte weights is an OR
    out.index_add_(0, ends >> 3, torch.ones_like(ends) << (ends & 7))
    return out.to(torch.uint8), nbits


def unpack_unary(data: Tensor, nbits: int, count: int) -> Tensor | None:
    """Inverse of pack_unary; None if the stream does not hold exactly count ones in nbits bits
    followed by zero padding."""
    if data.numel() != (nbits + 7) // 8:
        return None
    bits = unpack_bitvector(data)
    if count == 0:
        return torch.empty(0, dtype=torch.int64, device=data.device) if not bool(bits.any()) else None
    ends = torch.nonzero(bits).reshape(-1)
    if ends.numel() != count or int(ends[-1].item()) != nbits - 1:
        return None
    q = torch.diff(ends, prepend=ends.new_full((1,), -1)) - 1
    return q
