"""What a peer is doing right now, for the people watching it: `progress.json` in its run folder and a log line.

A round can take minutes (a big model's inner steps, a slow first deadline), and a peer that prints nothing
for that long looks hung. So the peer says which stage it is in, with the inner step it is at and what it
waits for. The file is replaced whole at most once a second (`gradnode simulate`'s live view reads it); a
stage change and, within the inner steps, every PROGRESS_LOG_S are logged.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gradnode.node import write_json

log = logging.getLogger(__name__)

FILE_NAME = "progress.json"
WRITE_S = 1.0  # the file is replaced at most this often
PROGRESS_LOG_S = 15.0  # within the inner steps, a log line at most this often


class Stage(enum.Enum):
    STARTING = "starting"
    WAITING_FOR_PEERS = "waiting for peers"
    GETTING_LEVEL = "getting the swarm's state"
    EVALUATING = "validation loss"
    COMPUTING = "inner steps"
    WAITING_FOR_ROUND = "waiting for the round's decision"
    FINISHING = "finishing"


@dataclass(frozen=True)
class Progress:
    """One moment of a peer's work. ``step`` of ``steps``: the inner step being run (COMPUTING); ``waits_for``:
    what the stage waits for, in words (peers in sight, a deadline)."""

    stage: Stage
    round: int
    step: int = 0
    steps: int = 0
    waits_for: str = ""
    step_s: float = 0.0  # seconds an inner step took, as last measured (0: not yet)
    time: float = 0.0  # wall-clock time it was written

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stage": self.stage.value}

    @staticmethod
    def from_json(data: Any) -> "Progress | None":
        """A progress.json read back; None for anything else (it is this machine's own file, read while written)."""
        try:
            return Progress(stage=Stage(data["stage"]), round=int(data["round"]), step=int(data["step"]),
                            steps=int(data["steps"]), waits_for=str(data["waits_for"])[:200],
                            step_s=float(data["step_s"]), time=float(data["time"]))
        except (KeyError, TypeError, ValueError):
            return None

    def short(self) -> str:
        """A few characters, for a live table: 'step 12/20' (or '999/1000'), 'peers', 'decision'."""
        if self.stage is Stage.COMPUTING:
            count = f"{self.step}/{self.steps}"
            return f"step {count}" if len(count) <= 5 else count
        return _SHORT[self.stage]


_SHORT = {Stage.STARTING: "start", Stage.WAITING_FOR_PEERS: "peers", Stage.GETTING_LEVEL: "sync",
          Stage.EVALUATING: "eval", Stage.COMPUTING: "step", Stage.WAITING_FOR_ROUND: "decision",
          Stage.FINISHING: "ending"}


def read(folder: Path) -> Progress | None:
    """The progress a peer last wrote in its run folder, or None."""
    import json

    try:
        return Progress.from_json(json.loads((folder / FILE_NAME).read_text()))
    except (OSError, ValueError):
        return None


class Reporter:
    """The peer's current Progress, written to ``folder`` and logged; any thread may call it."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / FILE_NAME
        self.now = Progress(Stage.STARTING, 0)
        self._lock = threading.Lock()
        self._written = self._logged = 0.0

    def stage(self, stage: Stage, round_: int, waits_for: str = "", steps: int = 0, quiet: bool = False) -> None:
        """Enter ``stage``: logged when it or what it waits for changes, unless ``quiet`` (said elsewhere, or every
        round: the file still shows it)."""
        with self._lock:
            changed = stage is not self.now.stage or waits_for != self.now.waits_for or round_ != self.now.round
            self.now = Progress(stage, round_, 0, steps, waits_for, self.now.step_s)
            if changed and not quiet and stage is not Stage.COMPUTING:
                log.info("round=%d %s%s", round_, stage.value, f": {waits_for}" if waits_for else "")
            self._write(force=True)

    def step(self, step: int, step_s: float) -> None:
        """Inner step ``step`` (1-based) of the round is about to run; the last one took ``step_s``."""
        with self._lock:
            now = self.now
            self.now = Progress(Stage.COMPUTING, now.round, step, now.steps, "", step_s or now.step_s)
            mono = time.monotonic()
            if mono - self._logged >= PROGRESS_LOG_S:
                self._logged = mono
                left = (now.steps - step + 1) * self.now.step_s
                log.info("round=%d inner step %d/%d%s", now.round, step, now.steps,
                         f", {self.now.step_s:.2f} s a step, ~{left:.0f} s to go" if self.now.step_s else "")
            self._write()

    def flush(self) -> None:
        """Write the current progress now (the file lags by up to WRITE_S otherwise)."""
        with self._lock:
            self._write(force=True)

    def _write(self, force: bool = False) -> None:
        mono = time.monotonic()
        if not force and mono - self._written < WRITE_S:
            return
        self._written = mono
        try:
            write_json(self.path, {**self.now.to_json(), "time": time.time()})
        except OSError as err:  # a full disk must not stop training; the log still says it
            log.debug("progress not written: %r", err)
