"""What an update holds in the virtual simulator (node/sim/virtual.py), and how a decided set is aggregated.
``Content`` is a part of ``virtual.Simulation``.

Every update carries a vector (``DIM`` floats). An honest one is the round's true direction plus noise, scaled
by the share of its steps it ran, and the direction drifts from round to round. From round
``Scenario.lies_from`` on, the content liars ('signflip', 'noise', 'freerider') send it negated, a random vector
of its norm, or an update of another peer that their chain applied the round before.

Every peer applies a decided set through protocol/screening.py's screens, run on the vectors' exact Gram
matrix, and the reputation table, shared state like the ledger: a screened-out sender is no contributor.
``Scenario.aggregation = "mean"`` counts every update in the set (the rule before the screens).
"""

from __future__ import annotations

import hashlib
import math
import operator
import random
from collections.abc import Iterable

from gradnode.node.sim.vpeer import VPeer
from gradnode.protocol import round as core
from gradnode.protocol import votes
from gradnode.protocol.records import resolve
from gradnode.protocol.screening import Screen, judge

DIM = 64  # an update's content: a vector this long (protocol/screening.py judges it, as it judges tensors)
NOISE = 1.0  # an honest update: the round's true direction (unit) plus noise of this norm (cosines ~0.5)
DRIFT = 0.8  # the cosine of one round's true direction to the last's (the loss surface changes slowly)


class Content:
    """The updates' vectors, and the sets' aggregates."""
    def _resolve(self, r: int, base: str, fps: bytes) -> list[tuple[str, str]]:
        """The (sender, digest) pairs a set of round r on the chain ``base`` lists (records.resolve against every
        peer's update of it): once per set, as every peer on the chain applies the same one."""
        key = (r, base, fps)
        got = self._resolved.get(key)
        if got is None:
            got = self._resolved[key] = resolve(fps, ((q, update_digest(q, r, base)) for q in self.peers))[0]
        return got

    def _content(self, p: VPeer, r: int) -> tuple[tuple[float, ...], int]:
        """p's update of round r as the robust rule sees it: a vector and its tokens (the steps it ran). An honest
        one is the round's true direction (``_direction``) plus noise of norm NOISE, scaled by the share of the
        round's steps it ran; from round ``lies_from`` on, 'signflip' sends it negated, 'noise' a random vector
        of its norm, 'freerider' an update of another peer that the chain it holds applied in round r - 1 (its
        own while there is none)."""
        steps = p.steps.get(r, self.sc.inner_steps)
        n = random.Random(f"{self.sc.seed}/noise/{p.id}/{r}")
        noise = _unit([n.gauss(0.0, 1.0) for _ in range(DIM)])
        scale = steps / self.sc.inner_steps
        vec = [(a + NOISE * b) * scale for a, b in zip(self._direction(r), noise)]
        lie = p.lie if r >= self.sc.lies_from else ""
        if lie == "signflip":
            vec = [-x for x in vec]
        elif lie == "noise":
            size = math.sqrt(math.fsum(x * x for x in vec))
            vec = [x * size for x in _unit([n.gauss(0.0, 1.0) for _ in range(DIM)])]
        elif lie == "freerider" and r - 1 in p.applied and r - 2 in p.hashes:
            # the update of the lowest id that the chain it holds applied in round r - 1 (its own in round 0,
            # with nothing to copy yet)
            base = p.hashes[r - 2]
            pairs = self._resolve(r - 1, base, p.applied[r - 1])
            copy = next((self.content[d] for q, d in sorted(pairs) if q != p.id and d in self.content), None)
            if copy is not None:
                return copy[0], steps
        return tuple(vec), steps

    def _direction(self, r: int) -> list[float]:
        """Round r's true direction: a unit vector at cosine ~DRIFT to round r - 1's (an update copied from the
        last round points nearly where this round's do: only the replay screen tells it apart)."""
        while len(self._truth) <= r:
            g = random.Random(f"{self.sc.seed}/truth/{len(self._truth)}")
            fresh = _unit([g.gauss(0.0, 1.0) for _ in range(DIM)])
            last = self._truth[-1] if self._truth else fresh
            self._truth.append(_unit([DRIFT * a + math.sqrt(1 - DRIFT * DRIFT) * b for a, b in zip(last, fresh)]))
        return self._truth[r]

    def _aggregate(self, p: VPeer, r: int, base: str, fps: bytes, pairs: list[tuple[str, str]]) -> frozenset[str]:
        """The senders whose updates the aggregate of p's set for round r (``pairs``: its (sender, digest)s, as
        resolved) counts: every one under 'mean'; under 'robust', those protocol/screening.py's screens give a
        weight (the reputation table, shared state, moves with the set). Judged once per chain and set: every
        peer on the chain holds the same table."""
        senders = p.sets[r]
        if self.sc.aggregation == "mean" or not senders:  # an empty set moves nothing, the table included
            p.reasons[r] = {}
            return senders
        key = (base, fps)
        if key not in self._judged:
            screens = self._screens(p, r, pairs)
            counted = frozenset(s.sender for s in screens if s.weight > 0)
            reasons = {s.sender: s.reason for s in screens if s.weight <= 0}
            self._judged[key] = (counted, p.reputation.after(screens, established=p.ledger), reasons)
        counted, p.reputation, p.reasons[r] = self._judged[key]
        return counted

    def _screens(self, p: VPeer, r: int, pairs: Iterable[tuple[str, str]]) -> list[Screen]:
        """protocol/screening.py's screens of round r's updates ``pairs`` ((sender, digest hex)s) on p's state
        (its reputation table, the previous round's fingerprints)."""
        ordered = sorted((q, bytes.fromhex(d)) for q, d in pairs)
        vecs, tokens = zip(*(self.content[d.hex()] for _, d in ordered))
        gram = [[0.0] * len(vecs) for _ in vecs]
        # each pair's products summed once, correctly rounded (exact and symmetric), and once per round: the
        # sets of a round differ by a few updates (late records), their pairs are nearly all the same
        dots = self._dots.setdefault(r, {})
        for old in [k for k in self._dots if k < r - 2]:
            del self._dots[old]
        for i, (u, (_, a)) in enumerate(zip(vecs, ordered)):
            for j in range(i, len(vecs)):
                x = dots.get((a, ordered[j][1]))
                if x is None:
                    x = dots[a, ordered[j][1]] = math.fsum(map(operator.mul, u, vecs[j]))
                gram[i][j] = gram[j][i] = x
        return judge(ordered, [hashlib.sha256(repr(u).encode()).digest() for u in vecs], gram,
                     [math.sqrt(gram[i][i]) for i in range(len(vecs))], [float(t) for t in tokens],
                     [False] * len(vecs), reputation=p.reputation.weights(), previous=p.reputation.recent)

    def _note_workers(self, p: VPeer, c: core.RoundCore, r: int) -> None:
        """The senders of round r's updates p verified outside the set it applies, whose update the screens
        count among all it verified (protocol/votes.py ``workers_after``; judged once per chain and pool): they
        vote. Before the round's aggregate moves p's reputation table."""
        if self.sc.votes != "contributors":
            return
        pool = tuple(sorted((s, d) for s, d in c.verified.items() if s not in c.doubted))

        def kept() -> frozenset[str]:
            if self.sc.aggregation == "mean":
                return frozenset(s for s, _ in pool)
            key = (c.base, pool)
            if key not in self._kept:
                self._kept[key] = frozenset(s.sender for s in self._screens(p, r, pool) if s.weight > 0)
            return self._kept[key]

        p.workers = votes.workers_after(p.workers, r, [s for s, _ in pool], p.id, p.sets[r], p.ledger, kept)


def _unit(v: list[float]) -> list[float]:
    size = math.sqrt(math.fsum(x * x for x in v))
    return [x / size for x in v]


def update_digest(peer: str, round_: int, base: str) -> str:
    """The digest of ``peer``'s update of ``round_`` made on the chain ``base`` (its blob, in the simulator)."""
    return hashlib.sha256(f"{peer}/{round_}/{base}".encode()).hexdigest()
