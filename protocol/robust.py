"""The 'robust' aggregation rule: screen the round's decided updates, then average what passes per coordinate.

``coord_mean`` bounds one attacker only through the median-norm clip, and with top-64 of 4096 most
coordinates have a single sender, so a sign-flipped, noisy or all-zero update moves (or dilutes) the
coordinates it sends at full weight. This rule decides from the decided updates alone, identically on
every peer, in this order:

1. caps: per tensor, every update's magnitudes are capped at ``value_cap`` x the round's median of the
   tensor's largest magnitude, so no coordinate can carry a whole norm budget;
2. replays: an update whose content (masks and values, not the header) equals one of the previous
   round's decided updates (their fingerprints, passed in) is left out;
3. duplicates: updates of equal content, or of cosine >= ``duplicate_cos``, count once: the member that
   agrees most with the updates outside the group stands for it, with the group's largest weight (the
   copy cannot be told from the original here, so nobody is blamed for it);
4. small: an update under ``small_norm`` x the median norm counts in proportion to its norm, in the
   numerator and in the per-coordinate sender counts alike (zeros marked as sent dilute nothing);
5. direction: the cosine of each update to the weighted mean of the other accepted updates; one at or
   below 0, or under ``min_cos_ratio`` x the median cosine, is left out; repeated until the accepted set
   is stable (a majority of honest updates keeps the median honest);
6. reputation: a sender whose reputation weight is 0 (protocol/reputation.py) is left out.

Then ``coord_mean`` (median-norm clip over the accepted updates, per-coordinate average over senders).
With honest updates only (none capped, none screened out) the result is bit-identical to ``coord_mean``.
This module holds the tensor half (caps, fingerprints, the exact Gram matrix, the aggregate); steps 2 to 6
decide from those numbers alone in protocol/screening.py (``judge``), which the virtual simulator runs too.

Determinism: for sparse updates every dot product is a sum over (level, level, sign) co-occurrence
counts (integers, exact on any device) times products of the fp32 levels, added with ``math.fsum``
(correctly rounded, so independent of order): the screens decide identically on CPUs and GPUs. Dense
updates (DiLoCo) use float64 reductions, identical on identical hardware, like their norms (wire.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gradnode.protocol.aggregate import aggregate, checked_weights
from gradnode.protocol.screening import RobustParams, Screen, judge
from gradnode.protocol.wire import DecodedUpdate, SparseTensor

def fingerprint(u: DecodedUpdate | Mapping[str, Tensor]) -> bytes:
    """BLAKE2b-256 of an update's content (sorted names, shapes, the positions sent and their fp32 values),
    header excluded: the same tensors re-sent under another sender, round, signature or index coding give
    the same fingerprint. A plain mapping's nonzero coordinates count as sent."""
    return _fingerprint(u.sparse if isinstance(u, DecodedUpdate) else
                        {n: SparseTensor.from_dense(t) for n, t in u.items()})


def _fingerprint(tensors: Mapping[str, SparseTensor]) -> bytes:
    h = hashlib.blake2b(digest_size=32, person=b"gradnode-fp")
    for name in sorted(tensors):
        sp = tensors[name]
        h.update(f"{name}:{sp.shape}\n".encode())
        if sp.index is None or sp.sent == sp.numel:  # dense: every position sent
            h.update(b"all")
        else:
            h.update(sp.index.cpu().numpy().astype("<i8").tobytes())
        h.update(sp.values.detach().float().cpu().contiguous().numpy().tobytes())
    return h.digest()


@dataclass
class _Item:
    sender: str
    digest: bytes
    tensors: Mapping[str, SparseTensor]
    levels: Mapping[str, Tensor]  # empty when the update is dense or a plain mapping
    source: DecodedUpdate | None
    weight: float


def _item(u: DecodedUpdate | Mapping[str, Tensor], index: int, weight: float) -> _Item:
    if isinstance(u, DecodedUpdate):
        return _Item(u.sender, u.digest, u.sparse, u.levels, u, weight)  # levels: SparseLoCo's tables only
    return _Item("", index.to_bytes(4, "big"), {n: SparseTensor.from_dense(t) for n, t in u.items()}, {}, None,
                 weight)


def _codes(sp: SparseTensor, levels: list[float]) -> Tensor | None:
    """int8 per position sent: +-(j+1) for a value of +-levels[j] (the first j when levels repeat); None if a
    value is off the table (then the tensor takes the float64 path)."""
    mag = sp.values.abs()
    idx = torch.zeros(mag.shape, dtype=torch.int8, device=mag.device)
    for j in reversed(range(len(levels))):
        idx = torch.where(mag == levels[j], j + 1, idx).to(torch.int8)
    if bool((idx == 0).any()):
        return None
    return torch.where(sp.values < 0, -idx, idx)


class _Gram:
    """Exact pairwise dot products of the (capped) updates, accumulated tensor by tensor."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.terms: list[list[list[float]]] = [[[] for _ in range(n)] for _ in range(n)]

    def add_sparse(self, tensors: list[SparseTensor], codes: list[Tensor], values: list[list[float]]) -> None:
        """Per update one tensor (its positions), its codes (``_codes``) and its (capped) level values. Each
        pair's dot product is a sum over co-occurring (code, code) counts: where b sent nothing, its code is 0."""
        n_levels = len(values[0])
        k = 2 * n_levels + 1
        table = [[0.0] * k for _ in range(self.n)]  # code + n_levels -> value
        for i, vals in enumerate(values):
            for j, v in enumerate(vals):
                table[i][n_levels + j + 1], table[i][n_levels - j - 1] = v, -v
        for a in range(self.n):
            if codes[a].numel() == 0:
                continue
            base = (codes[a].long() + n_levels) * k
            for b in range(a, self.n):
                counts = torch.bincount(base + _codes_at(tensors[b], codes[b], tensors[a]) + n_levels,
                                        minlength=k * k).tolist()
                out = self.terms[a][b]
                for key, c in enumerate(counts):
                    if c:
                        ka, kb = divmod(key, k)
                        out.append(c * (table[a][ka] * table[b][kb]))

    def add_dense(self, tensors: list[Tensor]) -> None:
        d = [t.double().reshape(-1) for t in tensors]
        for a in range(self.n):
            for b in range(a, self.n):
                self.terms[a][b].append(float(torch.dot(d[a], d[b])))

    def matrix(self) -> list[list[float]]:
        g = [[0.0] * self.n for _ in range(self.n)]
        for a in range(self.n):
            for b in range(a, self.n):
                g[a][b] = g[b][a] = math.fsum(self.terms[a][b])
        return g


def _codes_at(sp: SparseTensor, codes: Tensor, at: SparseTensor) -> Tensor:
    """``sp``'s codes (int64) at the positions ``at`` sent, 0 where ``sp`` sent nothing."""
    if sp.index is None or at.index is None:
        assert sp.index is None and at.index is None, "codes of sparse tensors only"
        return codes.long()
    if sp.index.numel() == 0:
        return torch.zeros(at.index.shape, dtype=torch.long, device=codes.device)
    where = torch.searchsorted(sp.index, at.index).clamp(max=sp.index.numel() - 1)
    return torch.where(sp.index[where] == at.index, codes[where].long(), 0)


def _cap_and_gram(items: list[_Item], cap: float) -> tuple[list[dict[str, SparseTensor]], list[bool],
                                                              list[list[float]]]:
    """Per tensor: the cap (cap x median over updates of the largest magnitude), the capped tensors,
    and the exact Gram matrix of the capped updates."""
    n = len(items)
    gram = _Gram(n)
    capped: list[dict[str, SparseTensor]] = [{} for _ in items]
    was_capped = [False] * n
    for name in sorted(items[0].tensors):
        ts = [it.tensors[name] for it in items]
        tops = [float(t.values.abs().max()) if t.sent else 0.0 for t in ts]
        bound = cap * statistics.median(tops)
        for i, t in enumerate(ts):
            over = tops[i] > bound
            was_capped[i] |= over
            capped[i][name] = t.with_values(t.values.clamp(-bound, bound)) if over else t
        codes = None
        if all(name in it.levels for it in items):
            levels = [[float(v) for v in it.levels[name].tolist()] for it in items]
            if len({len(lv) for lv in levels}) == 1:
                codes = [_codes(t, lv) for t, lv in zip(ts, levels)]
        if codes is not None and all(c is not None for c in codes):
            gram.add_sparse(ts, codes, [[min(v, bound) for v in lv] for lv in levels])  # type: ignore[arg-type]
        else:
            gram.add_dense([c[name].dense() for c in capped])
    return capped, was_capped, gram.matrix()


def screen(updates: Sequence[DecodedUpdate | Mapping[str, Tensor]], weights: Sequence[float] | None = None, *,
           reputation: Mapping[str, float] | None = None, previous: Collection[bytes] = (),
           params: RobustParams = RobustParams(), clip_to_median: bool = True
           ) -> tuple[list[Screen], list[dict[str, SparseTensor]], list[_Item]]:
    """The screens of the module docstring: one Screen per update in (sender, digest) order, the capped
    tensors and the items, in that same order. ``reputation``: sender -> weight multiplier (0 = left out;
    absent senders 1); ``previous``: fingerprints of the previous round's decided updates."""
    ws = checked_weights(updates, weights)
    raw = [_item(u, i, w) for i, (u, w) in enumerate(zip(updates, ws))]
    items = sorted(raw, key=lambda it: (it.sender, it.digest, it.weight))
    shapes = {n: t.shape for n, t in items[0].tensors.items()}
    for it in items:
        if {n: t.shape for n, t in it.tensors.items()} != shapes:
            raise ValueError(f"update {it.sender!r} does not match the others' tensors and shapes")
    n = len(items)
    fps = [_fingerprint(it.tensors) for it in items]
    capped, was_capped, gram = _cap_and_gram(items, params.value_cap)
    # the wire's exact norm where nothing was capped, so that honest rounds clip exactly as coord_mean does
    norms = [items[i].source.norm if items[i].source is not None and not was_capped[i]
             else math.sqrt(max(gram[i][i], 0.0)) for i in range(n)]
    screens = judge([(it.sender, it.digest) for it in items], fps, gram, norms, [it.weight for it in items],
                    was_capped, reputation=reputation, previous=previous, params=params,
                    clip_to_median=clip_to_median)
    return screens, capped, items


def robust_aggregate(updates: Sequence[DecodedUpdate | Mapping[str, Tensor]], weights: Sequence[float] | None = None,
                     *, reputation: Mapping[str, float] | None = None, previous: Collection[bytes] = (),
                     clip_to_median: bool = True, params: RobustParams = RobustParams()
                     ) -> tuple[dict[str, Tensor], list[Screen]]:
    """The screened coord_mean of the module docstring, and one Screen per update ((sender, digest) order).
    Nothing accepted gives an all-zero aggregate (the outer step then moves nothing)."""
    screens, capped, items = screen(updates, weights, reputation=reputation, previous=previous, params=params,
                                    clip_to_median=clip_to_median)
    kept, kept_w = [], []
    for s, tensors, it in zip(screens, capped, items):
        if s.weight <= 0:
            continue
        if it.source is not None and s.capped:
            kept.append(dataclasses.replace(it.source, sparse=tensors, sq_norm=s.norm * s.norm))
        elif it.source is not None:
            kept.append(it.source)
        else:
            kept.append({n: t.dense() for n, t in tensors.items()})
        kept_w.append(s.weight)
    if not kept:
        zeros = {n: t.values.new_zeros(t.shape) for n, t in sorted(items[0].tensors.items())}
        return zeros, screens
    return aggregate(kept, kept_w, rule="coord_mean", clip_to_median=clip_to_median), screens
