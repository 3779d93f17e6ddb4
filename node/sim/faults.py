"""The fault schedule of `gradnode simulate --faults SPEC`: a small grammar, parsed and validated up front.

    SPEC  := ITEM ("," ITEM)*
    ITEM  := kill:P@rN      kill -9 peer P (its process group) when the swarm starts round N
           | restart:P@rN   start P again with the same command (it resumes from its checkpoint)
           | stop:P@rN      SIGTERM: P announces its departure and leaves with a checkpoint
           | join:P@rN      P starts only when the swarm starts round N (late joiner)
           | corrupt:P@rN   P flips bytes of its updates from round N on (honest peers reject them)
           | forge:P@rN     P signs its updates with a foreign key from round N on
           | tamper:P@rN    P offers tampered state (honest hash, altered weights) from round N on
           | slow:PxF       every inner step of P is F times slower (a straggler)
           | bw:P=RATE      P's link is capped at RATE, e.g. 1mbit
           | client:P       P runs in client mode (behind NAT: no inbound connections)
    P     := a peer index, 'bootstrap' (kill only), or '?' (a peer picked by --seed)

Example: ``kill:2@r3,restart:2@r5,join:5@r2,slow:1x5,bw:3=1mbit,corrupt:4@r2``. The same SPEC and
seed give the same schedule. Errors name the item and what to change (``ValueError``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from gradnode.node.config import parse_rate

TIMED = ("kill", "restart", "stop", "join", "corrupt", "forge", "tamper")
STATIC = ("slow", "bw", "client")
_ITEM = re.compile(r"^(?P<action>[a-z]+):(?P<target>[^@x=]+|\?)"
                   r"(?:@r(?P<round>\d+)|x(?P<factor>[0-9.]+)|=(?P<rate>.+))?$")


@dataclass(frozen=True)
class Event:
    """A timed action on one process, fired when the swarm starts round ``round``."""

    action: str
    target: str  # "peer-<i>" or "bootstrap"
    round: int


@dataclass
class Schedule:
    events: list[Event] = field(default_factory=list)
    overrides: dict[int, list[str]] = field(default_factory=dict)  # peer index -> --set overrides
    late: dict[int, int] = field(default_factory=dict)  # peer index -> round it joins at

    def disturbed(self) -> set[int]:
        """Peers whose life or updates the schedule touches (the others keep honest, unbroken records)."""
        out = set(self.late)
        for e in self.events:
            if e.target.startswith("peer-"):
                out.add(int(e.target.split("-")[1]))
        return out


def parse(spec: str | None, peers: int, rounds: int, seed: int = 0) -> Schedule:
    """Parse and validate ``spec`` for a swarm of ``peers`` peers trained for ``rounds`` rounds."""
    sched = Schedule()
    if not spec or not spec.strip():
        return sched
    rng = random.Random(seed)
    down: dict[str, int] = {}  # target -> round it went down (kill/stop), for restart checks
    faulty: set[int] = set()
    for raw in (x.strip() for x in spec.split(",")):
        if not raw:
            raise ValueError(f"--faults: empty item in {spec!r} (remove the extra comma)")
        m = _ITEM.match(raw)
        if not m:
            raise ValueError(f"--faults: cannot read {raw!r}; expected e.g. kill:2@r3, slow:1x5, bw:3=1mbit, client:4")
        action, target = m["action"], m["target"].strip()
        if action not in TIMED + STATIC:
            raise ValueError(f"--faults: unknown action {action!r} in {raw!r}; use one of {', '.join(TIMED + STATIC)}")
        if target == "bootstrap":
            if action != "kill":
                raise ValueError(f"--faults: {raw!r}: only 'kill' applies to the bootstrap")
            index = None
        elif target == "?":
            index = rng.randrange(peers)
        elif target.isdigit():
            index = int(target)
            if index >= peers:
                raise ValueError(f"--faults: {raw!r}: peer {index} does not exist (peers are 0..{peers - 1})")
        else:
            raise ValueError(f"--faults: {raw!r}: the peer must be an index, 'bootstrap' or '?'")
        if action in TIMED:
            if m["round"] is None:
                raise ValueError(f"--faults: {raw!r} needs a round, e.g. {action}:{target}@r2")
            round_ = int(m["round"])
            if round_ >= rounds:
                raise ValueError(f"--faults: {raw!r}: round {round_} is not before the last round ({rounds})")
        elif action == "slow" and m["factor"] is None or action == "bw" and m["rate"] is None \
                or action == "client" and (m["round"] or m["factor"] or m["rate"]):
            form = {"slow": f"slow:{target}x5", "bw": f"bw:{target}=1mbit", "client": f"client:{target}"}[action]
            raise ValueError(f"--faults: {raw!r}: write it as {form}")
        name = "bootstrap" if index is None else f"peer-{index}"
        sets: list[str] = []
        if action in ("kill", "stop"):
            if name in down and down[name] >= 0:
                raise ValueError(f"--faults: {raw!r}: {name} is already down from round {down[name]}")
            down[name] = round_
            sched.events.append(Event(action, name, round_))
        elif action == "restart":
            if name not in down or down[name] >= round_:
                raise ValueError(f"--faults: {raw!r}: restart needs an earlier kill:{target}@rM or stop:{target}@rM "
                                 f"with M < {round_}")
            down[name] = -1
            sched.events.append(Event(action, name, round_))
        elif action == "join":
            if round_ < 1 or index in sched.late:
                raise ValueError(f"--faults: {raw!r}: a peer joins once, at round 1 or later")
            sched.late[index] = round_
            sched.events.append(Event(action, name, round_))
        elif action in ("corrupt", "forge", "tamper"):
            if index in faulty:
                raise ValueError(f"--faults: {raw!r}: peer {index} already has a corrupt/forge/tamper fault")
            faulty.add(index)
            sets += [f"swarm.fault={'tamper_state' if action == 'tamper' else action}", f"swarm.fault_round={round_}"]
        elif action == "slow":
            factor = float(m["factor"])
            if not 1.0 <= factor <= 100.0:
                raise ValueError(f"--faults: {raw!r}: the slowdown must lie in 1..100")
            sets.append(f"swarm.slowdown={factor}")
        elif action == "bw":
            try:
                parse_rate(m["rate"])
            except ValueError as err:
                raise ValueError(f"--faults: {raw!r}: {err}") from None
            sets.append(f"swarm.bandwidth={m['rate']}")
        elif action == "client":
            sets.append("swarm.client_mode=true")
        if sets:
            sched.overrides.setdefault(index, []).extend(sets)
    for index, round_ in sched.late.items():
        early = [e for e in sched.events if e.target == f"peer-{index}" and e.action != "join" and e.round <= round_]
        if early:
            raise ValueError(f"--faults: peer {index} joins at round {round_}; {early[0].action}@r{early[0].round} "
                             "comes before that")
    if len(sched.late) >= peers:
        raise ValueError("--faults: at least one peer must start at the beginning")
    sched.events.sort(key=lambda e: (e.round, TIMED.index(e.action)))
    return sched
