"""`gradnode bench scale`: what one peer moves and holds per round as the swarm grows, from the virtual
simulator, for a drawn committee (protocol/committee.py) beside today's all-to-all round.

Each row is one run of `simulate --virtual` at N peers: the config's model (update bytes at the codec's wire
size), its deadline settings, the same seed and rounds. Each figure is a peer's count per round, as min /
median / max over peers (node/sim/traffic.py): update bytes down and up, DHT records read, record bytes
read, and the peak number of updates its blob store held. A round's inner steps take ``round_s`` seconds
(30 by default: long enough that an all-to-all peer fetches nearly every update before the deadline; with
2 s rounds at 64 peers it fetched 7 of 63, and its figures said more about the deadline than about N).
All-to-all runs up to ``all_max`` peers. Every row also says whether the run was safe and on one hash.

``loopback`` runs real processes on 127.0.0.1 (`gradnode simulate`, the small model of `bench swarm`) at a
few sizes with one budget, and gives the same per-peer figures from their metrics, and whether their live
peers ended on one hash: the check that a committee's per-peer cost stays flat outside the simulator too.
"""

from __future__ import annotations

import time
from typing import Any

from gradnode.node.bench import pyplot
from gradnode.node.config import Config
from gradnode.node.sim import scenario, virtual

FIGURES = ("update_bytes_down", "update_bytes_up", "records_read", "record_bytes_read", "peak_updates_held")


def one(cfg: Config, peers: int, rounds: int, seed: int, committee: tuple[int, ...], round_s: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = virtual.run(scenario.of_config(cfg, peers=peers, rounds=rounds, seed=seed, committee=committee,
                                         compute_s=round_s))
    return {"peers": peers, "rule": "committee" if committee else "all-to-all",
            **{f: out["traffic"][f] for f in FIGURES},
            "violations": len(out["violations"]), "final_hashes": out["final_hashes"], "stalled": out["stalled"],
            "update_bytes": out["scenario"]["update_bytes"], "wall_s": round(time.perf_counter() - t0, 1)}


def run(cfg: Config, sizes: list[int], *, rounds: int, seed: int, committee: tuple[int, int, int],
        all_max: int, round_s: float) -> dict[str, Any]:
    rows = []
    for n in sizes:
        rows.append(one(cfg, n, rounds, seed, committee, round_s))
        if n <= all_max:
            rows.append(one(cfg, n, rounds, seed, (), round_s))
    return {"committee": list(committee), "rounds": rounds, "seed": seed, "round_s": round_s, "rows": rows}


LOOPBACK_FIGURES = ("update_bytes_down", "update_bytes_up", "records_read", "record_bytes_read", "peak_updates_held")


def loopback(sizes: list[int], *, rounds: int, seed: int, committee: tuple[int, int, int],
             overrides: list[str] = ()) -> list[dict[str, Any]]:
    """Real swarms on loopback, one per size, each under the same budget ``committee``: per-peer figures
    per round (min / median / max over peers) and whether the live peers hold one hash."""
    import shutil
    import tempfile
    from pathlib import Path

    from gradnode.node.bench.swarm import TRAFFIC_MODEL
    from gradnode.node.sim import simulate as sim

    k, w, j = committee
    budget = [f"committee.contributors={k}", f"committee.witnesses={w}", f"committee.newcomers={j}"]
    rows = []
    for n in sizes:
        out = Path(tempfile.mkdtemp(prefix=f"gradnode-scale-{n}-"))
        t0 = time.perf_counter()
        try:
            real = sim.run(sim.SimSettings(peers=n, rounds=rounds, config=None, out_dir=out, eval_peers=0,
                                           overrides=[*TRAFFIC_MODEL, *budget, *overrides], timeout_s=1800,
                                           seed=seed), live=False)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        rows.append({"peers": n, **{f: real["traffic"].get(f) for f in LOOPBACK_FIGURES},
                     "identical_hashes": real["identical_hashes"], "wall_s": round(time.perf_counter() - t0, 1)})
    return rows


def print_result(result: dict[str, Any]) -> None:
    k, w, j = result["committee"]
    print(f"per peer per round, median (min-max) over peers; committee K={k} W={w} J={j}; "
          f"{result['rounds']} rounds of {result['round_s']:g} s, seed {result['seed']}")
    print(f"{'N':>6} {'rule':<10} {'MB down':>16} {'MB up':>16} {'records read':>18} {'KB records':>18} "
          f"{'held':>6} {'safe':>5} {'s':>6}")
    for r in result["rows"]:
        def cell(f: str, scale: float) -> str:
            x = r[f]
            return f"{x['median'] / scale:.2f} ({x['min'] / scale:.2f}-{x['max'] / scale:.2f})"
        safe = "yes" if r["violations"] == 0 and r["final_hashes"] == 1 and not r["stalled"] else "NO"
        print(f"{r['peers']:>6} {r['rule']:<10} {cell('update_bytes_down', 1e6):>16} {cell('update_bytes_up', 1e6):>16} "
              f"{cell('records_read', 1):>18} {cell('record_bytes_read', 1e3):>18} "
              f"{r['peak_updates_held']['median']:>6.0f} {safe:>5} {r['wall_s']:>6}")
    if result.get("loopback"):
        k, w, j = result["loopback_committee"]
        print(f"real processes on 127.0.0.1, committee K={k} W={w} J={j}, per peer per round, median (min-max)")
        print(f"{'N':>6} {'KB down':>20} {'KB up':>20} {'records read':>18} {'one hash':>9} {'s':>6}")
        for r in result["loopback"]:
            def kb(f: str, scale: float = 1e3) -> str:
                x = r[f]
                return "-" if not x else f"{x['median'] / scale:.1f} ({x['min'] / scale:.1f}-{x['max'] / scale:.1f})"
            print(f"{r['peers']:>6} {kb('update_bytes_down'):>20} {kb('update_bytes_up'):>20} "
                  f"{kb('records_read', 1):>18} {'yes' if r['identical_hashes'] else 'NO':>9} {r['wall_s']:>6}")


def plot(result: dict[str, Any], path: str) -> None:
    """Median update bytes down and records read per peer and round against N, one line per rule."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (f, label) in zip(axes, (("update_bytes_down", "update MB down per peer per round"),
                                     ("records_read", "DHT records read per peer per round"))):
        for rule in ("committee", "all-to-all"):
            rows = [r for r in result["rows"] if r["rule"] == rule]
            scale = 1e6 if f == "update_bytes_down" else 1
            ax.plot([r["peers"] for r in rows], [r[f]["median"] / scale for r in rows], marker="o", label=rule)
        ax.set_xscale("log")
        ax.set_xlabel("peers (log)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    k, w, j = result["committee"]
    fig.suptitle(f"bench scale: committee K={k} W={w} J={j} beside all-to-all")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
