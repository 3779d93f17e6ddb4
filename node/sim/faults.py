"""The fault schedule of `gradnode simulate --faults SPEC`: a small grammar, parsed and validated up front.

    SPEC  := ITEM ("," ITEM)*
    ITEM  := kill:P@rN      kill -9 peer P (its process group) when the swarm starts round N
           | restart:P@rN   start P again with the same command (it resumes from its checkpoint)
           | stop:P@rN      SIGTERM: P announces its departure and leaves with a checkpoint
           | join:P@rN      P starts only when the swarm starts round N (late joiner)
           | corrupt:P@rN   P flips bytes of its updates from round N on (honest peers reject them)
           | forge:P@rN     P signs its updates with a foreign key from round N on
           | tamper:P@rN    P offers tampered state (honest hash, altered weights) from round N on
           | tokens:P[@rN]  adversary: P declares 2^40 tokens in its (validly signed) updates
           | dense:P[@rN]   adversary: P sends its updates with the dense codec in a sparse run
           | slowhold:P[@rN] adversary: P claims to hold every announced update and serves at 128 B/s
           | pushflood:P[@rN] adversary: P pushes forged copies of its update (6 under its own name, one under
                            each other peer's) to every peer each round
           | flood:P[@rN]   adversary: P runs 8 more identities of its own making (real DHT nodes, valid keys)
                            that publish 'training' member records and never an update, and an oversized value
           | sybilvotes:P[@rN] adversary: P runs 8 more identities of its own making that never send an update
                            but report a weight hash nobody holds for every round, and follow a chain of them
           | replayleave:P[@rN] adversary: P stores every other peer's newest signed 'leaving' record again,
                            each under a key of its own making (pair it with stop:X and restart:X)
           | equivocate:P[@rN] adversary: P publishes two different witness reports for each round (the
                            second names only its own update), taking turns in the DHT every 0.1 s for a second
           | lowid:P[@rN]   adversary: P grinds 24 keys for the lowest peer id and reports only its own
                            update (a witness that censors)
           | futurestate:P[@rN] adversary: P offers its state claimed for a round 10^6 ahead (under the hash of
                            that claim) and publishes a chain listing it
           | badmomentum:P[@rN] adversary: P offers honest weights with its outer momentum scaled by -1000,
                            under the honest hash
           | signflip:P[@rN] adversary: P sends its own update negated (validly signed, honest tokens)
           | noise:P[@rN]   adversary: P sends Gaussian noise through the codec, at its own update's norm
           | freerider:P[@rN] adversary: P sends, as its own, another peer's update that the previous round
                            applied (it trains, but sends what someone else computed)
           | lazy:P[@rN]    adversary: P trains every round on one fixed batch, whatever it was assigned
           | crossrun:P[@rN] adversary: the run is made with a genesis (open) and P replays, as its updates,
                            the ones it signed in an earlier run of the same name, config and seed
           | intruder:P     adversary: the run is permissioned (an authority admits every other peer) and P
                            joins without an admission certificate
           | slow:PxF       every inner step of P is F times slower (a straggler)
           | bw:P=RATE      P's link is capped at RATE, e.g. 1mbit
           | client:P       P runs in client mode (behind NAT: no inbound connections)
           | partition:G|G|...@rN   the network splits into these groups of peers, e.g. 0,1|2,3 (every peer in
                            one group; the bootstrap stays with the first group)
           | heal@rN        the network is whole again
    P     := a peer index, 'bootstrap' (kill and restart only), or '?' (a peer picked by --seed)

Example: ``kill:2@r3,restart:2@r5,join:5@r2,slow:1x5,bw:3=1mbit,corrupt:4@r2``. The same SPEC and
seed give the same schedule. A peer with one of the update faults (corrupt ... dense) has that fault's
name as its ``role`` in the summary; every other peer is ``honest``. Adversary faults without @rN apply
from the first round. Errors name the item and what to change (``ValueError``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from gradnode.node.config import parse_rate


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: its name, how each simulator spells it (None: that simulator does not model it),
    and what it does, in one line. KINDS is the one registry both parsers, `--faults help` and
    docs/simulator.md read."""

    name: str
    processes: str | None  # the grammar in `gradnode simulate`
    virtual: str | None  # the grammar in `gradnode simulate --virtual`
    meaning: str


KINDS: tuple[FaultKind, ...] = (
    FaultKind("kill", "kill:P@rN", "kill:P@rN", "kill -9 peer P when the swarm starts round N"),
    FaultKind("restart", "restart:P@rN", "restart:P@rN", "start P again with its folder: it resumes its checkpoint"),
    FaultKind("stop", "stop:P@rN", "stop:P@rN", "SIGTERM: P announces its departure and leaves with a checkpoint"),
    FaultKind("join", "join:P@rN", "join:P@rN", "P starts only at round N (a late joiner)"),
    FaultKind("slow", "slow:PxF", "slow:PxF", "every inner step of P is F times slower (a straggler)"),
    FaultKind("partition", "partition:G|G@rN", "partition:G|G@rN", "the network splits into these groups, e.g. 0,1|2,3"),
    FaultKind("heal", "heal@rN", "heal@rN", "the network is whole again"),
    FaultKind("bw", "bw:P=RATE", None, "P's link is capped at RATE, e.g. 1mbit"),
    FaultKind("client", "client:P", None, "P runs in client mode (behind NAT: no inbound connections)"),
    FaultKind("corrupt", "corrupt:P@rN", None, "P flips bytes of its updates (honest peers reject them)"),
    FaultKind("forge", "forge:P@rN", None, "P signs its updates with a foreign key"),
    FaultKind("tamper", "tamper:P@rN", None, "P offers tampered state: an honest hash over altered weights"),
    FaultKind("tokens", "tokens:P[@rN]", None, "P declares 2^40 tokens in its validly signed updates"),
    FaultKind("dense", "dense:P[@rN]", None, "P sends its updates with the dense codec in a sparse run"),
    FaultKind("slowhold", "slowhold:P[@rN]", None, "P claims to hold every update and serves at 128 B/s"),
    FaultKind("pushflood", "pushflood:P[@rN]", None, "P pushes forged copies of its update to every peer"),
    FaultKind("flood", "flood:P[@rN]", "flood:N", "keys of the attacker's making publish records far ahead, "
              "never an update (processes: 8 keys run by P; virtual: N keys, 1000 rounds ahead)"),
    FaultKind("sybilvotes", "sybilvotes:P[@rN]", None, "P runs 8 more keys that vote for a weight hash nobody holds"),
    FaultKind("sybils", None, "sybils:N", "N keys of the attacker's making vote for a made-up chain"),
    FaultKind("claims", None, "claims:S", "the sybil keys' records claim S seconds a round"),
    FaultKind("replayleave", "replayleave:P[@rN]", None, "P stores others' signed 'leaving' records again"),
    FaultKind("equivocate", "equivocate:P[@rN]", "equivocate:P", "P publishes two different witness reports a round"),
    FaultKind("censor", None, "censor:P", "P is a witness that reports only its own update"),
    FaultKind("withhold", None, "withhold:P", "P announces its update and never serves it"),
    FaultKind("lowid", "lowid:P[@rN]", None, "P grinds keys for the lowest peer id and censors as a witness"),
    FaultKind("stretch", None, "stretch:P", "P is an honest witness whose records claim an hour a round"),
    FaultKind("futurestate", "futurestate:P[@rN]", "futurestate:P", "P offers a state claimed 10^6 rounds ahead"),
    FaultKind("badmomentum", "badmomentum:P[@rN]", None, "P offers honest weights with its momentum scaled by -1000"),
    FaultKind("signflip", "signflip:P[@rN]", "signflip:P", "P sends its own update negated"),
    FaultKind("noise", "noise:P[@rN]", "noise:P", "P sends noise at its own update's norm"),
    FaultKind("freerider", "freerider:P[@rN]", "freerider:P", "P sends another peer's applied update as its own"),
    FaultKind("lazy", "lazy:P[@rN]", None, "P trains every round on one fixed batch"),
    FaultKind("crossrun", "crossrun:P[@rN]", None, "P replays updates it signed in an earlier run of the same name"),
    FaultKind("intruder", "intruder:P", None, "the run is permissioned and P joins without an admission"),
    FaultKind("drift", None, "drift:S", "every peer's clock is off by up to S seconds"),
    FaultKind("clock", None, "clock:P=S", "peer P's clock is S seconds off"),
    FaultKind("swizzle", None, "swizzle[:S]@rN", "a random half of the links clog one every S seconds, then unclog"),
    FaultKind("links", None, "links:S", "each peer's link is up to S times slower and farther than the fastest"),
    FaultKind("loss", None, "loss:PROB", "each transfer is lost with probability PROB, and retried"),
)
BY_NAME = {k.name: k for k in KINDS}


def names_for(virtual: bool) -> tuple[str, ...]:
    """The fault kinds one simulator models."""
    return tuple(k.name for k in KINDS if (k.virtual if virtual else k.processes) is not None)


def help_text(virtual: bool | None = None) -> str:
    """`--faults help`: one line per kind, with its grammar in the simulators that model it."""
    lines = ["P: a peer index ('?': one picked by --seed); N: a round (rN) or a count; S: seconds; F: a factor.",
             f"{'kind':<12} {'simulate':<20} {'simulate --virtual':<20} meaning"]
    for k in KINDS:
        if virtual is None or (k.virtual if virtual else k.processes) is not None:
            lines.append(f"{k.name:<12} {k.processes or '-':<20} {k.virtual or '-':<20} {k.meaning}")
    return "\n".join(lines)


def markdown_table() -> str:
    """The registry as docs/simulator.md shows it (a test checks the page holds it)."""
    rows = ["| kind | `simulate` | `simulate --virtual` | meaning |", "|---|---|---|---|"]
    rows += [f"| {k.name} | {f'`{k.processes}`' if k.processes else '-'} | {f'`{k.virtual}`' if k.virtual else '-'} "
             f"| {k.meaning} |".replace("|G|", "\\|G\\|").replace("G|G", "G\\|G") for k in KINDS]
    return "\n".join(rows)

LIFE = ("kill", "restart", "stop", "join")  # timed, on a process
BEHAVIOUR = {"corrupt": "corrupt", "forge": "forge", "tamper": "tamper_state",  # timed, swarm.fault of a peer
             "tokens": "tokens", "dense": "dense", "slowhold": "slowhold", "intruder": "intruder",
             "pushflood": "pushflood", "flood": "flood", "replayleave": "replayleave",
             "equivocate": "equivocate", "crossrun": "crossrun", "sybilvotes": "sybilvotes",
             "lowid": "lowid", "futurestate": "futurestate", "badmomentum": "badmomentum",
             "signflip": "signflip", "noise": "noise", "freerider": "freerider", "lazy": "lazy"}
# behaviours whose round is optional (default: from the start)
ADVERSARY = ("tokens", "dense", "slowhold", "intruder", "pushflood", "flood", "replayleave", "equivocate",
             "crossrun", "sybilvotes", "lowid", "futurestate", "badmomentum", "signflip", "noise", "freerider", "lazy")
STATIC = ("slow", "bw", "client")
NETWORK = ("partition", "heal")
ORDER = ("partition", "heal", *LIFE)  # events of one round fire in this order
_ITEM = re.compile(r"^(?P<action>[a-z]+):(?P<target>[^@x=]+|\?)"
                   r"(?:@r(?P<round>\d+)|x(?P<factor>[0-9.]+)|=(?P<rate>.+))?$")
_HEAL = re.compile(r"^heal@r(?P<round>\d+)$")


@dataclass(frozen=True)
class Event:
    """A timed action, fired when the swarm starts round ``round``: on one process (``target``
    'peer-<i>' or 'bootstrap'), or on the network ('partition' with its ``groups``, 'heal')."""

    action: str
    target: str
    round: int
    groups: tuple[tuple[int, ...], ...] = ()


@dataclass
class Schedule:
    events: list[Event] = field(default_factory=list)
    overrides: dict[int, list[str]] = field(default_factory=dict)  # peer index -> --set overrides
    late: dict[int, int] = field(default_factory=dict)  # peer index -> round it joins at
    roles: dict[int, str] = field(default_factory=dict)  # peer index -> its update fault (others: honest)

    def role(self, index: int) -> str:
        return self.roles.get(index, "honest")

    def disturbed(self) -> set[int]:
        """Peers whose life or updates the schedule touches (the others keep honest, unbroken records)."""
        out = set(self.late)
        for e in self.events:
            if e.target.startswith("peer-"):
                out.add(int(e.target.split("-")[1]))
        return out

    @property
    def partitioned(self) -> bool:
        return any(e.action == "partition" for e in self.events)


class _Parser:
    def __init__(self, peers: int, rounds: int, seed: int) -> None:
        self.peers, self.rounds, self.rng = peers, rounds, random.Random(seed)
        self.sched = Schedule()
        self.down: dict[str, int] = {}  # target -> round it went down (kill/stop), for restart checks
        self.faulty: set[int] = set()
        self.split_at: int | None = None  # round of the partition not yet healed

    def item(self, raw: str) -> None:
        heal = _HEAL.match(raw)
        if heal:
            return self._heal(raw, self._round(raw, heal["round"], "heal"))
        m = _ITEM.match(raw)
        if not m:
            raise ValueError(f"--faults: cannot read {raw!r}; expected e.g. kill:2@r3, slow:1x5, bw:3=1mbit, "
                             "client:4, partition:0,1|2,3@r3, heal@r6")
        action, target = m["action"], m["target"].strip()
        known = names_for(virtual=False)
        if action not in known:
            raise ValueError(f"--faults: unknown action {action!r} in {raw!r}; use one of {', '.join(known)}")
        if action == "partition":
            return self._partition(raw, target, self._round(raw, m["round"], f"partition:{target}"))
        index = self._peer(raw, action, target)
        if action in ADVERSARY and m["round"] is None:
            return self._timed(raw, action, target, index, 0)
        if action in LIFE or action in BEHAVIOUR:
            return self._timed(raw, action, target, index, self._round(raw, m["round"], f"{action}:{target}"))
        self._static(raw, action, target, index, m)

    def _round(self, raw: str, text: str | None, form: str) -> int:
        if text is None:
            raise ValueError(f"--faults: {raw!r} needs a round, e.g. {form}@r2")
        if int(text) >= self.rounds:
            raise ValueError(f"--faults: {raw!r}: round {text} is not before the last round ({self.rounds})")
        return int(text)

    def _peer(self, raw: str, action: str, target: str) -> int | None:
        if target == "bootstrap":
            if action not in ("kill", "restart"):
                raise ValueError(f"--faults: {raw!r}: only 'kill' and 'restart' apply to the bootstrap")
            return None
        if target == "?":
            return self.rng.randrange(self.peers)
        if not target.isdigit():
            raise ValueError(f"--faults: {raw!r}: the peer must be an index, 'bootstrap' or '?'")
        if int(target) >= self.peers:
            raise ValueError(f"--faults: {raw!r}: peer {target} does not exist (peers are 0..{self.peers - 1})")
        return int(target)

    def _timed(self, raw: str, action: str, target: str, index: int | None, round_: int) -> None:
        name = "bootstrap" if index is None else f"peer-{index}"
        if action in ("kill", "stop"):
            if self.down.get(name, -1) >= 0:
                raise ValueError(f"--faults: {raw!r}: {name} is already down from round {self.down[name]}")
            self.down[name] = round_
        elif action == "restart":
            if name not in self.down or self.down[name] >= round_:
                raise ValueError(f"--faults: {raw!r}: restart needs an earlier kill:{target}@rM or stop:{target}@rM "
                                 f"with M < {round_}")
            self.down[name] = -1
        elif action == "join":
            if round_ < 1 or index in self.sched.late:
                raise ValueError(f"--faults: {raw!r}: a peer joins once, at round 1 or later")
            self.sched.late[index] = round_  # type: ignore[index]
        else:  # corrupt, forge, tamper and the adversaries
            if index in self.faulty:
                raise ValueError(f"--faults: {raw!r}: peer {index} already has an update fault "
                                 f"({self.sched.roles[index]})")  # type: ignore[index]
            self.faulty.add(index)  # type: ignore[arg-type]
            self.sched.roles[index] = action  # type: ignore[index]
            self._set(index, f"swarm.fault={BEHAVIOUR[action]}", f"swarm.fault_round={round_}")
            return
        self.sched.events.append(Event(action, name, round_))

    def _static(self, raw: str, action: str, target: str, index: int | None, m: re.Match) -> None:
        if action == "slow" and m["factor"] is None or action == "bw" and m["rate"] is None \
                or action == "client" and (m["round"] or m["factor"] or m["rate"]):
            form = {"slow": f"slow:{target}x5", "bw": f"bw:{target}=1mbit", "client": f"client:{target}"}[action]
            raise ValueError(f"--faults: {raw!r}: write it as {form}")
        if action == "slow":
            factor = float(m["factor"])
            if not 1.0 <= factor <= 100.0:
                raise ValueError(f"--faults: {raw!r}: the slowdown must lie in 1..100")
            self._set(index, f"swarm.slowdown={factor}")
        elif action == "bw":
            try:
                parse_rate(m["rate"])
            except ValueError as err:
                raise ValueError(f"--faults: {raw!r}: {err}") from None
            self._set(index, f"swarm.bandwidth={m['rate']}")
        else:
            self._set(index, "swarm.client_mode=true")

    def _partition(self, raw: str, spec: str, round_: int) -> None:
        try:
            groups = tuple(tuple(int(p) for p in g.split(",")) for g in spec.split("|"))
        except ValueError:
            raise ValueError(f"--faults: {raw!r}: write the groups as peer indices, e.g. partition:0,1|2,3@r3") \
                from None
        listed = [p for g in groups for p in g]
        if len(groups) < 2 or sorted(listed) != list(range(self.peers)):
            raise ValueError(f"--faults: {raw!r}: list every peer 0..{self.peers - 1} once, in 2 or more groups "
                             "separated by |")
        if self.split_at is not None:
            raise ValueError(f"--faults: {raw!r}: the network is already split from round {self.split_at}; "
                             "heal@rN first")
        self.split_at = round_
        self.sched.events.append(Event("partition", "network", round_, groups))

    def _heal(self, raw: str, round_: int) -> None:
        if self.split_at is None or self.split_at >= round_:
            raise ValueError(f"--faults: {raw!r}: heal needs an earlier partition:...@rM with M < {round_}")
        self.split_at = None
        self.sched.events.append(Event("heal", "network", round_))

    def _set(self, index: int | None, *sets: str) -> None:
        self.sched.overrides.setdefault(index, []).extend(sets)  # type: ignore[arg-type]

    def finish(self) -> Schedule:
        sched = self.sched
        for index, round_ in sched.late.items():
            early = [e for e in sched.events if e.target == f"peer-{index}" and e.action != "join"
                     and e.round <= round_]
            if early:
                raise ValueError(f"--faults: peer {index} joins at round {round_}; {early[0].action}@r{early[0].round} "
                                 "comes before that")
        if len(sched.late) >= self.peers:
            raise ValueError("--faults: at least one peer must start at the beginning")
        sched.events.sort(key=lambda e: (e.round, ORDER.index(e.action)))
        return sched


def parse(spec: str | None, peers: int, rounds: int, seed: int = 0) -> Schedule:
    """Parse and validate ``spec`` for a swarm of ``peers`` peers trained for ``rounds`` rounds."""
    parser = _Parser(peers, rounds, seed)
    if not spec or not spec.strip():
        return parser.sched
    # a partition's groups hold commas: split the SPEC on commas that do not continue a group list
    for raw in (x.strip() for x in re.split(r",(?![0-9]+(?:[,|][0-9]+)*@r)", spec)):
        if not raw:
            raise ValueError(f"--faults: empty item in {spec!r} (remove the extra comma)")
        parser.item(raw)
    return parser.finish()
