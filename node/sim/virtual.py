"""`gradnode simulate --virtual`: the round protocol's real core (protocol/round.py) for many peers on one
virtual clock, from a seed. No torch, no sockets, no threads: the same seed gives the same run.

What is modelled, and how:
- A peer computes a round in a time drawn from its speed, then announces its update (a digest) and starts
  the next round's compute at once; the announced round's exchange runs meanwhile, and just before the
  next announcement the peer counts the round's reports again (``RoundCore.settle``) and applies it. This
  is the node's pipeline (node/swarm/peer.py).
- The DHT and the streams are one delay per delivery: every record a peer writes reaches each other peer
  ``latency + jitter`` later, and with probability ``late_p`` much later (``late_s``: the DHT hid a stored
  record from one reader for a while, as the real one does); an update is verified once it arrived
  (``update_bytes / bandwidth`` more). A partition cuts deliveries between groups.
- A peer's weights are a hash chain: the hash of round r is the hash of round r - 1 and the set applied.
  After applying round r a peer publishes that hash; the next round it compares its hash of r with the
  majority of the reports it received and, off it, re-syncs (adopts a majority peer's state after a
  download time), as the node's chores thread does.

Adversaries (``Scenario.liars``): a real core whose outputs a policy rewrites, never a mock.
- ``censor``: its report lists only its own update (the 'lowid' attacker of the process tests: a witness
  that keeps every other update out).
- ``equivocate``: two reports for each round, the honest one to half the peers and one listing only its
  own update to the other half (the worst case for the rule: nobody holds both, so nobody can prove it).
- ``withhold``: announces its update and never serves it (every fetch of it ends without the bytes).
``Scenario.rule`` picks the decision: ``witnesses`` (the core: what a strict majority of the counted reports
lists) or ``leader`` (the rule before witnesses: the lowest-id witness's report is the round's set), so that
a test shows an attack succeeding without the defence and failing with it.

Safety, checked after every applied round: every honest peer that applied round r on the same chain (the
same hash of r - 1) applied the same set (else a *violation*: the rules let two honest peers decide apart).
Censorship, counted at the end: an honest update that every honest peer verified before it reported, yet
left out of an honest peer's decided set (``kept_out``). Liveness: the rounds it takes after the last
violation until every honest peer holds one hash.
"""

from __future__ import annotations

import hashlib
import heapq
import random
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from gradnode.protocol import round as core
from gradnode.protocol.records import pack, resolve

TAIL = 4  # rounds of its chain a peer publishes (protocol/chain.py)
FINAL_CHECK_S = 10.0  # after its last round a peer checks that round's hash against the others' this much later
LIAR_KINDS = ("censor", "equivocate", "withhold")  # the adversaries modelled (see the module's docstring)


@dataclass(frozen=True)
class Scenario:
    peers: int = 8
    rounds: int = 20
    seed: int = 0
    compute_s: float = 2.0  # a median peer's round of inner steps
    spread: float = 0.2  # each round's compute time: compute_s x U(1 - spread, 1 + spread) x the peer's slowness
    latency_s: float = 0.05
    jitter_s: float = 0.05
    late_p: float = 0.01
    late_s: float = 8.0
    bandwidth_bps: float = 20e6
    update_bytes: int = 20_000
    state_bytes: int = 2_000_000
    params: core.Params = core.Params(min_deadline_s=2.0, max_wait_s=60.0)
    liars: tuple[tuple[int, str], ...] = ()  # (peer index, 'censor' | 'equivocate' | 'withhold')
    rule: str = "witnesses"  # or 'leader': the lowest-id witness's report decides (the rule before witnesses)

    def __post_init__(self) -> None:
        for index, kind in self.liars:
            if kind not in LIAR_KINDS or not 0 <= index < self.peers:
                raise ValueError(f"liar {index}:{kind}: a peer 0..{self.peers - 1} and one of {', '.join(LIAR_KINDS)}")
        if self.rule not in ("witnesses", "leader"):
            raise ValueError(f"rule {self.rule!r}: 'witnesses' or 'leader'")


@dataclass
class VPeer:
    id: str
    slowness: float
    lie: str = ""  # its policy ('' honest)
    hashes: dict[int, str] = field(default_factory=lambda: {-1: "genesis"})
    applied: dict[int, bytes] = field(default_factory=dict)
    cores: dict[int, core.RoundCore] = field(default_factory=dict)
    inbox: dict[int, list[Any]] = field(default_factory=lambda: defaultdict(list))  # events of rounds not open yet
    weights: dict[int, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))  # r -> peer -> hash
    waiting: int | None = None  # the round it must apply before announcing the next one
    computed: int = -1  # newest round computed and not yet announced
    resyncs: int = 0
    busy_until: float = 0.0  # a re-sync's download
    gen: int = 0  # bumped by a re-sync: the compute in flight is of a round given up
    reported: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the senders its report listed
    sets: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the senders of the set it applied


class Simulation:
    def __init__(self, sc: Scenario) -> None:
        self.sc, self.rng = sc, random.Random(sc.seed)
        lies = dict(sc.liars)
        self.peers = {f"p{i:04d}": VPeer(f"p{i:04d}", 1.0, lies.get(i, "")) for i in range(sc.peers)}
        self.now, self.events, self._seq = 0.0, 0, 0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self.decided: dict[tuple[int, str], bytes] = {}  # (round, chain) -> the first set applied on it
        self.violations: list[dict[str, Any]] = []
        self.last_violation = -1
        self.undecided = 0
        self.repairs: list[int] = []  # per re-sync: the round adopted minus the round found off the majority
        self._wakes: dict[tuple[str, int], float] = {}
        self.stalled = False
        self.per_round: dict[int, dict[str, int]] = defaultdict(lambda: {"applied": 0, "violations": 0, "resyncs": 0})

    # --- the clock ---------------------------------------------------------------------------------

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn))

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        for p in self.peers.values():
            self._compute(p, 0)
        limit = self.sc.rounds * 4 * self.sc.params.max_wait_s + 600.0
        while self._heap:
            if self._heap[0][0] > limit:  # a run that cannot end: say so, never spin
                self.stalled = True
                break
            self.now, _, fn = heapq.heappop(self._heap)
            self.events += 1
            fn()
        return self._summary(time.perf_counter() - t0)

    # --- the network -------------------------------------------------------------------------------

    def _delay(self) -> float:
        d = self.sc.latency_s + self.rng.random() * self.sc.jitter_s
        if self.rng.random() < self.sc.late_p:
            d += self.rng.random() * self.sc.late_s
        return d

    def _broadcast(self, src: VPeer, deliver: Callable[[VPeer, float], None]) -> None:
        for q in self.peers.values():
            if q is not src:
                self.at(self.now + self._delay(), lambda q=q: deliver(q, self.now))

    # --- a peer's rounds ---------------------------------------------------------------------------

    def _compute(self, p: VPeer, r: int) -> None:
        if r >= self.sc.rounds:  # the run is over: the pipeline drains (the last round is applied when decided)
            self.at(max(self.now, p.busy_until), lambda gen=p.gen: self._computed(p, r, gen))
            return
        s = self.sc.compute_s * p.slowness * (1 + self.sc.spread * (2 * self.rng.random() - 1))
        self.at(max(self.now, p.busy_until) + s, lambda gen=p.gen: self._computed(p, r, gen))

    def _computed(self, p: VPeer, r: int, gen: int) -> None:
        if gen != p.gen:
            return
        p.computed = r
        if r > 0 and (r - 1) not in p.applied:
            before = p.cores.get(r - 1)
            if before is not None and before.phase == "decided":
                self._apply(p, r - 1)  # announces round r
            else:
                p.waiting = r - 1  # round r - 1 is not decided yet: announce once it is applied
            return
        self._next(p, r)

    def _next(self, p: VPeer, r: int) -> None:
        """Round r - 1 is applied: announce round r, or, at the end of the run, check the last round once the
        others reported it (the node waits up to 10 s; the finished peers keep serving, Peer._linger)."""
        if r < self.sc.rounds:
            self._announce(p, r)
        else:
            self.at(self.now + FINAL_CHECK_S, lambda gen=p.gen: gen == p.gen and self._check(p, r - 1))

    def _announce(self, p: VPeer, r: int) -> None:
        c = core.RoundCore(self.sc.params, r, p.id, frozenset(), True, p.hashes[r - 1], self.sc.compute_s, self.now)
        p.cores[r] = c
        digest = hashlib.sha256(f"{p.id}/{r}/{p.hashes[r - 1]}".encode()).hexdigest()
        self._act(p, c, c.step(core.Members(self.now, self._view(p, r))))
        self._act(p, c, c.own_update(self.now, digest))
        for ev in sorted(p.inbox.pop(r, []), key=lambda e: e.now):
            self._act(p, c, c.step(ev if ev.now >= self.now else _at(ev, self.now)))
        sent = self.now
        fetch_s = self.sc.update_bytes * 8 / self.sc.bandwidth_bps

        def seen(q: VPeer, now: float) -> None:
            self._deliver(q, r, core.Announced(now, p.id, sent))  # the DHT gives its age: first seen = sent
            self._deliver(q, r, core.FetchStarted(now, p.id))
            got = core.FetchEnded if p.lie == "withhold" else lambda t, who: core.Verified(t, who, digest)
            self.at(now + fetch_s + self.sc.latency_s, lambda: self._deliver(q, r, got(self.now, p.id)))

        self._broadcast(p, seen)
        self._compute(p, r + 1)

    def _view(self, p: VPeer, r: int) -> core.View:
        others = frozenset(q for q in self.peers if q != p.id)
        return core.View(trainers=others, counted=others, present=others, live=frozenset(self.peers))

    def _deliver(self, q: VPeer, r: int, ev: Any) -> None:
        c = q.cores.get(r)
        if c is None:
            if r > max(q.cores, default=-1):
                q.inbox[r].append(ev)
            return
        self._act(q, c, c.step(ev))

    def _act(self, p: VPeer, c: core.RoundCore, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, core.PublishReport):
                p.reported[c.round_] = frozenset(s for s, _ in a.pairs)
                self._publish(p, c, a.pairs)
            elif isinstance(a, core.Wake):
                key, t = (p.id, c.round_), max(a.at, self.now + 1e-3)
                if self._wakes.get(key, float("inf")) > t:
                    self._wakes[key] = t
                    self.at(t, lambda c=c, key=key, t=t: self._tick(p, c, key, t))
            elif isinstance(a, core.AskWitnesses):
                self.at(self.now + 2 * self.sc.latency_s, lambda c=c, w=a.witnesses: self._answer(p, c, w))
            elif isinstance(a, core.Decided):
                if a.fps is None:
                    self.undecided += 1
                if p.waiting == c.round_ and c.round_ not in p.applied:
                    self._apply(p, c.round_)

    def _publish(self, p: VPeer, c: core.RoundCore, pairs: tuple[tuple[str, str], ...]) -> None:
        """Its report reaches every other peer; a liar's policy rewrites what each one gets."""
        own = tuple(x for x in pairs if x[0] == p.id)

        def report(to: VPeer) -> core.Report:
            lied = own if p.lie == "censor" or p.lie == "equivocate" and _half(to.id, c.round_) else pairs
            return core.Report(p.id, c.seed, pack(lied), digest=pack(lied))

        self._broadcast(p, lambda q, now, r=c.round_: self._deliver(q, r, core.ReportSeen(now, report(q))))

    def _tick(self, p: VPeer, c: core.RoundCore, key: tuple[str, int], t: float) -> None:
        if self._wakes.get(key) == t:
            del self._wakes[key]
        if c.phase != "decided":
            self._act(p, c, c.step(core.Tick(self.now)))

    def _answer(self, p: VPeer, c: core.RoundCore, witnesses: tuple[str, ...]) -> None:
        got = [q.cores[c.round_].reports[q.id] for q in (self.peers[w] for w in witnesses)
               if c.round_ in q.cores and q.id in q.cores[c.round_].reports and q.cores[c.round_].seed == c.seed]
        if c.phase == "deciding":
            self._act(p, c, c.asked(self.now, got))

    def _apply(self, p: VPeer, r: int) -> None:
        c = p.cores[r]
        settled = c.settle()
        if self.sc.rule == "leader":  # the rule before witnesses: the first counted report in id order stands
            counted = c._counted()
            settled = (counted[0].fps, 1) if counted else None
        fps = settled[0] if settled else b""
        p.applied[r] = fps
        p.sets[r] = frozenset(s for s, _ in resolve(fps, c.verified.items())[0])
        p.hashes[r] = hashlib.sha256(p.hashes[r - 1].encode() + fps).hexdigest()[:16]
        key = (r, c.seed)
        first = self.decided.setdefault(key, fps) if not p.lie else fps  # a liar's own decisions prove nothing
        if first != fps:
            self.violations.append({"round": r, "peer": p.id, "chain": c.seed,
                                    "updates": [len(first) // 16, len(fps) // 16]})
            self.per_round[r]["violations"] += 1
            self.last_violation = max(self.last_violation, r)
        p.waiting = None
        self.per_round[r]["applied"] += 1
        h = p.hashes[r]
        self._broadcast(p, lambda q, now, r=r, h=h: q.weights[r].__setitem__(p.id, h))
        p.weights[r][p.id] = h
        self._check(p, r - 1)
        if p.computed == r + 1:
            self._next(p, r + 1)

    def _check(self, p: VPeer, r: int) -> None:
        """The hash check of round r: off the majority of the weight reports received, re-sync."""
        votes = p.weights.get(r, {})
        if r < 0 or len(votes) < 2:
            return
        counts = Counter(votes.values())
        top = max(counts.values())
        best = min((h for h, n in counts.items() if n == top), key=lambda h: min(q for q, v in votes.items() if v == h))
        if best == p.hashes.get(r):
            return
        donors = [q for q, v in votes.items() if v == best and q != p.id]
        donor = self.peers[min(donors)]
        newest = max(donor.applied)
        p.resyncs += 1
        self.repairs.append(newest - r)
        self.per_round[r]["resyncs"] += 1
        p.gen += 1
        p.busy_until = self.now + self.sc.latency_s + self.sc.state_bytes * 8 / self.sc.bandwidth_bps
        p.hashes = {k: h for k, h in donor.hashes.items() if k <= newest}
        p.applied = {k: f for k, f in donor.applied.items() if k <= newest}
        p.waiting, p.computed = None, -1
        # what it holds now, it says (the node's member record publishes its chain's tail, and a report of a
        # chain left since counts for the one followed now: chores.off_majority)
        for k in range(max(0, newest - TAIL + 1), newest + 1):
            h = p.hashes[k]
            p.weights[k][p.id] = h
            self._broadcast(p, lambda q, now, k=k, h=h: q.weights[k].__setitem__(p.id, h))
        self.at(p.busy_until, lambda: self._compute(p, newest + 1))

    # --- the summary -------------------------------------------------------------------------------

    def _kept_out(self) -> int:
        """Honest updates every honest peer listed in its own report of a round, missing from an honest peer's
        applied set of it (a re-synced peer's adopted rounds are the donor's: not counted twice)."""
        honest = [p for p in self.peers.values() if not p.lie]
        out = 0
        for r in range(self.sc.rounds):
            listed = [p.reported.get(r) for p in honest]
            if not listed or any(x is None for x in listed):
                continue
            everyone = frozenset.intersection(*listed) & {p.id for p in honest}
            out += sum(len(everyone - p.sets[r]) for p in honest if r in p.sets)
        return out

    def _summary(self, wall: float) -> dict[str, Any]:
        last = self.sc.rounds - 1
        final = Counter(p.hashes.get(last, "") for p in self.peers.values() if not p.lie)
        liars = {p.id for p in self.peers.values() if p.lie}
        # liveness: how many rounds past a split's round the last of its peers re-synced onto the majority
        # (None: the run ended on more than one hash)
        converged = max(self.repairs, default=0) if len(final) == 1 and not self.stalled else None
        return {"seed": self.sc.seed, "peers": self.sc.peers, "rounds": self.sc.rounds,
                "violations": self.violations, "splits": len({v["round"] for v in self.violations}),
                "rounds_to_converge": converged, "final_hashes": len(final),
                "resyncs": sum(p.resyncs for p in self.peers.values() if not p.lie), "undecided": self.undecided,
                "kept_out": self._kept_out(),
                "liar_rounds": sum(bool(liars & p.sets[r]) for p in self.peers.values() if not p.lie for r in p.sets),
                "stalled": self.stalled, "per_round": [{"round": r, **self.per_round[r]} for r in sorted(self.per_round)],
                "events": self.events, "virtual_s": round(self.now, 3), "wall_s": round(wall, 3),
                "scenario": {k: v for k, v in asdict(self.sc).items() if k != "params"}}


def parse_liars(spec: str | None, peers: int) -> tuple[tuple[int, str], ...]:
    """``--faults`` for ``--virtual``: KIND:P items (KIND one of LIAR_KINDS, P a peer index), comma-separated.
    ValueError names the item and what to write instead."""
    out: list[tuple[int, str]] = []
    for raw in (x.strip() for x in (spec or "").split(",") if x.strip()):
        kind, _, index = raw.partition(":")
        if kind not in LIAR_KINDS or not index.isdigit():
            raise ValueError(f"--faults: {raw!r} is not modelled by --virtual; write KIND:P with KIND one of "
                             f"{', '.join(LIAR_KINDS)} (the process simulator runs the other faults)")
        if int(index) >= peers or int(index) in dict(out):
            raise ValueError(f"--faults: {raw!r}: peer {index} does not exist or has a fault already "
                             f"(peers are 0..{peers - 1})")
        out.append((int(index), kind))
    if 2 * len(out) >= peers:
        raise ValueError(f"--faults: {len(out)} liars of {peers} peers: the rules assume fewer than half")
    return tuple(out)


def _half(peer: str, round_: int) -> bool:
    """Which half of the peers an equivocator lies to in a round (fixed by the names: no randomness drawn)."""
    return hashlib.sha256(f"{peer}/{round_}".encode()).digest()[0] & 1 == 1


def _at(ev: Any, now: float) -> Any:
    """A buffered event taken at ``now`` (its round opened later than it arrived)."""
    return type(ev)(**{**ev.__dict__, "now": now})


def run(sc: Scenario) -> dict[str, Any]:
    return Simulation(sc).run()


def print_summary(out: dict[str, Any]) -> None:
    """Per round: how many peers applied it, how many applied another set than the first peer on their chain
    (0 when safe), and the re-syncs that found it off the majority; then the totals."""
    print(f"virtual swarm: {out['peers']} peers, {out['rounds']} rounds, seed {out['seed']}")
    print(f"{'round':>5} {'applied':>8} {'violations':>10} {'resyncs':>8}")
    for row in out["per_round"]:
        print(f"{row['round']:>5} {row['applied']:>8} {row['violations']:>10} {row['resyncs']:>8}")
    if out["scenario"]["liars"]:
        print(f"liars {', '.join(f'{i}:{k}' for i, k in out['scenario']['liars'])}: honest updates kept out "
              f"{out['kept_out']}; peer-rounds that applied a liar's update {out['liar_rounds']}")
    print(f"violations {len(out['violations'])} in {out['splits']} rounds; re-syncs {out['resyncs']}; "
          f"final hashes {out['final_hashes']}; rounds to converge {out['rounds_to_converge']}; "
          f"{out['events']} events, {out['virtual_s']:.0f} virtual s in {out['wall_s']:.2f} s"
          + ("; STALLED" if out["stalled"] else ""))
