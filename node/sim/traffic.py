"""What a peer moves per round, summarised over the swarm's peers: the same figures from a real `gradnode
simulate` (the transports' counters, node/swarm/transport.py) and from `gradnode simulate --virtual` (the
simulator's ``Counters``), so that the two can be set side by side.

A figure per round is a peer's counter between the first and the last round it applied, over the rounds
between them: the start (waiting for peers, a state download) and the end (the last checks, the linger) are
not rounds, and each costs a run once."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# per peer and round: update bytes fetched and served, DHT records (values) read and written, and the bytes of
# those read. A state download is counted apart (state_bytes_down), never as update bytes
PER_ROUND = ("update_bytes_down", "update_bytes_up", "records_read", "records_written", "record_bytes_read")


def spread(values: Iterable[float]) -> dict[str, float] | None:
    """min / median / max of ``values``; None for none."""
    got = sorted(values)
    if not got:
        return None
    return {"min": round(got[0], 1), "median": round(statistics.median(got), 1), "max": round(got[-1], 1)}


def between(first: Mapping[str, Any], last: Mapping[str, Any], rounds: int) -> dict[str, Any]:
    """Per round, from two snapshots of a peer's counters ``rounds`` rounds apart: each PER_ROUND figure, the
    seconds a round took, and the records read from each table."""
    out: dict[str, Any] = {k: (last[k] - first[k]) / rounds for k in (*PER_ROUND, "seconds")}
    out["tables"] = {t: (n - first["tables"].get(t, 0)) / rounds for t, n in last["tables"].items()}
    return out


def summary(peers: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Over ``peers`` (each: ``per_round``, from ``between``; ``peak_updates_held``; a real peer's
    ``dht_read_s``, one read's mean seconds), min / median / max of each PER_ROUND figure and of the peak
    number of updates a peer held at once, and the median records read per round from each table."""
    rows = [p for p in peers if p.get("per_round")]
    out: dict[str, Any] = {k: spread(p["per_round"][k] for p in rows) for k in PER_ROUND}
    out["peak_updates_held"] = spread(p["peak_updates_held"] for p in rows)
    out["round_s"] = spread(p["per_round"]["seconds"] for p in rows)
    if any("dht_read_s" in p for p in rows):
        out["dht_read_s"] = round(statistics.median(p["dht_read_s"] for p in rows), 4)
    tables = sorted({t for p in rows for t in p["per_round"]["tables"]})
    out["records_read_by_table"] = {t: round(statistics.median(p["per_round"]["tables"].get(t, 0.0) for p in rows), 2)
                                    for t in tables}
    return out


@dataclass
class Counters:
    """One peer's counters, as the virtual simulator keeps them (the node's transport keeps the same)."""

    update_bytes_down: int = 0
    update_bytes_up: int = 0
    state_bytes_down: int = 0
    records_read: float = 0.0  # a model of the node's polls (virtual.py, "What a peer reads"): not a whole number
    records_written: int = 0
    record_bytes_read: float = 0.0
    tables: dict[str, float] = field(default_factory=dict)  # records read, by table
    updates_held: int = 0  # now
    peak_updates_held: int = 0
    first: dict[str, Any] | None = None  # a snapshot at the first round it applied, and at the last
    last: dict[str, Any] | None = None
    applied: int = 0  # rounds applied

    def read(self, table: str, records: float, each: int) -> None:
        """``records`` read from ``table``, of ``each`` bytes."""
        self.records_read += records
        self.record_bytes_read += records * each
        self.tables[table] = self.tables.get(table, 0.0) + records

    def hold(self, cap: int) -> None:
        """One more update held, up to ``cap`` (the blob store evicts the oldest past its budget)."""
        self.updates_held = min(cap, self.updates_held + 1)
        self.peak_updates_held = max(self.peak_updates_held, self.updates_held)

    def snapshot(self, now: float) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in PER_ROUND}, "tables": dict(self.tables), "seconds": now}

    def applied_one(self, now: float) -> None:
        """A round applied at ``now``: the snapshots the figures per round are taken between."""
        self.applied += 1
        self.last = self.snapshot(now)
        if self.first is None:
            self.first = self.last

    def row(self) -> dict[str, Any]:
        """What ``summary`` takes of this peer."""
        rounds = self.applied - 1
        per_round = between(self.first, self.last, rounds) if rounds > 0 and self.first and self.last else None
        return {"per_round": per_round, "peak_updates_held": self.peak_updates_held}
