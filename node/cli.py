"""The `gradnode` command line. Imports nothing heavy at module level: `gradnode --help` stays fast.

Each command parses its options, loads the config and hands over to the module that does the work.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from gradnode.node.config import Config, ConfigError, load_config, parse_override

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="gradnode: decentralised SparseLoCo training over hivemind.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print measured figures.")
app.add_typer(bench_app, name="bench")

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML or TOML config; default: the embedded tiny-cpu preset.")
SetOpt = typer.Option(None, "--set", help="Override a config key, e.g. --set inner.lr=1e-3 (repeatable).")


def _load(config: Optional[Path], overrides: Optional[list[str]], extra: dict[str, Any] | None = None) -> Config:
    """Load the config, exit with the key-naming message on error (no traceback for user mistakes)."""
    try:
        pairs = dict(parse_override(o) for o in overrides or [])
        pairs.update(extra or {})
        return load_config(config, pairs)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None


def _setup_logging(verbose: bool) -> None:
    import logging

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@app.command("check-config")
def check_config(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt) -> None:
    """Validate a config file and print the full resolved tree as JSON."""
    cfg = _load(config, set_)
    typer.echo(json.dumps(cfg.model_dump(mode="json"), indent=2))


# --- commands added by the layers below (codec, training, swarm) ---


# --- codec benchmark (issue 2) ---


@bench_app.command("codec")
def bench_codec_cmd(params: int = typer.Option(20_000_000, "--params", min=10_000,
                                               help="Model size for the pseudo-gradient (parameters)."),
                    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
                    steps: int = typer.Option(4, "--steps", min=1, help="AdamW steps in the pseudo-gradient."),
                    repeats: int = typer.Option(7, "--repeats", min=1, help="Timed repeats (best is kept)."),
                    threads: int = typer.Option(0, "--threads", min=0,
                                                help="torch CPU threads for every measurement; 0 keeps torch's "
                                                     "default (use 1 on a machine shared with other jobs)."),
                    as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Compression ratio, speed and error of the update codec on a real pseudo-gradient."""
    if device not in ("cpu", "cuda"):
        typer.echo("--device must be cpu or cuda", err=True)
        raise typer.Exit(2)
    from gradnode.node.bench.codec import print_table, run

    result = run(params, device=device, steps=steps, repeats=repeats, threads=threads)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        print_table(result)


# --- swarm commands: bootstrap, join, status, simulate, bench swarm (issue 4) ---

PeerOpt = typer.Option(None, "--initial-peer", "-p", help="Multiaddr of a swarm peer (repeatable); adds to "
                                                          "swarm.initial_peers.")


def _swarm_cfg(config: Optional[Path], set_: Optional[list[str]], initial_peer: Optional[list[str]],
               extra: dict[str, Any] | None = None) -> Config:
    cfg = _load(config, set_, extra)
    if initial_peer:
        cfg.swarm.initial_peers = [*cfg.swarm.initial_peers, *initial_peer]
    return cfg


def _run_peer(cfg: Config, *, train: bool, peer_index: Optional[int], device: Optional[str], metrics: Optional[Path],
              summary: Optional[Path], evaluate: bool, maddrs_file: Optional[Path] = None) -> None:
    from gradnode.node.swarm.peer import Peer
    from gradnode.node.swarm.report import summary_json

    peer = Peer(cfg, peer_index=peer_index, device=device, metrics_path=metrics, evaluate=evaluate)
    peer.install_signal_handlers()
    try:
        peer.start()
        maddrs = peer.transport.maddrs()
        typer.echo("peer id: " + peer.identity.peer_id)
        for m in maddrs:
            typer.echo(m)
        if maddrs_file is not None:
            tmp = maddrs_file.with_suffix(".tmp")
            tmp.write_text("\n".join(maddrs) + "\n")
            tmp.replace(maddrs_file)
        if not train:
            peer.serve()
            return
        result = peer.train()
        if summary is not None:
            summary.write_text(summary_json(result))
        typer.echo(f"rounds={result.rounds} loss={result.final_loss} hash={result.param_hash[:16]} "
                   f"utilization={result.utilization:.3f} up={result.bytes_up} down={result.bytes_down} "
                   f"rejected={result.rejected_updates}")
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    finally:
        peer.close()


@app.command("bootstrap")
def bootstrap_cmd(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
                  train: bool = typer.Option(False, "--train/--serve-only", help="Also train (default: only keep "
                                                                                  "the DHT and records alive)."),
                  host: Optional[list[str]] = typer.Option(None, "--host", help="Listen multiaddr, e.g. "
                                                           "/ip4/0.0.0.0/tcp/31337 (repeatable)."),
                  device: Optional[str] = typer.Option(None, "--device"),
                  maddrs_file: Optional[Path] = typer.Option(None, "--maddrs-file", hidden=True),
                  verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Start a long-lived bootstrap peer with a stable identity; prints the multiaddrs others join with."""
    extra: dict[str, Any] = {"swarm.serve_only": not train}
    if host:
        extra["swarm.host_maddrs"] = list(host)
    cfg = _load(config, set_, extra)
    _setup_logging(verbose)
    _run_peer(cfg, train=train, peer_index=None, device=device, metrics=None, summary=None, evaluate=train,
              maddrs_file=maddrs_file)


@app.command("join")
def join_cmd(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
             initial_peer: Optional[list[str]] = PeerOpt,
             rounds: Optional[int] = typer.Option(None, "--rounds", help="Leave after this round (swarm.rounds)."),
             peer_index: Optional[int] = typer.Option(None, "--peer-index", min=0,
                                                      help="Data shard of this peer; default: derived from its "
                                                           "identity, so every volunteer reads its own slice."),
             output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Override run.output_dir."),
             device: Optional[str] = typer.Option(None, "--device"),
             metrics: Optional[Path] = typer.Option(None, "--metrics", help="Append a JSON line per round here."),
             summary: Optional[Path] = typer.Option(None, "--summary", help="Write the final summary JSON here."),
             no_eval: bool = typer.Option(False, "--no-eval", help="Skip the validation loss at start and end."),
             maddrs_file: Optional[Path] = typer.Option(None, "--maddrs-file", hidden=True),
             verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Join a swarm: download the current weights (verified by hash), then train and exchange every round."""
    extra: dict[str, Any] = {}
    if rounds is not None:
        extra["swarm.rounds"] = rounds
    if output_dir is not None:
        extra["run.output_dir"] = str(output_dir)
    cfg = _swarm_cfg(config, set_, initial_peer, extra)
    _setup_logging(verbose)
    _run_peer(cfg, train=True, peer_index=peer_index, device=device, metrics=metrics, summary=summary,
              evaluate=not no_eval, maddrs_file=maddrs_file)


@app.command("status")
def status_cmd(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
               initial_peer: Optional[list[str]] = PeerOpt,
               as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Print the swarm's members: peer, round, throughput, traffic, rejected updates, last seen."""
    import tempfile

    cfg = _swarm_cfg(config, set_, initial_peer)
    if not cfg.swarm.initial_peers:
        typer.echo("status needs --initial-peer (or swarm.initial_peers)", err=True)
        raise typer.Exit(2)
    from rich.console import Console
    from rich.table import Table

    from gradnode.node.swarm.identity import load_or_create
    from gradnode.node.swarm.membership import Membership
    from gradnode.node.swarm.transport import Transport

    with tempfile.TemporaryDirectory() as tmp:
        sw = cfg.swarm.model_copy(update={"client_mode": True, "host_maddrs": ["/ip4/127.0.0.1/tcp/0"]})
        ident = load_or_create(Path(tmp) / "status.key")
        transport = Transport(sw, ident)
        try:
            transport.start()
            members = Membership(transport, ident, cfg.run.run_id, cfg.swarm.record_ttl_s).members(max_age=0)
            now = transport.now()
        finally:
            transport.close()
    rows = sorted(members.values(), key=lambda m: m.peer_id)
    if as_json:
        typer.echo(json.dumps([{**m.model_dump(exclude={"public_key", "signature"}), "last_seen_s": now - m.time}
                               for m in rows]))
        return
    table = Table(title=f"swarm {cfg.run.run_id}: {len(rows)} peers")
    for col in ("peer", "role", "round", "tok/s", "loss", "up MB", "down MB", "rejected", "last seen", "version"):
        table.add_column(col)
    for m in rows:
        table.add_row(m.peer_id[:16], "train" if m.training else "serve", str(m.round), f"{m.tokens_per_s:.0f}",
                      f"{m.loss:.3f}" if m.loss is not None else "-", f"{m.bytes_up / 1e6:.1f}",
                      f"{m.bytes_down / 1e6:.1f}", str(m.rejected), f"{now - m.time:.0f}s ago", m.software_version)
    Console().print(table)


LinkOpt = typer.Option("auto", "--link", help="How --bandwidth caps each peer's link: netns = the peer runs in "
                      "its own network namespace behind a veth with tc tbf each way (root only; a real slow link for "
                      "TCP); bucket = a token bucket in the transport, on 127.0.0.1; auto = netns where it works, "
                      "else bucket.")


def _check_link(link: str, bandwidth: Optional[str]) -> None:
    """Fail fast with the reason (e.g. not root for --link netns), before any process starts."""
    from gradnode.node.sim.simulate import resolve_link

    try:
        resolve_link(link, bandwidth)
    except ValueError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None


@app.command("simulate")
def simulate_cmd(peers: int = typer.Option(4, "--peers", "-n", min=1, max=64, help="Training peers."),
                 rounds: int = typer.Option(5, "--rounds", "-r", min=1, help="Rounds each peer trains."),
                 config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
                 as_json: bool = typer.Option(False, "--json", help="Print one JSON summary object."),
                 plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of loss per round."),
                 bandwidth: Optional[str] = typer.Option(None, "--bandwidth", help="Cap each peer's link, e.g. "
                                                         "10mbit, each way (see --link for how)."),
                 link: str = LinkOpt,
                 output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Folder for logs and "
                                                           "checkpoints; default runs/simulate-<time>."),
                 faults_spec: Optional[str] = typer.Option(
                     None, "--faults", help="Fault schedule, e.g. kill:2@r3,restart:2@r5,join:5@r2,slow:1x5,"
                                            "bw:3=1mbit,corrupt:4@r2 (actions: kill restart stop join corrupt forge "
                                            "tamper slow bw client; peer '?' = picked by --seed)."),
                 seed: Optional[int] = typer.Option(None, "--seed", min=0, help="run.seed, and the picks of '?' "
                                                    "in --faults: the same seed gives the same run."),
                 timeout: float = typer.Option(3600.0, "--timeout", min=10.0, help="Stop every peer after this many "
                                               "seconds."),
                 verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Start a bootstrap and N peers as processes on this machine, show them live, print a summary."""
    import time as _time

    from gradnode.node.sim import simulate as sim

    _load(config, set_)  # fail fast on a bad config, before any process starts
    _setup_logging(verbose)
    if bandwidth is not None:
        from gradnode.node.config import parse_rate
        try:
            parse_rate(bandwidth)
        except ValueError as err:
            typer.echo(f"--bandwidth: {err}", err=True)
            raise typer.Exit(2) from None
    _check_link(link, bandwidth)
    from gradnode.node.sim import faults

    try:
        faults.parse(faults_spec, peers, rounds, seed or 0)  # fail fast, before any process starts
    except ValueError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    out = output_dir or Path("runs") / f"simulate-{_time.strftime('%Y%m%d-%H%M%S')}"
    settings = sim.SimSettings(peers=peers, rounds=rounds, config=config, out_dir=out.resolve(),
                               bandwidth=bandwidth, link=link, overrides=list(set_ or []), faults=faults_spec,
                               seed=seed, timeout_s=timeout)
    try:
        summary = sim.run(settings)
    except KeyboardInterrupt:
        typer.echo("interrupted: all peers stopped", err=True)
        raise typer.Exit(130) from None
    if plot_path is not None:
        sim.plot(summary, plot_path)
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        sim.print_summary(summary)
    if not summary["identical_hashes"]:
        raise typer.Exit(1)


@bench_app.command("swarm")
def bench_swarm_cmd(sizes: str = typer.Option("2,4,8", "--sizes", help="Swarm sizes for the traffic table."),
                    rounds: int = typer.Option(6, "--rounds", min=2, help="Rounds per swarm."),
                    bandwidth: str = typer.Option("20mbit", "--bandwidth", help="Link cap for the utilisation run."),
                    link: str = LinkOpt,
                    config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
                    as_json: bool = typer.Option(False, "--json")) -> None:
    """Utilisation at 4 peers under a link cap, non-overlapped communication, bytes per peer at 2/4/8."""
    from gradnode.node.bench import swarm as bench_swarm

    _load(config, set_)
    _check_link(link, bandwidth)
    counts = [int(x) for x in sizes.split(",") if x.strip()]
    result = bench_swarm.run(counts, rounds=rounds, bandwidth=bandwidth, config=config, overrides=list(set_ or []),
                             link=link)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        bench_swarm.print_result(result)


@app.command("train")
def train_cmd(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
              rounds: Optional[int] = typer.Option(None, "--rounds", help="Override the top-level `rounds`."),
              output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Override run.output_dir."),
              device: Optional[str] = typer.Option(None, "--device", help="cpu, cuda or cuda:N (default: inner.device)."),
              eval_every: int = typer.Option(5, "--eval-every", min=1, help="Validate every N rounds."),
              verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    """Train one peer alone, end to end (no network), with a progress bar and a final summary."""
    extra: dict[str, Any] = {}
    if rounds is not None:
        extra["rounds"] = rounds
    if output_dir is not None:
        extra["run.output_dir"] = str(output_dir)
    cfg = _load(config, set_, extra)
    _setup_logging(verbose)
    from rich.console import Console

    from gradnode.node.train.solo import summary_table, train

    console = Console()
    try:
        summary = train(cfg, eval_every=eval_every, console=console, device=device)
    except ValueError as err:  # user mistakes: data paths, corrupt checkpoints, devices
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    console.print(summary_table(cfg, summary))


@bench_app.command("quality")
def bench_quality_cmd(
        replicas: int = typer.Option(4, "--replicas", "-r", min=1, max=64, help="Replicas (peers) per algorithm."),
        rounds: int = typer.Option(20, "--rounds", "-n", min=1, help="Outer rounds per algorithm."),
        inner_steps: int = typer.Option(15, "--inner-steps", min=1, help="H: inner steps per round."),
        size: str = typer.Option("small", "--size", help="Model size: small (default, ~10 min on 2 CPU cores "
                                                          "in all), medium or large."),
        algorithms: Optional[list[str]] = typer.Option(None, "--algorithm", "-a", help="Run only these "
                                                       "(repeatable): ddp, diloco, sparseloco-packed12, sparseloco-rice."),
        inner_lr: float = typer.Option(1.5e-3, "--inner-lr", help="Peak inner AdamW lr, every algorithm "
                                       "(measured best for each)."),
        sparseloco_lr: float = typer.Option(1.0, "--sparseloco-lr", help="Outer learning rate of SparseLoCo."),
        ef_beta: float = typer.Option(0.9, "--ef-beta", help="SparseLoCo error-feedback decay (measured best)."),
        diloco_lr: float = typer.Option(0.5, "--diloco-lr", help="Outer learning rate of DiLoCo (measured best)."),
        aggregation: str = typer.Option("coord_mean", "--aggregation", help="SparseLoCo/DiLoCo aggregation: "
                                        "coord_mean (measured best) or mean."),
        seed: int = typer.Option(0, "--seed", min=0),
        set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a config key for every algorithm, "
                                                 "e.g. --set inner.batch_size=16 (repeatable)."),
        device: Optional[str] = typer.Option(None, "--device", help="cpu, cuda (default: auto)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
        plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of val loss vs tokens."),
        verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Compressed vs dense training: DDP AdamW, DiLoCo, SparseLoCo (12-bit and entropy-coded indices)."""
    import logging

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from gradnode.node.bench import quality as bq

    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if aggregation not in ("mean", "coord_mean"):
        typer.echo("--aggregation must be mean or coord_mean", err=True)
        raise typer.Exit(2)
    settings = bq.BenchSettings(replicas=replicas, rounds=rounds, inner_steps=inner_steps, size=size, seed=seed,
                                inner_lr=inner_lr, sparseloco_lr=sparseloco_lr, ef_beta=ef_beta, diloco_lr=diloco_lr,
                                aggregation=aggregation,
                                device=device)
    try:
        settings.overrides = dict(parse_override(o) for o in set_ or [])
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    names = tuple(algorithms) if algorithms else bq.ALGORITHMS
    err_console = Console(stderr=True)
    try:
        with Progress(console=err_console, transient=True) as progress:
            tasks = {n: progress.add_task(n, total=rounds) for n in names}
            results = bq.run_bench(settings, names, lambda n, r: progress.update(tasks[n], completed=r))
        if plot_path is not None:
            bq.plot(results, str(plot_path), f"{replicas} replicas, H={inner_steps}, {rounds} rounds ({size})")
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(bq.results_json(settings, results)))
        return
    console = Console() if sys.stdout.isatty() else Console(width=130)  # keep the table whole in logs
    table = Table(title=f"quality: {replicas} replicas, H={inner_steps}, {rounds} rounds, "
                        f"{results[0].params:,} params, {results[0].tokens:,} tokens each")
    for col in ("algorithm", "val loss", "bits/param/round", "bytes/peer/round", "x smaller than fp32", "time"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")
    for r in results:
        table.add_row(r.algorithm, f"{r.val_loss:.4f}", f"{r.bits_per_param_per_round:.4g}",
                      f"{r.bytes_per_peer_per_round:,.0f}", f"{r.fp32_ratio:,.1f}", f"{r.seconds:.0f} s")
    console.print(table)
    for goal, measured, bound, met in bq.goals(results):
        op = ">=" if "smaller" in goal else "<="
        console.print(f"{'met ' if met else 'MISSED'} {goal}: {measured:.4f} ({op} {bound})")
    if plot_path is not None:
        console.print(f"plot written to {plot_path}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
