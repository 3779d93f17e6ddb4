"""Exact top-k by magnitude in every chunk of a group.

The straightforward way (torch.topk over a [n_chunks, chunk] copy) spends most of its time sorting
values that cannot win. The fast path writes |x| chunk-major into a reused slab buffer, takes the max
of 32-value blocks (a reduction torch runs at memory speed), and bounds each chunk's k-th largest
value from below by a value that at least k block maxima reach (k distinct elements reach it). Only
elements above the bound (~4% at top-64 of 4096 on real pseudo-gradients) are candidates; an exact
top-k over the padded candidate lists finishes the job. Slabs keep temporaries small and recycled.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gradnode.protocol.chunking import Group
from gradnode.protocol.errors import ProtocolError

SLAB_NUMEL_CPU = 1 << 20
SLAB_NUMEL_CUDA = 1 << 26
MAX_CANDIDATES = 1024  # chunks with more candidates (ties, zero chunks) take the direct path


def _check_finite(t: Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        raise ProtocolError("update holds NaN or Inf values")


def _select(rows: Tensor, k: int) -> Tensor:
    """Mask of the top-k entries of each row; among entries equal to the k-th largest, the lowest
    columns win (the tie rule every backend follows, so payloads are reproducible bytes)."""
    kth = rows.topk(k, dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    above = rows > kth
    tied = rows == kth
    need = k - above.sum(dim=1, keepdim=True)
    return above | (tied & (tied.cumsum(dim=1) <= need))


def _selected_columns(rows: Tensor, k: int) -> Tensor:
    """[n, m] -> [n, k] columns picked by _select, ascending per row."""
    return torch.nonzero(_select(rows, k))[:, 1].view(rows.shape[0], k)


def topk_direct(view: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """[a, h, b, w] view -> (positions, values), each [a*b, k], positions ascending per row."""
    a, h, b, w = view.shape
    mat = view.permute(0, 2, 1, 3).reshape(a * b, h * w).float()
    _check_finite(mat)
    if k >= h * w:
        pos = torch.arange(h * w, device=mat.device).expand(a * b, -1).contiguous()
        return pos, mat
    pos = _selected_columns(mat.abs(), k)
    return pos, mat.gather(1, pos)


def _sub_block(chunk_numel: int, k: int) -> int:
    """Size of the blocks whose maxima bound the k-th largest, or 0 if no useful split exists.

    32 is the smallest size torch reduces at memory speed on CPU; smaller blocks give a tighter bound.
    """
    for s in (32, 16, 8):
        if chunk_numel % s == 0 and chunk_numel // s >= 2 * k:
            return s
    return 0


def _block_bound(bm: Tensor, k: int, iters: int = 6) -> Tensor:
    """Per row, a value t with at least k entries of bm >= t, close below the k-th largest.

    Geometric bisection between the row's min (always valid) and max: a handful of vectorised
    compare-and-count steps, cheaper than an exact per-row selection and as useful as a bound.
    """
    lo = bm.amin(dim=1).clamp(min=1e-30)
    hi = bm.amax(dim=1).clamp(min=1e-30)
    for _ in range(iters):
        mid = (lo * hi).sqrt()
        ok = (bm >= mid.unsqueeze(1)).sum(dim=1) >= k
        lo = torch.where(ok, mid, lo)
        hi = torch.where(ok, hi, mid)
    return torch.where(bm.amin(dim=1) > 0, lo, torch.zeros_like(lo))


def _topk_slab(x: Tensor, k: int, s: int, buf: Tensor, mask_buf: Tensor) -> tuple[Tensor, Tensor]:
    """x: [a, h, b, w] slab -> (chunk-major flat ids of the selected values in the slab, their |x|).

    ids are chunk * chunk_numel + position, ascending; every chunk has exactly k of them.
    """
    a, h, b, w = x.shape
    n_chunks, size = a * b, h * w
    mag = buf[:n_chunks * size].view(a, b, h, w)
    xp = x.permute(0, 2, 1, 3)
    if x.dtype == torch.float32:
        torch.abs(xp, out=mag)
    else:
        mag.copy_(xp).abs_()
    mag = mag.view(n_chunks, size)
    bm = mag.view(n_chunks, size // s, s).amax(dim=2)
    _check_finite(bm)
    thr = _block_bound(bm, k)
    mask = mask_buf[:n_chunks * size].view(n_chunks, size)
    torch.ge(mag, thr.unsqueeze(1), out=mask)
    ids = torch.nonzero(mask.view(-1)).view(-1)  # chunk-major, positions ascending
    chunk = ids // size
    counts = torch.bincount(chunk, minlength=n_chunks)
    heavy = counts > MAX_CANDIDATES
    if bool(heavy.any()):  # ties or near-zero chunks: give those chunks the direct path
        keep = ~heavy[chunk]
        ids, chunk = ids[keep], chunk[keep]
        counts = counts.masked_fill(heavy, 0)
    starts = torch.cumsum(counts, 0) - counts
    width = max(int(counts.max().item()), k)
    col = torch.arange(ids.numel(), device=x.device) - starts[chunk]
    cand_mag = mag.view(-1).take(ids)
    padded = torch.full((n_chunks, width), -1.0, device=x.device)
    padded[chunk, col] = cand_mag  # candidates in position order, so _select's tie rule holds
    picked = _select(padded, k)[chunk, col]
    if not bool(heavy.any()):
        return ids[picked].view(n_chunks, k), cand_mag[picked].view(n_chunks, k)
    out = torch.empty((n_chunks, k), dtype=torch.int64, device=x.device)
    light = torch.nonzero(~heavy).view(-1)
    out[light] = ids[picked].view(-1, k)
    hrows = torch.nonzero(heavy).view(-1)
    out[hrows] = _selected_columns(mag[hrows], k) + hrows.unsqueeze(1) * size
    return out, mag.view(-1).take(out.view(-1)).view(n_chunks, k)


def topk_group(flat: Tensor, group: Group, k: int) -> tuple[Tensor, Tensor]:
    """Exact top-k |x| in each chunk of a group of a contiguous 1-D tensor (any float dtype).

    Returns (positions int64, values fp32), each [n_chunks, min(k, chunk_numel)], positions ascending.
    Among equal magnitudes the lowest positions win. Raises ProtocolError on NaN/Inf.
    """
    view = group.view(flat)
    k = min(k, group.chunk_numel)
    size = group.chunk_numel
    s = _sub_block(size, k)
    if not s:
        return topk_direct(view, k)
    slab_numel = SLAB_NUMEL_CUDA if flat.is_cuda else SLAB_NUMEL_CPU
    rows_per_slab = max(1, slab_numel // (group.h * group.b * group.w))
    n = min(group.a, rows_per_slab) * group.b * size
    buf = torch.empty(n, dtype=torch.float32, device=flat.device)
    mask_buf = torch.empty(n, dtype=torch.bool, device=flat.device)
    parts = []
    for a0 in range(0, group.a, rows_per_slab):
        ids, _ = _topk_slab(view[a0:a0 + rows_per_slab], k, s, buf, mask_buf)
        parts.append(ids + a0 * group.b * size)
    ids = parts[0] if len(parts) == 1 else torch.cat(parts)
    pos = ids % size
    values = flat.take(group.flat_index(pos)).float()
    return pos, values
