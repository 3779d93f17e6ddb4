"""A run as its folder's files tell it: what the status page draws after the run ends (`gradnode status
--run-dir DIR --serve PORT`), and the figures the live page takes from this machine's peers.

A folder is either one peer's run folder (run.output_dir: health.json, events.jsonl, checkpoints/, and its
metrics rows) or a `gradnode simulate` run folder, which holds one such folder per peer (peer-0/, peer-1/, ...,
named on the page by their folder). A peer's rows are ``metrics.jsonl`` in its folder, else the file its start
event names (`gradnode join --metrics FILE`).

Files grow while a run goes on: each is read from where the last read ended, a long file's tail only, and
every value is checked before use (the rows quote peers' ids; nothing here is drawn as markup).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gradnode.node.status import figures
from gradnode.node.swarm import events, health
from gradnode.node.swarm.events import Kind

log = logging.getLogger(__name__)

MAX_PEERS = 256  # peer folders read
MAX_ROWS = 400  # rows kept per peer (the newest)
MAX_EVENTS = 400  # events kept per peer (the newest)
TAIL_BYTES = 1 << 20  # of a file met for the first time, only its end is read
READ_BYTES = 4 << 20  # read per file per refresh at most
SMALL_BYTES = 1 << 20  # health.json and summary.json larger than this are not parsed
LIVE_S = 60.0  # a peer whose files changed within this is taken as running (health.check's age)
REFRESH_S = 1.0  # the files are read again at most this often
_PEER_ID = re.compile(r"[1-9A-HJ-NP-Za-km-z]{20,64}")
_HASH = re.compile(r"[0-9a-f]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_PEER_FOLDER = re.compile(r"peer-\d{1,6}")


def _num(v: Any, lo: float = 0.0, hi: float = 1e15) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi else None


def _int(v: Any, hi: int = 2**62) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi else None


def _peer_id(v: Any) -> str | None:
    return v if isinstance(v, str) and _PEER_ID.fullmatch(v) else None


def _row(d: dict[str, Any]) -> dict[str, Any] | None:
    """A metrics row's figures the page uses, checked; None for a row without a round."""
    r = _int(d.get("round"), 10**9)
    if r is None:
        return None
    h = d.get("hash")
    return {"round": r, "loss": _num(d.get("loss"), 0.0, 1e6), "val_loss": _num(d.get("val_loss"), 0.0, 1e6),
            "utilization": _num(d.get("utilization"), 0.0, 1.0), "time": _num(d.get("time"), 0.0, 1e11),
            "hash": h[:64] if isinstance(h, str) and _HASH.fullmatch(h[:64]) else None,
            "bytes_up": _int(d.get("bytes_up")) or 0, "bytes_down": _int(d.get("bytes_down")) or 0,
            "rejected": _int(d.get("rejected")) or 0, "resyncs": _int(d.get("resyncs")) or 0,
            "contributed": _int(d.get("contributed")), "excluded": _int(d.get("excluded")),
            "abstained": _int(d.get("abstained")), "own_included": d.get("own_included") is True,
            "started": _num(d.get("started"), 0.0, 1e11),
            "banned": [p for p in d.get("banned", [])[:64] if _peer_id(p)] if isinstance(d.get("banned"), list) else []}


def _event(d: dict[str, Any]) -> dict[str, Any] | None:
    """An events.jsonl line, checked (kinds the peer writes only); None for anything else."""
    try:
        kind = Kind(d.get("kind"))
    except ValueError:
        return None
    t = _num(d.get("time"), 0.0, 1e11)
    if t is None:
        return None
    out: dict[str, Any] = {"time": t, "kind": kind.value, "message": str(d.get("message", ""))[:events.MAX_MESSAGE],
                           "round": _int(d.get("round"), 10**9)}
    for k in ("val_loss",):
        out[k] = _num(d.get(k), 0.0, 1e6)
    for k in ("rounds", "rounds_applied", "suppressed"):
        out[k] = _int(d.get(k), 10**9)
    for k in ("reason", "version", "metrics", "run", "source"):
        out[k] = str(d[k])[:events.MAX_FIELD] if isinstance(d.get(k), str) else None
    out["reached"] = d.get("reached") if isinstance(d.get("reached"), bool) else None
    out["ahead_s"] = _num(d.get("ahead_s"), -1e9, 1e9)
    out["peer"] = _peer_id(d.get("peer"))
    return out


class _Lines:
    """The checked JSON objects of a growing JSON-lines file, the newest ``keep``, read from where the last read
    ended (a file met first: its last TAIL_BYTES; replaced or rotated: again from its start). A line cut by
    where a read began is no JSON object, and is dropped as any other bad line."""

    def __init__(self, path: Path, keep: int, check: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        self.path, self.check = path, check
        self.rows: deque[dict[str, Any]] = deque(maxlen=keep)
        self.offset: int | None = None  # None: not read yet
        self.inode = -1
        self.partial = b""  # the end of the last read, a line not finished yet

    def refresh(self) -> None:
        try:
            st = self.path.stat()
            if self.offset is None or st.st_ino != self.inode or st.st_size < self.offset:
                start = max(0, st.st_size - TAIL_BYTES) if self.offset is None else 0
                self.inode, self.offset, self.partial = st.st_ino, start, b""
            if st.st_size == self.offset:
                return
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(min(READ_BYTES, st.st_size - self.offset))
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > READ_BYTES:  # no row is this long: what comes of it is dropped as a bad line
            self.partial = b""
        for line in lines:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            row = self.check(d) if isinstance(d, dict) else None
            if row is not None:
                self.rows.append(row)


def _small_json(path: Path) -> dict[str, Any] | None:
    try:
        if path.stat().st_size > SMALL_BYTES:
            return None
        d = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


@dataclass
class PeerFolder:
    """One peer's folder, as last read."""

    name: str
    path: Path
    rows: _Lines = field(init=False)
    events: _Lines = field(init=False)
    rotated: _Lines = field(init=False)
    health: dict[str, Any] | None = None
    summary: bool = False
    peer: str | None = None
    changed: float = 0.0  # wall time its files last changed
    _summary_read: tuple[float | None, str | None] = (None, None)  # (mtime, peer id) of summary.json as last read

    def __post_init__(self) -> None:
        self.rows = _Lines(self.path / "metrics.jsonl", MAX_ROWS, _row)
        self.events = _Lines(self.path / events.FILE_NAME, MAX_EVENTS, _event)
        self.rotated = _Lines(self.path / (events.FILE_NAME + ".1"), MAX_EVENTS, _event)

    def refresh(self) -> None:
        if self.rotated.offset is None:  # the rotated file only once, before the live one is followed
            self.rotated.refresh()
        self.events.refresh()
        start = self.start()
        if start is not None and start.get("metrics") and not (self.path / "metrics.jsonl").exists():
            named = Path(start["metrics"])
            if named != self.rows.path and named.name.endswith(".jsonl"):
                self.rows = _Lines(named, MAX_ROWS, _row)
        self.rows.refresh()
        self.health = _small_json(self.path / health.FILE_NAME)
        mtime = self._mtime("summary.json")
        if mtime != self._summary_read[0]:  # read once it changed: it lists every round's hash
            self._summary_read = (mtime, _peer_id((_small_json(self.path / "summary.json") or {}).get("peer")))
        self.summary = mtime is not None
        self.peer = (start or {}).get("peer") or self._maddrs_peer() or self._summary_read[1]
        times = [self._mtime(p) for p in ("metrics.jsonl", events.FILE_NAME, health.FILE_NAME, "summary.json")]
        self.changed = max([t for t in times if t is not None] + [self._mtime_of(self.rows.path) or 0.0])

    def _mtime(self, name: str) -> float | None:
        return self._mtime_of(self.path / name)

    @staticmethod
    def _mtime_of(path: Path) -> float | None:
        try:
            return path.stat().st_mtime
        except OSError:
            return None

    def _maddrs_peer(self) -> str | None:
        """The peer id in its address file: ``maddrs`` in its folder (a simulate peer's), or NAME.maddrs beside
        it (a simulate bootstrap's)."""
        for path in (self.path / "maddrs", self.path.parent / f"{self.name}.maddrs"):
            try:
                text = path.read_text()[:8192]
            except (OSError, ValueError):
                continue
            found = next((_peer_id(m.rsplit("/p2p/", 1)[1]) for m in text.split() if "/p2p/" in m), None)
            if found:
                return found
        return None

    def all_events(self) -> list[dict[str, Any]]:
        return [*self.rotated.rows, *self.events.rows]

    def told(self) -> list[dict[str, Any]]:
        """Its events for the log: evaluations aside (they are the validation curve), and the warnings of a
        process whose run was over (its shutdown's, about nothing left to do)."""
        out, over = [], False
        for e in self.all_events():
            over = (over or e["kind"] == Kind.END.value) and e["kind"] != Kind.START.value
            if e["kind"] == Kind.EVAL.value or (over and e["kind"] == Kind.WARNING.value):
                continue
            out.append(e)
        return out

    def start(self) -> dict[str, Any] | None:
        return next((e for e in reversed(self.all_events()) if e["kind"] == Kind.START.value), None)

    def state(self, now: float) -> str:
        """'finished' (an end at the run's last round after its last start, or its summary), 'stopped' (an end
        before it), 'running' (files changed within LIVE_S), 'gone' (killed or hung), or 'waiting' (nothing
        written yet)."""
        start = self.start()
        end = next((e for e in reversed(self.all_events()) if e["kind"] == Kind.END.value
                    and (start is None or e["time"] >= start["time"])), None)
        if end is not None:
            return "stopped" if end["reached"] is False else "finished"
        if self.summary:
            return "finished"
        if not self.changed:
            return "waiting"
        return "running" if now - self.changed <= LIVE_S else "gone"

    def val_points(self) -> list[list[float]]:
        """[rounds applied, validation loss, time]: each evaluation its event tells, and each new value in the
        rows (older peers' runs hold no evaluation events)."""
        found: dict[int, tuple[float, float]] = {}
        for e in self.all_events():
            if e["kind"] in (Kind.EVAL.value, Kind.END.value) and e["val_loss"] is not None:
                x = e["rounds_applied"] if e["rounds_applied"] is not None else e["round"]
                if x is not None:
                    found[x] = (e["val_loss"], e["time"])
        told = {v for v, _ in found.values()}  # a row carries the last value until the next evaluation
        last = None
        for r in self.rows.rows:
            v = r["val_loss"]
            if v is not None and v != last and v not in told and r["time"] is not None:
                found.setdefault(r["round"] + 1, (v, r["time"]))
            last = v
        return [[x, v, t] for x, (v, t) in sorted(found.items())]

    def figures(self, now: float) -> dict[str, Any]:
        """What this peer's files say of it (the page's per-peer figures that records do not carry)."""
        rows = self.rows.rows
        start = self.start() or {}
        vals = self.val_points()
        out = {"name": self.name, "peer": self.peer, "state": self.state(now),
               "round": _int((self.health or {}).get("round"), 10**9) or 0, "val_loss": vals[-1][1] if vals else None,
               "version": start.get("version"), "target": start.get("rounds"), "run": start.get("run"),
               "started": start.get("time"), "last_seen_s": round(max(0.0, now - self.changed), 1) if self.changed
               else None, "losses": [[r["round"], r["loss"], r["time"]] for r in rows if r["loss"] is not None],
               "val_losses": vals, "loss": None, "utilization": None, "contributed": None, "excluded": None,
               "abstained": None, "resyncs": None, "rejected": 0, "bytes_up": 0, "bytes_down": 0}
        if rows:
            last = rows[-1]
            out.update({k: last[k] for k in ("loss", "utilization", "excluded", "abstained", "resyncs", "rejected",
                                             "bytes_up", "bytes_down")})
            out["round"] = last["round"] + 1  # rounds applied, as a member record counts them
            # rows of older versions do not count contributions: those of the rows kept, then
            out["contributed"] = last["contributed"] if last["contributed"] is not None \
                else sum(r["own_included"] for r in rows)
        return out


def around(folder: Path) -> Path:
    """The run folder a process's own folder belongs to: a simulate run's, when ``folder`` is its bootstrap's
    (peer-N folders beside it), else ``folder`` itself."""
    folder = Path(folder)
    parent = folder.parent
    if folder.name == "bootstrap" and any(_PEER_FOLDER.fullmatch(p.name) for p in _dirs(parent)):
        return parent
    return folder


def _dirs(folder: Path) -> list[Path]:
    try:
        return sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.name)[:4 * MAX_PEERS]
    except OSError:
        return []


def _index(name: str) -> int:
    return int(name.split("-", 1)[1]) if _PEER_FOLDER.fullmatch(name) else -1


class RunFolder:
    """The peers of a run folder, read again at most every REFRESH_S; ``snapshot()`` is the page's JSON."""

    def __init__(self, root: Path, run_id: str = "", target_rounds: int | None = None,
                 refresh_s: float = REFRESH_S) -> None:
        self.root, self.run_id, self.target_rounds = Path(root), run_id, target_rounds or None
        self.refresh_s = refresh_s
        self.folders: dict[str, PeerFolder] = {}
        self.polls = 0
        self._read = 0.0
        self._lock = threading.Lock()

    def _discover(self) -> None:
        subs = [p for p in _dirs(self.root) if _PEER_FOLDER.fullmatch(p.name) or p.name == "bootstrap"]
        if not subs:  # one peer's own folder
            subs = [self.root]
        for p in sorted(subs, key=lambda p: (_index(p.name), p.name))[:MAX_PEERS]:
            name = p.name if _NAME.fullmatch(p.name) else "peer"
            if name not in self.folders:
                self.folders[name] = PeerFolder(name, p)

    def refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._read < self.refresh_s and self.polls:
                return
            self._discover()
            for f in self.folders.values():
                f.refresh()
            self._read = time.monotonic()
            self.polls += 1

    def extras(self, now: float) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], int | None]:
        """What the live page adds from this machine's files: figures by peer id, the events, the run's rounds."""
        self.refresh()
        with self._lock:
            found = {f.peer: f.figures(now) for f in self.folders.values() if f.peer}
            return found, self._events(), self._target(found.values())

    def _target(self, peers: Any) -> int | None:
        told = [p["target"] for p in peers if p.get("target")]
        return self.target_rounds or (max(told) if told else None)

    def _events(self) -> list[dict[str, Any]]:
        """Every peer's events (``PeerFolder.told``) and the reputation bans its rows name first, oldest first, the
        newest MAX_EVENTS."""
        out = []
        banned: dict[str, tuple[float, str, int]] = {}
        for f in self.folders.values():
            out.extend({**e, "peer": f.peer, "name": f.name} for e in f.told())
            for r in f.rows.rows:
                for p in r["banned"]:
                    if r["time"] is not None and (p not in banned or r["time"] < banned[p][0]):
                        banned[p] = (r["time"], f.name, r["round"])
        for p, (t, name, r) in banned.items():
            out.append({"time": t, "kind": Kind.BAN.value, "round": r, "peer": p, "name": self._name_of(p),
                        "message": f"banned by the reputation table (first in the rows of {name})"})
        out.sort(key=lambda e: e["time"])
        return out[-figures.MAX_EVENTS:]

    def _name_of(self, peer: str) -> str | None:
        return next((f.name for f in self.folders.values() if f.peer == peer), None)

    def snapshot(self) -> dict[str, Any]:
        self.refresh()
        now = time.time()
        with self._lock:
            trainers = [f for f in self.folders.values() if f.name != "bootstrap"]
            peers = [f.figures(now) for f in trainers]
            evs = self._events()
            rounds = self._rounds(trainers)
        running = [p for p in peers if p["state"] == "running"]
        typical = figures.typical_round([p["round"] for p in (running or peers) if p["round"] is not None])
        majority = {r["round"]: r["top"] for r in rounds}
        hashes = {f.name: {r["round"]: r["hash"][:16] for r in f.rows.rows if r["hash"]} for f in trainers}
        for p in peers:
            p.update(self._standing(p, hashes[p["name"]], majority, typical))
        finished = bool(peers) and not running and any(p["state"] == "finished" for p in peers)
        reached = {r["round"] + 1: r["time"] for r in rounds if r["time"] is not None}
        starts = [p["started"] for p in peers if p["started"]] + ([min(reached.values())] if reached else [])
        shared = [r for r in rounds if r["reports"] >= 2] or rounds
        run = self.run_id or next((p["run"] for p in peers if p["run"]), "") or self.root.name
        return {"run": run, "source": "folder", "folder": str(self.root)[-200:], "polls": self.polls,
                "interval_s": 2.0 if not finished else 10.0, "time": now, "round": typical,
                "live_trainers": len(running), "chains": len(shared[-1]["hashes"]) if shared else 0,
                "progress": figures.progress(typical, self._target(peers), reached, min(starts) if starts else None,
                                             now, finished),
                "peers": [{**p, "role": "train", "live": p["state"] == "running"} for p in peers],
                "rounds": [{k: v for k, v in r.items() if k != "top"} for r in rounds[-MAX_ROWS:]],
                "events": evs}

    @staticmethod
    def _standing(p: dict[str, Any], mine: dict[int, str], majority: dict[int, str | None],
                  typical: int) -> dict[str, Any]:
        """Its newest hash and whether it is the most common one of that round (off the majority: another chain
        of weights than most peers'), and whether it is rounds behind the swarm."""
        shared = [r for r in sorted(mine) if majority.get(r)]
        r = shared[-1] if shared else (max(mine) if mine else None)
        h = mine.get(r) if r is not None else None
        agrees = None if r is None or not majority.get(r) else h == majority[r]
        return {"hash": h[:16] if h else None, "hash_round": r, "agrees": agrees,
                "behind": figures.behind(p["round"], typical),
                "lag": max(0, typical - p["round"])}

    @staticmethod
    def _rounds(trainers: list[PeerFolder]) -> list[dict[str, Any]]:
        """Per round: the peers whose rows hold it (each once), their distinct hashes (the most common as ``top``,
        None on a tie), the bytes they moved reaching it, when it was first applied."""
        by: dict[int, dict[str, Any]] = {}

        def row_of(r: int) -> dict[str, Any]:
            return by.setdefault(r, {"round": r, "reports": 0, "hashes": Counter(), "sent_bytes": 0,
                                     "received_bytes": 0, "update_bytes": None, "time": None})

        for f in trainers:
            prev = None
            for r in f.rows.rows:  # bytes: the counters' steps within one process life
                if prev is not None and prev["started"] == r["started"] and r["round"] > prev["round"]:
                    row_of(r["round"])["sent_bytes"] += max(0, r["bytes_up"] - prev["bytes_up"])
                    row_of(r["round"])["received_bytes"] += max(0, r["bytes_down"] - prev["bytes_down"])
                prev = r
            for r in {r["round"]: r for r in f.rows.rows}.values():  # a round done again after a restart: once
                row = row_of(r["round"])
                row["reports"] += 1
                if r["hash"]:
                    row["hashes"][r["hash"][:16]] += 1
                if r["time"] is not None and (row["time"] is None or r["time"] < row["time"]):
                    row["time"] = r["time"]
        out = []
        for r in sorted(by):
            row, common = by[r], by[r]["hashes"].most_common(2)
            top = common[0][0] if common and (len(common) == 1 or common[0][1] > common[1][1]) else None
            out.append({**row, "hashes": dict(row["hashes"].most_common(8)), "top": top})
        return out
