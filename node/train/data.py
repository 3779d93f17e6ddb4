"""Byte-level language-modelling data: corpus loading, train/validation split, reproducible batches.

A corpus is a list of documents (bytes). Documents go to the validation split by a hash of their
name, so the split is deterministic and disjoint and does not depend on the order files are found.
Training batches are random windows drawn from a generator seeded by (run_id, seed, peer, step,
micro-batch): every peer and every round reads a different slice, and any batch can be recomputed
from its coordinates alone (that is the whole data cursor).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from gradnode.node.config import DataConfig

log = logging.getLogger(__name__)

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".json", ".jsonl", ".csv", ".html", ".xml", ".tex", ".c", ".h"}
SEPARATOR = b"\n\n"


@dataclass(frozen=True)
class Corpus:
    """Train and validation byte streams as uint8 tensors (documents joined by a blank line)."""

    train: Tensor
    val: Tensor
    documents: int

    @property
    def nbytes(self) -> int:
        return self.train.numel() + self.val.numel()


def _unit_hash(*parts: object) -> float:
    """A stable hash of ``parts`` mapped to [0, 1)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def stdlib_root() -> Path:
    """The standard-library folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_documents() -> list[tuple[str, Path]]:
    root = stdlib_root()
    files = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in _SKIP_DIRS]  # never walk into installed packages
        files.extend(Path(folder, n) for n in names if n.endswith(".py"))
    return sorted((p.relative_to(root).as_posix(), p) for p in files)


def _text_documents(paths: list[Path], key: str = "data.paths") -> list[tuple[str, Path]]:
    docs: list[tuple[str, Path]] = []
    for i, path in enumerate(paths):
        if path.is_file():
            docs.append((f"{i}/{path.name}", path))
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _TEXT_SUFFIXES)
            docs.extend((f"{i}/{p.relative_to(path).as_posix()}", p) for p in found)
        else:
            raise ValueError(f"{key}: {path} does not exist")
    return docs


def text_stream(paths: list[Path], key: str, max_bytes: int) -> Tensor:
    """Text files and folders (their files with a text suffix, sorted) read whole, up to ``max_bytes``, joined
    by a blank line as the corpus joins documents: a held-out stream for `gradnode eval --data`. A missing
    path, an empty file, or a folder without text is a mistake naming ``key``."""
    for path in paths:
        if path.is_file() and path.stat().st_size == 0:
            raise ValueError(f"{key}: {path} is empty")
        if path.is_dir() and not _text_documents([path], key):
            raise ValueError(f"{key}: no text files in {path} (suffixes {' '.join(sorted(_TEXT_SUFFIXES))})")
    docs = _read_files(_text_documents(paths, key), max_bytes)
    if not docs:
        raise ValueError(f"{key}: the files hold no text")
    return torch.frombuffer(bytearray(SEPARATOR.join(d for _, d in docs)), dtype=torch.uint8)


def _read_files(docs: list[tuple[str, Path]], max_bytes: int) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    total = 0
    for name, path in docs:
        if total >= max_bytes:
            break
        data = path.read_bytes()[: max_bytes - total]
        if data:
            out.append((name, data))
            total += len(data)
    return out


def _hf_documents(cfg: DataConfig) -> list[tuple[str, bytes]]:
    try:
        import datasets
    except ImportError:
        raise ValueError("data.source='hf' needs the optional extra: pip install 'gradnode[hf]'") from None
    stream = datasets.load_dataset(cfg.hf_dataset, split=cfg.hf_split, streaming=True)
    out: list[tuple[str, bytes]] = []
    total = 0
    for i, row in enumerate(stream):
        if cfg.hf_text_field not in row:
            raise ValueError(f"data.hf_text_field: column {cfg.hf_text_field!r} not in dataset {cfg.hf_dataset!r}")
        data = str(row[cfg.hf_text_field]).encode()[: cfg.max_bytes - total]
        out.append((str(i), data))
        total += len(data)
        if total >= cfg.max_bytes:
            break
    return out


def split_documents(docs: list[tuple[str, bytes]], val_fraction: float) -> tuple[bytes, bytes]:
    """Deterministic, disjoint split by document name; one document is split by its tail instead."""
    val_docs = [d for n, d in docs if _unit_hash("val", n) < val_fraction]
    train_docs = [d for n, d in docs if _unit_hash("val", n) >= val_fraction]
    if not val_docs or not train_docs:  # too few documents to split by name
        joined = SEPARATOR.join(d for _, d in docs)
        cut = len(joined) - max(1, int(len(joined) * val_fraction))
        return joined[:cut], joined[cut:]
    return SEPARATOR.join(train_docs), SEPARATOR.join(val_docs)


def _build_corpus(cfg: DataConfig) -> Corpus:
    if cfg.source == "stdlib":
        docs = _read_files(_stdlib_documents(), cfg.max_bytes)
    elif cfg.source == "text":
        docs = _read_files(_text_documents(cfg.paths), cfg.max_bytes)
    else:
        docs = _hf_documents(cfg)
    if sum(len(d) for _, d in docs) == 0:
        key = {"stdlib": "data.source", "text": "data.paths", "hf": "data.hf_dataset"}[cfg.source]
        raise ValueError(f"{key}: the corpus is empty (source={cfg.source!r})")
    train, val = split_documents(docs, cfg.val_fraction)
    corpus = Corpus(torch.frombuffer(bytearray(train), dtype=torch.uint8),
                    torch.frombuffer(bytearray(val), dtype=torch.uint8), len(docs))
    log.info("corpus loaded source=%s documents=%d train_bytes=%d val_bytes=%d",
             cfg.source, len(docs), corpus.train.numel(), corpus.val.numel())
    return corpus


@functools.lru_cache(maxsize=4)
def _cached_corpus(key: str) -> Corpus:
    return _build_corpus(DataConfig.model_validate_json(key))


def load_corpus(cfg: DataConfig) -> Corpus:
    """The corpus described by ``cfg`` (cached per process: the replicas of a benchmark share it)."""
    return _cached_corpus(cfg.model_dump_json())


class Batches:
    """Reproducible batches of ``(inputs, targets)`` windows from one corpus, for one run and peer."""

    def __init__(self, corpus: Corpus, seq_len: int, batch_size: int, run_id: str, seed: int) -> None:
        for name, split in (("train", corpus.train), ("val", corpus.val)):
            if split.numel() <= seq_len + 1:
                raise ValueError(f"model.seq_len ({seq_len}) is too long for the {name} split "
                                 f"({split.numel()} bytes); add data or lower it")
        self.corpus, self.seq_len, self.batch_size = corpus, seq_len, batch_size
        self.run_id, self.seed = run_id, seed

    def _windows(self, data: Tensor, generator: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
        starts = torch.randint(0, data.numel() - self.seq_len - 1, (n,), generator=generator)
        offsets = torch.arange(self.seq_len + 1)
        rows = data[starts[:, None] + offsets].long()
        return rows[:, :-1], rows[:, 1:]

    def train(self, peer: int, step: int, micro: int = 0) -> tuple[Tensor, Tensor]:
        """Micro-batch ``micro`` of inner step ``step`` (a global counter) for ``peer``."""
        g = torch.Generator().manual_seed(_seed("train", self.run_id, self.seed, peer, step, micro))
        return self._windows(self.corpus.train, g, self.batch_size)

    def sample(self, rows: int, *key: object) -> tuple[Tensor, Tensor]:
        """``rows`` training windows drawn by a generator seeded from ``key`` (e.g. a witness's secret and a
        round): a stream of its own, apart from every peer's assigned batches."""
        g = torch.Generator().manual_seed(_seed("sample", self.run_id, self.seed, *key))
        return self._windows(self.corpus.train, g, rows)

    def val(self, index: int) -> tuple[Tensor, Tensor]:
        """Validation batch ``index``: the same for every peer of the run."""
        g = torch.Generator().manual_seed(_seed("val", self.run_id, self.seed, index))
        return self._windows(self.corpus.val, g, self.batch_size)


class FixedBatches(Batches):
    """A lazy peer's data (testing aid: `bench robust`'s and the swarm's 'lazy' attacker): inner step 0's
    batch, every step, whatever it was assigned."""

    @classmethod
    def of(cls, batches: Batches) -> "FixedBatches":
        return cls(batches.corpus, batches.seq_len, batches.batch_size, batches.run_id, batches.seed)

    def train(self, peer: int, step: int, micro: int = 0) -> tuple[Tensor, Tensor]:
        return super().train(peer, 0, micro)

