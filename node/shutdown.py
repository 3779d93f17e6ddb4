"""How a command ends on SIGTERM or SIGINT, sent to its process or to its whole process group.

systemd's default stop, `timeout` and Ctrl+C signal the whole group: the command and every process it
forked (hivemind's DHT process, the libp2p daemon) get the same signal. The rules:

- The first signal asks the command to end: it stops its inner steps, finishes its round when it can,
  leaves a checkpoint and exits.
- A second signal, or ``grace_s`` after the first, ends it at once: its child processes are killed and it
  exits with status 128 + the signal's number. The newest checkpoint on disk is what it leaves (checkpoints
  are written atomically, so that one is whole).
- A process forked after ``install`` takes the default action of both signals back. A forked child must
  not run a handler only its parent acts on: hivemind ends its DHT process with SIGTERM, and a child that
  swallowed it was waited for forever.

This module must not import torch (``gradnode --help`` stays fast).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_forks_reset = False  # os.register_at_fork cannot be undone: the hook is registered once per process


def _default_handlers_in_child() -> None:
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, deepest first (Linux /proc; [] where it cannot be read)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except (OSError, ValueError):
            continue
        for kid in kids:
            out += [*descendants(kid), kid]
    return out


def kill_descendants() -> None:
    """SIGKILL every process below this one."""
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def exit_now(signum: int) -> None:
    """End this process at once: SIGKILL every process below it, flush the logs, exit 128 + ``signum``."""
    log.warning("signal=%d: ending now; the newest checkpoint on disk is what this run leaves", signum)
    kill_descendants()
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # a closed stream: nothing more to say
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(128 + signum)


class Shutdown:
    """The two-step stop above, for one command. ``on_request(signum)`` runs on the first signal, from the
    handler, and must not block (set events, start a thread); ``at_once(signum)`` on the second signal or when
    ``grace_s`` (None: no limit; a callable is asked at the first signal) has passed since the first,
    ``exit_now`` by default."""

    def __init__(self, on_request: Callable[[int], None] | None = None,
                 grace_s: float | Callable[[], float] | None = None,
                 at_once: Callable[[int], None] = exit_now) -> None:
        self.on_request, self.grace_s, self.at_once = on_request, grace_s, at_once
        self.requested = threading.Event()
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._cancel = threading.Event()

    def install(self) -> "Shutdown":
        """Take SIGTERM and SIGINT in this (the main) thread; forked children get the defaults back."""
        global _forks_reset
        if not _forks_reset:
            os.register_at_fork(after_in_child=_default_handlers_in_child)
            _forks_reset = True
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Restore the handlers ``install`` replaced, and cancel the grace timer."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        self._cancel.set()

    def __enter__(self) -> "Shutdown":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.requested.is_set():
            self.at_once(signum)
            return
        self.signum = signum
        self.requested.set()
        log.info("signal=%d: finishing the round and checkpointing (a second signal ends at once)", signum)
        if self.grace_s is not None:  # asked on a thread: a callable may read what the main thread holds locked
            threading.Thread(target=self._deadline, args=(signum,), name="shutdown-grace", daemon=True).start()
        if self.on_request is not None:
            self.on_request(signum)

    def _deadline(self, signum: int) -> None:
        grace = self.grace_s() if callable(self.grace_s) else self.grace_s
        assert grace is not None
        log.info("ending at once in %.0f s unless finished before", grace)
        if not self._cancel.wait(grace):
            self.at_once(signum)
