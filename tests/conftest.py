"""Shared fixtures. Swarm tests spawn real peers (bootstrap + `gradnode join` processes on 127.0.0.1)
through gradnode.node.sim.simulate, which stops every process it started by PID, also on failure."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, settings

# Property tests judge what the code gives, never how fast: a loaded machine (the process tests' swarms on the
# other worker) made one of test_witness.py's examples take 408 ms against hypothesis's default deadline of
# 200 ms, and the suite failed ("Unreliable test timings"). No deadline, and no health check about slow data
# generation, for every property test (one that sets its own settings inherits these).
settings.register_profile("gradnode", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile("gradnode")

# Everything the tests and the processes they start write to the temp folder (pytest's tmp_path, the
# libp2p daemons' sockets, multiprocessing and torch helper folders) goes to one folder per session.
# Each xdist worker makes its own beside the controller's, named after it (a worker inherits the controller's
# environment: GRADNODE_TESTS_TMPDIR, the temp folder the run started with, and GRADNODE_TESTS_SESSION, its folder).
PARENT_TMP = os.environ.setdefault("GRADNODE_TESTS_TMPDIR", tempfile.gettempdir())
_FIRST = os.environ.get("GRADNODE_TESTS_SESSION")
SESSION_TMP = tempfile.mkdtemp(prefix=f"{os.path.basename(_FIRST)}-" if _FIRST else "gn-tests-",
                               dir=PARENT_TMP)  # short: unix socket paths are capped at 107 bytes
os.environ.setdefault("GRADNODE_TESTS_SESSION", SESSION_TMP)
os.environ["TMPDIR"] = SESSION_TMP
tempfile.tempdir = None  # re-read TMPDIR

# The suite runs on two xdist workers (pyproject: -n 2). The process tests (a test marked swarm or process: the
# files of PROCESS_FILES) run on one worker, one test after another, in the order below. The other worker runs
# the process tests of BESIDE first, a file at a time, then the pure tests a file at a time (its module fixtures
# start once), and the simulator's seeded sweeps test by test. Swarms that need the CPU never run at once (two
# paced by sleeping do: see BESIDE): beside the mix of adversaries, the paced peers of the partition test fell
# far enough behind for the others to finish the run without them (seen once, in a trial that spread the swarm
# tests over both workers). The order: the process tests that leave a core idle first, the swarms that need both
# cores last (the mix of adversaries uses 250-290 CPU-seconds in 120-150 s alone: docs/notes/swarm.md).
PROCESS_FILES = ("test_partition.py", "test_swarm_faults.py", "test_transport.py", "test_catchup.py", "test_agreement.py",
                 "test_admission.py", "test_cli.py", "test_signals.py", "test_netns.py", "test_two_hosts.py", "test_genesis.py", "test_eval.py",
                 "test_observe.py", "test_swarm.py", "test_elastic.py", "test_adversaries.py", "test_docker.py",
                 "test_status_page.py")
# Process tests that use little CPU for their time (CPU-seconds of all their processes over wall seconds, measured
# test by test): they run on the other worker while the first of the serial ones run (the partition's peers,
# paced by sleeping: 118 CPU-s in 144 s). The straggler's swarm first (paced too: with the client-mode peer and the
# graceful leave in it, 30 CPU-s in 40 s alone; without them, 33 CPU-s in 57 s alone, 39 in 96 beside the
# partition), then transports and single processes (the trickling holder: 2.5 CPU-s in 25 s). Measured on the
# whole suite: each worker busy for 638 and 653 s, the suite 659 s; before, 720 s (all process tests on one
# worker) and 256 s, the suite 755 s.
BESIDE = ("test_swarm_faults.py", "test_transport.py", "test_catchup.py", "test_agreement.py", "test_cli.py", "test_eval.py",
          "test_status_page.py",  # one headless Chromium at a time, a few CPU-seconds each
          "test_partition.py::test_a_peer_alone_waits_for_its_run_and_says_so",
          "test_partition.py::test_peers_back_after_their_run_ended_are_told_so_and_stop")
SPREAD = ("test_virtual.py",)


def _beside(nodeid: str) -> bool:
    name = nodeid.rsplit("/", 1)[-1]
    return any(name == b or name.startswith(b + "::") or name.startswith(b + "[") for b in BESIDE)


def _tier(nodeid: str) -> int:
    """The order scopes are handed out in: 0, the process tests run one after another (one scope, to the first
    worker); 1, those run beside them (see BESIDE); 2, any other file; 3, a spread file's tests, one each."""
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    if name in PROCESS_FILES:
        return 1 if _beside(nodeid) else 0
    return 3 if name in SPREAD else 2


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduler by scope, with our scopes: the serial process tests one scope, a spread file's tests one
    each, any other file one (xdist's own `xdist_group` marks are not read under pytest 9: tested, 3.8.0)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByTier(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return ("processes", path, path, nodeid)[_tier(nodeid)]

    return ByTier(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (item.get_closest_marker("swarm") or item.get_closest_marker("process")) and \
                item.path.name not in PROCESS_FILES:
            raise pytest.UsageError(f"{item.path.name} starts processes: add it to PROCESS_FILES in tests/conftest.py")

    def rank(item: pytest.Item) -> tuple[int, int]:
        name, tier = item.path.name, _tier(item.nodeid)
        order = PROCESS_FILES if tier == 0 else tuple(b.split("::")[0] for b in BESIDE) if tier == 1 else ()
        return tier, order.index(name) if name in order else 0

    items.sort(key=rank)  # stable: a file's tests keep their order


def pytest_report_header(config: pytest.Config) -> str:
    return (f"temp folder of this session: {SESSION_TMP}, and one per worker, {SESSION_TMP}-* (each removed when "
            f"its tests pass)")


# A model small enough for several peers per core; 4 inner steps per round.
TINY_SWARM = ["model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.seq_len=32", "inner.batch_size=4",
              "inner.steps=4", "inner.warmup_steps=2", "swarm.min_deadline_s=2.0", "swarm.max_wait_s=60",
              "checkpoint.every_rounds=2"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A passing run leaves nothing behind: the temp folder of the session goes (a failing run keeps it to
    look at, its path in the first line of the output; GRADNODE_KEEP_TEST_TMP=1 keeps it always)."""
    if exitstatus == 0 and not os.environ.get("GRADNODE_KEEP_TEST_TMP"):
        from multiprocessing import util

        # last of all at exit: after multiprocessing removed its own folder in it (priority -100)
        util.Finalize(None, shutil.rmtree, args=(SESSION_TMP,), kwargs={"ignore_errors": True}, exitpriority=-101)


def temp_leftovers() -> set[str]:
    """What hivemind's daemons and multiprocessing leave in the temp folder when their process is killed."""
    return {p.name for p in Path(tempfile.gettempdir()).iterdir()
            if p.name.startswith(("hivemind-", "pymp-", "gn-"))}


@pytest.fixture
def run_swarm(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """Run a simulated swarm; afterwards nothing it made is left in the temp folder (kill -9s included)."""
    from gradnode.node.sim import simulate as sim

    def run(peers: int, rounds: int, peer_overrides: dict[int, list[str]] | None = None, on_swarm: Any = None,
            timeout_s: float = 400.0, faults: str | None = None, extra: list[str] | None = None,
            link: str = "auto") -> dict[str, Any]:
        settings = sim.SimSettings(peers=peers, rounds=rounds, config=None, out_dir=tmp_path / "swarm",
                                   overrides=[*TINY_SWARM, *(extra or [])], peer_overrides=peer_overrides or {},
                                   timeout_s=timeout_s, eval_peers=1, faults=faults, link=link)
        before = temp_leftovers()
        summary = sim.run(settings, live=False, on_swarm=on_swarm)
        assert temp_leftovers() <= before, f"left in the temp folder: {temp_leftovers() - before}"
        return summary

    return run


def swarm_metrics(summary: dict[str, Any], index: int) -> list[dict[str, Any]]:
    from gradnode.node.sim import simulate as sim

    return sim.read_metrics(Path(summary["out_dir"]) / f"peer-{index}" / "metrics.jsonl")


# log lines that tell how a peer moved between chains (what a split's post-mortem needs: CI keeps no logs)
CHAIN_EVENTS = ("another chain", "state adopted", "re-sync", "differs from the majority", "giving it up",
                "leads among the live", "following the proposal", "equivocated", "undecided", "outcome dropped",
                "exchanged on hash")


def settles(check: Callable[[], Any], within_s: float = 60.0) -> bool:
    """``check()`` is true now or turns true within ``within_s`` (a DHT store or read that a loaded machine fails
    once, a counter another thread updates)."""
    end = time.monotonic() + within_s
    while not check() and time.monotonic() < end:
        time.sleep(0.02)
    return bool(check())


def explain(summary: dict[str, Any], tail: int = 25) -> str:
    """A failed swarm assertion's message: one line per peer, the last log lines of every peer that did not
    finish every round, and, when the peers ended on several hashes, every peer's chain events and its
    last round lines (pytest cuts a summary dict after a hundred characters)."""
    lines, rounds = [], summary["rounds"]
    split = len({p.get("param_hash") for p in summary["peers"] if "error" not in p}) > 1
    for p in summary["peers"]:
        last = sorted(p.get("hashes", {}), key=int)[-1:] if p.get("hashes") else []
        lines.append(f"peer-{p['index']}: rounds={p.get('rounds')} error={p.get('error')} resyncs={p.get('resyncs')} "
                     f"hash={p.get('param_hash', '')[:12]} last_round_hashed={last}")
        log = Path(summary["out_dir"]) / f"peer-{p['index']}.log"
        if not log.exists():
            continue
        text = log.read_text(errors="replace").splitlines()
        if "error" in p or p.get("rounds") != rounds:
            lines += ["    " + x for x in text[-tail:]]
        elif split:
            events = [x for x in text if any(e in x for e in CHAIN_EVENTS)]
            applied = [x for x in text if " applied=" in x]
            lines += ["    " + x for x in events[-tail:] + applied[-6:]]
    return "\n".join(lines)


@pytest.fixture
def metrics_of() -> Callable[[dict[str, Any], int], list[dict[str, Any]]]:
    return swarm_metrics


@pytest.fixture
def trio(tmp_path: Path):
    """Three real transports on 127.0.0.1, b and c bootstrapped from a; closed afterwards."""
    from gradnode.node.config import SwarmConfig
    from gradnode.node.swarm.identity import load_or_create
    from gradnode.node.swarm.transport import Transport

    made: list[Any] = []
    try:
        first = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"]), load_or_create(tmp_path / "a"))
        made.append(first)
        first.start()
        for name in ("b", "c"):
            t = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=first.maddrs()),
                          load_or_create(tmp_path / name))
            made.append(t)
            t.start()
        yield made
    finally:
        for t in made:
            t.close()
