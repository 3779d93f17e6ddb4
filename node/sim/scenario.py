"""The virtual simulator's scenario (node/sim/virtual.py): the swarm, its faults and its adversaries, as one
frozen dataclass; ``--faults`` read into its fields; and a run's config as a scenario (``of_config``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gradnode.node.sim import sizes
from gradnode.protocol import committee
from gradnode.protocol import round as core

VOTES = ("contributors", "ledger", "everyone")  # Scenario.votes
WITNESS_LIES = ("censor", "equivocate", "withhold")  # liars about what they hold (virtual.py's docstring)
CONTENT_LIES = ("signflip", "noise", "freerider")  # honest witnesses whose updates do not help
# honest witnesses and updates whose member records lie: an hour a round (sight.PACE_LIE_S), a state far ahead
CLAIM_LIES = ("stretch", "futurestate")
LIAR_KINDS = WITNESS_LIES + CONTENT_LIES + CLAIM_LIES  # the adversaries modelled
LIFE_ACTIONS = ("kill", "stop", "restart", "join")

if TYPE_CHECKING:
    from gradnode.node.config import Config


@dataclass(frozen=True)
class Scenario:
    """One virtual run: the swarm, its network, its faults and its adversaries (virtual.py says how each is
    modelled). The same scenario gives the same run."""

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
    liars: tuple[tuple[int, str], ...] = ()  # (peer index, one of LIAR_KINDS)
    # how a decided set is aggregated: 'robust' (the node's default, protocol/screening.py's screens and the
    # reputation table over the updates' vectors; a screened-out sender is no contributor) or 'mean' (every
    # update in the set counts: the rule before the screens)
    aggregation: str = "robust"
    lies_from: int = 0  # the round from which the unhelpful kinds (CONTENT_LIES) lie; honest before it
    rule: str = "witnesses"  # or 'leader': the lowest-id witness's report decides (the rule before witnesses)
    # a network split: the peers of each group (indices) reach only each other from the first announcement of
    # round ``partition_at`` until the first of round ``heal_at`` (-1: never healed)
    partition: tuple[tuple[int, ...], ...] = ()
    partition_at: int = 0
    heal_at: int = -1
    # or the split heals this many virtual seconds after it fell (-1: at ``heal_at``): a swarm that a split stops
    # (a drawn committee's round waits for a majority of its witnesses) never reaches the round that would heal it
    heal_after_s: float = -1.0
    record_ttl_s: float = 30.0  # a member record unseen this long is gone (swarm.record_ttl_s)
    slow: tuple[tuple[int, float], ...] = ()  # (peer index, factor): stragglers, every step that much slower
    inner_steps: int = 8  # a round's inner steps (inner.steps), cut short at the round's cut time
    min_steps: int = 1  # the fewest steps a peer runs before its steps may be cut (swarm.min_steps)
    # clock drift: each peer's wall clock is off by U(-drift_s, drift_s) (or ``clock_off``: (peer, seconds)).
    # The DHT's times are wall-clock times: an announcement's age is the reader's clock minus the time the
    # announcer stamped (clamped to 0..600 s, as clock.Deadline), and a record expires on the writer's clock
    drift_s: float = 0.0
    clock_off: tuple[tuple[int, float], ...] = ()
    # (peer index, seconds): a peer whose process starts that late into the run, its first record and its round 0
    # then (no look for a newer state: only the cut time and abstaining bring it into the others' phase)
    starts: tuple[tuple[int, float], ...] = ()
    # swizzle-clogging (FoundationDB's): from the first announcement of round ``swizzle_at``, a random half of
    # the links between peers clog one by one every ``swizzle_s`` seconds, then unclog one by one in another
    # random order; what a clogged link carries arrives when it unclogs (a stalled connection, not a loss)
    swizzle_at: int = -1
    swizzle_s: float = 2.0
    # keys of an attacker's own making (the process tests' 'sybilvotes'): they never send an update, and every
    # heartbeat publish 'training' member records following a chain of hashes nobody holds, at the swarm's
    # newest round, and report those hashes for every round. ``votes``: whose chain and weight report counts
    # (everyone's before a peer applied a round): 'contributors' (the node's rule, protocol/votes.py: a key
    # whose updates the peer's chain applied in the last 64 rounds, the shared contributors ledger, or one of
    # whose updates the peer verified outside its set in those rounds and the screens count), 'ledger' (the rule
    # before, the ledger alone: a peer that forked alone in round 0 counts only its own chain's contributors,
    # itself and whoever was in its set, and a healed split with late records ended on two hashes) or 'everyone'
    sybils: int = 0
    sybils_ahead: int = 0  # rounds past the swarm's newest that the sybils' records claim (the 'flood': 1000)
    votes: str = "contributors"
    # the round time the sybil keys' records claim (0: none, as before). A record costs nothing to make: the node
    # paces its rounds on the lower median of the claims of the last round's senders only (``pace``:
    # 'contributors'), never of every record in sight ('everyone': the rule an attacker would want)
    sybil_pace_s: float = 0.0
    pace: str = "contributors"
    # a round's eligible witnesses: 'live' (the live trainers when deciding starts) or 'ledger' (the node's
    # eligible_witnesses: contributors of the last 8 rounds). The tests run 'live'; under 'ledger' splits and
    # swizzles converge later and a 20x straggler re-syncs now and then with timely records (docs/notes/swarm.md,
    # "Not done": not understood yet)
    eligible: str = "live"
    # churn, fired at the first announcement of a round: ('kill' | 'stop' | 'restart' | 'join', peer, round).
    # kill: the process dies (its record goes stale); stop: it leaves and says so; restart: it comes back with
    # its disk (its state) and nothing else; join: it starts then (not before), with nothing
    life: tuple[tuple[str, int, int], ...] = ()
    # per-link networks: each peer's link has a bandwidth drawn log-uniformly in [bandwidth_bps / link_spread,
    # bandwidth_bps] and a one-way latency in [latency_s, latency_s x link_spread]; a transfer between two
    # peers runs at the slower one's bandwidth after the mean of their latencies. ``loss_p``: each transfer
    # attempt (an update fetch, a state download) is lost with that probability and retried after RETRY_S
    # (the transport's retry); the DHT's records are never lost, they come late (``late_p``)
    link_spread: float = 1.0
    loss_p: float = 0.0
    # a restarted peer that kept its disk replays the rounds it missed (fetches their updates and applies them)
    # when they are at most this many and weigh less than the state, else downloads the state
    # (swarm.catchup_rounds; protocol/sync.py replay_or_download, as node/swarm/sync.py decides); 0: always download
    catchup_rounds: int = 8
    # the model the updates are of (0: none named; ``update_bytes`` is then what it is): `simulate --virtual`
    # sets update_bytes to the codec's wire size of the config's model, or of this many parameters
    model_params: int = 0
    own_copies: int = 2  # copies of its own update a sender serves per window (swarm.own_update_copies; 0: no cap)
    # trainers in sight, itself included, before a peer starts its first round (swarm.min_peers; `simulate
    # --virtual` sets the config's, 2 by default). 1: every peer starts at once, as the tests' scenarios do: a
    # peer whose first round is shorter than a record's way then decides it alone
    min_peers: int = 1
    dht_read_s: float = 0.1  # one DHT read's seconds: a poll loop's period is its wait plus its reads
    busy_s: float = 0.0  # a peer's seconds a round outside its inner steps and its waits (applying, checkpoints)
    # a drawn committee a round (protocol/committee.py): (contributors, witnesses, newcomers); () none, everyone
    # contributes. Its witnesses are the round's eligible ones, whatever ``eligible`` says
    committee: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for index, kind in self.liars:
            if kind not in LIAR_KINDS or not 0 <= index < self.peers:
                raise ValueError(f"liar {index}:{kind}: a peer 0..{self.peers - 1} and one of {', '.join(LIAR_KINDS)}")
        if self.votes not in VOTES or self.sybils < 0 or self.eligible not in ("live", "ledger"):
            raise ValueError(f"votes {self.votes!r}: one of {', '.join(VOTES)}; sybils >= 0")
        if self.pace not in ("contributors", "everyone") or not self.sybil_pace_s >= 0:
            raise ValueError(f"pace {self.pace!r}: 'contributors' or 'everyone'; sybil_pace_s >= 0")
        if self.aggregation not in ("robust", "mean"):
            raise ValueError(f"aggregation {self.aggregation!r}: 'robust' or 'mean'")
        if self.rule not in ("witnesses", "leader"):
            raise ValueError(f"rule {self.rule!r}: 'witnesses' or 'leader'")
        for action, index, _ in self.life:
            if action not in LIFE_ACTIONS or not 0 <= index < self.peers:
                raise ValueError(f"{action}:{index}: one of {', '.join(LIFE_ACTIONS)} and a peer 0..{self.peers - 1}")
        for index, factor in self.slow:
            if not 0 <= index < self.peers or not 1.0 <= factor <= 100.0:
                raise ValueError(f"slow {index}x{factor}: a peer 0..{self.peers - 1} and a factor in 1..100")
        if self.drift_s < 0 or any(not 0 <= i < self.peers for i, _ in self.clock_off):
            raise ValueError(f"drift_s >= 0 and clock_off of peers 0..{self.peers - 1}")
        joining = {i for action, i, _ in self.life if action == "join"}
        if any(not 0 <= i < self.peers or i in joining or not s >= 0 for i, s in self.starts):
            raise ValueError(f"starts: peers 0..{self.peers - 1} that do not join later, each after >= 0 s")
        if not 1 <= self.min_steps <= self.inner_steps:
            raise ValueError(f"min_steps {self.min_steps}: 1..inner_steps ({self.inner_steps})")
        if self.committee and len(self.committee) != 3:
            raise ValueError(f"committee {self.committee}: (contributors, witnesses, newcomers)")
        committee.Budget(*self.committee)  # its own checks
        cut = [i for g in self.partition for i in g]
        if self.partition and (len(self.partition) < 2 or len(set(cut)) != len(cut)
                               or not all(0 <= i < self.peers for i in cut)):
            raise ValueError(f"partition {self.partition}: two or more groups of distinct peers 0..{self.peers - 1}")



def parse_faults(spec: str | None, peers: int) -> dict[str, Any]:
    """``--faults`` for ``--virtual``, as ``Scenario`` fields: lying witnesses (KIND:P, KIND one of LIAR_KINDS,
    P a peer index), one network split with its heal, churn and stragglers, in the process simulator's
    grammar (``partition:0,1|2,3@r3,heal@r12,kill:2@r4,restart:2@r6,stop:3@r5,join:5@r2,slow:1x5``), and
    clocks off (``drift:S``: each peer's by U(-S, S) seconds; ``clock:P=S``: peer P's by S), and
    swizzle-clogging (``swizzle@rN``, ``swizzle:S@rN``), ``sybils:N`` (keys of the attacker's making voting
    for a made-up chain; votes counted per recent contributor), ``flood:N`` (the same keys, their records 1000
    rounds ahead: the process tests' 'flood'; ``claims:S``: their records claim S seconds a round), and per-link
    networks (``links:S``: each peer's link up to S times slower and S times farther than the fastest; ``loss:P``:
    transfers lost and retried). ValueError names the item and what to write instead."""
    from gradnode.node.sim import faults

    items = [x.strip() for x in re.split(r",(?![0-9]+(?:[,|][0-9]+)*@r)", spec or "") if x.strip()]
    modelled = faults.names_for(virtual=True)
    for raw in items:
        if re.split(r"[:@]", raw, maxsplit=1)[0] not in modelled:
            raise ValueError(f"--faults: {raw!r} is not modelled by --virtual; it models {', '.join(modelled)} "
                             "(`gradnode simulate --faults help` lists each with its grammar)")
    clocks = [x for x in items
              if x.startswith(("drift:", "clock:", "swizzle", "sybils:", "flood:", "claims:", "links:", "loss:"))]
    timed = [x for x in items if x.startswith(("partition:", "heal@", "slow:", *(f"{a}:" for a in LIFE_ACTIONS)))]
    out: dict[str, Any] = {"liars": parse_liars(",".join(x for x in items if x not in timed + clocks), peers)}
    offsets: list[tuple[int, float]] = []
    for raw in clocks:
        net = re.fullmatch(r"(links|loss):([0-9.]+)", raw)
        if net is not None:
            field, value = ("link_spread", float(net[2])) if net[1] == "links" else ("loss_p", float(net[2]))
            if field in out or (field == "link_spread" and value < 1) or (field == "loss_p" and not value < 1):
                raise ValueError(f"--faults: {raw!r}: write links:S (links S times slower and S times farther at "
                                 "most, S >= 1) or loss:P (each transfer lost with probability P < 1), once")
            out[field] = value
            continue
        claim = re.fullmatch(r"claims:([0-9]+(?:\.[0-9]*)?)", raw)
        if claim is not None and "sybil_pace_s" not in out:
            out["sybil_pace_s"] = float(claim[1])
            continue
        if raw.startswith("claims:"):
            raise ValueError(f"--faults: {raw!r}: write claims:S (the sybil keys' records claim S seconds a round), "
                             "once")
        n = re.fullmatch(r"(sybils|flood):([0-9]+)", raw)
        if n is not None and "sybils" not in out:
            out.update(sybils=int(n[2]), **({"sybils_ahead": 1000} if n[1] == "flood" else {}))
            continue
        if raw.startswith(("sybils:", "flood:")):
            raise ValueError(f"--faults: {raw!r}: write sybils:N or flood:N (N keys of the attacker's making), once")
        z = re.fullmatch(r"swizzle(?::([0-9.]+))?@r([0-9]+)", raw)
        if z is not None and "swizzle_at" not in out:
            out.update(swizzle_at=int(z[2]), **({"swizzle_s": float(z[1])} if z[1] else {}))
            continue
        if raw.startswith("swizzle"):
            raise ValueError(f"--faults: {raw!r}: write swizzle@rN or swizzle:S@rN (links clog one every S seconds, "
                             "default 2, from round N, then unclog), once")
        m = re.fullmatch(r"drift:([0-9.]+)|clock:([0-9]+)=([+-]?[0-9.]+)", raw)
        if m is None or m[1] is not None and "drift_s" in out:
            raise ValueError(f"--faults: {raw!r}: write drift:S (every clock off by up to S seconds, once) or "
                             "clock:P=S (peer P's clock S seconds off, e.g. clock:3=-40)")
        if m[1] is not None:
            out["drift_s"] = float(m[1])
        elif int(m[2]) >= peers:
            raise ValueError(f"--faults: {raw!r}: peer {m[2]} does not exist (peers are 0..{peers - 1})")
        else:
            offsets.append((int(m[2]), float(m[3])))
    if offsets:
        out["clock_off"] = tuple(offsets)
    if "sybil_pace_s" in out and "sybils" not in out:
        raise ValueError("--faults: claims:S is what the sybil keys claim: add sybils:N or flood:N")
    sched = faults.parse(",".join(timed), peers, rounds=1 << 30) if timed else faults.Schedule()
    slow = tuple((i, float(o.split("=", 1)[1])) for i, sets in sorted(sched.overrides.items())
                 for o in sets if o.startswith("swarm.slowdown="))
    if slow:
        out["slow"] = slow
    life: list[tuple[str, int, int]] = []
    for e in sched.events:  # a join is an event too (and in sched.late)
        if e.target == "bootstrap":
            raise ValueError("--faults: --virtual has no bootstrap (every peer's records reach every other)")
        if e.action == "partition" and "partition" in out:
            raise ValueError("--faults: --virtual models one partition (and its heal) per run")
        if e.action == "partition":
            out.update(partition=e.groups, partition_at=e.round)
        elif e.action == "heal":
            out["heal_at"] = e.round
        else:
            life.append((e.action, int(e.target.split("-")[1]), e.round))
    if life:
        out["life"] = tuple(life)
    return out


def parse_committee(spec: str) -> tuple[int, int, int]:
    """``K,W,J``: a round's drawn contributors, witnesses and newcomer slots (protocol/committee.py)."""
    try:
        k, w, j = (int(x) for x in spec.split(","))
        committee.Budget(k, w, j)
    except ValueError:
        raise ValueError(f"--committee {spec!r}: K,W,J, three counts >= 0 with K and W both above 0") from None
    if k == 0:
        raise ValueError(f"--committee {spec!r}: K and W above 0")
    return k, w, j


def parse_liars(spec: str | None, peers: int) -> tuple[tuple[int, str], ...]:
    """The lying witnesses of ``--faults`` for ``--virtual``: KIND:P items, comma-separated."""
    out: list[tuple[int, str]] = []
    for raw in (x.strip() for x in (spec or "").split(",") if x.strip()):
        kind, _, index = raw.partition(":")
        if kind not in LIAR_KINDS or not index.isdigit():
            raise ValueError(f"--faults: {raw!r} is not modelled by --virtual; write KIND:P with KIND one of "
                             f"{', '.join(LIAR_KINDS)}, or partition:G|G@rN, heal@rM, kill/stop/restart/join:P@rN, "
                             "slow:PxF, drift:S, clock:P=S, swizzle@rN, sybils:N, flood:N, links:S, loss:P (the process "
                             "simulator runs the other faults)")
        if int(index) >= peers or int(index) in dict(out):
            raise ValueError(f"--faults: {raw!r}: peer {index} does not exist or has a fault already "
                             f"(peers are 0..{peers - 1})")
        out.append((int(index), kind))
    if 2 * len(out) >= peers:
        raise ValueError(f"--faults: {len(out)} liars of {peers} peers: the rules assume fewer than half")
    return tuple(out)


def of_config(cfg: Config, *, model_params: int | None = None, **fields: Any) -> Scenario:
    """The virtual simulator's scenario for a run of ``cfg``: its swarm's deadline settings, record ttl, inner
    steps, copy budget and committee, and its model's update size (or that of ``model_params`` parameters); ``fields``
    set the rest (peers, rounds, seed, faults, compute_s, ...)."""
    from gradnode.node.swarm.clock import params  # the node's swarm (and torch): only for a config

    sw, c = cfg.swarm, cfg.committee
    if c.contributors:  # the config's committee, unless the fields name one
        fields.setdefault("committee", (c.contributors, c.witnesses, c.newcomers))
    return Scenario(params=params(sw), record_ttl_s=sw.record_ttl_s, inner_steps=cfg.inner.steps,
                    min_steps=min(sw.min_steps, cfg.inner.steps), own_copies=sw.own_update_copies,
                    min_peers=sw.min_peers,
                    update_bytes=sizes.update_bytes(cfg, model_params), model_params=model_params or 0, **fields)
