"""gradnode.node: the runtime of a peer (config, CLI, training, transport, swarm). Owns all I/O."""

import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any

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
