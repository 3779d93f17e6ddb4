"""A peer's event log: re-syncs, bans, equivocations, clock skew, evaluations and warnings, one JSON line each
in ``events.jsonl`` of its run folder, for the status page of a run in progress or finished
(node/status/runfolder.py reads it).

The events are the peer's own log lines. A handler on the ``gradnode`` loggers keeps every warning and error,
and every line tagged with an event kind (``log.info(..., extra=events.tag(Kind.RESYNC, reason=...))``), so
each event is written once, where it is already logged. The file stays bounded: past ``MAX_BYTES`` it moves to
``events.jsonl.1`` (the one before goes), and one message template writes at most ``BURST`` lines a minute. A
flood of bad records from the network must neither fill the disk nor drown the other events.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from enum import Enum
from pathlib import Path
from typing import Any

FILE_NAME = "events.jsonl"
MAX_BYTES = 256 * 1024  # one file's size; with the rotated one a peer keeps at most twice this
BURST = 20  # lines of one message template per minute; the rest are counted on the next one written
WINDOW_S = 60.0
MAX_MESSAGE = 400  # characters of a message kept (a message may quote a peer's strings)
MAX_FIELD = 200  # characters of a string field kept
_EXTRA = "gradnode_event"
_ROUND = re.compile(r"\bround=(\d{1,12})\b")


class Kind(str, Enum):
    """What an event is. The peer writes the first group; the status page's watch adds the second from what
    it sees in the swarm's records."""

    START = "start"  # training starts: this peer's id, the run's rounds, its round
    EVAL = "eval"  # a validation loss
    RESYNC = "resync"  # a state adopted or caught up (a join, a hash mismatch, a fork)
    BAN = "ban"  # a sender ignored for invalid updates, peers revoked, a reputation ban
    EQUIVOCATION = "equivocation"  # a witness caught with two reports of one round
    CLOCK = "clock"  # this clock off the peers'
    WARNING = "warning"
    ERROR = "error"
    END = "end"  # this peer's run is over
    PEER = "peer"  # a peer came into sight, left or went quiet
    FORK = "fork"  # a peer off the chain most peers follow, or the swarm split into several chains
    BEHIND = "behind"  # a peer rounds behind the swarm


def tag(kind: Kind, **fields: Any) -> dict[str, Any]:
    """The ``extra=`` of a log call that is an event of ``kind``; ``fields`` (numbers, short strings) travel
    with it to the page (``round``, ``val_loss``, ``reason``, ...)."""
    return {_EXTRA: (kind, fields)}


def _field(v: Any) -> Any:
    """A JSON-safe, bounded field value (None for anything else)."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Enum):
        v = v.value
    return str(v)[:MAX_FIELD]


class EventFile(logging.Handler):
    """Appends the events among the log records to ``folder/events.jsonl`` (bounded; module docstring)."""

    def __init__(self, folder: Path, max_bytes: int = MAX_BYTES) -> None:
        super().__init__(level=logging.DEBUG)
        self.path = Path(folder) / FILE_NAME
        self.max_bytes = max_bytes
        self._burst: dict[tuple[str, str], tuple[float, int, int]] = {}  # template -> (window start, written, held)

    def emit(self, record: logging.LogRecord) -> None:
        kind, fields = getattr(record, _EXTRA, (None, {}))
        if kind is None:
            if record.levelno < logging.WARNING:
                return
            kind = Kind.ERROR if record.levelno >= logging.ERROR else Kind.WARNING
        held = self._admit((record.name, str(record.msg)), record.created)
        if held is None:
            return
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format: the template itself still says what happened
            message = str(record.msg)
        row: dict[str, Any] = {"time": record.created, "kind": Kind(kind).value, "level": record.levelname,
                               "source": record.name.rsplit(".", 1)[-1], "message": message[:MAX_MESSAGE]}
        found = _ROUND.search(message)
        if found:
            row["round"] = int(found.group(1))
        row.update((str(k)[:32], _field(v)) for k, v in list(fields.items())[:16])
        if held:
            row["suppressed"] = held
        self._append(json.dumps(row, allow_nan=False) + "\n")

    def _admit(self, key: tuple[str, str], now: float) -> int | None:
        """None when ``key``'s template wrote its BURST lines this minute (counted); else the lines it held back
        since its last one written."""
        start, written, held = self._burst.get(key, (now, 0, 0))
        if now - start >= WINDOW_S:
            start, written = now, 0
        if written >= BURST:
            self._burst[key] = (start, written, held + 1)
            return None
        self._burst[key] = (start, written + 1, 0)
        if len(self._burst) > 4096:  # templates are few; keys of a dead window go first
            self._burst = {k: v for k, v in self._burst.items() if now - v[0] < WINDOW_S}
        return held

    def _append(self, line: str) -> None:
        """One line at the end of the file, rotated first when it would pass ``max_bytes``. A full disk or an
        unwritable folder costs only the event: training goes on."""
        data = line.encode()
        try:
            if self.path.exists() and self.path.stat().st_size + len(data) > self.max_bytes:
                os.replace(self.path, self.path.with_name(FILE_NAME + ".1"))
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError:
            pass


def install(folder: Path) -> EventFile:
    """Record this process's events in ``folder`` from now on (every ``gradnode`` logger); returns the handler
    for ``uninstall``."""
    handler = EventFile(folder)
    logging.getLogger("gradnode").addHandler(handler)
    return handler


def uninstall(handler: EventFile) -> None:
    logging.getLogger("gradnode").removeHandler(handler)
    handler.close()
