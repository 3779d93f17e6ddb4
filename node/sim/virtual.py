"""`gradnode simulate --virtual`: the protocol's real cores (protocol/round.py, protocol/peer.py) for many peers
on one virtual clock, from a seed. No torch, no sockets, no threads: the same seed gives the same run.

``Simulation`` is the cores' shell: a heap of events on a virtual clock, and the peers' pipelines. Its parts
model the rest: the network (network.py), what a peer sees and reads (sight.py), what an update holds and how
a set is aggregated (content.py), state sync (states.py), and the run's result (summary.py).

A peer's rounds:
- It computes a round as ``inner_steps`` steps of a time drawn from its speed (``Scenario.slow``: a
  straggler's factor), then announces its update (a digest) and starts the next round's compute at once.
- The announced round's exchange runs meanwhile. Just before the next announcement the peer counts the
  round's reports again (``RoundCore.settle``) and applies it.
- While it computes, it reads the announcements every ``POLL_S`` and cuts its steps short at the round's cut
  time (``round.cut_at``: a slow peer runs fewer steps). A round whose cut time is nearer than its fewest
  steps it sits out (``peer_core.to_compute``): an abstaining report at once, its compute for the next round,
  and the round it sat out observed and applied as the others decided it.
- Its weights are a hash chain: the hash of round r is the hash of round r - 1 and the set applied. After
  applying round r it publishes that hash, with its member record. After applying the next it reads the
  reports of r and the tails in its sight, and after applying the one after, its peer core decides: stay,
  re-sync, or follow the winning chain. After the run's last round it decides at once
  (``peer_core.settle_at_once``), then lingers.

Adversaries (``Scenario.liars``): a real core whose outputs a policy rewrites, never a mock.
- ``censor``: its report lists only its own update (the 'lowid' attacker of the process tests: a witness
  that keeps every other update out).
- ``equivocate``: two reports for each round, the honest one to half the peers and one listing only its
  own update to the other half (the worst case for the rule: nobody holds both, so nobody can prove it).
- ``withhold``: announces its update and never serves it (every fetch of it ends without the bytes).
- ``signflip``, ``noise``, ``freerider``: an honest witness whose update does not help (robust learning's swarm
  attacks; content.py).
- ``futurestate``: an honest witness and update whose member records list, after its chain's tail, a state
  ``FUTURE_ROUNDS`` past its newest under a hash of its making, and offer that state (states.py says what a
  peer refuses). One that takes a made-up state counts in ``made_up``, and in ``far_states`` when it lies
  past the run's end.
- ``stretch``: an honest witness and update whose member records claim an hour a round (``sight.PACE_LIE_S``), and
  ``Scenario.sybil_pace_s``: the sybil keys' records claim that many seconds. ``Scenario.pace = "everyone"``
  paces on every record in sight instead of the last round's senders' (the rule an attacker would want).
``Scenario.rule`` picks the decision: ``witnesses`` (the core: what a strict majority of the counted reports
lists) or ``leader`` (the rule before witnesses: the lowest-id witness's report is the round's set), so that
a test shows an attack succeeding without the defence and failing with it.

Safety, checked after every applied round: every honest peer that applied round r on the same chain (the
same hash of r - 1), on the same side of a split, applied the same set. Else it is a *violation*: two honest
peers decided apart. The two sides of a split train on apart by design, and the heal merges them.
"""
from __future__ import annotations

import gc
import hashlib
import heapq
import math
import operator
import random
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, Callable

from gradnode.node.sim import sizes
from gradnode.node.sim.content import Content, update_digest
from gradnode.node.sim.network import Network
from gradnode.node.sim.scenario import Scenario
from gradnode.node.sim.sight import POLL_S, Sight, keeps_newest
from gradnode.node.sim.states import States, download_s
from gradnode.node.sim.summary import Summary
from gradnode.node.sim.vpeer import VPeer
from gradnode.protocol import committee
from gradnode.protocol import chain
from gradnode.protocol import peer as peer_core
from gradnode.protocol import round as core
from gradnode.protocol import roster
from gradnode.protocol import sync as sync_rules
from gradnode.protocol.gossip import CopyBudget, copy_window_s
from gradnode.protocol.records import FINGERPRINT_BYTES, pack
from gradnode.protocol.reputation import Reputation
from gradnode.protocol.votes import CONTRIBUTOR_ROUNDS
from gradnode.protocol.witness import Counts, eligible_witnesses

FINAL_CHECK_S = 10.0  # after its last round a peer checks that round's hash against the others' this much later
BLOB_BUDGET = 1 << 30  # the bytes of blobs a peer holds, oldest evicted first (transport.Transport's blob_budget)


class Simulation(Network, Sight, Content, States, Summary):
    def __init__(self, sc: Scenario) -> None:
        self.sc, self.rng = sc, random.Random(sc.seed)
        lies, slow = dict(sc.liars), dict(sc.slow)
        self.peers = {f"p{i:04d}": VPeer(f"p{i:04d}", slow.get(i, 1.0), lies.get(i, "")) for i in range(sc.peers)}
        for p in self.peers.values():
            p.core = self._core(p)
        drift = random.Random(f"{sc.seed}/drift")  # its own stream: a run without drift draws as before
        self.off = {q: drift.uniform(-sc.drift_s, sc.drift_s) if sc.drift_s else 0.0 for q in self.peers}
        self.off.update({f"p{i:04d}": d for i, d in sc.clock_off})
        links = random.Random(f"{sc.seed}/links")  # their own streams too: a uniform, lossless run draws as before
        self.bw = {q: sc.bandwidth_bps / sc.link_spread ** links.random() for q in self.peers}
        self.lat = {q: sc.latency_s * sc.link_spread ** links.random() for q in self.peers}
        self.loss = random.Random(f"{sc.seed}/loss")
        # links shared in turn: when each peer's upload and download are next free (``_fetch``)
        self.up_free: dict[str, float] = dict.fromkeys(self.peers, 0.0)
        self.down_free: dict[str, float] = dict.fromkeys(self.peers, 0.0)
        self.copies = CopyBudget(sc.own_copies, copy_window_s(sc.params.min_deadline_s))  # the senders' budgets
        # an update's digest -> its copies fetched or being fetched: (when the fetch ends, by whom)
        self.holders: dict[str, list[tuple[float, str]]] = defaultdict(list)
        # digest -> holdings_parts -> part -> those of them under that part, in the same order (``_holders_in``)
        self.holders_by_part: dict[str, dict[int, dict[int | None, list[tuple[float, str]]]]] = defaultdict(dict)
        # (round, part of the holdings) -> peers that listed what they hold there
        self.holding_writers: dict[tuple[int, int | None], int] = defaultdict(int)
        self.sources = random.Random(f"{sc.seed}/sources")  # which holder a fetcher turns to
        self.blob_cap = max(1, BLOB_BUDGET // max(1, sc.update_bytes))  # updates a peer's blob store holds
        self.budget = committee.Budget(*sc.committee)
        self.now, self.events, self._seq = 0.0, 0, 0
        self._heap: list[tuple[float, int, Callable[..., None], tuple]] = []  # (time, seq, fn, args)
        self.decided: dict[tuple[int, str, int], bytes] = {}  # (round, chain, side) -> the first set applied on it
        self.violations: list[dict[str, Any]] = []
        self.last_violation = -1
        self.undecided = 0
        self.waited_out = 0  # honest peer-rounds that collected or decided until max_wait_s
        self.no_offer = 0  # re-syncs that found no state offer on the winning chain at first (the peer read the offers again every OFFER_POLL_S until its look ended)
        self.repairs: list[int] = []  # per re-sync: the round adopted minus the round found off the majority
        self.adopted: list[int] = []  # per re-sync: the round of the state adopted
        # (peer, round, its core's id: the pending tick holds the core, so the id is its own) -> the earliest tick
        self._wakes: dict[tuple[str, int, int], float] = {}
        # the witness rule, each count derived from the nearest of its last ones: every peer of a round counts
        # nearly the same reports (the run's own, gone with it)
        self._witnessed = Counts(keep=8)
        self._batch: dict[int, tuple[core.RoundCore, list[Any]]] | None = None  # the poll being read: core id -> events
        self._taking: dict[int, list[tuple[VPeer, str]]] = {}  # the poll being read: round -> announcements read
        polls = random.Random(f"{sc.seed}/polls")  # each peer's polls fall at its own phase (a stream of their own)
        self._phase = {q: polls.random() * core.POLL_S for q in self.peers}
        # what a broadcast reads of each peer: it, half its link's latency, its polls' phase
        self._reach = [(q, self.lat[q.id] / 2, self._phase[q.id]) for q in self.peers.values()]
        self.stalled = False
        self.per_round: dict[int, dict[str, int]] = defaultdict(lambda: {"applied": 0, "violations": 0, "resyncs": 0})
        self.group: dict[str, int] | None = None  # peer -> its side while the network is split
        self.healed = False
        self.healed_round = -1  # the newest round any peer opened when a timed heal (``heal_after_s``) came
        self.clogged: set[frozenset[str]] = set()
        # a clogged link's deliveries: (reader, writer, deliver), posted again when it unclogs
        self.held: dict[frozenset[str], list[tuple[VPeer, VPeer, Callable[[VPeer, float], None]]]] = defaultdict(list)
        self.swizzled = False
        self.unclogged_at = -1.0  # when the last clogged link unclogs (the swizzle's heal)
        self.unclog_round = -1  # the newest round announced then
        self.heartbeat_s = min(10.0, sc.record_ttl_s / 3)
        self.life = sorted(((r, n, action, f"p{i:04d}") for n, (action, i, r) in enumerate(sc.life)))
        self.downloads = 0  # states a (re)starting peer adopted
        self.catchups = 0  # (re)starting peers that replayed the rounds they missed instead
        self.made_up = 0  # states adopted by honest peers that a liar made up
        self.fakes: set[chain.Link] = set()  # the states liars made up
        self.far_states = 0  # states adopted that claim a round past the run's end (a 'futurestate' liar's)
        self.abstained = 0  # honest peer-rounds sat out (too slow for the round's deadline)
        self.cut_short = 0  # honest peer-rounds computed with fewer steps than inner_steps (the cut time)
        self.content: dict[str, tuple[tuple[float, ...], int]] = {}  # an update's digest -> its vector and tokens
        # (chain, set) -> the senders counted, the reputation table after, each sender's screen reason
        self._judged: dict[tuple[str, bytes], tuple[frozenset[str], Reputation, dict[str, str]]] = {}
        self._kept: dict[tuple[str, tuple[tuple[str, str], ...]], frozenset[str]] = {}  # _note_workers' screens
        self._resolved: dict[tuple[int, str, bytes], list[tuple[str, str]]] = {}  # _resolve's sets
        self._dots: dict[int, dict[tuple[bytes, bytes], float]] = {}  # round -> two updates' dot product (_aggregate)
        self._truth: list[list[float]] = []  # each round's true direction (a unit vector), drawn as needed
        for _, _, action, peer in self.life:
            if action == "join":
                self.peers[peer].alive = False

    # --- the clock ---------------------------------------------------------------------------------

    def _core(self, p: VPeer) -> peer_core.PeerCore:
        """A new process's peer core: nothing of the last one's looks survives a restart."""
        return peer_core.PeerCore(p.id, peer_core.Params(max_wait_s=self.sc.params.max_wait_s))

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` at virtual time t (now if t is past); events of equal times in the order pushed."""
        self._seq += 1
        now = self.now
        heapq.heappush(self._heap, (now if now > t else t, self._seq, fn, args))  # max(t, now), as it picks

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        late = {f"p{i:04d}": s for i, s in self.sc.starts}
        for p in self.peers.values():
            if p.alive and p.id in late:
                self.at(late[p.id], lambda p=p, gen=p.gen: gen == p.gen and p.alive and self._begin(p))
            elif p.alive:
                self._begin(p)
        if self.sc.sybils:
            self._sybil_beat()
        limit = self.sc.rounds * 4 * self.sc.params.max_wait_s + 600.0
        heap, pop = self._heap, heapq.heappop
        # no cyclic garbage collection while it runs: a run holds millions of live tuples (mail, records, events)
        # that each full collection walks, and makes almost no cycles (10 objects collected in 11 full collections
        # of 256 x 2, which took 13.1 CPU-s with them, 8.7 without); what it leaves is collected after it
        collecting = gc.isenabled()
        gc.disable()
        try:
            while heap:
                if heap[0][0] > limit:  # a run that cannot end: say so, never spin
                    self.stalled = True
                    break
                self.now, _, fn, args = pop(heap)
                self.events += 1
                fn(*args)
        finally:
            if collecting:
                gc.enable()
        return self._summary(time.perf_counter() - t0)

    def _begin(self, p: VPeer) -> None:
        """p's process starts with the run (or ``Scenario.starts`` late): its first record, then its first round
        once ``min_peers`` trainers are in sight, itself included (Peer._wait_for_peers, read every POLL_S)."""
        self._heartbeat(p)
        self._when_enough(p, p.gen)

    def _when_enough(self, p: VPeer, gen: int) -> None:
        if gen != p.gen or not p.alive:
            return
        if 1 + len(self._sight(p)[0]) >= self.sc.min_peers:
            self._compute(p, 0)
        else:
            self.at(self.now + POLL_S, self._when_enough, p, gen)

    # --- churn -------------------------------------------------------------------------------------

    def _churn(self, r: int) -> None:
        """Fire the churn of rounds up to ``r`` (at the first announcement of round r)."""
        while self.life and self.life[0][0] <= r:
            _, _, action, peer = self.life.pop(0)
            p = self.peers[peer]
            if action in ("kill", "stop") and p.alive:
                p.alive, p.gen, p.incarnation, p.mail = False, p.gen + 1, p.incarnation + 1, {}  # in flight: lost
                if action == "stop":  # its departure reaches the others: nobody waits for it from then on
                    def gone(q: VPeer, now: float, sent: float = self.now) -> None:
                        if keeps_newest(q, p.id, sent):
                            q.forget(p.id)

                    self._broadcast(p, gone)
                    for k, c in p.cores.items():  # and it abstains from the rounds it witnesses unreported
                        if c.phase is not core.Phase.DECIDED and c.witness and p.id not in c.reports:
                            left = core.Report(p.id, "", abstain=True)
                            self._broadcast(p, lambda q, now, k=k, left=left:
                                            self._deliver(q, k, core.ReportSeen(now, left)))
            elif action in ("restart", "join") and not p.alive:
                self._start(p, fresh=action == "join")

    def _start(self, p: VPeer, fresh: bool) -> None:
        """A process (re)starts: with its disk (its hashes and applied sets) or none; nothing in memory. It reads
        the records for a heartbeat, then adopts the newest state offered on the winning chain when that is
        ahead of its own (Peer start-up: Sync.level), and trains on from there."""
        p.alive, p.done, p.gen, p.incarnation = True, False, p.gen + 1, p.incarnation + 1
        if fresh:
            p.hashes, p.applied, p.ledger, p.reputation, p.pools = {-1: committee.GENESIS}, {}, {}, Reputation(), {}
        p.senders, p.step_s, p.told, p.workers = frozenset(), 0.0, {}, {}  # in memory only (its step time: anew)
        p.records, p.cores, p.newest, p.offer, p.sight, p.views = {}, {}, -1, None, None, {}  # sight: read anew
        p.lists = {}  # it lists its record until it opens a round
        p.records_of, p.announcers_of, p.weights = defaultdict(list), defaultdict(dict), defaultdict(dict)
        p.reports_at = defaultdict(dict)
        # what reaches it from now on it reads (the DHT holds it for the new process); its dead process's own fetches
        # (no writer) and what came while it was down are gone
        p.mail = {k: box for k, box in ((k, [e for e in box if e[0] >= self.now and e[2] is not None])
                                        for k, box in p.mail.items()) if box}
        p.stamps, p.members_read = {}, self.now
        p.core, p.waiting, p.computed, p.chores = self._core(p), None, -1, None
        self._revote(p)
        self._heartbeat(p)
        self.at(self.now + self.heartbeat_s + 2 * self.sc.latency_s, lambda gen=p.gen: self._rejoin(p, gen))

    def _rejoin(self, p: VPeer, gen: int) -> None:
        if gen != p.gen or not p.alive:
            return
        own = max(p.applied, default=-1)
        want = p.core.resync(peer_core.Reason.JOIN, own + 1)
        offer, dead = self._newest_offer(p, None, after=want.lowest_round - 2)
        start = own + 1
        if offer is None and dead:  # its look found only donors out of reach: on from its own state
            p.busy_until = self.now + want.look_s
        if offer is not None:
            tail, hashes, applied, ledger, p.reputation, pools = offer
            self.made_up += tail[-1] in self.fakes and not p.lie
            start = tail[-1][0] + 1
            # replay the missed rounds (their updates, fetched from any holder) or download the state: a peer
            # with no history of its own, or whose newest round is not on the offer's chain, downloads
            missed = sum(len(fps) // FINGERPRINT_BYTES for k, fps in applied.items() if own < k < start) * \
                self.sc.update_bytes
            on_chain = own >= 0 and hashes.get(own) == p.hashes.get(own)
            how = sync_rules.replay_or_download(behind=start - (own + 1), window=self.sc.catchup_rounds,
                                                replay_bytes=missed, state_bytes=self.sc.state_bytes) \
                if on_chain else sync_rules.CatchUp.DOWNLOAD
            p.hashes, p.applied, p.ledger, p.senders = dict(hashes), dict(applied), dict(ledger), frozenset()
            p.pools = dict(pools)
            self._revote(p)
            p.busy_until = self.now + download_s(dead, want.look_s) + \
                self._transfer_s(None, p.id, missed if how is sync_rules.CatchUp.REPLAY else self.sc.state_bytes)
            if how is sync_rules.CatchUp.REPLAY:
                p.traffic.update_bytes_down += missed
            else:
                p.traffic.state_bytes_down += self.sc.state_bytes
            self.downloads += how is sync_rules.CatchUp.DOWNLOAD
            self.catchups += how is sync_rules.CatchUp.REPLAY
            self.far_states += start > self.sc.rounds and not p.lie  # past the run's end: only a liar offers one
            p.core.step(peer_core.StateAdopted(self.now, start - 1))
        self._publish_record(p)
        self._compute(p, start)

    # --- a peer's rounds ---------------------------------------------------------------------------

    def _compute(self, p: VPeer, r: int, may_abstain: bool = True) -> None:
        if r >= self.sc.rounds:  # the run is over: the pipeline drains (the last round is applied when decided)
            self.at(max(self.now, p.busy_until), lambda gen=p.gen: self._computed(p, r, gen, 0))
            return
        # whether the round is already too late for its fewest steps (peer_core.to_compute); the pace its records
        # say now (clock.CutTime reads it when made: here and when the compute starts)
        pace = self._pace(p)
        late = may_abstain and core.too_late(self.now, p.step_s, self.sc.min_steps, self._cut_at(p, r, False, pace))
        nxt = peer_core.to_compute(r, self.sc.rounds, late)
        if nxt.sat_out is not None:
            self._abstain(p, nxt.sat_out)
            self._compute(p, nxt.round, may_abstain=False)
            return
        t0 = max(self.now, p.busy_until) + self.sc.busy_s
        p.compute_from = {k: v for k, v in p.compute_from.items() if k >= r - 2}
        p.compute_from[r] = t0
        step_s = self.sc.compute_s * p.slowness * (1 + self.sc.spread * (2 * self.rng.random() - 1)) / self.sc.inner_steps
        self.at(t0, self._poll, p, r, t0, step_s, p.gen, pace)

    def _poll(self, p: VPeer, r: int, t0: float, step_s: float, gen: int, pace: float) -> None:
        """A computing peer reads its round's cut time (clock.RoundClock's watcher) and, with it, when its
        steps end: after the first step past ``min_steps`` whose successor would end after the cut time."""
        if gen != p.gen:
            return
        cut = self._cut_at(p, r, True, pace)
        boundary = math.ceil((self.now - t0) / step_s - 1e-9)  # the next step boundary, where it asks again
        steps = self.sc.inner_steps if cut is None else \
            min(self.sc.inner_steps, max(self.sc.min_steps, boundary, math.floor((cut - t0) / step_s)))
        end = t0 + steps * step_s
        if end <= self.now + POLL_S:
            self.at(end, self._computed, p, r, gen, steps, step_s)
        else:
            self.at(self.now + POLL_S, self._poll, p, r, t0, step_s, gen, pace)

    def _cut_at(self, p: VPeer, r: int, predict: bool, pace: float) -> float | None:
        """Round r's cut time from what p saw: the first sightings of its announcements and the trainers
        keeping up, at the round time ``pace`` (clock.CutTime; with ``predict``, from round r - 1's deadline
        before r's is known)."""

        def made_of(k: int) -> tuple[Any, ...]:
            # what a round's sightings and count are made of: its view (kept while its records stay: _view), its
            # core and the announcers seen (both only grow)
            c, seen = p.cores.get(k), p.announcers_of.get(k)
            return self._view(p, k), c, len(c.first_seen) if c else 0, len(seen) if seen else 0

        def seen(k: int) -> tuple[dict[str, float], int]:
            first = self._announced(p, k)
            v = self._view(p, k)
            return first, 1 + len(v.counted - (v.ahead - first.keys()))

        # the same cut time while what it is made of is the same: a computing peer asks at every poll
        key = (r, predict, pace, made_of(r), made_of(r - 1) if predict and r > 0 else None)
        got = p.cut
        if got is not None and _same(got[0], key):
            return got[1]
        window = core.window_s(self.sc.params, pace)
        previous = seen(r - 1) if predict and r > 0 else None
        cut = core.cut_at(*seen(r), window, pace, previous)
        p.cut = (key, cut)
        return cut

    def _abstain(self, p: VPeer, r: int) -> None:
        """p sits round r out: it says so at once (nobody waits for its report; a report it made before, on any chain,
        of it stands) and observes the round later."""
        p.abstained.add(r)
        self.abstained += not p.lie
        if r in p.reported:
            return
        sat_out = core.Report(p.id, "", abstain=True)
        self._broadcast(p, lambda q, now: self._deliver(q, r, core.ReportSeen(now, sat_out)))

    def _computed(self, p: VPeer, r: int, gen: int, steps: int, step_s: float = 0.0) -> None:
        if gen != p.gen:
            return
        if steps:
            p.steps[r], p.step_s = steps, step_s
            self.cut_short += steps < self.sc.inner_steps and not p.lie
            self._read_while_computing(p, r)
        if p.busy_until > self.now:  # its main loop is looking for a state offer: the round waits for it
            self.at(p.busy_until, lambda: self._computed(p, r, gen, 0))
            return
        p.computed = r
        self._advance(p)

    def _advance(self, p: VPeer) -> None:
        """Round ``p.computed`` is computed: apply the rounds before it as they are decided (one it sat out is
        observed first: its core opens once the round before is applied, on that round's hash), then
        announce it."""
        r, gen = p.computed, p.gen
        if r < 0:
            return
        for q in (r - 2, r - 1):
            if q < 0 or q in p.applied:
                continue
            c = p.cores.get(q)
            if c is None and q in p.abstained and (q - 1) in p.hashes:
                c = self._open(p, q, sender=False)
            if c is not None and c.phase is core.Phase.DECIDED:
                self._apply(p, q)
                if p.gen != gen:  # the hash check after it re-synced p: the pipeline starts again from there
                    return
                continue
            p.waiting = q  # not decided yet: announce once it is applied
            return
        self._next(p, r)

    def _continue(self, p: VPeer) -> None:
        """After an apply: on with the pipeline, once a state download (a failed look for an offer) is over."""
        if p.busy_until > self.now:
            self.at(p.busy_until, lambda gen=p.gen: gen == p.gen and self._advance(p))
        else:
            self._advance(p)

    def _next(self, p: VPeer, r: int) -> None:
        """Round r - 1 is applied: announce round r, or, at the end of the run, check the last round once the
        others reported it (the node waits up to 10 s; the finished peers keep serving, Peer._linger)."""
        if r < self.sc.rounds:
            self._announce(p, r)
        elif p.final_gen != p.gen:  # once per state: the drain and the last apply can both get here
            p.final_gen = p.gen
            self.at(self.now + FINAL_CHECK_S, lambda gen=p.gen: gen == p.gen and self._final_check(p, r - 1))

    def _final_check(self, p: VPeer, r: int) -> None:
        """The last round's hash check, then the linger (the peer core's ``Finished``)."""
        self._check(p, r, last=True)
        p.core.step(peer_core.Finished(self.now))
        self._linger(p, r, p.gen)

    def _linger(self, p: VPeer, r: int, gen: int) -> None:
        """A linger's poll, every peer_core.LINGER_POLL_S: what the peer core says, carried out."""
        if gen != p.gen:  # it re-synced: it runs its rounds again, and checks again at their end
            return
        self._read_members(p)
        rounds = {q: k for q, (k, training) in self._sight(p)[1].items() if training}
        act = p.core.step(peer_core.Lingering(self.now, max(p.hashes) + 1, peer_core.Chains(self._tails(p)), rounds))
        if isinstance(act, peer_core.Leave):
            p.done = True
            return
        if isinstance(act, peer_core.LookAgain):
            self._carry_out(p, r, act)
            if gen != p.gen:
                return
        self.at(self.now + peer_core.LINGER_POLL_S, lambda: self._linger(p, r, gen))

    # --- a round's exchange ----------------------------------------------------------------------

    def _announce(self, p: VPeer, r: int) -> None:
        self._split_or_heal(r)
        self._churn(r)
        if not p.alive:  # its own churn event killed it
            return
        drawn = self._committee(p, r)
        if not committee.announces(drawn, committee.base(r, p.hashes), p.id, self._roster(p)):  # its work waits, or is dropped
            self._read_members(p)
            self._open(p, r, sender=False)
            self._compute(p, r + 1)
            return
        digest = update_digest(p.id, r, p.hashes[r - 1])
        # a digest names one content: a round announced again on the same chain (after a re-sync) is the same
        # update to every reader, as its first announcement was
        self.content.setdefault(digest, self._content(p, r))
        self._read_members(p)
        self._open(p, r, sender=r not in p.abstained, digest=digest)  # a round sat out is never reported on
        p.traffic.records_written += 1
        p.traffic.hold(self.blob_cap)
        stamped, off = self.now + self.off[p.id], self.off
        deliver, post, fetch = self._deliver, self._post, self._fetch

        def seen(q: VPeer, now: float) -> None:
            # the DHT gives its age on the reader's clock from the announcer's stamp (clamped to 0..600 s)
            age = min(max(0.0, (now + off[q.id]) - stamped), 600.0)
            if r >= q.newest - 2:
                q.announcers_of[r].setdefault(p.id, now - age)
            if self.budget.drawn:  # the poll's reads of a committee's round are taken together (``_take``)
                deliver(q, r, core.Announced(now, p.id, now - age))
                self._taking.setdefault(r, []).append((p, digest))
                return
            # q's poll (now: its time) starts the fetch; a later poll takes it once it ended (exchange.py's reap)
            deliver(q, r, core.Announced(now, p.id, now - age), core.FetchStarted(self.now, p.id))
            end, via = fetch(p, q, r, digest)
            post(q, end, None, lambda q, now: self._fetched(q, r, p, digest, now, via))

        self._broadcast(p, seen)
        self._compute(p, r + 1)

    def _open(self, p: VPeer, r: int, sender: bool, digest: str = "") -> core.RoundCore:
        """Round r's core on p, on the hash p applied for r - 1: with its own update (``sender``) or as an
        observer of a round it sat out; what the records hold for r is read into it."""
        # the node's rule ('ledger'): the contributors of the last WITNESS_WINDOW rounds; 'live': the live
        # trainers when deciding starts (docs/notes/swarm.md, "Not done": the two differ in the simulator's results)
        eligible = frozenset(eligible_witnesses(p.ledger, r)) if self.sc.eligible == "ledger" else frozenset()
        drawn = self._committee(p, r)
        witness = committee.reports(p.id, drawn, sends=sender, observes=r in p.abstained)
        if drawn is not None and drawn.pool:  # its drawn witnesses, and none of the others
            eligible = drawn.witnesses
        c = core.RoundCore(self.sc.params, r, p.id, eligible, sender, p.hashes[r - 1], self._pace(p), self.now,
                           witness=witness, committee=drawn, witnessed=self._witnessed)
        p.cores[r] = c
        p.lists = {k: v for k, v in p.lists.items() if r - 2 <= k < r}  # not past it (a re-sync back)
        p.lists[r] = roster.lists(p.id, drawn, sender)
        if self.budget.drawn:
            self._revote(p)  # its recent committees changed: whose votes count (roster.sampled)
        p.newest = max(p.newest, r)
        self._act(p, c, c.step(core.Members(self.now, self._view(p, r))))
        if sender:
            self._act(p, c, c.own_update(self.now, digest))
        # what the DHT holds of the round, read at once: the node's first poll of a round reads it all and its core
        # takes it as one batch (agreement.poll); each record was once a decision of its own, a schedule no node has
        # (in the order they came, decided at the poll's time: the core reads an event's own time nowhere else)
        held = sorted(p.records_of.get(r, []), key=operator.attrgetter("now"))
        if held:
            self._act(p, c, c.steps([*held, core.Tick(self.now)]))
        for old in [k for k in p.records_of if k < r - 2]:
            del p.records_of[old]
            p.announcers_of.pop(old, None)
            p.reports_at.pop(old, None)
        for old in [k for k in p.views if k < r - 2]:
            del p.views[old]
        return c

    def _committee(self, p: VPeer, r: int) -> committee.Committee | None:
        """Round r's committee as p draws it: from the state after round r - LAG, its hash and its pool."""
        return committee.of_round(self.budget, r, p.hashes, p.pools)

    def _take(self, q: VPeer, r: int, read: list[tuple[VPeer, str]]) -> None:
        """The announcements of round r that one poll of q read: the fetches q starts (``committee.Fetches.take``,
        on the base the first announcer announced on, as q witnesses the round or not). A later poll takes
        each once it ended (exchange.py's reap)."""
        fetches, drawn = q.fetches.get(r), self._committee(q, r)
        if fetches is None:
            q.fetches = {k: v for k, v in q.fetches.items() if k >= r - 2}
            witness = committee.reports(q.id, drawn, sends=drawn is None or drawn.sends(q.id),
                                        observes=r in q.abstained)
            fetches = q.fetches[r] = committee.Fetches(committee.base(r, read[0][0].hashes), witness)
        digests = {p.id: (p, d) for p, d in read}
        for sender in fetches.take(drawn, [p.id for p, _ in read]):
            p, digest = digests[sender]
            self._deliver(q, r, core.FetchStarted(self.now, p.id))
            end, via = self._fetch(p, q, r, digest)
            self._post(q, end, None, lambda q, now, r=r, p=p, digest=digest, via=via:
                       self._fetched(q, r, p, digest, now, via))

    def _deliver(self, q: VPeer, r: int, *events: Any) -> None:
        """Events of round r reach q at its poll (``_read_mail``): kept with the round's records (its announcers:
        by ``_announce``), and taken by the round's core with whatever else the poll read."""
        if r >= q.newest - 2:
            q.records_of[r].extend(events)
        c = q.cores.get(r)
        if c is not None:
            got = self._batch.get(id(c))  # the core is alive while the poll is read: its id is its own
            if got is None:
                self._batch[id(c)] = (c, list(events))
            else:
                got[1].extend(events)

    def _act(self, p: VPeer, c: core.RoundCore, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, core.PublishReport):
                p.reported[c.round_] = frozenset(s for s, _ in a.pairs)
                if self.now - c.start >= self.sc.params.max_wait_s and not p.lie:
                    self.waited_out += 1  # it collected until max_wait_s: nobody it waited for came
                self._publish(p, c, a.pairs)
            elif isinstance(a, core.Wake):
                # the node polls its records while it waits: here at least every heartbeat (a record gone stale,
                # the other side of a split, changes what the round waits for)
                # one timer per core: a core of the round opened again (after a re-sync) has its own; keyed by the
                # peer's generation, the old core's pending tick took the new one's place and fired for nothing, and
                # the new core, waiting for time alone, never decided (a stall the simulator found)
                key, t = (p.id, c.round_, id(c)), max(min(a.at, self.now + self.heartbeat_s), self.now + 1e-3)
                if self._wakes.get(key, float("inf")) > t:
                    self._wakes[key] = t
                    self.at(t, self._tick, p, c, key, t)
            elif isinstance(a, core.AskWitnesses):
                self.at(self.now + 2 * self.sc.latency_s, self._answer, p, c, a.witnesses, self.now + a.wait_s)
            elif isinstance(a, core.Decided):
                self._read_while_deciding(p, c)
                if a.fps is None:
                    self.undecided += 1
                if a.how is core.HowDecided.MAX_WAIT and not p.lie:
                    self.waited_out += 1
                if p.waiting == c.round_ and c.round_ not in p.applied:
                    self._apply(p, c.round_)
                    self._continue(p)

    def _publish(self, p: VPeer, c: core.RoundCore, pairs: tuple[tuple[str, str], ...]) -> None:
        """Its report reaches every other peer; a liar's policy rewrites what each one gets."""
        honest, lie = pack(pairs), pack(x for x in pairs if x[0] == p.id)  # once: a report is N fingerprints
        told = {fps: core.Report(p.id, c.base, fps, digest=fps) for fps in (honest, lie)}

        def report(to: VPeer) -> core.Report:
            lied = p.lie == "censor" or p.lie == "equivocate" and _half(to.id, c.round_)
            return told[lie if lied else honest]

        if p.lie:
            p.told = {k: f for k, f in p.told.items() if k >= c.round_ - 2}
            p.told[c.round_] = report
        def seen(q: VPeer, now: float, r: int = c.round_) -> None:
            if r >= q.newest - 2:
                q.reports_at[r].setdefault(p.id, now)
            self._deliver(q, r, core.ReportSeen(now, report(q)))

        self._broadcast(p, seen)

    def _tick(self, p: VPeer, c: core.RoundCore, key: tuple[str, int, int], t: float) -> None:
        if self._wakes.get(key) == t:
            del self._wakes[key]
        if c.phase is not core.Phase.DECIDED and p.alive and p.cores.get(c.round_) is c:
            self._act(p, c, c.step(core.Members(self.now, self._view(p, c.round_))))

    def _answer(self, p: VPeer, c: core.RoundCore, witnesses: tuple[str, ...], deadline: float) -> None:
        """The witnesses p asked serve their reports of the round (Agreement.ask: a stream to each), a liar the one
        its policy tells p. The node's transport asks again a witness that served nothing (no report yet, its
        process dead, its link cut, a sybil key with no process) until the ask's deadline: an ask that did not
        hear from every witness at once ends at its deadline, with the reports they had by then."""
        got = self._served(p, c, witnesses)
        if len(got) == len(witnesses) or deadline <= self.now:
            self._asked(p, c, got)
        else:
            self.at(deadline, lambda: self._asked(p, c, self._served(p, c, witnesses)))

    def _served(self, p: VPeer, c: core.RoundCore, witnesses: tuple[str, ...]) -> list[core.Report]:
        r, got = c.round_, []
        for w in witnesses:
            q = self.peers.get(w)
            if q is None or not q.alive or not self._linked(p, q):
                continue
            held = q.cores.get(r)
            if held is not None and held.base == c.base and q.id in held.reports:
                got.append(q.told[r](p) if q.lie and r in q.told else held.reports[q.id])
        return got

    def _asked(self, p: VPeer, c: core.RoundCore, got: list[core.Report]) -> None:
        if c.phase is core.Phase.DECIDING and p.alive and p.cores.get(c.round_) is c:
            self._act(p, c, c.asked(self.now, got))

    def _apply(self, p: VPeer, r: int) -> None:
        c = p.cores[r]
        p.traffic.read("reports", len(c.reports), sizes.report(len(c.first_seen)))  # the second count reads them again
        p.traffic.applied_one(self.now)
        settled = c.settle()
        if self.sc.rule == "leader":  # the rule before witnesses: the first counted report in id order stands
            counted = c._counted()
            settled = (counted[0].fps, 1) if counted else None
        fps = settled[0] if settled else b""
        p.applied[r] = fps
        # the senders of the set, known from the round's signed announcements (a peer fetches
        # what it applies: an update it never verified is in its ledger all the same)
        pairs = self._resolve(r, c.base, fps)
        p.sets[r] = frozenset(s for s, _ in pairs)
        # an update of the set it never verified it fetches now (the aggregate needs it): its bytes count too
        p.traffic.update_bytes_down += len(p.sets[r] - c.verified.keys() - {p.id}) * self.sc.update_bytes
        p.senders = p.sets[r]
        p.roster.observe(c.committee, c.base, c.newcomers)
        self._note_workers(p, c, r)
        p.counted[r] = self._aggregate(p, r, c.base, fps, pairs)
        # contributors: the senders whose updates counted (the robust rule gives a screened-out one weight 0)
        p.ledger = {q: k for q, k in {**p.ledger, **dict.fromkeys(p.counted[r], r)}.items() if k > r - CONTRIBUTOR_ROUNDS}
        if self.budget.drawn:  # the pool the committee of round r + LAG is drawn from
            p.pools = {k: v for k, v in p.pools.items() if k > r - 2 * committee.LAG}
            p.pools[r] = frozenset(p.ledger)
        p.hashes[r] = hashlib.sha256(p.hashes[r - 1].encode() + fps).hexdigest()[:16]
        self._revote(p)
        # one chain per side while the network is split: both sides train on, by design (the heal merges them
        # onto the chain rule's winner); what must never differ is the set two peers of one side apply
        key = (r, c.base, self.group[p.id] if self.group is not None else -1)
        first = self.decided.setdefault(key, fps) if not p.lie else fps  # a liar's own decisions prove nothing
        if first != fps:
            self.violations.append({"round": r, "peer": p.id, "chain": c.base,
                                    "updates": [len(first) // 16, len(fps) // 16]})
            self.per_round[r]["violations"] += 1
            self.last_violation = max(self.last_violation, r)
        p.waiting = None
        self.per_round[r]["applied"] += 1
        self._publish_record(p, ((r, p.hashes[r]),))
        if r + 1 not in p.abstained:  # a round sat out is observed next: the node hands off once after both
            self._check(p, r - 1)

    def _check(self, p: VPeer, r: int, last: bool = False) -> None:
        """After applying round r + 1 (or at the end, ``last``): round r's hash check, stepped through the peer
        core. The previous round's check is settled first, then this one is handed over (``_hand_off``) and read
        (``_read_check``): p acts on it after its next round is applied, or at once after the last
        (``peer_core.settle_at_once``). A look for a state holds the hand-off until it ended."""
        if last:
            self._settle_check(p, r, replace(self._read_check(p, r), check=peer_core.Check.LAST))
            return
        pending, p.chores, gen = p.chores, None, p.gen
        if pending is not None:
            self._settle_check(p, pending.round, pending)
        if p.gen != gen:  # it re-synced now: the round just checked is on weights replaced since
            return
        if p.busy_until > self.now:  # a look for a state holds the main loop: the hand-off comes after it
            self.at(p.busy_until, lambda: self._hand_off(p, r, gen))
        else:
            self._hand_off(p, r, gen)

    def _hand_off(self, p: VPeer, r: int, gen: int) -> None:
        """The chores of round r's check are handed over and read now; settled at the next hand-off, or at once
        after the run's last round."""
        if gen != p.gen or not p.alive:
            return
        found = self._read_check(p, r)
        if peer_core.settle_at_once(r + 1, self.sc.rounds):
            self._settle_check(p, r, found)
        else:
            p.chores = found

    def _read_check(self, p: VPeer, r: int) -> peer_core.HashChecked:
        """What the chores read of round r: the voting weight reports, p's hash, and the chains in its sight."""
        counts_for, among = self._votes(p), self._weighers(p, r)
        reported = p.weights.get(r, {})  # the DHT returns every record under the key, a witness's or not
        p.traffic.read("weights", len(reported), sizes.weights(len(p.sets.get(r, ()))))
        votes = {q: h for q, h in reported.items() if (among is None or q in among) and counts_for(q)} \
            if r >= 0 else {}
        return peer_core.HashChecked(self.now, r, max(p.hashes) + 1, p.hashes.get(r), votes,
                                     peer_core.Chains(self._tails(p)))

    def _settle_check(self, p: VPeer, r: int, found: peer_core.HashChecked) -> None:
        """The peer core's answer to a hash check, read at the hand-off and acted on now (p's engine round now)."""
        self._carry_out(p, r, p.core.step(replace(found, now=self.now, engine_round=max(p.hashes) + 1)))

    def _carry_out(self, p: VPeer, r: int, act: peer_core.Action) -> None:
        """A look again reads the records afresh (Peer._follow_winning_chain); a ``Resync`` looks for a state."""
        if isinstance(act, peer_core.LookAgain):
            act = p.core.step(peer_core.ChainsLooked(self.now, max(p.hashes) + 1, peer_core.Chains(self._tails(p))))
        if isinstance(act, peer_core.Resync):
            self._resync(p, r, act)


def _same(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> bool:
    """Two keys of kept results are the same: numbers equal, everything else the very same object."""
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(x is y or (type(x) in (int, float, bool) and x == y) or
                                    (type(x) is tuple and type(y) is tuple and _same(x, y)) for x, y in zip(a, b))


def _half(peer: str, round_: int) -> bool:
    """Which half of the peers an equivocator lies to in a round (fixed by the names: no randomness drawn)."""
    return hashlib.sha256(f"{peer}/{round_}".encode()).digest()[0] & 1 == 1


def run(sc: Scenario) -> dict[str, Any]:
    return Simulation(sc).run()

