"""`gradnode bench traffic`: what a peer moves per round, in a real swarm on 127.0.0.1 and in the virtual
simulator, side by side, so that the simulator's figures are checked against the node's.

For each swarm size it runs `gradnode simulate` (real processes, the small model of `bench swarm`) and reads
its peers' median seconds per round, of inner steps and of main loop, and the mean time of one DHT read. Then
it runs `simulate --virtual` with as many peers and rounds, those times, the codec's wire size of the same
model, and the latency that gives the same median round time (``matched``).

Each figure is the median over peers of a peer's count per round (node/sim/traffic.py): update bytes down and
up, DHT records read and written, and the record bytes read. ``ratio`` is the virtual figure over the real one.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from gradnode.node.bench.swarm import TRAFFIC_MODEL
from gradnode.node.config import load_config, parse_override
from gradnode.node.sim import simulate as sim
from gradnode.node.sim import scenario, traffic, virtual


MATCH_TRIES = 8  # runs of the simulator to find the latency that gives the real swarm's round time
MAIN_LOOP = ("deadline_poll", "update", "apply")  # the main loop's phases outside inner steps and waits (peer.py)


def _per_peer(out_dir: Path, peers: int, of_rows: Any) -> float:
    """The median over peers of ``of_rows`` (a peer's metrics rows -> its figure; None: none)."""
    per_peer = []
    for i in range(peers):
        got = of_rows([r for r in sim.read_metrics(out_dir / f"peer-{i}" / "metrics.jsonl") if "inner_s" in r])
        if got is not None:
            per_peer.append(got)
    return statistics.median(per_peer) if per_peer else 0.0


def inner_seconds(out_dir: Path, peers: int) -> float:
    """The median over peers of a peer's median seconds of inner steps a round (its metrics rows)."""
    def of(rows: list[dict[str, Any]]) -> float | None:
        steps = [b["inner_s"] - a["inner_s"] for a, b in zip(rows, rows[1:])]
        return statistics.median(steps) if steps else None
    return _per_peer(out_dir, peers, of)


def busy_seconds(out_dir: Path, peers: int) -> float:
    """The median over peers of a peer's seconds a round in its main loop outside inner steps and waits
    (``MAIN_LOOP``: the late check, publishing, applying), from its last metrics row's phase times."""
    def of(rows: list[dict[str, Any]]) -> float | None:
        return sum(rows[-1].get("phase_s", {}).get(k, 0.0) for k in MAIN_LOOP) / len(rows) if rows else None
    return _per_peer(out_dir, peers, of)


def matched(cfg: Any, real: dict[str, Any], peers: int, rounds: int, seed: int, compute_s: float,
            busy_s: float) -> tuple[dict[str, Any], float]:
    """The virtual run whose median round time is the real swarm's (within 5 %), with the real inner steps' and
    main loop's seconds, and the latency that matches: a real peer waits most of a round for its exchange (a
    record's way and a fetch on CPU that many processes share take that long), so the round time the simulator
    lacks goes into each record's and transfer's way, found by bisection; and that latency."""
    want, lo, hi, latency = real["traffic"]["round_s"]["median"], 0.0, 2.0, 0.05
    for _ in range(MATCH_TRIES):
        sc = scenario.of_config(cfg, peers=peers, rounds=rounds, seed=seed, compute_s=max(0.01, compute_s),
                                busy_s=busy_s, latency_s=latency, dht_read_s=real["traffic"].get("dht_read_s", 0.1))
        model = virtual.run(sc)
        got = model["traffic"]["round_s"]["median"]
        if abs(got - want) <= 0.05 * want:
            break
        lo, hi = (latency, hi) if got < want else (lo, latency)
        latency = (lo + hi) / 2
    return model, latency


def one(peers: int, rounds: int, config: Path | None, overrides: list[str], seed: int) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"gradnode-traffic-{peers}-"))
    try:
        real = sim.run(sim.SimSettings(peers=peers, rounds=rounds, config=config, out_dir=out, overrides=overrides,
                                       eval_peers=0, timeout_s=1800, seed=seed), live=False)
        compute_s, busy_s = inner_seconds(out, peers), busy_seconds(out, peers)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(config, dict(parse_override(o) for o in overrides))
    model, latency_s = matched(cfg, real, peers, rounds, seed, compute_s, busy_s)
    ratio = {k: round(model["traffic"][k]["median"] / real["traffic"][k]["median"], 3)
             for k in traffic.PER_ROUND if real["traffic"].get(k) and real["traffic"][k]["median"]}
    return {"peers": peers, "rounds": rounds, "compute_s": round(compute_s, 3), "busy_s": round(busy_s, 3),
            "latency_s": round(latency_s, 3),
            "update_bytes": model["scenario"]["update_bytes"],
            "identical_hashes": real["identical_hashes"], "violations": len(model["violations"]),
            "real": real["traffic"], "virtual": model["traffic"], "ratio": ratio}


def run(counts: list[int], *, rounds: int, config: Path | None, overrides: list[str], seed: int = 0) -> dict[str, Any]:
    return {"swarms": [one(n, rounds, config, [*TRAFFIC_MODEL, *overrides], seed) for n in counts]}


def print_result(result: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(title="per peer and round, median over peers: real swarm on 127.0.0.1 | virtual simulator",
              box=box.SIMPLE_HEAD)
    for col in ("peers", "round s", *traffic.PER_ROUND):
        t.add_column(col, justify="right", no_wrap=True)
    for s in result["swarms"]:
        cells = [f"{s['real'][k]['median']:.0f} | {s['virtual'][k]['median']:.0f} ({s['ratio'].get(k, 0):.2f})"
                 for k in traffic.PER_ROUND]
        t.add_row(str(s["peers"]), f"{s['real']['round_s']['median']:.1f}", *cells)
    Console().print(t)
