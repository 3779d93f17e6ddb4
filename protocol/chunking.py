"""How a tensor is cut into chunks: s x s tiles of 2-D weights (SparseLoCo), contiguous runs otherwise.

A tensor is covered by a few *groups*; each group is a regular grid of a x b chunks of h x w values,
seen as a strided view [a, h, b, w] of the flat tensor. In-chunk position of (r, c) is r*w + c, so a
contiguous chunk is just a group with b == 1 and row stride w. Ragged edges (dims that do not divide
the tile side, tails shorter than a chunk) become extra groups with smaller chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor


@dataclass(frozen=True)
class Group:
    offset: int  # flat index of element (0, 0, 0, 0)
    stride: int  # flat distance between consecutive rows
    a: int
    h: int
    b: int
    w: int

    @property
    def n_chunks(self) -> int:
        return self.a * self.b

    @property
    def chunk_numel(self) -> int:
        return self.h * self.w

    def view(self, flat: Tensor) -> Tensor:
        """[a, h, b, w] view of a contiguous 1-D tensor."""
        return flat.as_strided((self.a, self.h, self.b, self.w), (self.h * self.stride, self.stride, self.w, 1),
                               flat.storage_offset() + self.offset)

    def flat_index(self, pos: Tensor) -> Tensor:
        """[n_chunks, k] in-chunk positions -> flat indices into the tensor."""
        chunk = torch.arange(self.n_chunks, device=pos.device).unsqueeze(1)
        ia, ib = chunk // self.b, chunk % self.b
        r, c = pos // self.w, pos % self.w
        return self.offset + (ia * self.h + r) * self.stride + ib * self.w + c


def _contiguous_split(chunk: int) -> tuple[int, int]:
    """Rows x width of a contiguous chunk; width 64 when possible (the fast selector reduces rows)."""
    w = math.gcd(chunk, 64)
    return chunk // w, w


@lru_cache(maxsize=4096)
def layout(shape: tuple[int, ...], chunk: int) -> tuple[Group, ...]:
    numel = math.prod(shape)
    if numel == 0:
        return ()
    side = math.isqrt(chunk)
    if len(shape) >= 2 and side * side == chunk:
        rows = shape[0]
        cols = numel // rows
        ra, rr = divmod(rows, side)
        cb, cr = divmod(cols, side)
        groups = []
        for a, h, row0 in ((ra, side, 0), (1 if rr else 0, rr, ra * side)):
            for b, w, col0 in ((cb, side, 0), (1 if cr else 0, cr, cb * side)):
                if a and b:
                    groups.append(Group(row0 * cols + col0, cols, a, h, b, w))
        return tuple(groups)
    full, tail = divmod(numel, chunk)
    groups = []
    if full:
        h, w = _contiguous_split(chunk)
        groups.append(Group(0, w, full * 1, h, 1, w))
    if tail:
        groups.append(Group(full * chunk, tail, 1, 1, 1, tail))
    return tuple(groups)
