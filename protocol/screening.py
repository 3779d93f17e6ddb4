"""The robust rule's decisions, from numbers alone: which of a round's decided updates count, and with what
weight (protocol/robust.py's module docstring gives the rule; this module is its torch-free half).

``judge`` takes what the decisions need of each update: its content fingerprint, the exact Gram matrix of
the (capped) updates, their norms and token weights; ``robust.screen`` computes those from the tensors and
the virtual simulator (node/sim/virtual.py) from the small vectors it gives its updates, so both run the
same screens, the same passes and the same tie rules. Everything is Python floats added with
``math.fsum``: the same inputs give the same screens on every machine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

REASONS = ("", "replay", "duplicate", "small", "direction", "reputation")


@dataclass(frozen=True)
class RobustParams:
    """The rule's constants; every peer of a run must use the same (they decide the aggregate)."""

    value_cap: float = 2.0  # x the median over updates of a tensor's largest magnitude
    duplicate_cos: float = 0.95  # honest pairs measured at 0.08-0.47; none ever merged in bench robust
    small_norm: float = 0.5  # below this x the median norm an update counts in proportion
    min_cos_ratio: float = 0.35  # x the median cosine to the others' mean
    max_passes: int = 4  # direction screen iterations

    def __post_init__(self) -> None:
        if not self.value_cap > 0 or not 0 < self.duplicate_cos <= 1 or not 0 <= self.small_norm <= 1:
            raise ValueError("value_cap must be > 0, duplicate_cos in (0, 1], small_norm in [0, 1]")
        if not 0 <= self.min_cos_ratio <= 1 or self.max_passes < 1:
            raise ValueError("min_cos_ratio must be in [0, 1] and max_passes >= 1")


@dataclass(frozen=True)
class Screen:
    """What the rule decided about one update (in canonical (sender, digest) order)."""

    sender: str
    digest: bytes
    fingerprint: bytes  # content hash: masks and values (see fingerprint())
    weight: float  # its weight in the aggregate (token weight x norm factor); 0 = left out
    reason: str  # "" when it counts, else one of REASONS: why it was left out or down-weighted
    cos: float  # cosine to the weighted mean of the other accepted updates (after caps and clipping);
    # 1.0 when no other update was accepted to compare with
    norm: float  # L2 norm after the caps
    capped: bool  # some of its magnitudes were capped

    @property
    def strike(self) -> bool:
        """Counts against the sender's reputation: a replay, or a direction the others contradict (also
        judged for a sender its reputation leaves out, so that one who behaves again recovers)."""
        return self.reason in ("replay", "direction")


def judge(pairs: Sequence[tuple[str, bytes]], fps: Sequence[bytes], gram: Sequence[Sequence[float]],
          norms: Sequence[float], weights: Sequence[float], capped: Sequence[bool], *,
          reputation: Mapping[str, float] | None = None, previous: Collection[bytes] = (),
          params: RobustParams = RobustParams(), clip_to_median: bool = True) -> list[Screen]:
    """One Screen per update, in the order given ((sender, digest) order: the caller sorts): replays of
    ``previous`` (the last round's fingerprints), duplicates, small norms, directions against the others'
    weighted mean, and the ``reputation`` weights (sender -> multiplier, 0 = left out; absent senders 1).
    ``gram``: the exact pairwise dot products of the updates after the caps; ``capped``: whether a cap cut
    one of its magnitudes (recorded only)."""
    n = len(pairs)
    reason = ["replay" if fps[i] in previous else "" for i in range(n)]
    weight = list(weights)
    live = [i for i in range(n) if not reason[i] and weight[i] > 0]
    for r, members in _groups(fps, gram, weight, live, params.duplicate_cos).items():
        weight[r] = max(weight[m] for m in members)
        for m in members:
            if m != r:
                reason[m] = "duplicate"
    reps = [i for i in live if not reason[i]]
    median_norm = statistics.median([norms[i] for i in reps]) if reps else 0.0
    factor = [0.0] * n
    for i in reps:
        floor = params.small_norm * median_norm
        factor[i] = 0.0 if norms[i] == 0.0 else 1.0 if norms[i] >= floor else norms[i] / floor
    rep_w = [1.0 if reputation is None else float(reputation.get(pairs[i][0], 1.0)) for i in range(n)]
    candidates = [i for i in reps if factor[i] > 0 and rep_w[i] > 0]
    accepted, cos = _direction(candidates, weight, factor, rep_w, norms, gram, params, clip_to_median)
    yardstick = _median_cos(cos, candidates)
    screens = []
    for i, (sender, digest) in enumerate(pairs):
        if not reason[i] and i in reps:
            if i not in accepted and cos[i] is not None and not _passes(i, cos, yardstick, params):
                reason[i] = "direction"
            elif rep_w[i] <= 0:
                reason[i] = "reputation"
            elif factor[i] < 1.0:
                reason[i] = "small"
            elif i not in accepted:
                reason[i] = "direction"
        w = weight[i] * factor[i] * rep_w[i] if i in accepted else 0.0
        screens.append(Screen(sender, digest, fps[i], w, reason[i],
                              1.0 if cos[i] is None else cos[i], norms[i], capped[i]))
    return screens


def _groups(fps: list[bytes], gram: list[list[float]], weights: list[float], live: list[int],
            dup_cos: float) -> dict[int, list[int]]:
    """Representative -> members, over the live updates: equal fingerprints or cosine >= dup_cos. A group's
    representative is the member that agrees most with the live updates outside the group (equal content:
    any; a near-copy with a twist of its own stands for the group only if the twist points where the
    others do), ties to the first in (sender, digest) order: no name or digest can be ground to win it."""
    first: dict[int, int] = {}
    for i in live:
        for r in list(dict.fromkeys(first.values())):
            norms = gram[i][i] * gram[r][r]
            if fps[i] == fps[r] or (norms > 0 and gram[i][r] / math.sqrt(norms) >= dup_cos):
                first[i] = r
                break
        else:
            first[i] = i
    members: dict[int, list[int]] = {}
    for i in live:
        members.setdefault(first[i], []).append(i)
    groups: dict[int, list[int]] = {}
    for group in members.values():
        outside = [j for j in live if j not in group]

        def agreement(m: int) -> float:
            if gram[m][m] <= 0:
                return -math.inf
            return math.fsum(weights[j] * gram[m][j] for j in outside) / math.sqrt(gram[m][m])

        best = max(group, key=lambda m: (agreement(m), -m))
        groups[best] = group
    return groups


def _exact_partials(terms: Iterable[float]) -> list[float]:
    """Floats whose exact sum is the exact sum of ``terms`` (Shewchuk's partials, what math.fsum keeps inside):
    a sum of many terms kept exactly, so that a few of them can be taken out again without adding up the rest."""
    partials: list[float] = []
    for x in terms:
        i = 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]
    return partials


def _cos_to_others(coef: dict[int, float], gram: list[list[float]], n: int) -> list[float | None]:
    """For every update i < n, its cosine to sum_j coef_j u_j over j != i (None when there is no other update).

    The squared norm of the others' sum is every pair's term (coef_j coef_k) gram_jk over the positive coefs,
    less i's row and column: the whole sum is kept exactly once (``_exact_partials``) and i's terms, each the
    same float, are taken out of it inside one fsum, so every value is the correctly rounded sum of exactly the
    terms that summing the others' pairs one by one adds up (the same bits), in O(n) per update, not O(n^2)."""
    pos = [j for j in coef if coef[j] > 0]
    whole = _exact_partials((coef[j] * coef[k]) * gram[j][k] for j in pos for k in pos)
    without_none = math.fsum(whole)
    out: list[float | None] = []
    for i in range(n):
        others = [j for j in pos if j != i]
        if not others:
            out.append(None)
            continue
        num = math.fsum(coef[j] * gram[i][j] for j in others)
        if len(others) == len(pos):
            sq = without_none
        else:
            mine = [(coef[i] * coef[k]) * gram[i][k] for k in pos]
            mine += [(coef[j] * coef[i]) * gram[j][i] for j in others]
            sq = math.fsum([*whole, *(-t for t in mine)])
        out.append(0.0 if gram[i][i] <= 0 or sq <= 0 else num / (math.sqrt(gram[i][i]) * math.sqrt(sq)))
    return out


def _median_cos(cos: list[float | None], candidates: list[int]) -> float | None:
    """The median cosine of the candidates that have one (the direction screen's yardstick); None: none has."""
    values = [c for j in candidates if (c := cos[j]) is not None]
    return statistics.median(values) if values else None


def _passes(i: int, cos: list[float | None], median: float | None, params: RobustParams) -> bool:
    c = cos[i]
    if c is None or median is None:
        return True
    return c > 0.0 and c >= params.min_cos_ratio * median


def _direction(candidates: list[int], weight: list[float], factor: list[float], rep_w: list[float],
               norms: list[float], gram: list[list[float]], params: RobustParams,
               clip_to_median: bool) -> tuple[set[int], list[float | None]]:
    """The accepted set after the direction screen, and every update's final cosine to the others' mean."""
    accepted = set(candidates)
    cos: list[float | None] = [None] * len(norms)
    for _ in range(params.max_passes):
        median = statistics.median([norms[j] for j in accepted]) if accepted else 0.0
        coef = {}
        for j in sorted(accepted):
            clip = median / norms[j] if clip_to_median and norms[j] > median else 1.0
            coef[j] = weight[j] * factor[j] * rep_w[j] * clip
        cos = _cos_to_others(coef, gram, len(norms))  # every update, for the record; only candidates can be accepted
        yardstick = _median_cos(cos, candidates)
        new = {i for i in candidates if _passes(i, cos, yardstick, params)}
        if new == accepted:
            break
        accepted = new
    return accepted, cos
