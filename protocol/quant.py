"""Sign-magnitude quantisation of the kept values with a per-tensor table of magnitude levels.

A code of b bits is (sign << (b-1)) | level_index; the value it stands for is exactly +-levels[i], so
receivers and the sender's error feedback reconstruct bit-identical tensors on any device. Top-k values
are all large in magnitude, so spending one bit on the sign and fitting the remaining 2**(b-1) levels
to |v| (a few Lloyd-Max iterations from quantile starts) beats an affine grid over [min, max].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LLOYD_ITERS = 2
QUANTILE_SAMPLE = 1 << 11
FIXED_BITS = 32


def _fixed_point(mag: Tensor) -> tuple[Tensor, float]:
    """|v| as int64 fixed point (|v| * 2**s truncated, s = FIXED_BITS - exponent of the max), and 2**-s.

    Integer sums are exact in any order, so levels do not depend on how a backend reduces; the
    truncation costs at most 2**-32 of the largest value.
    """
    s = FIXED_BITS - math.frexp(float(mag.max()))[1]
    return (mag.double() * 2.0 ** s).long(), 2.0 ** -s


def _means(sums: Tensor, counts: Tensor, unscale: float, old: Tensor) -> Tensor:
    """Per-level mean of the fixed-point sums back in fp32; empty levels keep their old value."""
    means = sums.double() / counts.double().clamp(min=1) * unscale
    return torch.where(counts > 0, means, old.double()).float().sort().values


def fit_levels(mag: Tensor, n_levels: int) -> Tensor:
    """Magnitude levels (fp32, ascending, finite, >= 0) that minimise squared error on |v| (approximately).

    Defined bit-exactly (integer sums, integer quantile ranks) so the native encoder matches it.
    """
    mag = mag.reshape(-1).float()
    n = mag.numel()
    if n == 0:
        return torch.zeros(n_levels, dtype=torch.float32, device=mag.device)
    fixed, unscale = _fixed_point(mag)
    if n_levels == 1:
        return _means(fixed.sum().reshape(1), torch.tensor([n], device=mag.device), unscale, mag[:1])
    step = max(1, n // QUANTILE_SAMPLE)
    sample = mag[::step].sort().values
    m = sample.numel()
    ranks = [((2 * j + 1) * (m - 1) + n_levels) // (2 * n_levels) for j in range(n_levels)]
    levels = sample[torch.tensor(ranks, device=mag.device)]
    for _ in range(LLOYD_ITERS):
        edges = (levels[1:] + levels[:-1]) / 2
        if n_levels == 2:  # the default 2-bit case: one edge, a compare beats bucketize
            upper = mag >= edges[0]
            n_up, s_up, s_all = upper.sum(), (fixed * upper).sum(), fixed.sum()
            counts = torch.stack([n - n_up, n_up])
            sums = torch.stack([s_all - s_up, s_up])
        else:
            idx = torch.bucketize(mag, edges, right=True)
            counts = torch.bincount(idx, minlength=n_levels)
            sums = torch.zeros(n_levels, dtype=torch.int64, device=mag.device).index_add_(0, idx, fixed)
        levels = _means(sums, counts, unscale, levels)
    return levels


def quantise(values: Tensor, levels: Tensor, bits: int) -> Tensor:
    """fp32 values -> uint8 codes (sign bit on top, nearest level below)."""
    n_levels = levels.numel()
    sign = (values < 0).to(torch.uint8)
    if n_levels == 1:
        return sign
    edges = (levels[1:] + levels[:-1]) / 2
    if n_levels == 2:
        idx = (values.abs() >= edges[0]).to(torch.uint8)
    else:
        idx = torch.bucketize(values.abs(), edges, right=True).to(torch.uint8)
    return (sign << (bits - 1)) | idx


def dequantise(codes: Tensor, levels: Tensor, bits: int) -> Tensor:
    """uint8/int codes -> fp32 values +-levels[i]; exact (a table lookup and a sign flip)."""
    codes = codes.to(torch.int64)
    mag = levels[codes & ((1 << (bits - 1)) - 1)]
    return torch.where((codes >> (bits - 1)) & 1 == 1, -mag, mag)
