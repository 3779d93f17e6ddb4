"""`gradnode bench swarm`: real swarms on 127.0.0.1, figures printed, nothing asserted.

1. Utilisation: 4 peers on the given config with every link capped (`--link`: tc tbf in network
   namespaces, or the transport's token bucket), overlapped exchange: time in inner steps / wall
   time, and the seconds per round the main loop waited for communication (the part not hidden
   behind compute); also both without the run's end, where the last round's exchange has no next
   round to overlap with (a pipeline drain every finite run pays once).
   Also where the rest of the wall time goes: main-thread seconds per round by phase (waiting for
   the exchange, applying the outer step, encoding the update, ...), and the same for the chores
   thread that reports hashes, offers state and writes checkpoints behind the inner steps.
2. Traffic: bytes up and down per peer per round at each swarm size (a small model, so that 8 peers
   fit on a laptop), and of the upload, the copies of the peer's own update: all-to-all exchange
   means every peer downloads N-1 updates, so mean upload = mean download grows with N; gossip keeps
   each sender's upload of its own update about flat, the rest is relaying others' updates.

Every swarm also reports its re-syncs, the rounds whose weights split (even where a re-sync repaired
them), and the share of the peers' own updates that made their round (a swarm agreeing on empty sets
would split nothing).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from gradnode.node.sim import simulate as sim

TRAFFIC_MODEL = ["model.n_layer=2", "model.n_head=2", "model.d_model=64", "model.seq_len=64", "inner.batch_size=4",
                 "inner.steps=6", "inner.warmup_steps=2", "swarm.min_deadline_s=1.0"]


def _swarm(out: Path, peers: int, rounds: int, config: Path | None, overrides: list[str],
           bandwidth: str | None, link: str = "auto") -> dict[str, Any]:
    s = sim.SimSettings(peers=peers, rounds=rounds, config=config, out_dir=out, bandwidth=bandwidth, link=link,
                        overrides=overrides, eval_peers=0, timeout_s=1800)
    return sim.run(s, live=False)


def split_rounds(peers: list[dict[str, Any]]) -> list[int]:
    """Rounds after which the peers that recorded a weight hash for them did not all record the same one
    (a split, even one a re-sync repaired later: the losing side keeps its old hash in its round log)."""
    seen: dict[str, set[str]] = {}
    for p in (p for p in peers if p.get("role", "honest") == "honest"):  # an adversary's hash says nothing
        for r, h in p.get("hashes", {}).items():
            seen.setdefault(r, set()).add(h)
    return sorted(int(r) for r, hashes in seen.items() if len(hashes) > 1)


def _per_round(summary: dict[str, Any]) -> dict[str, Any]:
    ok = [p for p in summary["peers"] if "error" not in p]
    rounds = max(1, summary["rounds"])
    up = [p["bytes_up"] / rounds for p in ok]
    down = [p["bytes_down"] / rounds for p in ok]
    own = [p.get("own_update_bytes_up", 0) / rounds for p in ok]
    phases = sorted({k for p in ok for k in p.get("phase_s_per_round", {})})
    return {"own_update_up_per_peer_round_mean": statistics.mean(own) if own else 0.0,
            "own_update_up_per_peer_round_max": max(own, default=0.0),
            "phase_s_per_round": {k: statistics.mean(p.get("phase_s_per_round", {}).get(k, 0.0) for p in ok)
                                  for k in phases},
            "peers": len(summary["peers"]), "finished": len(ok), "identical_hashes": summary["identical_hashes"],
            "resyncs": sum(p.get("resyncs", 0) for p in ok), "split_rounds": split_rounds(ok),
            # the share of the peers' own updates that made their rounds: agreeing on empty sets is no success
            "own_included_rate": statistics.mean(p.get("contributed", 0) / rounds for p in ok) if ok else 0.0,
            "up_per_peer_round_mean": statistics.mean(up) if up else 0.0, "up_per_peer_round_max": max(up, default=0),
            "down_per_peer_round_mean": statistics.mean(down) if down else 0.0,
            "utilization_mean": statistics.mean(p["utilization"] for p in ok) if ok else 0.0,
            "comm_wait_s_per_round": statistics.mean(p["comm_wait_s_per_round"] for p in ok) if ok else 0.0,
            "utilization_steady_mean": statistics.mean(p["utilization_steady"] for p in ok) if ok else 0.0,
            "comm_wait_s_per_round_steady": statistics.mean(p["comm_wait_s_per_round_steady"] for p in ok) if ok else 0.0}


def run(sizes: list[int], *, rounds: int, bandwidth: str, config: Path | None, overrides: list[str],
        link: str = "auto") -> dict[str, Any]:
    out: dict[str, Any] = {"bandwidth": bandwidth, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="gradnode-bench-") as tmp:
        util = _swarm(Path(tmp) / "util", 4, rounds, config, overrides, bandwidth, link)
        out["link"] = util["link"]
        out["utilization_4_peers"] = _per_round(util)
        out["traffic"] = [_per_round(_swarm(Path(tmp) / f"n{n}", n, rounds, None, TRAFFIC_MODEL + overrides, None))
                          for n in sizes]
    return out


def print_result(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    u = result["utilization_4_peers"]
    console = Console()
    console.print(f"4 peers, link cap {result['bandwidth']} ({result['link']}): "
                  f"utilization {u['utilization_mean']:.1%}, "
                  f"non-overlapped communication {u['comm_wait_s_per_round']:.2f} s/round, "
                  f"identical weights: {u['identical_hashes']}, re-syncs: {u['resyncs']}, "
                  f"rounds split: {len(u['split_rounds'])}, own updates in their round: {u['own_included_rate']:.0%}")
    console.print(f"  without the run's end (the last round's exchange has nothing to overlap with): utilization "
                  f"{u['utilization_steady_mean']:.1%}, non-overlapped communication "
                  f"{u['comm_wait_s_per_round_steady']:.2f} s/round")
    main = ("wait", "apply", "update", "chores_wait")
    console.print("seconds per round outside the inner steps, main thread: " +
                  ", ".join(f"{k} {v:.2f}" for k, v in u["phase_s_per_round"].items() if k in main) +
                  "; chores thread (overlapped): " +
                  ", ".join(f"{k} {v:.2f}" for k, v in u["phase_s_per_round"].items() if k not in main))
    t = Table(title="traffic per peer per round")
    for col in ("peers", "up mean KB", "up max KB", "own update up mean KB", "own update up max KB", "down mean KB",
                "identical", "re-syncs", "rounds split", "own updates in"):
        t.add_column(col, justify="right")
    for row in result["traffic"]:
        t.add_row(str(row["peers"]), f"{row['up_per_peer_round_mean'] / 1e3:.1f}",
                  f"{row['up_per_peer_round_max'] / 1e3:.1f}", f"{row['own_update_up_per_peer_round_mean'] / 1e3:.1f}",
                  f"{row['own_update_up_per_peer_round_max'] / 1e3:.1f}", f"{row['down_per_peer_round_mean'] / 1e3:.1f}",
                  str(row["identical_hashes"]), str(row["resyncs"]), str(len(row["split_rounds"])),
                  f"{row['own_included_rate']:.0%}")
    console.print(t)
