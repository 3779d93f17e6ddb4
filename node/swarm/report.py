"""What a peer reports about its own run: counters, time per phase, the per-round metrics line and the
final summary (`gradnode join --metrics/--summary`, read by `gradnode simulate` and the benchmarks)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from gradnode.node.train.evaluate import MEASURE


@dataclass
class PeerSummary:
    peer: str
    rounds: int
    final_loss: float | None
    val_loss_first: float | None  # at the start and the end of this process's run, both MEASURE's figure
    val_loss_last: float | None
    param_hash: str
    bytes_up: int
    bytes_down: int
    utilization: float  # time in inner steps / wall time of the training loop
    comm_wait_s_per_round: float
    # the same without the end of the run, when the last round's exchange has nothing left to overlap with
    utilization_steady: float
    comm_wait_s_per_round_steady: float
    rejected_updates: int
    rejected_by_sender: dict[str, dict[str, int]] = field(default_factory=dict)
    resyncs: int = 0
    own_excluded: int = 0
    contributed: int = 0  # rounds whose agreed set held this peer's update
    abstained: int = 0  # rounds this peer sat out to get back in phase (too slow for their deadline)
    undrawn: int = 0  # rounds a committee left this peer out of: it sent nothing and observed them
    hashes: dict[int, str] = field(default_factory=dict)
    joined_round: int = 0  # the first round this process trained (after resuming and syncing)
    first_contribution: int | None = None  # the first round whose agreed set held this peer's update
    catchups: int = 0  # missed rounds caught up by replaying their updates
    state_downloads: int = 0  # full states downloaded (joining, or too far behind to replay)
    rejected_state_offers: int = 0  # offers whose weights did not match their advertised hash
    resumed_round: int | None = None  # round of the own checkpoint this process resumed from
    state_bytes_up: int = 0  # state served to joiners
    own_update_bytes_up: int = 0  # copies of this peer's own updates uploaded (the rest of bytes_up is relaying)
    dht_reads: int = 0  # DHT reads made, and those answered by another thread's read of the same key just before
    dht_reads_shared: int = 0
    state_bytes_down: int = 0  # of bytes_down, state chunks fetched (the rest is updates)
    # DHT records over the run (Transport.records): reads, records_read, record_bytes_read, records_written,
    # record_bytes_written; and the same by table
    records: dict[str, int] = field(default_factory=dict)
    records_by_table: dict[str, dict[str, int]] = field(default_factory=dict)
    peak_updates_held: int = 0  # the most updates its blob store held at once
    # this clock against the peers' (protocol/skew.py), as last measured; None when no peer answered a ping
    clock_ahead_s: float | None = None
    clock_error_s: float | None = None
    # the round the run ended on, as most of its contributors told this peer when it found nobody training (it
    # came back after the end, and stopped where it was); None when it ran to its own end or was stopped
    run_over_at: int | None = None
    # main-thread seconds per round outside the inner steps, by phase (what utilisation loses, and where)
    phase_s_per_round: dict[str, float] = field(default_factory=dict)
    val_loss_measure: str = MEASURE  # what val_loss_first and val_loss_last measure (node/train/evaluate.py)


def summary_json(s: PeerSummary) -> str:
    d = asdict(s)
    d["hashes"] = {str(k): v for k, v in d["hashes"].items()}
    return json.dumps(d)


@dataclass
class Tally:
    """A peer's counters over its run."""

    started: float = field(default_factory=time.time)  # when this process started (wall clock): which life a row is of
    rounds_done: int = 0  # rounds this process applied itself
    resyncs: int = 0
    own_excluded: int = 0
    contributed: int = 0
    abstained: int = 0
    undrawn: int = 0
    catchups: int = 0
    joined_round: int = 0
    first_contribution: int | None = None
    resumed_round: int | None = None
    inner_s: float = 0.0  # seconds in inner steps
    wait_s: float = 0.0  # seconds the main loop waited for a round's outcome
    drain_s: float = 0.0  # the run's end: the last round's exchange with nothing to overlap with
    drain_wait_s: float = 0.0
    sync: Counter = field(default_factory=Counter)  # statesync.fetch's 'downloads', 'rejected_offers', ...


class Phases:
    """Seconds spent per named phase, from any thread (main loop and chores thread)."""

    def __init__(self) -> None:
        self._s: Counter = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._s[name] += seconds

    @contextlib.contextmanager
    def time(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - t0)

    def totals(self) -> dict[str, float]:
        with self._lock:
            return dict(self._s)


def append_metrics(path: Path | None, row: dict[str, Any]) -> None:
    """One JSON line per applied round (the live view of `gradnode simulate` reads them)."""
    if path is None:
        return
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
