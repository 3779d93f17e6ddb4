"""gradnode.node: the runtime of a peer (config, CLI, training, transport, swarm). Owns all I/O."""

import json
import logging
import os
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

try:
    __version__ = metadata.version("gradnode")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"


def write_atomic(path: Path, data: bytes, sync: bool = False) -> None:
    """``data`` in ``path``, replaced whole (a reader never sees half a file; a crash mid-write leaves the
    previous one; ``sync``: a power loss too, the bytes on disk before the rename). OSError goes to the caller."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, data: Any, indent: int | None = None) -> None:
    """``data`` as JSON in ``path``, replaced whole (``write_atomic``). OSError goes to the caller."""
    write_atomic(path, json.dumps(data, indent=indent).encode())


def read_kept(path: Path, parse: Callable[[bytes], list[bytes]], what: str) -> list[bytes]:
    """The signed records a bootstrap kept in ``path`` (``parse``: the strict reader of their list, unverified);
    none without the file, and none from one that cannot be read or parsed (said: it costs only what it kept)."""
    try:
        return parse(path.read_bytes()) if path.exists() else []
    except (OSError, ValueError) as err:  # RecordError is a ValueError
        logging.getLogger(__name__).warning("kept %s %s unreadable (%s); starting without them", what, path, err)
        return []


def save_kept(path: Path, blob: bytes, what: str) -> None:
    """A bootstrap's kept records in ``path``, synced (a power loss leaves the old file or the new one, never an
    empty one); a full disk costs only this save (said), what the bootstrap holds and serves is unchanged."""
    try:
        write_atomic(path, blob, sync=True)
    except OSError as err:
        logging.getLogger(__name__).warning("kept %s not saved (%s)", what, err)
