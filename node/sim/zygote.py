"""One process that imports what a peer needs once, then forks every process of a simulated swarm.

A peer's process spends about two CPU-seconds importing torch and hivemind before it does anything (measured:
`python -X importtime -c "import gradnode.node.swarm.peer"`, 1.8 s alone; more while other peers start beside
it), and about one more when its first optimizer imports torch._dynamo. `gradnode simulate` starts a bootstrap
and N peers, and again every peer a fault restarts: on a 2-core machine the imports were a quarter of a 4-peer
swarm's CPU for 10 rounds. The zygote (Android's name for the same trick) imports them once and forks a
child per process: the child starts its own session (its process group, which a kill -9 takes down with its
DHT process and daemon), writes to its own log, and runs the CLI command as `python -m gradnode.node.cli ARGS`
would, exiting through the interpreter's normal exit (threads joined, atexit handlers run).

A fork copies only the state the imports made, all of it the same in a fresh process, with three exceptions
dealt with here: the global random generators are reseeded in the child (`random` reseeds itself at a fork,
numpy's legacy one is reseeded explicitly); hivemind's cross-process locks, made at its import, are made anew
in the child (AFTER_FORK: shared, one child killed -9 while holding one stalled every other's DHT); and no
thread may run in the zygote when it forks (checked once the imports are done: the zygote refuses to serve
otherwise and the swarm starts its processes the usual way).

The parent talks to it over its stdin and stdout, one line each way: a request is a JSON list, the log file's
path and the arguments; the answer the child's pid, or an error line. The zygote reaps its children and
writes `exit PID CODE` when one ends (CODE as subprocess reports it: minus the signal that killed it), so that
`Forked`, the parent's handle, answers `poll`, `wait` and `send_signal` as a `subprocess.Popen` does.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

CLI = "gradnode.node.cli:main"  # what a child runs by default: `python -m gradnode.node.cli ARGS`
# torch._dynamo: torch.optim imports it when a peer makes its first optimizer (the inner AdamW), ~0.9 s more
PRELOAD = ("gradnode.node.cli", "gradnode.node.swarm.peer", "gradnode.node.swarm.report", "torch._dynamo")
# called in every child before its command: what a process forked from the zygote must not share with the others
# (hivemind's cross-process locks, made at its import: a child killed -9 holding one stalled every other's DHT)
AFTER_FORK = ("gradnode.node.swarm.transport:fresh_locks",)


class Zygote:
    """The parent's side: start the zygote (``start`` says whether it is serving), fork processes through it."""

    def __init__(self, env: dict[str, str], log_path: Path, entry: str = "") -> None:
        """``entry``: 'module:function' that a child calls, its arguments in sys.argv[1:] (tests); the CLI
        by default."""
        self._log = open(log_path, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "gradnode.node.sim.zygote", *([entry] if entry else [])],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=env, start_new_session=True,
                                     text=True, bufsize=1)
        self._lock = threading.Lock()  # one request at a time: answers come in order
        self._changed = threading.Condition()
        self._answers: list[str] = []
        self._codes: dict[int, int] = {}
        self._gone = False  # the zygote's stdout closed: it died or was stopped
        self._ready = False
        self._reader = threading.Thread(target=self._read, daemon=True, name="zygote-reader")
        self._reader.start()

    def start(self, timeout: float = 120.0) -> bool:
        """Wait until the zygote imported everything and serves; False when it will not (see its log)."""
        answer = self._answer(timeout)
        self._ready = answer == "ready"
        return self._ready

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                if line.startswith("exit "):
                    _, pid, code = line.split()
                    self._codes[int(pid)] = int(code)
                else:
                    self._answers.append(line.strip())
                self._changed.notify_all()
        with self._changed:
            self._gone = True
            self._changed.notify_all()

    def _answer(self, timeout: float) -> str:
        end = time.monotonic() + timeout
        with self._changed:
            while not self._answers and not self._gone and time.monotonic() < end:
                self._changed.wait(max(0.0, end - time.monotonic()))
            return self._answers.pop(0) if self._answers else ""

    def fork(self, args: list[str], log_path: Path) -> "Forked":
        """A child running ``gradnode ARGS`` (as `python -m gradnode.node.cli ARGS`), its output appended to
        ``log_path``, which exists when this returns, as with subprocess.Popen (the child opens it only once
        forked). RuntimeError when the zygote does not answer with a pid."""
        open(log_path, "a").close()
        with self._lock:
            if not self._ready or self._gone:
                raise RuntimeError("the zygote is not serving")
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps([str(log_path), *args]) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError) as e:
                raise RuntimeError(f"the zygote is gone: {e}") from None
            answer = self._answer(60.0)
        if not answer.isdigit():
            raise RuntimeError(f"the zygote did not fork: {answer or 'no answer'}")
        return Forked(self, int(answer), args)

    def returncode(self, pid: int) -> int | None:
        with self._changed:
            if pid in self._codes:
                return self._codes[pid]
            if self._gone and not _exists(pid):  # nobody reaps it now: it ended, with a code nobody knows
                self._codes[pid] = -signal.SIGKILL
                return self._codes[pid]
            return None

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        end = None if timeout is None else time.monotonic() + timeout
        while (code := self.returncode(pid)) is None:
            left = 0.2 if end is None else min(0.2, end - time.monotonic())
            if left <= 0:
                return None
            with self._changed:
                if pid not in self._codes:
                    self._changed.wait(left)
        return code

    def close(self) -> None:
        """Stop the zygote (its children are the swarm's to stop: it does not wait for them)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5.0)
        self._log.close()


class Forked:
    """A process the zygote forked, answering as much of `subprocess.Popen` as the swarm uses."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self.zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.wait_for(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie exists until it is reaped: it has ended
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# --- the zygote's side ---------------------------------------------------------------------------------


def _child(run: Callable[[], None], log_path: str, args: list[str], started: int) -> None:
    """In the forked child: a session and stdio of its own, fresh random state, then the CLI; never returns.
    ``started``: a pipe's end to close once its session is made (the zygote answers with the pid only then)."""
    os.setsid()
    os.close(started)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the zygote ignores it; a fresh process does not
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    sys.stdin = open(0, closefd=False)
    # as PYTHONUNBUFFERED: every write reaches the log at once (a kill -9 loses nothing written)
    sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    for hook in AFTER_FORK:
        _named(hook)()
    sys.argv = ["gradnode", *args]
    run()
    sys.exit(0)  # the interpreter exits as a fresh one would: threads joined, atexit handlers run


def _named(spec: str) -> Callable[[], None]:
    """The function 'module:function' names, imported by name as `python -m` finds it: the simulator sits
    below the command line and the transport in the layering."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def _serve(entry: str) -> None:
    run = _named(entry)
    for name in PRELOAD:
        __import__(name)
    if threading.active_count() != 1:  # a fork would copy a lock another thread may hold
        print(f"threads after the imports: {[t.name for t in threading.enumerate()]}", flush=True)
        return
    # a child's end wakes the loop at once: SIGCHLD writes a byte to this pipe (its handler does nothing else)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    print("ready", flush=True)
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        while True:  # reap: each child's end is reported once
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            print(f"exit {pid} {os.waitstatus_to_exitcode(status)}", flush=True)
        readable, _, _ = select.select([stdin, wake_r], [], [], 5.0)
        if wake_r in readable:
            os.read(wake_r, 4096)
        if stdin not in readable:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:  # the swarm is done with us
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            try:
                log_path, *args = json.loads(line)
            except (ValueError, TypeError) as e:
                print(f"bad request: {e}", flush=True)
                continue
            started_r, started_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                os.close(started_r)
                _child(run, log_path, args, started_w)
            # the pid goes out once the child has its own session: a kill of its group right after (os.killpg,
            # as the swarm stops a process) found no such group while the fork had returned and the child had not
            # run yet (29 of 30 forks on a loaded machine, for 3-6 ms); the child's end of the pipe closes then
            os.close(started_w)
            os.read(started_r, 1)
            os.close(started_r)
            print(pid, flush=True)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl+C reaches the swarm's processes; the swarm stops us
    _serve(sys.argv[1] if len(sys.argv) > 1 else CLI)


if __name__ == "__main__":
    main()
