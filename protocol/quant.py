"""Sign-magnitude quantisation of the kept values with a per-tensor table of magnitude levels.

A code of b bits is (sign << (b-1)) | level_index; the value it stands for is exactly +-levels[i], so
receivers and the sender's error feedback reconstruct bit-identical tensors on any device. Top-k values
are all large in magnitude, so spending one bit on the sign and fitting the remaining 2**(b-1) levels
to |v| (a few Lloyd-Max iterations from quantile starts) beats an affine grid over [min, max].
"""

from __future__ import annotations

import torch
from torch import Tensor

LLOYD_ITERS = 2
QUANTILE_SAMPLE = 1 << 11


def fit_levels(mag: Tensor, n_levels: int) -> Tensor:
    """Magnitude levels (fp32, ascending, finite, >= 0) that minimise squared error on |v| (approximately)."""
    mag = mag.reshape(-1).float()
    if mag.numel() == 0:
        return torch.zeros(n_levels, dtype=torch.float32, device=mag.device)
    if n_levels == 1:
        return mag.double().mean().float().reshape(1)
    step = max(1, mag.numel() // QUANTILE_SAMPLE)
    sample = mag[::step].sort().values
    qs = (torch.arange(n_levels, dtype=torch.float32, device=mag.device) + 0.5) / n_levels
    levels = sample[(qs * (sample.numel() - 1)).round().long()]
    for _ in range(LLOYD_ITERS):
        if n_levels == 2:  # the default 2-bit case: one edge, a compare beats bucketize
            upper = mag >= (levels[0] + levels[1]) / 2
            n_up = upper.sum()
            s_up = (mag * upper).sum(dtype=torch.float64)
            s_all = mag.sum(dtype=torch.float64)
            counts = torch.stack([mag.numel() - n_up, n_up]).double()
            sums = torch.stack([s_all - s_up, s_up])
        else:
            idx = torch.bucketize(mag, (levels[1:] + levels[:-1]) / 2)
            counts = torch.bincount(idx, minlength=n_levels).double()
            sums = torch.bincount(idx, weights=mag.double(), minlength=n_levels)
        levels = torch.where(counts > 0, sums / counts.clamp(min=1), levels.double()).float().sort().values
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
        idx = torch.bucketize(values.abs(), edges).to(torch.uint8)
    return (sign << (bits - 1)) | idx


def dequantise(codes: Tensor, levels: Tensor, bits: int) -> Tensor:
    """uint8/int codes -> fp32 values +-levels[i]; exact (a table lookup and a sign flip)."""
    codes = codes.to(torch.int64)
    mag = levels[codes & ((1 << (bits - 1)) - 1)]
    return torch.where((codes >> (bits - 1)) & 1 == 1, -mag, mag)
