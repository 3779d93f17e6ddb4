"""Atomic checkpoints: one folder per round, written under a temporary name and renamed when complete.

Layout: ``<dir>/round-00000012/state.pt`` (torch, loaded with ``weights_only=True``) next to
``meta.json`` holding the state's sha256 and the format (and, since export and eval, the resolved config under
``config``; older checkpoints lack it and still load). A folder that fails its digest, its schema or torch's
loader is reported as a :class:`CheckpointError` and never modified or deleted.

Format 2 stores every tensor once (Engine.state_dict): the agreed weights, the peer's own weights only where
they differ from those (a checkpoint at a round boundary holds the weights once), the pseudo-gradient's start
only where it differs from both, the error-feedback buffers, AdamW's two moments and the outer optimizer's
state. A tensor that views a larger buffer is written alone, never with the whole buffer. Format 1 (every set
of weights in full) still loads; a newer format is refused with what to do.

Size, measured on the default model (configs/tiny-cpu.yaml, 3,248,640 parameters, SparseLoCo): format 1
wrote 24.02 bytes/param (78,042,629 bytes) in every case. Format 2 writes 16.02 at a round boundary
(`gradnode train`, a peer's last checkpoint) and 20.02 where the peer's own weights differ from the agreed
ones (a stop mid-round; a peer's checkpoints between rounds, overlapped). Measure it with
``gradnode train --rounds 1 --set inner.steps=2 --output-dir /tmp/ck``, then
``stat -c %s /tmp/ck/checkpoints/round-00000001/state.pt`` divided by the parameter count it prints.

Only writing and loading import torch: a command checks the path it was given (``candidates``) first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 2  # 2: each tensor once (1: the peer's own weights and the start in full, beside the agreed ones)
READS = (1, 2)  # formats this gradnode loads
_NAME = re.compile(r"^round-(\d{8})$")
_FILES = ("state.pt", "meta.json")


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt or belongs to another run."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(directory: Path | str, round_: int, state: dict[str, Any], meta: dict[str, Any], keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``round_``; prune to the newest ``keep`` valid-looking ones."""
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = folder(directory, round_)
    tmp = directory / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    state_path = tmp / "state.pt"
    with state_path.open("wb") as f:
        torch.save(_compact(state), f)
        f.flush()
        os.fsync(f.fileno())
    full_meta = {"format": FORMAT, "round": round_, "sha256": _sha256(state_path), **meta}
    with (tmp / "meta.json").open("w") as f:
        json.dump(full_meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():  # re-saving the same round replaces it: move the old one aside first
        old = directory / f".old-{final.name}-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    _fsync_dir(directory)
    log.info("checkpoint saved path=%s round=%d", final, round_)
    for stale in list_checkpoints(directory)[keep:]:
        shutil.rmtree(stale)
        log.info("checkpoint pruned path=%s", stale)
    return final


def _compact(obj: Any) -> Any:
    """``obj`` with every tensor that views a larger buffer replaced by a copy of just its elements: torch.save
    writes a tensor's whole storage. Tensors that fill their storage are kept as they are, so two names for one
    tensor (tied weights) still share it and it is written once."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.clone() if obj.untyped_storage().nbytes() > obj.numel() * obj.element_size() else obj
    if isinstance(obj, dict):
        return {k: _compact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_compact(v) for v in obj)
    return obj


def drop_after(directory: Path | str, round_: int) -> list[Path]:
    """Remove the checkpoints of rounds after ``round_`` (a chain this peer gave up for the swarm's: they
    would otherwise be resumed from, and would prune the newer ones of the adopted chain)."""
    gone = [p for p in list_checkpoints(directory) if int(_NAME.match(p.name).group(1)) > round_]
    for path in gone:
        shutil.rmtree(path)
        log.info("checkpoint of an abandoned chain removed path=%s", path)
    return gone


def list_checkpoints(directory: Path | str) -> list[Path]:
    """Checkpoint folders in ``directory``, newest round first (temporary folders excluded)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name, reverse=True)


def folder(directory: Path | str, round_: int) -> Path:
    """The checkpoint folder of ``round_`` in ``directory`` (whether or not it exists)."""
    return Path(directory) / f"round-{round_:08d}"


def made_at(directory: Path | str, round_: int) -> float | None:
    """When the checkpoint of ``round_`` in ``directory`` was written (its meta.json's mtime); None when there is
    none. The state a resumed engine holds is as old as the checkpoint it loaded, which is not the newest one when a
    newer one failed to verify."""
    try:
        return (folder(directory, round_) / "meta.json").stat().st_mtime
    except OSError:
        return None


def load(path: Path | str, run_id: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load and verify one checkpoint folder; returns ``(state, meta)``."""
    import torch

    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path}: unreadable meta.json ({err})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("format"), int) or not isinstance(meta.get("sha256"), str):
        raise CheckpointError(f"checkpoint {path}: meta.json is not a gradnode checkpoint (no format and sha256)")
    if meta["format"] not in READS:
        raise CheckpointError(f"checkpoint {path}: format {meta['format']}, this gradnode reads formats "
                              f"{', '.join(map(str, READS))}: run the gradnode that wrote it, or start afresh with "
                              f"--set checkpoint.resume=false")
    if run_id is not None and meta.get("run_id") != run_id:
        raise CheckpointError(f"checkpoint {path}: belongs to run {meta.get('run_id')!r}, not run.run_id={run_id!r}")
    state_path = path / "state.pt"
    try:
        digest = _sha256(state_path)
    except OSError as err:
        raise CheckpointError(f"checkpoint {path}: unreadable state.pt ({err})") from None
    if digest != meta["sha256"]:
        raise CheckpointError(f"checkpoint {path}: state.pt is corrupt (sha256 mismatch)")
    try:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a damaged archive
        raise CheckpointError(f"checkpoint {path}: cannot load state.pt ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path}: state.pt does not hold a dict")
    return state, meta


def load_latest(directory: Path | str, run_id: str | None = None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The newest checkpoint that verifies; corrupt ones are logged and skipped (left on disk).

    Returns None when the folder has no checkpoint; raises :class:`CheckpointError` when it has
    some but none verifies.
    """
    candidates = list_checkpoints(directory)
    errors = []
    for path in candidates:
        try:
            return load(path, run_id)
        except CheckpointError as err:
            log.warning("checkpoint skipped path=%s reason=%s", path, err)
            errors.append(str(err))
    if errors:
        raise CheckpointError("no valid checkpoint in " + str(directory) + ":\n  " + "\n  ".join(errors))
    return None


def candidates(path: Path | str) -> list[Path]:
    """The checkpoint folders ``path`` names, newest first: a checkpoint folder itself, or those of a
    ``checkpoints/`` folder or of a run folder (its ``checkpoints/``). Checks the path alone, without torch;
    a missing path, a file, or a folder without checkpoints is a :class:`CheckpointError` saying what to name."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or folder")
    if not path.is_dir():
        hint = f" (here: {path.parent})" if path.name in _FILES else ""
        raise CheckpointError(f"{path} is a file: name a checkpoint folder (round-NNNNNNNN){hint}, a checkpoints/ "
                              "folder or a run folder")
    if (path / "meta.json").exists() or _NAME.match(path.name):
        return [path]
    found = list_checkpoints(path) or list_checkpoints(path / "checkpoints")
    if not found:
        raise CheckpointError(f"{path}: no checkpoint in it (round-NNNNNNNN folders, here or in its checkpoints/)")
    return found


def find(path: Path | str) -> tuple[Path, dict[str, Any], dict[str, Any], list[str]]:
    """The checkpoint ``path`` names (see ``candidates``): that folder, or the newest one that verifies. Returns
    ``(folder, state, meta, skipped)``, ``skipped`` saying which newer checkpoints failed and why."""
    found = candidates(path)
    if len(found) == 1 and found[0] == Path(path):  # a checkpoint folder itself: its own error, if any
        state, meta = load(found[0])
        return found[0], state, meta, []
    skipped: list[str] = []
    for folder in found:
        try:
            state, meta = load(folder)
        except CheckpointError as err:
            skipped.append(str(err))
            continue
        return folder, state, meta, skipped
    raise CheckpointError(f"no valid checkpoint in {path}: " + "; ".join(skipped))
