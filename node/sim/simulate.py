"""`gradnode simulate`: a bootstrap and N peers as separate processes on this machine, with a live view.

Every process runs the real CLI (`gradnode bootstrap`, `gradnode join`) in its own session, and is
stopped by its PID (its process group: the peer, its DHT process and its libp2p daemon) at the end, on
an error, or on Ctrl+C. On this host they are forked from one process that imported torch and hivemind
once (zygote.py: ~3 CPU-seconds saved per process started); a process in a network namespace is started
by `ip netns exec` as a fresh one. Peers report through files: a metrics line per
round (the live view) and a summary JSON when they finish. A fault schedule (faults.py) kills,
restarts, stops and starts peers late when the swarm reaches given rounds; a restarted peer runs
the same command again and resumes from its checkpoint.

With `--bandwidth RATE` every peer's link is capped by one of two shapers (`--link`):
- `netns` (root only, node/netns.py): each peer runs in its own network namespace behind a veth with a
  tc tbf qdisc each way; the kernel's TCP sees a real slow link. The bootstrap stays on the host.
- `bucket`: everything on 127.0.0.1, and the transport paces its own bytes (`swarm.bandwidth`).
`auto` picks netns where it works. Without `--bandwidth` nothing is capped and all runs on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradnode.node import write_json
from gradnode.node.config import peer_id_of
from gradnode.node.shutdown import Shutdown, kill_descendants
from gradnode.node.sim import faults, netns, traffic, zygote
from gradnode.node.swarm import progress

log = logging.getLogger(__name__)

LINKS = ("auto", "netns", "bucket")  # how --bandwidth caps links (module docstring)


@dataclass
class SimSettings:
    peers: int
    rounds: int
    config: Path | None
    out_dir: Path
    bandwidth: str | None = None
    link: str = "auto"  # one of LINKS; only matters with a bandwidth
    overrides: list[str] = field(default_factory=list)
    peer_overrides: dict[int, list[str]] = field(default_factory=dict)
    timeout_s: float = 1800.0
    eval_peers: int = 1
    eval_index: int | None = None  # evaluate on this peer only (default: peers below eval_peers)
    faults: str | None = None  # the --faults SPEC (faults.py)
    seed: int | None = None  # run.seed and the picks of '?' in the SPEC
    serve: int | None = None  # the bootstrap serves the status page on this port; peers expose metrics


def resolve_link(link: str, bandwidth: str | None) -> str:
    """The shaper a run will use: 'netns', 'bucket', or 'none' without a bandwidth. Raises ValueError
    (before anything starts) for an unknown mode, or for 'netns' where namespaces cannot be made."""
    if link not in LINKS:
        raise ValueError(f"--link must be one of {', '.join(LINKS)}, not {link!r}")
    if bandwidth is None:
        if link == "netns":
            raise ValueError("--link netns caps links at --bandwidth: give a rate too, e.g. --bandwidth 20mbit")
        return "none"
    if link == "bucket":
        return "bucket"
    ok, why = netns.available()
    if link == "netns" and not ok:
        raise ValueError(f"--link netns: network namespaces + tc cannot be used here ({why}); "
                         "use --link bucket for the transport's token bucket")
    return "netns" if ok else "bucket"


def describe_link(link: str, s: SimSettings) -> str:
    """One line for the log: which shaper caps the links and, where `auto` fell back to the token
    bucket, why."""
    if link == "netns":
        return f"netns: {s.bandwidth} each way per peer, tc tbf on veths into per-peer network namespaces"
    if link == "bucket":
        why = "" if s.link == "bucket" else f" (network namespaces unavailable: {netns.available()[1]})"
        return f"bucket: {s.bandwidth} each way per peer, token bucket in the transport{why}"
    return "none: no --bandwidth, peers on 127.0.0.1 uncapped"


def with_genesis(s: SimSettings, intruders: list[int], replayers: list[int]) -> dict[str, list[str]]:
    """Make the run a genesis run, as an operator would with `gradnode run init`: permissioned when there are
    ``intruders`` (an authority key, named in the genesis, admits the bootstrap and every other peer; each
    process's key is made here, in its run folder, where it will find it), open otherwise. Each of
    ``replayers`` keeps the genesis of an earlier run of the same name, config and seed (it took part in
    it): ``earlier-genesis.json`` in its folder. Returns the arguments each process starts with."""
    import secrets

    from gradnode.node.config import load_config, parse_override, shared_rules
    from gradnode.node.swarm import admission
    from gradnode.node.swarm.identity import load_or_create
    from gradnode.node.train.engine import initial_weights_hash
    from gradnode.protocol.genesis import Genesis

    overrides = dict(parse_override(o) for o in s.overrides)
    if s.seed is not None:
        overrides["run.seed"] = s.seed
    cfg = load_config(s.config, overrides)
    authority = load_or_create(s.out_dir / "authority.key") if intruders else None

    def genesis_of(created: float) -> Genesis:
        return Genesis(name=cfg.run.run_id[:47], rules=shared_rules(cfg), weights_hash=initial_weights_hash(cfg),
                       nonce=secrets.token_hex(16), authority=authority.public_der.hex() if authority else None,
                       created=created)

    genesis = genesis_of(time.time())
    (s.out_dir / "genesis.json").write_text(genesis.to_json())
    extra: dict[str, list[str]] = {}
    for name in ["bootstrap", *(f"peer-{i}" for i in range(s.peers))]:
        folder = s.out_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        extra[name] = ["--set", f"run.genesis={s.out_dir / 'genesis.json'}"]
        if name != "bootstrap" and _index(name) in replayers:
            (folder / "earlier-genesis.json").write_text(genesis_of(time.time() - 86400).to_json())
        if authority is None or (name != "bootstrap" and _index(name) in intruders):
            continue
        peer = load_or_create(folder / "identity.key").peer_id
        (folder / "admission.cert").write_bytes(admission.admit(authority, genesis.run_id, peer, time.time() + 86400))
        extra[name] += ["--set", f"run.admission={folder / 'admission.cert'}"]
    log.info("%s run %s: intruders %s, replaying an earlier run: %s", "permissioned" if authority else "open",
             genesis.run_id, intruders, replayers)
    return extra


PROMETHEUS_YML = """# written by `gradnode simulate --serve`: prometheus --config.file=<this file>
global:
  scrape_interval: 5s
scrape_configs:
  - job_name: gradnode
    file_sd_configs:
      - files: ["{targets}"]
        refresh_interval: 5s
"""


class Swarm:
    """The processes of one simulated swarm; a context manager that always cleans up. With `links`,
    peer i runs inside namespace i and listens on its address there; the bootstrap on the host side."""

    def __init__(self, s: SimSettings, links: netns.Links | None = None, partition_in_transport: bool = False) -> None:
        self.s = s
        self.links = links
        self.procs: dict[str, subprocess.Popen | zygote.Forked] = {}
        # the processes on this host are forked from one that imported torch and hivemind once (zygote.py);
        # None until the first starts, False where it would not serve (then each one starts the usual way)
        self.zygote: zygote.Zygote | None | bool = None
        self.logs: list[Any] = []
        self.args: dict[str, list[str]] = {}  # the command of every peer, for restarts
        self.starts: dict[str, list[int]] = {}  # swarm round at every (re)start of a process
        self.initial: list[str] = []
        # every process's temp files (the libp2p daemon's sockets, multiprocessing folders) go to one short
        # folder of this run, removed at the end: a kill -9 leaves nothing behind in /tmp
        self.tmp = tempfile.mkdtemp(prefix="gn-")
        self.bootstrap_port = 0
        # a partition without network namespaces: each peer's transport reads whom to drop from this file
        self.partition_file: str | None = "partition.json" if partition_in_transport else None
        self.extra: dict[str, list[str]] = {}  # more arguments per process (a permissioned run's files)
        self.metrics_targets: dict[str, str] = {}  # name -> host:port of its Prometheus metrics (--serve)

    def __enter__(self) -> "Swarm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_all()
        if isinstance(self.zygote, zygote.Zygote):
            self.zygote.close()
        # torch_shm_manager (started by torch for hivemind's shared memory) lives outside the peers' process
        # groups and removes its own folder here once its clients are gone: let it, or it aborts at exit
        end = time.monotonic() + 5.0
        while any(Path(self.tmp).glob("torch-shm-dir-*")) and time.monotonic() < end:
            time.sleep(0.1)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen | zygote.Forked:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=self.tmp)
        log_path = self.s.out_dir / f"{name}.log"
        prefix = self.links.exec_prefix(_index(name)) if self.links and name != "bootstrap" else []
        proc: subprocess.Popen | zygote.Forked | None = None
        if not prefix:  # a process in a namespace is started by `ip netns exec`: not forked here
            proc = self._fork(env, args, log_path)
        if proc is None:
            logf = open(log_path, "a")
            self.logs.append(logf)
            proc = subprocess.Popen([*prefix, sys.executable, "-m", "gradnode.node.cli", *args], stdout=logf,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs[name] = proc
        log.info("started name=%s pid=%d", name, proc.pid)
        return proc

    def _fork(self, env: dict[str, str], args: list[str], log_path: Path) -> zygote.Forked | None:
        """The process forked from the zygote (started at the first call), or None where it does not serve."""
        if self.zygote is None:
            z = zygote.Zygote(env, self.s.out_dir / "zygote.log")
            self.zygote = z if z.start() else False
            if self.zygote is False:
                log.warning("the zygote does not serve (see %s): processes start one by one",
                            self.s.out_dir / "zygote.log")
                z.close()
        if not isinstance(self.zygote, zygote.Zygote):
            return None
        try:
            return self.zygote.fork(args, log_path)
        except RuntimeError as e:
            log.warning("%s: starting processes one by one from now on", e)
            self.zygote = False
            return None

    def _host_ip(self, name: str) -> str:
        """Where a process listens: loopback, or with links its namespace's address (the bridge's for the
        bootstrap)."""
        if self.links is None:
            return "127.0.0.1"
        return self.links.host_ip if name == "bootstrap" else self.links.peers[_index(name)][1]

    def _common(self, name: str) -> list[str]:
        # the bootstrap listens on a fixed port: restarted, it comes back at the address peers were given
        port = self.bootstrap_port if name == "bootstrap" else 0
        # every process here has a key of its own, made in its own folder, and a restart follows the end of the
        # process it replaces: hivemind's check that nobody else runs the key (swarm.identity_check) is skipped
        args = ["--set", f"run.output_dir={self.s.out_dir / name}", "--set", "swarm.identity_check=false",
                "--set", f"swarm.host_maddrs=['/ip4/{self._host_ip(name)}/tcp/{port}']", *self.extra.get(name, [])]
        if self.partition_file is not None and name != "bootstrap":
            args += ["--set", f"swarm.fault_partition_file={self.s.out_dir / name / 'partition.json'}"]
        if self.s.config is not None:
            args += ["--config", str(self.s.config)]
        for o in self.s.overrides:
            args += ["--set", o]
        if self.s.seed is not None:
            args += ["--set", f"run.seed={self.s.seed}"]
        if self.s.serve is not None:  # each process's metrics on a port of its own, listed for Prometheus
            if name not in self.metrics_targets:
                ip = self._host_ip(name)
                self.metrics_targets[name] = f"{ip}:{_free_port(ip)}"
                write_json(self.s.out_dir / "prometheus-targets.json",
                            [{"targets": [t], "labels": {"process": n}} for n, t in self.metrics_targets.items()])
                prometheus_yml = self.s.out_dir / "prometheus.yml"  # `prometheus --config.file=` this file
                if not prometheus_yml.exists():
                    prometheus_yml.write_text(PROMETHEUS_YML.format(targets=self.s.out_dir / "prometheus-targets.json"))
            ip, port = self.metrics_targets[name].rsplit(":", 1)
            args += ["--set", f"metrics.port={port}", "--set", f"metrics.host={ip}"]
        return args

    def start_bootstrap(self, timeout: float = 120.0, wait: bool = True) -> list[str]:
        """Start the bootstrap and return the address peers join with. ``wait``: once it is up (the addresses
        it printed); else at once: its key is made here and its port chosen here, so its address is known
        before it runs, and peers started meanwhile keep dialling it (swarm.connect_timeout_s) while both
        start (python and torch take seconds each; then call ``bootstrap_ready``)."""
        from gradnode.node.swarm.identity import load_or_create

        maddr_file = self.s.out_dir / "bootstrap.maddrs"
        self.bootstrap_port = _free_port(self._host_ip("bootstrap"))
        key = load_or_create(self.s.out_dir / "bootstrap" / "identity.key")  # where the bootstrap looks for it
        self.args["bootstrap"] = ["bootstrap", *self._common("bootstrap"), "--maddrs-file", str(maddr_file)]
        if self.s.serve is not None:
            self.args["bootstrap"] += ["--status-port", str(self.s.serve)]
        self.starts["bootstrap"] = [0]
        self._spawn("bootstrap", self.args["bootstrap"])
        if not wait:
            return [f"/ip4/{self._host_ip('bootstrap')}/tcp/{self.bootstrap_port}/p2p/{key.peer_id}"]
        return self.bootstrap_ready(timeout)

    def bootstrap_ready(self, timeout: float = 120.0) -> list[str]:
        """The addresses the bootstrap printed once up; ValueError with its last error when it did not start."""
        maddr_file = self.s.out_dir / "bootstrap.maddrs"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if maddr_file.exists() and maddr_file.read_text().strip():
                return maddr_file.read_text().split()
            if self.procs["bootstrap"].poll() is not None:
                break
            time.sleep(0.2)
        log_path = self.s.out_dir / "bootstrap.log"
        errors = [line for line in log_path.read_text().splitlines() if line.startswith("error: ")] \
            if log_path.exists() else []
        raise ValueError(f"the bootstrap did not start: {errors[-1][7:] if errors else 'no address within '}"
                         f"{'' if errors else f'{timeout:.0f} s'} (its log: {log_path})")

    def start_peer(self, i: int, initial: list[str], min_peers: int | None = None, round_: int = 0) -> None:
        name = f"peer-{i}"
        (self.s.out_dir / name).mkdir(parents=True, exist_ok=True)
        args = ["join", *self._common(name), "--peer-index", str(i), "--rounds", str(self.s.rounds),
                "--metrics", str(self.s.out_dir / name / "metrics.jsonl"),
                "--summary", str(self.s.out_dir / name / "summary.json"),
                "--maddrs-file", str(self.s.out_dir / name / "maddrs"),
                "--set", f"swarm.min_peers={min_peers or self.s.peers}"]
        for m in initial:
            args += ["--initial-peer", m]
        if self.s.bandwidth and self.links is None:  # with links tc caps it; shaping twice would halve it
            args += ["--set", f"swarm.bandwidth={self.s.bandwidth}"]
        evaluates = i == self.s.eval_index if self.s.eval_index is not None else i < self.s.eval_peers
        if not evaluates:
            args += ["--no-eval"]
        for o in self.s.peer_overrides.get(i, []):
            args += ["--set", o]
        self.args[name] = args
        self.starts.setdefault(name, []).append(round_)
        self._spawn(name, args)

    def restart(self, name: str, round_: int) -> None:
        """Run a stopped or killed process's command again, as an operator would: a peer gets the bootstrap's
        address and finds the rest through its own address book, nothing more."""
        if self.running(name):
            self.kill(name)
            self.procs[name].wait()
        self.starts[name].append(round_)
        (self.s.out_dir / name / "summary.json").unlink(missing_ok=True)  # written again when it finishes
        self._spawn(name, self.args[name])

    def partition(self, groups: tuple[tuple[int, ...], ...]) -> None:
        """Cut the network between the groups (the bootstrap stays with the first): with network namespaces
        by routes that drop the other groups' packets, else each peer's transport drops their traffic."""
        if self.links is not None:
            self.links.cut([list(g) for g in groups])
            return
        ids = {i: _peer_id(self.s.out_dir / f"peer-{i}" / "maddrs") for g in groups for i in g}
        boot = _peer_id(self.s.out_dir / "bootstrap.maddrs")
        for k, group in enumerate(groups):
            away = [ids[j] for g in groups if g is not group for j in g] + ([boot] if k else [])
            for i in group:
                write_json(self.s.out_dir / f"peer-{i}" / "partition.json", {"blocked": [x for x in away if x]})

    def heal(self) -> None:
        if self.links is not None:
            self.links.heal()
            return
        for i in range(self.s.peers):
            write_json(self.s.out_dir / f"peer-{i}" / "partition.json", {"blocked": []})

    def running(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def peers_running(self, ignore: frozenset[str] = frozenset()) -> int:
        return sum(1 for n, p in self.procs.items() if n != "bootstrap" and n not in ignore and p.poll() is None)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """SIGKILL goes to the peer's whole process group (itself, its DHT process, its p2pd); SIGTERM only
        to the peer, which then leaves gracefully and shuts its DHT and daemon down itself."""
        proc = self.procs[name]
        if proc.poll() is None:
            try:
                if sig == signal.SIGKILL:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop_all(self, grace: float = 10.0) -> None:
        for name in self.procs:
            self.kill(name, signal.SIGTERM)
        end = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for name, proc in self.procs.items():
            self.kill(name, signal.SIGKILL)  # also reaps leftovers of a group whose leader already exited
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        for f in self.logs:
            f.close()


def _index(name: str) -> int:
    return int(name.split("-")[1])  # "peer-3" -> 3


def _free_port(ip: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def _peer_id(maddrs_file: Path) -> str | None:
    """The peer id in a process's address file (None before it wrote one)."""
    if not maddrs_file.exists():
        return None
    return next(filter(None, map(peer_id_of, maddrs_file.read_text().split())), None)


def swarm_round(s: SimSettings, groups: tuple[tuple[int, ...], ...] = ()) -> int:
    """The round the swarm trains now: one past the newest round any peer applied. While the network is
    split into ``groups``, the round every group of two or more peers has reached (the sides train at their
    own pace; a lone peer pauses, never training alone)."""
    def newest(indices: Any) -> int:
        rows = [read_metrics(s.out_dir / f"peer-{i}" / "metrics.jsonl") for i in indices]
        rounds = [r[-1]["round"] for r in rows if r]
        return max(rounds, default=-1) + 1

    sides = [g for g in groups if len(g) > 1]
    return min(newest(g) for g in sides) if sides else newest(range(s.peers))


def _fire(swarm: Swarm, event: Any, round_: int) -> None:
    log.info("fault %s:%s at round=%d", event.action, event.target, round_)
    if event.action == "kill":
        swarm.kill(event.target)
    elif event.action == "stop":
        swarm.kill(event.target, signal.SIGTERM)
    elif event.action == "restart":
        swarm.restart(event.target, round_)
    elif event.action == "join":  # as a volunteer would: the bootstrap's address, nothing more
        swarm.start_peer(_index(event.target), swarm.initial, min_peers=2, round_=round_)
    elif event.action == "partition":
        swarm.partition(event.groups)
    elif event.action == "heal":
        swarm.heal()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written
    return rows


# The live view fits 80 columns: short headers, explained once under the table.
LIVE_COLUMNS = ("peer", "round", "loss", "hash", "upd", "up MB", "dn MB", "wait", "rej", "sync", "now")
LIVE_LEGEND = ("hash: of the shared weights; upd: updates applied in the round; wait: seconds the "
               "round's outcome was waited for; rej: updates rejected; sync: re-syncs; now: what the peer "
               "does (step: its inner step)")


def peer_name(index: int) -> str:
    return f"peer-{index}"


def live_table(s: SimSettings, started: float) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(title=f"gradnode simulate: {s.peers} peers, {time.monotonic() - started:.0f} s", box=box.SIMPLE_HEAD,
              pad_edge=False, collapse_padding=True,
              caption=LIVE_LEGEND, caption_justify="left")
    for col in LIVE_COLUMNS:
        t.add_column(col, justify="left" if col == "peer" else "right", no_wrap=True)
    for i in range(s.peers):
        rows = read_metrics(s.out_dir / peer_name(i) / "metrics.jsonl")
        now = progress.read(s.out_dir / peer_name(i))
        doing = now.short() if now is not None else "start"
        if not rows:
            t.add_row(peer_name(i), f"0/{s.rounds}", "-", "-", "", "", "", "", "", "", doing)
            continue
        r = rows[-1]
        t.add_row(peer_name(i), f"{r['round'] + 1}/{s.rounds}", f"{r['loss']:.3f}" if r["loss"] else "-",
                  (r["hash"] or "")[:6], str(r["applied"]), f"{r['bytes_up'] / 1e6:.1f}",
                  f"{r['bytes_down'] / 1e6:.1f}", f"{r['wait_s']:.1f}", str(r["rejected"]), str(r["resyncs"]), doing)
    return t


def run(s: SimSettings, *, live: bool = True, on_swarm: Any = None, console: Any = None) -> dict[str, Any]:
    """Run the swarm to the end; returns the summary object (`--json`). The live view goes to ``console``
    (stderr by default), the one logging writes to, so that log lines print above it."""
    from rich.console import Console
    from rich.live import Live


    link = resolve_link(s.link, s.bandwidth)  # may refuse: before any folder or process is made
    schedule = faults.parse(s.faults, s.peers, s.rounds, s.seed or 0)
    for index, sets in schedule.overrides.items():
        s.peer_overrides[index] = [*s.peer_overrides.get(index, []), *sets]
    if s.eval_index is None and schedule.events:  # evaluate on a peer the schedule leaves alone
        calm = [i for i in range(s.peers) if i not in schedule.disturbed() and i not in schedule.overrides]
        s.eval_index = calm[0] if calm else None
    s.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pending = list(schedule.events)
    log.info("link shaping: %s", describe_link(link, s))
    # a partition cuts namespaces' routes where they can be made (unless --link bucket said not to use
    # them), else each peer's transport drops the other groups' traffic
    partition = None if not schedule.partitioned else "netns" if link == "netns" or \
        (s.link != "bucket" and netns.available()[0]) else "transport"
    if partition:
        log.info("partitions: %s", "network namespaces, routes cut" if partition == "netns" else
                 "in the transport (no network namespaces here)")
    with _signals_unwind(), contextlib.ExitStack() as stack:
        # exits in reverse: the processes are stopped before their namespaces go
        rate = s.bandwidth if link == "netns" else None
        links = stack.enter_context(netns.Links(s.peers, rate)) if link == "netns" or partition == "netns" else None
        swarm = stack.enter_context(Swarm(s, links, partition_in_transport=partition == "transport"))
        intruders = [i for i, r in schedule.roles.items() if r == "intruder"]
        replayers = [i for i, r in schedule.roles.items() if r == "crossrun"]
        if intruders or replayers:
            swarm.extra = with_genesis(s, intruders, replayers)
        initial = swarm.start_bootstrap(wait=False)  # the peers start beside it, not after it
        swarm.initial = initial
        first = [i for i in range(s.peers) if i not in schedule.late]
        for i in first:  # intruders are nobody: the others do not count on them
            swarm.start_peer(i, initial, min_peers=len([j for j in first if j not in intruders]))
        swarm.bootstrap_ready()  # or its error, the peers stopped with the swarm
        # nobody works with an intruder, so it may never finish: the run ends when the others have
        waits_for = frozenset(f"peer-{i}" for i in intruders)
        if on_swarm is not None:
            on_swarm(swarm)
        end = started + s.timeout_s
        split: tuple[tuple[int, ...], ...] = ()  # the groups of a partition in force
        console = console or Console(stderr=True)
        with Live(live_table(s, started), console=console, refresh_per_second=2, transient=False,
                  auto_refresh=False) as view:
            while (swarm.peers_running(ignore=waits_for) or pending) and time.monotonic() < end:
                if pending:
                    now = swarm_round(s, split)
                    while pending and pending[0].round <= now:
                        event = pending.pop(0)
                        _fire(swarm, event, now)
                        split = event.groups if event.action == "partition" else () if event.action == "heal" \
                            else split
                    if not swarm.peers_running() and pending:
                        log.warning("no peer left to reach round %d; dropping %d fault(s)", pending[0].round,
                                    len(pending))
                        pending.clear()
                if live:
                    view.update(live_table(s, started), refresh=True)
                time.sleep(0.5)
            view.update(live_table(s, started), refresh=True)
        if not console.is_terminal:
            console.line()  # a log file or pipe: end the last frame's line before the summary follows
        starts = dict(swarm.starts)
    return {**collect(s, time.monotonic() - started, starts), "link": link, "partition": partition}


class Interrupted(KeyboardInterrupt):
    """A signal ended the simulation; its processes are stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """The first SIGTERM or SIGINT raises Interrupted while the swarm runs, so that the `with` blocks stop the
    processes (each gets SIGTERM and swarm.stop_all's grace) and remove the namespaces (Python's default
    SIGTERM would exit without either). A second signal kills every process below this one at once, so that
    the unwinding does not wait out the grace."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int) -> None:
        raise Interrupted(signum)

    with Shutdown(on_request=_raise, at_once=lambda _signum: kill_descendants()):
        yield


def collect(s: SimSettings, seconds: float, starts: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """The summary: per peer its role (honest or its fault), figures and life (joined_round, restarts,
    resyncs); identical final hashes are judged among the honest peers alive at the end (those that
    finished every round)."""
    peers = []
    val_first = val_last = measure = None
    starts = starts or {}
    schedule = faults.parse(s.faults, s.peers, s.rounds, s.seed or 0)
    for i in range(s.peers):
        name = f"peer-{i}"
        path = s.out_dir / name / "summary.json"
        rows = read_metrics(s.out_dir / name / "metrics.jsonl")
        life = {"role": schedule.role(i), "restarts": max(0, len(starts.get(name, [0])) - 1),
                "joined_round": rows[0].get("joined_round", 0) if rows else None,
                "first_contribution": next((r["round"] for r in rows if r.get("own_included")), None)}
        if not path.exists():
            peers.append({"peer": name, "index": i, "error": "no summary (crashed or killed)", **life})
            continue
        d = json.loads(path.read_text())
        if d.get("val_loss_first") is not None and val_first is None:
            val_first, val_last, measure = d["val_loss_first"], d["val_loss_last"], d.get("val_loss_measure")
        peers.append({"peer": d["peer"], "index": i, "final_loss": d["final_loss"], "param_hash": d["param_hash"],
                      "rounds": d["rounds"], "bytes_up": d["bytes_up"], "bytes_down": d["bytes_down"],
                      "utilization": round(d["utilization"], 4), "rejected_updates": d["rejected_updates"],
                      "comm_wait_s_per_round": round(d["comm_wait_s_per_round"], 4), "resyncs": d["resyncs"],
                      "utilization_steady": round(d.get("utilization_steady", 0.0), 4),
                      "comm_wait_s_per_round_steady": round(d.get("comm_wait_s_per_round_steady", 0.0), 4),
                      "own_excluded": d["own_excluded"], "rejected_by_sender": d["rejected_by_sender"],
                      "catchups": d.get("catchups", 0), "state_downloads": d.get("state_downloads", 0),
                      "rejected_state_offers": d.get("rejected_state_offers", 0),
                      "resumed_round": d.get("resumed_round"), "state_bytes_up": d.get("state_bytes_up", 0),
                      "own_update_bytes_up": d.get("own_update_bytes_up", 0),
                      "clock_ahead_s": d.get("clock_ahead_s"), "clock_error_s": d.get("clock_error_s"),
                      "contributed": d.get("contributed", 0), "abstained": d.get("abstained", 0),
                      "undrawn": d.get("undrawn", 0),
                      "phase_s_per_round": d.get("phase_s_per_round", {}), "hashes": d["hashes"],
                      **_traffic(d, rows), **life})
    rounds = max((p.get("rounds", 0) for p in peers), default=0)
    live = [p for p in peers if "error" not in p and p["rounds"] == rounds and p["role"] == "honest"]
    losses = [r["loss"] for r in read_metrics(s.out_dir / f"peer-{s.eval_index or 0}" / "metrics.jsonl")
              if r.get("loss") is not None]
    return {"peers": peers, "rounds": rounds, "val_loss_first": val_first, "val_loss_last": val_last,
            "val_loss_measure": measure,
            "train_loss_first": losses[0] if losses else None, "train_loss_last": losses[-1] if losses else None,
            "live_peers": len(live), "identical_hashes": bool(live) and len({p["param_hash"] for p in live}) == 1,
            "traffic": traffic.summary(live),
            "seconds": round(seconds, 1), "faults": s.faults, "seed": s.seed, "out_dir": str(s.out_dir)}


def _traffic(d: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A peer's traffic per round (node/sim/traffic.py: between its first and last applied rounds, of the
    process that wrote its summary), the most updates it held, one DHT read's mean seconds."""
    life = [r for r in rows if "traffic" in r and r.get("started") == rows[-1].get("started")] if rows else []
    records = d.get("records", {})
    return {"per_round": traffic.between({**life[0]["traffic"], "seconds": life[0]["time"]},
                                         {**life[-1]["traffic"], "seconds": life[-1]["time"]}, len(life) - 1)
            if len(life) > 1 else None,
            "peak_updates_held": d.get("peak_updates_held", 0), "state_bytes_down": d.get("state_bytes_down", 0),
            "dht_read_s": records.get("read_ms", 0) / 1000 / max(1, records.get("reads", 0)),
            "records": records, "records_by_table": d.get("records_by_table", {})}


def plot(summary: dict[str, Any], path: Path) -> None:
    """Training loss per round of every peer (needs matplotlib: pip install 'gradnode[plot]')."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    out = Path(summary["out_dir"])
    for p in summary["peers"]:
        rows = read_metrics(out / f"peer-{p.get('index', 0)}" / "metrics.jsonl")
        ax.plot([r["round"] for r in rows], [r["loss"] for r in rows], label=peer_name(p.get("index", 0)))
    ax.set_xlabel("round")
    ax.set_ylabel("train loss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_summary(summary: dict[str, Any], console: Any = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    def r3(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    measure = f" {summary['val_loss_measure']}" if summary.get("val_loss_measure") else ""  # its unit and bytes
    t = Table(title=f"{summary['rounds']} rounds in {summary['seconds']:.0f} s; val loss "
                    f"{r3(summary['val_loss_first'])} -> {r3(summary['val_loss_last'])}{measure}; identical weights: "
                    f"{'yes' if summary['identical_hashes'] else 'NO'}; link shaping: {summary.get('link', 'none')}",
              box=box.SIMPLE_HEAD)
    for col in ("peer", "id", "rounds", "loss", "weights", "up MB", "dn MB", "util", "rej"):
        t.add_column(col, justify="left" if col in ("peer", "id") else "right", no_wrap=True)
    for p in summary["peers"]:
        name = peer_name(p["index"])
        if "error" in p:
            t.add_row(name, "-", "-", "-", p["error"], "", "", "", "")
            continue
        t.add_row(name, p["peer"][:8], str(p["rounds"]), r3(p["final_loss"]), p["param_hash"][:8],
                  f"{p['bytes_up'] / 1e6:.2f}", f"{p['bytes_down'] / 1e6:.2f}", f"{p['utilization']:.1%}",
                  str(p["rejected_updates"]))
    (console or Console()).print(t)
