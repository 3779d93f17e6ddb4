"""Atomic checkpoints: one folder per round, written under a temporary name and renamed when complete.

Layout: ``<dir>/round-00000012/state.pt`` (torch, loaded with ``weights_only=True``) next to
``meta.json`` holding the state's sha256 (and, since export and eval, the resolved config under
``config``; older checkpoints lack it and still load). A folder that fails its digest, its schema or torch's
loader is reported as a :class:`CheckpointError` and never modified or deleted.
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

import torch

log = logging.getLogger(__name__)

FORMAT = 1
_NAME = re.compile(r"^round-(\d{8})$")


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
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = folder(directory, round_)
    tmp = directory / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    state_path = tmp / "state.pt"
    with state_path.open("wb") as f:
        torch.save(state, f)
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
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path}: unreadable meta.json ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("sha256"), str):
        raise CheckpointError(f"checkpoint {path}: meta.json is not a gradnode checkpoint (format {FORMAT})")
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


def find(path: Path | str) -> tuple[Path, dict[str, Any], dict[str, Any], list[str]]:
    """The checkpoint ``path`` names: a checkpoint folder itself, or the newest one that verifies in a
    ``checkpoints/`` folder or in a run folder (its ``checkpoints/``). Returns ``(folder, state, meta,
    skipped)``, ``skipped`` saying which newer checkpoints failed and why."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or folder")
    if not path.is_dir():
        raise CheckpointError(f"{path} is a file: name a checkpoint folder (round-NNNNNNNN), a checkpoints/ folder "
                              "or a run folder")
    if (path / "meta.json").exists() or _NAME.match(path.name):
        state, meta = load(path)
        return path, state, meta, []
    candidates = list_checkpoints(path) or list_checkpoints(path / "checkpoints")
    if not candidates:
        raise CheckpointError(f"{path}: no checkpoint in it (round-NNNNNNNN folders, here or in its checkpoints/)")
    skipped: list[str] = []
    for folder in candidates:
        try:
            state, meta = load(folder)
        except CheckpointError as err:
            skipped.append(str(err))
            continue
        return folder, state, meta, skipped
    raise CheckpointError(f"no valid checkpoint in {path}: " + "; ".join(skipped))
