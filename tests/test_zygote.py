"""The zygote (node/sim/zygote.py): a simulated swarm's processes are forked from one process that imported
torch and hivemind once. Each must be what a fresh `python -m gradnode.node.cli` process is: its own session
(a kill -9 of its group takes down its DHT process and daemon, nobody else), its own log, its own random
state, no thread of the zygote's, and its exit code as subprocess reports it, even after the zygote died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gradnode.node.sim.zygote import Zygote


def _zygote(tmp_path: Path, entry: str = "_zygote_probe:probe") -> Zygote:
    tests = str(Path(__file__).parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])),
               TMPDIR=str(tmp_path))
    return Zygote(env, tmp_path / "zygote.log", entry)


def _seen(log: Path) -> dict:
    return json.loads(log.read_text().splitlines()[0])


def test_each_forked_process_has_its_own_session_log_randomness_and_exit_code(tmp_path: Path) -> None:
    z = _zygote(tmp_path)
    try:
        assert z.start(), (tmp_path / "zygote.log").read_text()
        a, b = z.fork(["exit", "0"], tmp_path / "a.log"), z.fork(["exit", "3"], tmp_path / "b.log")
        assert (a.wait(timeout=60), b.wait(timeout=60)) == (0, 3)
        seen = [_seen(tmp_path / "a.log"), _seen(tmp_path / "b.log")]
        for s, p, args in zip(seen, (a, b), (["exit", "0"], ["exit", "3"])):
            assert s["pid"] == p.pid == s["sid"], s  # a session (and process group) of its own
            assert s["threads"] == 1 and s["sigint"] and s["args"] == args, s  # Ctrl+C raises, as in a fresh one
        assert seen[0]["random"] != seen[1]["random"] and seen[0]["numpy"] != seen[1]["numpy"], seen
        c = z.fork(["sleep", "60"], tmp_path / "c.log")
        assert (tmp_path / "c.log").exists()  # as with subprocess.Popen: a test may read it at once
        assert c.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            c.wait(timeout=0.5)
        os.killpg(c.pid, signal.SIGKILL)
        assert c.wait(timeout=60) == -signal.SIGKILL
    finally:
        z.close()


def test_a_child_has_its_own_process_group_as_soon_as_its_pid_is_known(tmp_path: Path) -> None:
    """The swarm stops a process by killing its group; one stopped right after it was forked must be killed too
    (the zygote answered as soon as fork() returned, before the child had made its session: no such group)."""
    z = _zygote(tmp_path)
    try:
        assert z.start(), (tmp_path / "zygote.log").read_text()
        for n in range(10):
            c = z.fork(["sleep", "60"], tmp_path / f"c{n}.log")
            os.killpg(c.pid, signal.SIGKILL)
            assert c.wait(timeout=60) == -signal.SIGKILL
    finally:
        z.close()


def test_a_child_outlives_its_zygote_and_is_still_waited_for(tmp_path: Path) -> None:
    z = _zygote(tmp_path)
    try:
        assert z.start(), (tmp_path / "zygote.log").read_text()
        c = z.fork(["sleep", "60"], tmp_path / "c.log")
        z.proc.kill()
        z.proc.wait()
        with pytest.raises(RuntimeError):
            z.fork(["exit", "0"], tmp_path / "d.log")
        assert c.poll() is None  # still running, though nobody will report its end now
        os.killpg(c.pid, signal.SIGKILL)
        assert c.wait(timeout=60) == -signal.SIGKILL  # gone: its code is unknown, reported as killed
    finally:
        z.close()


def test_a_zygote_that_cannot_serve_says_so(tmp_path: Path) -> None:
    z = _zygote(tmp_path, entry="_zygote_probe:no_such_function")
    try:
        assert not z.start()
        with pytest.raises(RuntimeError):
            z.fork(["exit", "0"], tmp_path / "a.log")
    finally:
        z.close()
    assert "no_such_function" in (tmp_path / "zygote.log").read_text()


def test_the_cli_forked_answers_as_the_command_does(tmp_path: Path) -> None:
    """The default child: `gradnode ARGS`, with its output and exit code (2 for a usage mistake)."""
    z = Zygote(dict(os.environ, TMPDIR=str(tmp_path)), tmp_path / "zygote.log")
    try:
        assert z.start(), (tmp_path / "zygote.log").read_text()
        ok, bad = z.fork(["--version"], tmp_path / "ok.log"), z.fork(["join", "--no-such-option"], tmp_path / "bad.log")
        assert (ok.wait(timeout=60), bad.wait(timeout=60)) == (0, 2)
        assert "gradnode" in (tmp_path / "ok.log").read_text()
        assert "no-such-option" in (tmp_path / "bad.log").read_text()
    finally:
        z.close()


def test_a_child_killed_holding_a_hivemind_lock_holds_up_no_other(tmp_path: Path) -> None:
    """hivemind makes its cross-process locks at import. Forked from one zygote, every process of a swarm shared
    them, and a process killed -9 while holding the one every DHT result passes through left all the others'
    DHTs blocked for good (the kill/restart process test hung so, twice, before each child made its own). Each
    child makes its own."""
    z = _zygote(tmp_path)
    try:
        assert z.start(), (tmp_path / "zygote.log").read_text()
        holder = z.fork(["hold"], tmp_path / "hold.log")
        end = time.monotonic() + 60
        while "held" not in (tmp_path / "hold.log").read_text() and time.monotonic() < end:
            time.sleep(0.1)
        assert "held" in (tmp_path / "hold.log").read_text()  # killed while it holds the lock, or nothing is shown
        os.killpg(holder.pid, signal.SIGKILL)
        assert holder.wait(timeout=60) == -signal.SIGKILL
        taker = z.fork(["take"], tmp_path / "take.log")
        assert taker.wait(timeout=60) == 0
        assert json.loads((tmp_path / "take.log").read_text().splitlines()[-1]) == {"took": True}
    finally:
        z.close()
