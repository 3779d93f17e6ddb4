"""Combining the round's decoded updates into one outer gradient, identically on every peer.

Determinism: contributions are sorted by (sender, digest, weight), each is scaled by a coefficient
computed in Python floats, and summed in that order with separate multiply and add ops (one IEEE
rounding each, no fused multiply-add), so the result is bit-identical whatever the arrival order.
Each update is added as it was sent (wire.SparseTensor: positions and values): skipping the coordinates it
did not send skips additions of zero, which change no sum, so the result equals the dense sum bit for bit.
Clipping: each update is scaled down to the median norm of the round (Templar), which bounds what a
single peer with a huge or malicious update can do. The 'robust' rule (screens, then coord_mean of what
passes, with a reputation table) is ``robust_aggregate`` in protocol/robust.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gradnode.protocol.wire import DecodedUpdate, SparseTensor

RULES = ("mean", "coord_mean")


@dataclass
class _Contribution:
    key: tuple[str, bytes]
    tensors: Mapping[str, SparseTensor]
    norm: float


def _contribution(u: DecodedUpdate | Mapping[str, Tensor], index: int) -> _Contribution:
    if isinstance(u, DecodedUpdate):
        return _Contribution((u.sender, u.digest), u.sparse, u.norm)
    # plain tensors: the caller's order is the canonical order; the nonzero coordinates count as sent
    sq = math.fsum(float(t.double().square().sum().item()) for _, t in sorted(u.items()))
    return _Contribution(("", index.to_bytes(4, "big")), {n: SparseTensor.from_dense(t) for n, t in u.items()},
                         math.sqrt(sq))


def clip_scales(norms: Sequence[float]) -> list[float]:
    """min(1, median / norm) per update (1 for zero norms)."""
    median = statistics.median(norms)
    return [1.0 if n <= median or n == 0.0 else median / n for n in norms]


def checked_weights(updates: Sequence[object], weights: Sequence[float] | None) -> list[float]:
    """One finite, non-negative float weight per update (all 1 when None); ValueError otherwise."""
    if not updates:
        raise ValueError("nothing to aggregate")
    if weights is None:
        return [1.0] * len(updates)
    if len(weights) != len(updates):
        raise ValueError("one weight per update")
    ws = [float(w) for w in weights]
    if any(not math.isfinite(w) or w < 0 for w in ws):
        raise ValueError("weights must be finite and >= 0")
    return ws


def aggregate(updates: Sequence[DecodedUpdate | Mapping[str, Tensor]], weights: Sequence[float] | None = None,
              rule: str = "mean", clip_to_median: bool = True) -> dict[str, Tensor]:
    """Weighted combination of decoded updates (fp32, on the updates' device).

    rule 'mean': sum_i w_i s_i u_i / sum_i w_i, coordinates a peer did not send counting as zero.
    rule 'coord_mean': per coordinate, sum_i w_i s_i u_i / sum_i w_i m_i over the peers i that sent it
    (m_i its mask); coordinates nobody sent are zero. s_i is the median-norm clip scale (or 1).
    Plain name -> tensor mappings are accepted too (in the caller's order, all coordinates sent).
    """
    if rule not in RULES:
        raise ValueError(f"aggregation rule must be one of {RULES}, got {rule!r}")
    weights = checked_weights(updates, weights)
    if sum(weights) <= 0:
        raise ValueError("weights must be finite, >= 0 and not all zero")
    contribs = [_contribution(u, i) for i, u in enumerate(updates)]
    shapes = {name: t.shape for name, t in contribs[0].tensors.items()}
    for c in contribs:
        if {name: t.shape for name, t in c.tensors.items()} != shapes:
            raise ValueError(f"update {c.key[0]!r} does not match the others' tensors and shapes")
    order = sorted(range(len(contribs)), key=lambda i: (contribs[i].key, weights[i]))
    scales = clip_scales([contribs[i].norm for i in order]) if clip_to_median else [1.0] * len(order)
    ws = [weights[i] for i in order]
    total_w = math.fsum(ws)
    out: dict[str, Tensor] = {}
    for name in sorted(shapes):
        first = contribs[order[0]].tensors[name]
        acc = first.values.new_zeros(first.numel)
        if rule == "mean":
            for i, w, s in zip(order, ws, scales):
                sp = contribs[i].tensors[name]
                sp.add_to(acc, sp.values * (w * s / total_w))
        else:
            denom = torch.zeros_like(acc)
            for i, w, s in zip(order, ws, scales):
                sp = contribs[i].tensors[name]
                sp.add_to(acc, sp.values * (w * s))
                sp.add_to(denom, torch.ones_like(sp.values) * w)
            acc = torch.where(denom > 0, acc / denom.clamp(min=1e-30), acc.new_zeros(()))
        out[name] = acc.reshape(shapes[name])
    return out
