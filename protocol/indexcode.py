"""In-chunk position coding: fixed-width ('packed12') and Rice-coded gaps ('rice').

Positions arrive as [n_chunks, k] int64, ascending per row. Rice codes the gaps g = p_i - p_{i-1} - 1
(p_{-1} = -1) with parameter r as two streams: the low r bits of each gap, fixed-width, and g >> r in
unary. Keeping the streams apart makes both directions plain vectorised ops (no serial bit parsing)
and costs nothing: the total is n*(r+1) + sum(g >> r) bits, Rice's length. At 64 of 4096 that is
~7.6 bits per index against the information limit log2(C(4096, 64))/64 = 7.36.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gradnode.protocol.bitpack import pack_bits, pack_unary, packed_nbytes, unpack_bits, unpack_unary

MAX_RICE_PARAM = 16


def gaps(pos: Tensor) -> Tensor:
    g = torch.diff(pos, dim=1, prepend=pos.new_full((pos.shape[0], 1), -1)) - 1
    return g


def undo_gaps(g: Tensor) -> Tensor:
    return torch.cumsum(g + 1, dim=1) - 1


def best_rice_param(g: Tensor) -> int:
    """r minimising n*r + sum(g >> r): start from floor(log2(mean gap * 0.6931)), check the neighbours.

    Exact integer and float64 arithmetic only, so every backend picks the same r.
    """
    n = g.numel()
    if n == 0:
        return 0
    guess = max(0, min(MAX_RICE_PARAM, math.frexp(max(int(g.sum()) / n * 0.6931, 1.0))[1] - 1))
    best_r, best_cost = guess, None
    for r in range(max(0, guess - 1), min(MAX_RICE_PARAM, guess + 1) + 1):
        cost = n * r + int((g >> r).sum().item())
        if best_cost is None or cost < best_cost:
            best_r, best_cost = r, cost
    return best_r


def rice_encode(g_flat: Tensor, r: int) -> tuple[Tensor, Tensor, int]:
    """Gaps (flat int64) -> (low-bits stream, unary stream, unary length in bits)."""
    low = pack_bits(g_flat & ((1 << r) - 1), r) if r else torch.empty(0, dtype=torch.uint8, device=g_flat.device)
    unary, nbits = pack_unary(g_flat >> r)
    return low, unary, nbits


def rice_decode(low: Tensor, unary: Tensor, r: int, nbits: int, count: int) -> Tensor | None:
    """Inverse of rice_encode; None if the unary stream is malformed."""
    q = unpack_unary(unary, nbits, count)
    if q is None:
        return None
    if r == 0:
        return q
    return (q << r) | unpack_bits(low, r, count)


def rice_nbytes_bound(count: int, r: int, max_gap_sum: int) -> tuple[int, int]:
    """(low stream bytes, max unary bits) for count gaps whose sum is at most max_gap_sum."""
    return packed_nbytes(count, r), count + (max_gap_sum >> r)
