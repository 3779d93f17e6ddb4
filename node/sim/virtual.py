"""`gradnode simulate --virtual`: the round protocol's real core (protocol/round.py) for many peers on one
virtual clock, from a seed. No torch, no sockets, no threads: the same seed gives the same run.

What is modelled, and how:
- A peer computes a round as ``inner_steps`` steps of a time drawn from its speed (``Scenario.slow``: a
  straggler's factor), then announces its update (a digest) and starts the next round's compute at once;
  the announced round's exchange runs meanwhile, and just before the next announcement the peer counts the
  round's reports again (``RoundCore.settle``) and applies it. This is the node's pipeline
  (node/swarm/peer.py). While it computes, the peer reads the announcements every ``POLL_S`` and cuts its
  steps short at the round's cut time (``round.cut_at``, as node/swarm/clock.py: a slow peer runs fewer steps);
  a peer whose cut time for a round is nearer than its fewest steps sits it out (``peer_core.to_compute``:
  an abstaining report at once, its compute for the next round, and the round it sat out observed and
  applied as the others decided it).
- The DHT and the streams are one delay per delivery: every record a peer writes reaches each other peer
  ``latency + jitter`` later, and with probability ``late_p`` much later (``late_s``: the DHT hid a stored
  record from one reader for a while, as the real one does); a key's newest value wins (a late copy of an
  older record changes nothing). A peer reads what reached it at its polls (every ``round.POLL_S``, at a
  phase of its own): records, announcements, reports and its fetches' ends, in the order they came, and
  each of its round cores takes one poll's events as one batch, as agreement.Agreement feeds the same core (a
  split between reader and writer at the poll loses what came, a clogged link holds it). The poll that reads
  an announcement starts the update's fetch, and the first poll after it ended (``update_bytes / bandwidth``
  after the link's latency) verifies it (exchange.RoundExchange starts and reaps its fetches so). A reader keeps
  what reached it (a round re-opened after a re-sync reads the same records again).
- Member records: every peer publishes the tail of its chain after each round and every heartbeat
  (``min(10 s, record_ttl_s / 3)``); a peer's view of the swarm (``core.View``: who is live, present, two
  rounds ahead) is the records it saw within ``record_ttl_s``, re-read at least every heartbeat while a
  round waits (the node polls them). A record also claims its writer's round time (its last round's seconds
  a step times ``inner_steps``: a member record's step_seconds): a peer paces a round (its deadline window, its
  cut time) on the lower median of the claims in its sight of the last round's senders, its own time before
  it applied one (``round.pace``, as Clock.round_seconds), read when it sets out to compute the round and when
  its core opens. Nobody is handed the swarm's true pace.
- A partition (``Scenario.partition``) cuts every delivery between its groups from the first announcement
  of round ``partition_at`` to the first of ``heal_at``: records in flight are lost, the other side's
  records go stale, and each side trains on as its own swarm.
- A peer's weights are a hash chain: the hash of round r is the hash of round r - 1 and the set applied.
  After applying round r a peer publishes that hash, with its member record. After applying the next it reads
  the reports of r and the tails in its sight, and after applying the one after, its peer core decides
  (protocol/peer.py, the node's own rules between rounds: stay, re-sync, or follow the winning chain); after
  the run's last round it decides at once (``peer_core.settle_at_once``). A re-sync adopts the newest state a peer offers
  that the core's ``Resync`` allows, after a download time. It knows a donor by its record only: one whose
  process died or whose link is cut costs a stream's open timeout (``OPEN_S``), and with no donor of the
  newest state in reach the download retries until it gives up and the peer looks again.

Adversaries (``Scenario.liars``): a real core whose outputs a policy rewrites, never a mock.
- ``censor``: its report lists only its own update (the 'lowid' attacker of the process tests: a witness
  that keeps every other update out).
- ``equivocate``: two reports for each round, the honest one to half the peers and one listing only its
  own update to the other half (the worst case for the rule: nobody holds both, so nobody can prove it).
- ``withhold``: announces its update and never serves it (every fetch of it ends without the bytes).
- ``signflip``, ``noise``, ``freerider``: an honest witness whose update does not help (robust learning's swarm
  attacks). Every update carries a vector (``DIM`` floats: an honest one is the round's true direction plus
  noise, scaled by the share of its steps it ran, the direction drifting from round to round; these send it
  negated, a random vector of its norm, or an update of another peer that their chain applied the round
  before, from round ``Scenario.lies_from`` on), and every peer applies a decided set through
  the robust rule's screens (protocol/screening.py: the node's code, run on the vectors' exact Gram matrix)
  and the reputation table, shared state like the ledger: a screened-out sender is no contributor.
  ``Scenario.aggregation = "mean"`` counts every update in the set (the rule before the screens).
- ``futurestate``: an honest witness and update whose member records list, after its chain's tail, a state
  ``FUTURE_ROUNDS`` past its newest under a hash of its making, and offer that state (the chain rule groups it
  with the honest chain: the tails agree on every round they share). A peer looking for a state refuses an offer
  claiming a round more than ``sync.RECORD_LAG`` past every other voting trainer's record (protocol/sync.py
  ``beyond_reach``, as node/swarm/statesync.py), and adopts only a state more than half of the winners' tails list
  (``chain.adoptable``); one that takes a made-up state counts in ``made_up``, and in ``far_states`` when it lies
  past the run's end. The node's 'futurestate' lists the claimed state alone, a chain of one the rule refuses anyway.
- ``stretch``: an honest witness and update whose member records claim an hour a round (``PACE_LIE_S``), and
  ``Scenario.sybil_pace_s``: the sybil keys' records claim that many seconds. ``Scenario.pace = "everyone"``
  paces on every record in sight instead of the last round's senders' (the rule an attacker would want).
``Scenario.rule`` picks the decision: ``witnesses`` (the core: what a strict majority of the counted reports
lists) or ``leader`` (the rule before witnesses: the lowest-id witness's report is the round's set), so that
a test shows an attack succeeding without the defence and failing with it.

Safety, checked after every applied round: every honest peer that applied round r on the same chain (the
same hash of r - 1), on the same side of a split, applied the same set (else a *violation*: two honest peers
decided apart; the two sides of a split train on apart by design, and the heal merges them).
Censorship, counted at the end: an honest update that every honest peer verified before it reported, yet
left out of an honest peer's decided set (``kept_out``). Liveness (``rounds_to_converge``): the rounds it
takes after a violation until every honest peer holds one hash, or with a partition, after its heal
(the newest round a peer adopted a state of, past ``heal_at``); None when the run ends on two hashes.
"""

from __future__ import annotations

import gc
import hashlib
import heapq
import math
import operator
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, NamedTuple

from gradnode.node.sim import sizes, traffic
from gradnode.node.sim.scenario import Scenario
from gradnode.protocol import committee
from gradnode.protocol import chain
from gradnode.protocol import peer as peer_core
from gradnode.protocol import round as core
from gradnode.protocol import sync as sync_rules
from gradnode.protocol import votes
from gradnode.protocol.gossip import CopyBudget, copy_window_s
from gradnode.protocol.records import FINGERPRINT_BYTES, pack, resolve
from gradnode.protocol.reputation import Reputation
from gradnode.protocol.screening import Screen, judge
from gradnode.protocol.votes import CONTRIBUTOR_ROUNDS
from gradnode.protocol.witness import Counts, eligible_witnesses

TAIL = 4  # rounds of its chain a peer publishes (protocol/chain.py)
FINAL_CHECK_S = 10.0  # after its last round a peer checks that round's hash against the others' this much later
OFFER_POLL_S = 0.5  # how often a peer looking for a state offer reads the offers again (statesync.fetch)
OPEN_S = 5.0  # a stream to a donor whose process died or whose link is cut fails after this (transport._OPEN_S)
PACE_LIE_S = 3600.0  # the round time a 'stretch' liar's records claim
FUTURE_ROUNDS = 10**6  # how far past its newest round a 'futurestate' liar's records claim a state (adversary.py)
DIM = 64  # an update's content: a vector this long (protocol/screening.py judges it, as it judges tensors)
NOISE = 1.0  # an honest update: the round's true direction (unit) plus noise of this norm (cosines ~0.5)
DRIFT = 0.8  # the cosine of one round's true direction to the last's (the loss surface changes slowly)
RETRY_S = 1.0  # a lost transfer is noticed and retried this much later (the transport's timeout and retry)
POLLS_PER_S = 1 / core.POLL_S  # a peer's polls of the DHT a second (it reads what reached it at each, _read_mail)
POLL_S = 0.5  # how often a computing peer reads the announcements for its cut time (clock.RoundClock.POLL_S)
MEMBERS_READ_S = 0.5  # how often a running peer reads the member records (Membership.members: max_age)
BLOB_BUDGET = 1 << 30  # the bytes of blobs a peer holds, oldest evicted first (transport.Transport's blob_budget)


class _Offer(NamedTuple):
    """A state offer as protocol/sync.py reads it: who offers the state after which round, its hash; and the
    state itself (tail, hashes, applied sets, contributors ledger)."""

    peer: str
    round: int
    param_hash: str
    state: Any


@dataclass
class VPeer:
    id: str
    slowness: float
    lie: str = ""  # its policy ('' honest)
    hashes: dict[int, str] = field(default_factory=lambda: {-1: committee.GENESIS})
    applied: dict[int, bytes] = field(default_factory=dict)
    cores: dict[int, core.RoundCore] = field(default_factory=dict)
    newest: int = -1  # max(cores): the newest round it opened
    # what the DHT holds for it, by round: every round event delivered to it, replayed into a round's core when
    # the round opens (a round re-opened after a re-sync reads the same records again: the DHT still holds them)
    records_of: dict[int, list[Any]] = field(default_factory=lambda: defaultdict(list))
    # the announcers among them, by round: each one's first sighting (the first Announced of it in records_of)
    announcers_of: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    reports_at: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))  # r -> witness -> came
    weights: dict[int, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))  # r -> peer -> hash
    # when the newest record (peer) and weight report ((peer, round)) it holds of each writer were written
    stamps: dict[Any, float] = field(default_factory=dict)
    # what reached it and waits for its next poll, by poll: (time, seq, writer or None, deliver) (_read_mail)
    mail: dict[int, list[tuple[float, int, Any, Callable[..., None]]]] = field(default_factory=dict)
    waiting: int | None = None  # the round it must apply before announcing the next one
    computed: int = -1  # newest round computed and not yet announced
    resyncs: int = 0
    busy_until: float = 0.0  # a re-sync's download
    gen: int = 0  # bumped by a re-sync: the compute in flight is of a round given up
    reported: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the senders its report listed
    sets: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the senders of the set it applied
    # q -> (when seen, its tail, the state it offers: its hashes and applied sets up to its newest round, the
    # round time it claims)
    records: dict[str, tuple[float, tuple[chain.Link, ...], Any, float]] = field(default_factory=dict)
    held: int = 0  # changes to ``records`` so far (Simulation._sight keeps what it read of them until the next)
    sight: Any = None  # Simulation._sight's last reading: (held, when a record of it expires, tails, rounds)
    views: dict[int, Any] = field(default_factory=dict)  # round -> the last view of it made (Simulation._view)
    offer: Any = None  # the state it offers now (one snapshot shared by its readers), rebuilt when it changes
    core: peer_core.PeerCore | None = None  # its rules between rounds (protocol/peer.py), made by Simulation
    # the hash check handed to the chores thread at the last apply, settled at the next
    chores: peer_core.HashChecked | None = None
    done: bool = False  # its last round is applied and checked: it stops its heartbeat
    final_gen: int = -1  # the state (gen) whose last round's check is scheduled
    alive: bool = True  # its process runs (churn: killed, stopped, or not joined yet)
    step_s: float = 0.0  # its seconds per inner step, measured in its last round (0 before it computed one)
    steps: dict[int, int] = field(default_factory=dict)  # round -> inner steps it ran for it
    abstained: set[int] = field(default_factory=set)  # rounds it sat out (too slow for their deadline)
    ledger: dict[str, int] = field(default_factory=dict)  # contributors: sender -> last round applied (shared state)
    pools: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> its ledger's keys (shared state)
    fetches: dict[int, committee.Fetches] = field(default_factory=dict)  # round -> which updates it fetches
    workers: dict[str, int] = field(default_factory=dict)  # sender -> newest round it verified and screened (memory)
    voters: frozenset[str] | None = None  # whose votes count (Simulation._revote); None: everyone's
    senders: frozenset[str] = frozenset()  # the senders of the last round it applied (whose records set the pace)
    counted: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the senders the aggregate counted
    reasons: dict[int, dict[str, str]] = field(default_factory=dict)  # round -> sender -> why the screens left it out
    reputation: Reputation = field(default_factory=Reputation)  # the robust rule's table (shared state)
    incarnation: int = 0  # bumped when its process dies or starts (its heartbeat belongs to one)
    # a liar's report of a round as it tells each reader (``Simulation._publish``): what it serves when asked too
    told: dict[int, Callable[["VPeer"], core.Report]] = field(default_factory=dict)
    traffic: traffic.Counters = field(default_factory=traffic.Counters)  # what it moved (``Simulation._fetch``)
    compute_from: dict[int, float] = field(default_factory=dict)  # round -> when its compute of it began
    members_read: float = 0.0  # the member records read up to this time (``Simulation._read_members``)
    holdings_at: tuple[int, float] = (-1, -1.0)  # (round, poll) of its last holdings write
    holdings_read: tuple[int, float] = (-1, -1.0)  # and of its last holdings read

    def tail(self) -> tuple[chain.Link, ...]:
        return tuple((k, self.hashes[k]) for k in sorted(self.hashes)[-TAIL:] if k >= 0)


class Simulation:
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
        self.holding_writers: dict[int, int] = defaultdict(int)  # round -> peers that listed what they hold
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

    # --- the network -------------------------------------------------------------------------------

    def _delay(self, a: str | None = None, b: str | None = None) -> float:
        """A record's way from peer a to peer b (the DHT: their links' latency, jitter, and now and then late)."""
        d = self._latency(a, b) + self.rng.random() * self.sc.jitter_s
        if self.rng.random() < self.sc.late_p:
            d += self.rng.random() * self.sc.late_s
        return d

    def _latency(self, a: str | None, b: str | None) -> float:
        return (self.lat[a] + self.lat[b]) / 2 if a in self.lat and b in self.lat else self.sc.latency_s

    def _transfer_s(self, a: str | None, b: str, size: int) -> float:
        """How long ``size`` bytes take from a to b (a None: from any donor, at b's own link): the slower link's
        bandwidth after their latency, again after RETRY_S for each attempt lost (``loss_p``)."""
        once = size * 8 / min(self.bw.get(a, math.inf), self.bw[b])
        t = self._latency(a, b) + once
        while self.sc.loss_p and self.loss.random() < self.sc.loss_p:
            t += RETRY_S + once
        return t

    def _linked(self, a: VPeer, b: VPeer) -> bool:
        return (self.group is None or self.group[a.id] == self.group[b.id]) and frozenset((a.id, b.id)) not in self.clogged

    def _broadcast(self, src: VPeer, deliver: Callable[[VPeer, float], None]) -> None:
        """Every other peer gets it after a delay, at its first poll since (``_post``)."""
        # _delay's draws and _post, inlined: N - 1 of them per record, the simulator's busiest loop
        random, jitter, late_p, late_s = self.rng.random, self.sc.jitter_s, self.sc.late_p, self.sc.late_s
        ceil, at, read, seq, poll_s = math.ceil, self.at, self._read_mail, self._seq, core.POLL_S
        base = self.now + self.lat[src.id] / 2  # every peer has a link (_latency)
        for q, half, phase in self._reach:
            if q is not src:
                t = base + half + random() * jitter
                if random() < late_p:
                    t += random() * late_s
                k = ceil((t - phase) * POLLS_PER_S)
                if phase + k * poll_s < t:  # rounding: never read before it arrives
                    k += 1
                seq += 1
                box = q.mail.get(k)
                if box is None:
                    q.mail[k] = [(t, seq, src, deliver)]
                    at(phase + k * poll_s, read, q, k)
                else:
                    box.append((t, seq, src, deliver))
        self._seq = seq

    def _post(self, q: VPeer, t: float, src: VPeer | None, deliver: Callable[[VPeer, float], None]) -> None:
        """What reaches q at time t (from ``src``; None: a transfer of its own, which no split or clog stops
        once begun) is read at q's first poll since: q reads the DHT and its streams every ``round.POLL_S``, at a
        phase of its own, and takes what came since its last poll in the order it came (``_read_mail``)."""
        phase = self._phase[q.id]
        k = math.ceil((t - phase) * POLLS_PER_S)
        if phase + k * core.POLL_S < t:  # rounding: never read before it arrives
            k += 1
        self._seq += 1
        box = q.mail.get(k)
        if box is None:
            q.mail[k] = [(t, self._seq, src, deliver)]
            self.at(phase + k * core.POLL_S, self._read_mail, q, k)
        else:
            box.append((t, self._seq, src, deliver))

    def _read_mail(self, q: VPeer, k: int) -> None:
        """q's poll ``k``: what reached it since the last one, delivered as it came (a split between q and its
        writer now: lost; their link clogged now: held until it unclogs), then each round core that got events
        takes them as one batch and decides once, at the poll's time (the node's agreement reads the DHT every
        round.POLL_S and feeds its core one poll at a time)."""
        box = q.mail.pop(k, None)
        if box is None or not q.alive:
            return
        batches: dict[int, tuple[core.RoundCore, list[Any]]] = {}
        self._batch = batches
        group, clogged = self.group, self.clogged
        box.sort()  # (time, seq, ...): seq is unique, so the callables are never compared
        for t, _, src, deliver in box:
            if src is not None:
                if group is not None and group[src.id] != group[q.id]:
                    continue
                if clogged:
                    link = frozenset((src.id, q.id))
                    if link in clogged:
                        self.held[link].append((q, src, deliver))
                        continue
            deliver(q, t)
        self._batch = None
        for c, events in batches.values():
            if q.alive and q.cores.get(c.round_) is c:
                self._act(q, c, c.steps([*events, core.Tick(self.now)]))

    def _swizzle(self) -> None:
        """Clog a random half of the links one by one, then unclog them one by one in another order."""
        self.swizzled = True
        rng = random.Random(f"{self.sc.seed}/swizzle")
        names = sorted(self.peers)
        links = [frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1:] if rng.random() < 0.5]
        rng.shuffle(links)
        step = self.sc.swizzle_s
        for i, link in enumerate(links):
            self.at(self.now + i * step, lambda link=link: self.clogged.add(link))
        rng.shuffle(links)
        start = self.now + len(links) * step
        for i, link in enumerate(links):
            self.at(start + i * step, lambda link=link: self._unclog(link))
        self.unclogged_at = start + max(0, len(links) - 1) * step

    def _unclog(self, link: frozenset[str]) -> None:
        self.clogged.discard(link)
        if self.now >= self.unclogged_at:
            self.unclog_round = max(p.newest for p in self.peers.values())
        for q, src, deliver in self.held.pop(link, []):
            self._post(q, self.now + self._delay(src.id, q.id), src, deliver)

    def _split_or_heal(self, r: int) -> None:
        """The split falls at the first announcement of round ``partition_at`` and heals at the first of ``heal_at``
        (or ``heal_after_s`` after it fell)."""
        if self.sc.partition and self.group is None and not self.healed and r >= self.sc.partition_at:
            self.group = {f"p{i:04d}": n for n, g in enumerate(self.sc.partition) for i in g}
            others = [i for i in range(self.sc.peers) if f"p{i:04d}" not in self.group]
            self.group.update({f"p{i:04d}": 0 for i in others})  # peers in no group stay with the first
            if self.sc.heal_after_s >= 0:
                self.at(self.now + self.sc.heal_after_s, self._heal)
        elif self.group is not None and 0 <= self.sc.heal_at <= r:
            self.group, self.healed = None, True
        if 0 <= self.sc.swizzle_at <= r and not self.swizzled:
            self._swizzle()

    def _heal(self) -> None:
        self.group, self.healed = None, True
        self.healed_round = max((p.newest for p in self.peers.values()), default=0)

    def _publish_record(self, p: VPeer, hashes: tuple[tuple[int, str], ...] = ()) -> None:
        """Its member record (its chain's tail) and its state offer reach the others, with its weight reports of
        the rounds ``hashes`` names (round, hash) after an apply or an adoption (one write of the node's chores
        thread: the weight report, the state offer, the member record); it holds them itself."""
        tail, chain_ = p.tail(), dict(p.hashes)
        if p.lie == "futurestate" and tail and tail[-1][0] >= self.sc.lies_from:  # a state far ahead, claimed
            far = tail[-1][0] + FUTURE_ROUNDS
            chain_[far] = _digest(p.id, far, tail[-1][1])[:16]
            tail += ((far, chain_[far]),)
            self.fakes.add(tail[-1])
        if p.offer is None or p.offer[0] != tail:
            p.offer = (tail, chain_, dict(p.applied), dict(p.ledger), p.reputation, dict(p.pools))
        record = (tail, p.offer, PACE_LIE_S if p.lie == "stretch" else p.step_s * self.sc.inner_steps)
        self._read_members(p)
        p.records[p.id] = (self.now, *record)
        p.held += 1
        p.traffic.records_written += 1 + 2 * bool(hashes)  # with a weight report and a state offer
        for k, h in hashes:
            p.weights[k][p.id] = h

        sent = self.now

        def deliver(q: VPeer, now: float) -> None:
            stamps = q.stamps  # _newest inlined for the record (one per record and reader)
            if stamps.get(p.id, -1.0) < sent:
                stamps[p.id] = sent
                q.records[p.id] = (now, *record)
                q.held += 1
            for k, h in hashes:
                if _newest(q, (p.id, k), sent):
                    q.weights[k][p.id] = h

        self._broadcast(p, deliver)

    def _heartbeat(self, p: VPeer, incarnation: int | None = None) -> None:
        if p.done or not p.alive or (incarnation is not None and incarnation != p.incarnation):
            return
        self._publish_record(p)
        self.at(self.now + self.heartbeat_s, lambda i=p.incarnation: self._heartbeat(p, i))

    def _sybil_beat(self) -> None:
        """The sybil keys' heartbeat: member records on a chain of made-up hashes at the swarm's newest round (or
        ``sybils_ahead`` rounds past it), and weight reports of those hashes, to every live peer (records and
        reports only: they run no core)."""
        newest = max((max(p.hashes) for p in self.peers.values() if p.alive and not p.lie), default=-1)
        if newest < 0 and self.now > 0 and all(p.done for p in self.peers.values()):
            return
        top = newest + self.sc.sybils_ahead
        tail = tuple((k, f"sybil{k}") for k in range(max(0, top - TAIL + 1), top + 1))
        for i in range(self.sc.sybils):
            sid = f"s{i:04d}"
            for q in self.peers.values():
                def deliver(q: VPeer = q, sid: str = sid) -> None:
                    if q.alive:
                        q.records[sid] = (self.now, tail, None, self.sc.sybil_pace_s)  # no state offered
                        q.held += 1
                        for k, h in tail:
                            q.weights[k][sid] = h
                self.at(self.now + self._delay(), deliver)
        if not all(p.done or not p.alive for p in self.peers.values()):
            self.at(self.now + self.heartbeat_s, self._sybil_beat)

    def _churn(self, r: int) -> None:
        """Fire the churn of rounds up to ``r`` (at the first announcement of round r)."""
        while self.life and self.life[0][0] <= r:
            _, _, action, peer = self.life.pop(0)
            p = self.peers[peer]
            if action in ("kill", "stop") and p.alive:
                p.alive, p.gen, p.incarnation, p.mail = False, p.gen + 1, p.incarnation + 1, {}  # in flight: lost
                if action == "stop":  # its departure reaches the others: nobody waits for it from then on
                    def gone(q: VPeer, now: float, sent: float = self.now) -> None:
                        if _newest(q, p.id, sent):
                            q.records.pop(p.id, None)
                            q.held += 1

                    self._broadcast(p, gone)
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
        p.records, p.cores, p.newest, p.offer, p.held, p.views = {}, {}, -1, None, p.held + 1, {}
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
            p.busy_until = self.now + _download_s(dead, want.look_s) + \
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

    def _fresh(self, p: VPeer, q: str, seen: float) -> bool:
        """q's record, which reached p at ``seen``, has not expired on p's clock: it expires ``record_ttl_s``
        after q wrote it, on q's clock (a writer whose clock is behind writes records that expire early)."""
        return self.now - seen < self.sc.record_ttl_s + self.off.get(q, 0.0) - self.off[p.id]

    def _votes(self, p: VPeer) -> Callable[[str], bool]:
        """Whose chain and weight reports count for p (Membership.votes): ``VPeer.voters``; everyone's before it
        applied a round, or under ``votes='everyone'``."""
        return _everyone if p.voters is None else p.voters.__contains__

    def _revote(self, p: VPeer) -> None:
        """p's voters anew, after its ledger or the senders it verified changed (protocol/votes.py; ``votes``:
        'ledger', the ledger alone; 'everyone': None)."""
        if self.sc.votes == "everyone" or not p.ledger:
            p.voters = None
        elif self.sc.votes == "ledger":
            p.voters = frozenset(p.ledger)
        else:
            p.voters = votes.voters(p.ledger, p.workers, max(p.hashes), p.reputation.banned())

    def _tails(self, p: VPeer, with_me: bool = True, voting: bool = True) -> dict[str, tuple[chain.Link, ...]]:
        """The tails of the member records in p's sight (seen within the records' ttl), its own included; with
        ``voting``, only those of keys whose vote counts (``_votes``)."""
        out = self._sight(p)[0]
        if voting and p.voters is not None:
            out = {q: t for q, t in out.items() if q in p.voters}
        elif with_me:
            out = dict(out)
        if with_me:
            out[p.id] = p.tail()
        return out

    def _sight(self, p: VPeer) -> tuple[dict[str, tuple[chain.Link, ...]], dict[str, tuple[int, bool]]]:
        """The other peers' member records in p's sight: their tails, and what round.view_of reads of them (the
        round after the last each tail names, training). Kept while p receives no record and none of them
        expires (``VPeer.held``: its records' count of changes): every poll of every peer reads them, and most
        polls come between two changes."""
        got = p.sight
        if got is not None and got[0] == p.held and self.now < got[1]:
            return got[2], got[3]
        # _fresh inlined (the same sums): a record expires record_ttl_s after it was written, on its writer's clock
        now, ttl, off, me = self.now, self.sc.record_ttl_s, self.off, p.id
        mine = off[me]
        tails, expires = {}, math.inf
        for q, (seen, t, _, _) in p.records.items():
            life = ttl + off.get(q, 0.0) - mine
            if now - seen < life and q != me:
                tails[q] = t
                if seen + life < expires:
                    expires = seen + life
        rounds = {q: (t[-1][0] + 1 if t else 0, True) for q, t in tails.items()}
        # kept until a nanosecond before the first expiry: the test above is a difference, the expiry a sum
        p.sight = (p.held, expires - 1e-9, tails, rounds)
        return tails, rounds

    def _pace(self, p: VPeer) -> float:
        """p's round time (``round.pace``, which Clock.round_seconds reads too): the lower median of the round
        times that the member records in its sight claim, of the last round's senders (of every record in sight
        under ``pace='everyone'``), its own time counted as it measured it; before it applied a round, its own
        time (``min_deadline_s`` before it computed one)."""
        own = p.step_s * self.sc.inner_steps
        records, sight = p.records, self._sight(p)[0]
        everyone = self.sc.pace == "everyone"
        claims = {q: records[q][3] for q in (sight if everyone else p.senders) if q in sight}
        claims[p.id] = own
        return core.pace(claims, claims.keys() if everyone else p.senders, own or self.sc.params.min_deadline_s)

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

        def seen(k: int) -> tuple[dict[str, float], int]:
            first = self._announced(p, k)
            v = self._view(p, k)
            return first, 1 + len(v.counted - (v.ahead - first.keys()))

        window = core.window_s(self.sc.params, pace)
        previous = seen(r - 1) if predict and r > 0 else None
        return core.cut_at(*seen(r), window, pace, previous)

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

    # --- what a peer reads ------------------------------------------------------------------------
    # A peer reads the DHT by polling, and a read of a key returns every value under it. These count its reads,
    # each returning what had reached the reader by then: the member records every MEMBERS_READ_S plus a read;
    # while its inner steps of a round run, that round's announcements every POLL_S plus a read (the round
    # clock's watcher); while it decides one, its announcements and reports every round.POLL_S plus two reads
    # (the agreement's poll), and the reports once more when it settles; a round's weight reports at its hash
    # check; the round's holdings at each poll that starts a fetch (``_fetch``).

    def _read_members(self, p: VPeer) -> None:
        """The member records p read since the last count: its sight's records, every MEMBERS_READ_S."""
        if p.alive:
            every = MEMBERS_READ_S + self.sc.dht_read_s
            p.traffic.read("members", (1 + len(self._sight(p)[0])) * (self.now - p.members_read) / every,
                       sizes.member(TAIL))
        p.members_read = self.now

    def _announcements_read(self, p: VPeer, r: int, since: float, every: float, until: float | None = None) -> float:
        """Round r's announcements that p's reads every ``every`` seconds from ``since`` until ``until`` (now)
        returned: each one from its first sighting on (a read returns what reached p by then)."""
        until = self.now if until is None else until
        return sum(max(0.0, until - max(t, since)) for t in self._announced(p, r).values()) / every

    def _read_while_computing(self, p: VPeer, r: int) -> None:
        """While its inner steps of round r ran, p read r's announcements every POLL_S from their start (the round
        clock's watcher, closed when they end), and r - 1's too until half the trainers in its sight had announced
        r (clock.CutTime predicts the cut time from the round before)."""
        since = p.compute_from.get(r)
        if since is None:
            return
        every = POLL_S + self.sc.dht_read_s
        first = self._announced(p, r)
        read = self._announcements_read(p, r, since, every) + sum(t <= since for t in first.values())
        if r > 0:
            times = sorted(first.values())
            need = (len(self._sight(p)[0]) + 1) // 2
            anchor = times[need - 1] if 0 < need <= len(times) else self.now
            until = min(self.now, max(since, anchor))
            read += self._announcements_read(p, r - 1, since, every, until=until) + len(self._announced(p, r - 1))
        p.traffic.read("updates", read, sizes.announcement())

    def _read_while_deciding(self, p: VPeer, c: core.RoundCore) -> None:
        """From its core's opening to its decision p polled every round.POLL_S: the round's announcements and its
        reports, each from when it reached p on (a read returns what reached p by then; its own report, from when
        it published it)."""
        every = core.POLL_S + 2 * self.sc.dht_read_s
        r, now = c.round_, self.now
        seen = self._announcements_read(p, r, c.start, every) + len(self._announced(p, r))
        p.traffic.read("updates", seen, sizes.announcement())
        came = p.reports_at.get(r, {})
        if p.id in c.reports:
            came = {**came, p.id: c.reported_at}
        polls = sum(max(0.0, now - max(t, c.start)) for t in came.values()) / every + len(came)
        p.traffic.read("reports", polls, sizes.report(len(c.first_seen)))

    def _announce(self, p: VPeer, r: int) -> None:
        self._split_or_heal(r)
        self._churn(r)
        if not p.alive:  # its own churn event killed it
            return
        drawn = self._committee(p, r)
        if drawn is not None and not drawn.sends(p.id):  # not drawn: its work waits in its error feedback
            self._read_members(p)
            self._open(p, r, sender=False)
            self._compute(p, r + 1)
            return
        digest = _digest(p.id, r, p.hashes[r - 1])
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
            if not self._fetches(q, r, p):  # out of q's committee round: read, never fetched
                deliver(q, r, core.Announced(now, p.id, now - age))
                return
            # q's poll (now: its time) starts the fetch; a later poll takes it once it ended (exchange.py's reap)
            deliver(q, r, core.Announced(now, p.id, now - age), core.FetchStarted(self.now, p.id))
            end, via = fetch(p, q, r, digest)
            post(q, end, None, lambda q, now: self._fetched(q, r, p, digest, now, via))

        self._broadcast(p, seen)
        self._compute(p, r + 1)

    def _fetch(self, p: VPeer, q: VPeer, r: int, digest: str) -> tuple[float, str]:
        """When q's fetch of p's update of round r ends, and from whom. The sender serves its copies within its
        budget (protocol/gossip.py: ``own_copies`` a window); past them q fetches from a random peer in its reach
        that holds a copy (the node's holdings), or, while none does yet, from the first whose copy arrives,
        once it has (the node's fetcher, told 'busy', tries the holders again). Each link carries one transfer
        at a time at its full speed: a transfer begins once the uploader's and the downloader's earlier ones
        ended (their sum is what shared links take), and is tried again after RETRY_S for each attempt lost
        (``loss_p``). q also reads the round's holdings."""
        via, ready = p.id, self.now
        if not self.copies.take(digest, self.now):
            reach = [(t, h) for t, h in self.holders[digest] if self.peers[h].alive and self._linked(self.peers[h], q)]
            held = [h for t, h in reach if t <= self.now]
            if held:
                via = held[self.sources.randrange(len(held))]
            elif reach:
                ready, via = min(reach)
        if q.holdings_read != (r, self.now):  # the fetches a poll starts share one read (transport.READ_SHARE_S)
            q.holdings_read = (r, self.now)
            q.traffic.read("holdings", self.holding_writers[r], sizes.holdings(len(q.announcers_of.get(r, ()))))
        size = self.sc.update_bytes
        begin = max(ready, self.up_free[via], self.down_free[q.id])
        self.up_free[via] = self.down_free[q.id] = begin + size * 8 / min(self.bw[via], self.bw[q.id])
        t = begin + self._transfer_s(via, q.id, size)
        if p.lie != "withhold":  # nobody holds what its sender never served
            self.holders[digest].append((t, q.id))
        return t, via

    def _fetched(self, q: VPeer, r: int, p: VPeer, digest: str, now: float, via: str) -> None:
        """q's fetch of p's update of round r ended at ``now``: verified, or without the bytes (a withholder's).
        A verified update is held and served on, and q lists its holdings once per poll that verified one."""
        if p.lie == "withhold":
            self._deliver(q, r, core.FetchEnded(now, p.id))
            return
        size = self.sc.update_bytes
        q.traffic.update_bytes_down += size
        self.peers[via].traffic.update_bytes_up += size
        q.traffic.hold(self.blob_cap)
        if q.holdings_at != (r, self.now):
            if q.holdings_at[0] != r:
                self.holding_writers[r] += 1
            q.holdings_at = (r, self.now)
            q.traffic.records_written += 1
        self._deliver(q, r, core.Verified(now, p.id, digest))

    def _open(self, p: VPeer, r: int, sender: bool, digest: str = "") -> core.RoundCore:
        """Round r's core on p, on the hash p applied for r - 1: with its own update (``sender``) or as an
        observer of a round it sat out; what the records hold for r is read into it."""
        # the node's rule ('ledger'): the contributors of the last WITNESS_WINDOW rounds; 'live': the live
        # trainers when deciding starts (docs/notes/swarm.md, "Not done": the two differ in the simulator's results)
        eligible = frozenset(eligible_witnesses(p.ledger, r)) if self.sc.eligible == "ledger" else frozenset()
        drawn, witness = self._committee(p, r), None
        if drawn is not None and drawn.pool:  # its drawn witnesses, and none of the others
            eligible, witness = drawn.witnesses, p.id in drawn.witnesses
        c = core.RoundCore(self.sc.params, r, p.id, eligible, sender, p.hashes[r - 1], self._pace(p), self.now,
                           witness=witness, committee=drawn, witnessed=self._witnessed)
        p.cores[r] = c
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

    def _fetches(self, q: VPeer, r: int, p: VPeer) -> bool:
        """Whether q fetches p's update of round r (``committee.Fetches``, on the base p announced on)."""
        fetches = q.fetches.get(r)
        if fetches is None:
            q.fetches = {k: v for k, v in q.fetches.items() if k >= r - 2}
            fetches = q.fetches[r] = committee.Fetches(committee.base(r, p.hashes))
        return fetches(self._committee(q, r), p.id)

    def _announced(self, p: VPeer, r: int) -> dict[str, float]:
        """Who announced round r in p's sight, first seen when: its core's sightings and the records it holds."""
        c = p.cores.get(r)
        first = dict(p.announcers_of.get(r, ()))
        if c is not None:
            first.update(c.first_seen)  # the core's sighting first (read by value: its order matters nowhere)
        return first

    def _view(self, p: VPeer, r: int) -> core.View:
        """What p's member records say, by the node's rule (``round.view_of``): the peers whose record it saw
        within the ttl (a split hides the others once theirs go stale), each at the round after the last its
        tail names; the last round p applied's senders and this round's announcers are counted; with
        ``votes`` other than 'everyone' only p's voters vote (``VPeer.voters``). The same view while what it is
        made of is (``_sight``'s records, the round's announcers, the last round's senders, the voters)."""
        records = self._sight(p)[1]
        c, seen = p.cores.get(r), p.announcers_of.get(r)
        key = (p.sight, c, len(c.first_seen) if c else 0, seen, len(seen) if seen else 0, p.senders, p.voters)
        got = p.views.get(r)
        if got is not None and all(a is b or type(a) is int and a == b for a, b in zip(got[0], key)):
            return got[1]
        voters = p.voters or ()
        view = core.view_of(records, p.id, r, announced=self._announced(p, r), workers=p.senders, voters=voters)
        p.views[r] = (key, view)
        return view

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

    def _resolve(self, r: int, base: str, fps: bytes) -> list[tuple[str, str]]:
        """The (sender, digest) pairs a set of round r on the chain ``base`` lists (records.resolve against every
        peer's update of it): once per set, as every peer on the chain applies the same one."""
        key = (r, base, fps)
        got = self._resolved.get(key)
        if got is None:
            got = self._resolved[key] = resolve(fps, ((q, _digest(q, r, base)) for q in self.peers))[0]
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
        count among all it verified (the node's Peer._note_workers; judged once per chain and pool): they vote
        (protocol/votes.py). Before the round's aggregate moves p's reputation table."""
        pool = tuple(sorted((s, d) for s, d in c.verified.items() if s not in c.doubted))
        extra = [s for s, _ in pool if s != p.id and s not in p.sets[r] and s not in p.ledger]
        if not extra or self.sc.votes != "contributors":
            return
        if self.sc.aggregation == "mean":
            kept = frozenset(extra)
        else:
            key = (c.base, pool)
            if key not in self._kept:
                self._kept[key] = frozenset(s.sender for s in self._screens(p, r, pool) if s.weight > 0)
            kept = self._kept[key]
        p.workers = {q: k for q, k in p.workers.items() if k > r - CONTRIBUTOR_ROUNDS}
        p.workers.update((q, r) for q in extra if q in kept)

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
        counts_for = self._votes(p)
        reported = p.weights.get(r, {})
        p.traffic.read("weights", len(reported), sizes.weights(len(p.sets.get(r, ()))))
        votes = {q: h for q, h in reported.items() if counts_for(q)} if r >= 0 else {}
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

    def _newest_offer(self, p: VPeer, links: set[chain.Link] | None, after: int = -2) -> tuple[Any, int]:
        """The newest state offered in p's sight past round ``after`` that the node's rule trusts (protocol/sync.py
        ``trusted_offers``: its newest link in ``links``, the winning chain's; None: the chain the other voting
        trainers follow now, as statesync.newest_offers reads it, p's own vote left out; no links at all: the hash
        most offerers give, the simulator keeps no weight-report majority for that fallback), and how many of that
        state's donors p cannot reach. p knows a donor by its record only: one whose process died or whose link is
        cut (a split, a clog) is asked like any other (``_download_s``); with none in reach the download fails:
        (None, their count), and the node reads the same offers again until their records expire or a newer state
        is offered (an older one is not taken instead). (None, 0) when nothing is offered. The state is the lowest
        reachable id's (every donor of one round on one chain offers the same state)."""
        if links is None:
            links = chain.adoptable(self._tails(p, with_me=False))
        offers = [_Offer(q, t[-1][0] + 1, t[-1][1], offer) for q, (seen, t, offer, _) in p.records.items()
                  if q != p.id and t and offer is not None and self._fresh(p, q, seen) and t[-1][0] > after]
        # none claiming a round more than RECORD_LAG past every other voting trainer's record (statesync.beyond_reach:
        # the records' rounds of the voters in sight that published a tail; an offer's hash only matches itself)
        votes = self._votes(p)
        reported = {q: r for q, (r, _) in self._sight(p)[1].items() if r > 0 and votes(q)}
        offers = [o for o in offers if not sync_rules.beyond_reach(o, reported)]
        good = sync_rules.trusted_offers(offers, links=links, expected=lambda r: None)
        reach = [o for o in good if self.peers[o.peer].alive and self._linked(p, self.peers[o.peer])]
        return (min(reach, key=lambda o: o.peer).state if reach else None), len(good) - len(reach)

    def _resync(self, p: VPeer, r: int, want: peer_core.Resync) -> None:
        """Carry out the peer core's ``Resync``: adopt the newest state offered in p's sight (``_newest_offer``) of
        ``want.lowest_round`` on, of the chain its links name (a fork) or else the one the others follow (read
        again at each look). None: p's main loop looks for one for ``want.look_s``, then carries on with its
        own state."""
        links = set(want.links) if want.links is not None else None
        after = want.lowest_round - 2  # an offer's round is its newest link's plus one
        offer, dead = self._newest_offer(p, links, after)
        if offer is None:
            self.no_offer += 1
            until = self.now + want.look_s
            p.busy_until = max(p.busy_until, until)
            again = self.now + _again(dead, want.look_s)
            self.at(again, lambda gen=p.gen: self._look_for_offer(p, r, links, after, until, want.look_s, gen))
            return
        self._adopt(p, r, offer, _download_s(dead, want.look_s))

    def _look_for_offer(self, p: VPeer, r: int, links: set[chain.Link] | None, after: int, until: float,
                        look_s: float, gen: int) -> None:
        """p's main loop reads the offers again every OFFER_POLL_S until its look ends (statesync.fetch): one
        that turns up in reach (a link unclogged, a split healed) is adopted then. A fork's look trusts the chain
        it set out for (``links``); a hash mismatch's (None) the chain the others follow now (the node's fetch reads
        it afresh at each read, statesync.newest_offers: the winners of the look's start move on meanwhile)."""
        if gen != p.gen or not p.alive:
            return
        offer, dead = self._newest_offer(p, links, after)
        if offer is not None:
            self._adopt(p, r, offer, _download_s(dead, look_s))
        elif self.now + _again(dead, look_s) < until:
            self.at(self.now + _again(dead, look_s),
                    lambda: self._look_for_offer(p, r, links, after, until, look_s, gen))

    def _adopt(self, p: VPeer, r: int, offer: Any, lost: float = 0.0) -> None:
        """p downloads ``offer`` (``lost`` seconds to donors out of reach first) and runs on from it (its rounds
        after the offer's are computed again)."""
        tail, hashes, applied, ledger, p.reputation, pools = offer
        newest = tail[-1][0]
        self.made_up += tail[-1] in self.fakes and not p.lie
        p.resyncs += 1
        self.far_states += newest >= self.sc.rounds and not p.lie
        self.repairs.append(newest - r)
        self.adopted.append(newest)
        self.per_round[r]["resyncs"] += 1
        p.gen += 1
        was_done, p.done = p.done, False
        p.busy_until = self.now + lost + self._transfer_s(None, p.id, self.sc.state_bytes)
        p.traffic.state_bytes_down += self.sc.state_bytes
        p.hashes = {k: h for k, h in hashes.items() if k <= newest}
        p.applied = {k: f for k, f in applied.items() if k <= newest}
        p.ledger, p.senders, p.pools = dict(ledger), frozenset(), {k: v for k, v in pools.items() if k <= newest}
        self._revote(p)
        p.waiting, p.computed = None, -1
        p.core.step(peer_core.StateAdopted(self.now, newest))
        # what it holds now, it says (the node's member record publishes its chain's tail, and a report of a
        # chain left since counts for the one followed now: chores.off_majority)
        self._publish_record(p, tuple((k, p.hashes[k]) for k in range(max(0, newest - TAIL + 1), newest + 1)
                                      if k in p.hashes))  # a liar's far state skips the rounds before it
        self.at(p.busy_until, lambda: self._compute(p, newest + 1))
        if was_done:  # its heartbeat had stopped at the end of its run
            self.at(self.now + self.heartbeat_s, lambda: self._heartbeat(p))

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
        final = Counter(p.hashes.get(last, "") for p in self.peers.values() if not p.lie and p.alive)
        liars = {p.id for p in self.peers.values() if p.lie}
        # per peer, the honest peer-rounds whose applied set listed its update, and whose aggregate counted it
        applied, counted = Counter(), Counter()
        for p in self.peers.values():
            if not p.lie:
                for senders in p.sets.values():
                    applied.update(senders)
                for senders in p.counted.values():
                    counted.update(senders)
        # liveness: how many rounds past a split's round the last of its peers re-synced onto the majority, or
        # with a partition, past the heal (None: the run ended on more than one hash)
        converged = max(self.repairs, default=0) if len(final) == 1 and not self.stalled else None
        if converged is not None and self.sc.partition and (self.sc.heal_at >= 0 or self.sc.heal_after_s >= 0):
            healed = self.sc.heal_at if self.sc.heal_after_s < 0 else self.healed_round
            converged = max([a - healed for a in self.adopted] + [0])
        if converged is not None and self.swizzled:  # rounds from the last link's unclogging on
            converged = max([a - self.unclog_round for a in self.adopted] + [0]) if self.unclog_round >= 0 else None
        return {"seed": self.sc.seed, "peers": self.sc.peers, "rounds": self.sc.rounds,
                "violations": self.violations, "splits": len({v["round"] for v in self.violations}),
                "rounds_to_converge": converged, "final_hashes": len(final),
                "resyncs": sum(p.resyncs for p in self.peers.values() if not p.lie), "undecided": self.undecided,
                "waited_out": self.waited_out, "no_offer": self.no_offer, "downloads": self.downloads,
                "catchups": self.catchups, "far_states": self.far_states, "made_up": self.made_up,
                "abstained": self.abstained, "cut_short": self.cut_short,
                "contributed": {q: applied[q] for q in self.peers},
                "kept_out": self._kept_out(),
                "liar_rounds": sum(bool(liars & p.sets[r]) for p in self.peers.values() if not p.lie for r in p.sets),
                "counted": {q: counted[q] for q in self.peers},
                # honest updates in an honest peer's applied set that its aggregate did not count
                "honest_screened": sum(len(p.sets[r] - p.counted[r] - liars) for p in self.peers.values()
                                       if not p.lie for r in p.counted),
                # why the screens left a liar's update out, over the honest peers' applied sets
                "liar_screens": dict(sorted(Counter(why for p in self.peers.values() if not p.lie
                                                    for r in p.reasons for q, why in p.reasons[r].items()
                                                    if q in liars).items())),
                "traffic": traffic.summary(p.traffic.row() for p in self.peers.values() if not p.lie),
                "stalled": self.stalled, "per_round": [{"round": r, **self.per_round[r]} for r in sorted(self.per_round)],
                "events": self.events, "virtual_s": round(self.now, 3), "wall_s": round(wall, 3),
                "scenario": {k: v for k, v in asdict(self.sc).items() if k != "params"}}


def _unit(v: list[float]) -> list[float]:
    size = math.sqrt(math.fsum(x * x for x in v))
    return [x / size for x in v]


def _digest(peer: str, round_: int, base: str) -> str:
    """The digest of ``peer``'s update of ``round_`` made on the chain ``base`` (its blob, in the simulator)."""
    return hashlib.sha256(f"{peer}/{round_}/{base}".encode()).hexdigest()


def _half(peer: str, round_: int) -> bool:
    """Which half of the peers an equivocator lies to in a round (fixed by the names: no randomness drawn)."""
    return hashlib.sha256(f"{peer}/{round_}".encode()).digest()[0] & 1 == 1


def _newest(q: VPeer, key: Any, sent: float) -> bool:
    """The DHT keeps a key's newest value: whether what was written at ``sent`` under ``key`` (a writer's member
    record: its id; its weight report of a round: (id, round)) is newer than what q holds (then noted as held).
    A late copy of an older record changes nothing."""
    if q.stamps.get(key, -1.0) < sent:
        q.stamps[key] = sent
        return True
    return False


def _everyone(q: str) -> bool:
    return True


def _give_up_s(look_s: float) -> float:
    """How long one state download of a look of ``look_s`` seconds retries its donors before it gives up
    (statesync.fetch: ``max(10, look_s / 2)``, within the look)."""
    return min(look_s, max(10.0, look_s / 2))


def _download_s(dead: int, look_s: float) -> float:
    """What ``dead`` donors out of reach add to a state download that a reachable one serves: a chunk asks the
    donors in a random order (transport.fetch_async) and one that cannot answer fails after a stream's open
    timeout (OPEN_S), so the slowest of a state's many chunks tries about every one of them first."""
    return min(OPEN_S * dead, _give_up_s(look_s))


def _again(dead: int, look_s: float) -> float:
    """When a peer looking for a state offer reads the offers again: OFFER_POLL_S after it found none (the node
    sleeps 0.5 s), or a second after a download that retried donors out of reach (``dead`` of them) until it gave
    up (statesync.fetch)."""
    return _give_up_s(look_s) + 1.0 if dead else OFFER_POLL_S


def run(sc: Scenario) -> dict[str, Any]:
    return Simulation(sc).run()


def print_summary(out: dict[str, Any]) -> None:
    """Per round: how many peers applied it, how many applied another set than the first peer on their chain
    (0 when safe), and the re-syncs that found it off the majority; then the totals."""
    print(f"virtual swarm: {out['peers']} peers, {out['rounds']} rounds, seed {out['seed']}")
    print(f"{'round':>5} {'applied':>8} {'violations':>10} {'resyncs':>8}")
    for row in out["per_round"]:
        print(f"{row['round']:>5} {row['applied']:>8} {row['violations']:>10} {row['resyncs']:>8}")
    sc = out["scenario"]
    if sc["partition"]:
        heal = f"healed at round {sc['heal_at']}" if sc["heal_at"] >= 0 else "never healed"
        print(f"partition {'|'.join(','.join(map(str, g)) for g in sc['partition'])} from round {sc['partition_at']}, "
              f"{heal} (each side trains on; the rounds to converge count from the heal)")
    if out["scenario"]["liars"]:
        print(f"liars {', '.join(f'{i}:{k}' for i, k in out['scenario']['liars'])}: honest updates kept out "
              f"{out['kept_out']}; peer-rounds that applied a liar's update {out['liar_rounds']}, that counted it "
              f"(the robust rule's screens) {', '.join(str(out['counted'][f'p{i:04d}']) for i, _ in out['scenario']['liars'])}; "
              f"honest updates screened out {out['honest_screened']}")
    if any(k == "futurestate" for _, k in sc["liars"]):
        print(f"states a liar made up that a peer adopted: {out['made_up']} ({out['far_states']} past the run's end)")
    if sc["swizzle_at"] >= 0:
        print(f"swizzle-clogging from round {sc['swizzle_at']}: a link clogs every {sc['swizzle_s']:g} s, then they "
              f"unclog (the rounds to converge count from the last)")
    if sc["drift_s"] or sc["clock_off"]:
        print(f"clocks off: up to {sc['drift_s']:g} s each" + "".join(f", peer {i} by {d:+g} s" for i, d in sc["clock_off"]))
    if sc["slow"]:
        print(f"stragglers {', '.join(f'{i}x{f:g}' for i, f in sc['slow'])}: rounds in the applied sets "
              f"{', '.join(str(out['contributed'][f'p{i:04d}'] // max(1, out['peers'] - len(sc['liars']))) for i, _ in sc['slow'])}"
              f" of {out['rounds']}; honest peer-rounds sat out {out['abstained']}, cut short {out['cut_short']}")
    print(f"violations {len(out['violations'])} in {out['splits']} rounds; re-syncs {out['resyncs']}; "
          f"final hashes {out['final_hashes']}; rounds to converge {out['rounds_to_converge']}; "
          f"{out['events']} events, {out['virtual_s']:.0f} virtual s in {out['wall_s']:.2f} s"
          + ("; STALLED" if out["stalled"] else ""))
