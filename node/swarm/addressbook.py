"""The address book: peers of this run that this peer has seen, so that it can find the swarm again.

A peer learns addresses only from signed member records of its run (membership.py checks them). It
keeps the newest ``MAX_ENTRIES`` in a JSON file in its run folder (written atomically with its
checkpoints, or by the bootstrap every heartbeat), and uses them as well as its configured initial
peers when it (re)starts, and while it runs to re-dial members it no longer sees. So a peer restarted
after the bootstrap died, or a bootstrap restarted with an empty DHT, reconnects to the swarm it knew,
and two groups split by the network find each other again once the network heals.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from gradnode.node import write_json

log = logging.getLogger(__name__)

MAX_ENTRIES = 256
FILE_NAME = "addressbook.json"


@dataclass
class Entry:
    maddrs: list[str]
    seen: float  # wall-clock time of the newest member record that listed these addresses
    next_dial: float = 0.0  # monotonic time before which it is not dialled again (back-off)
    failures: int = 0


class AddressBook:
    """Peer id -> addresses and when it was last seen; this peer itself is never in it."""

    def __init__(self, path: Path | None, me: str) -> None:
        self.path, self.me = path, me
        self.entries: dict[str, Entry] = {}
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            raw = json.loads(path.read_text())
            for peer, e in raw.get("peers", {}).items():
                if peer != self.me and isinstance(e.get("maddrs"), list):
                    self.entries[str(peer)] = Entry([str(m) for m in e["maddrs"]][:16], float(e.get("seen", 0.0)))
        except (OSError, ValueError, AttributeError, TypeError) as err:  # a damaged book only costs addresses
            log.warning("address book %s unreadable (%s); starting with an empty one", path, err)
        self._trim()

    def note(self, peers: Iterable[tuple[str, list[str]]], now: float | None = None) -> None:
        """Remember the addresses of peers seen now (from verified member records)."""
        now = time.time() if now is None else now
        for peer, maddrs in peers:
            if peer == self.me or not maddrs:
                continue
            old = self.entries.get(peer)
            self.entries[peer] = Entry(list(maddrs)[:16], now)
            if old is not None and old.maddrs == list(maddrs)[:16]:
                self.entries[peer].failures, self.entries[peer].next_dial = old.failures, old.next_dial
        self._trim()

    def _trim(self) -> None:
        if len(self.entries) > MAX_ENTRIES:
            keep = sorted(self.entries, key=lambda p: self.entries[p].seen, reverse=True)[:MAX_ENTRIES]
            self.entries = {p: self.entries[p] for p in keep}

    def newest(self, limit: int, exclude: Iterable[str] = ()) -> list[tuple[str, list[str]]]:
        """(peer id, maddrs) of the most recently seen peers, ``exclude`` left out."""
        skip = set(exclude)
        ranked = sorted((p for p in self.entries if p not in skip), key=lambda p: self.entries[p].seen, reverse=True)
        return [(p, self.entries[p].maddrs) for p in ranked[:limit]]

    def due(self, absent: Iterable[str], limit: int, now: float) -> list[tuple[str, list[str]]]:
        """Peers of ``absent`` (known here, not seen live now) whose back-off has passed, newest first."""
        ready = [p for p in absent if p in self.entries and self.entries[p].next_dial <= now]
        ready.sort(key=lambda p: self.entries[p].seen, reverse=True)
        return [(p, self.entries[p].maddrs) for p in ready[:limit]]

    def dialled(self, peer: str, ok: bool, now: float) -> None:
        """Back off from a peer that did not answer: 10 s, then 20 s, then every 30 s (a split network that
        heals is noticed within half a minute)."""
        e = self.entries.get(peer)
        if e is None:
            return
        e.failures = 0 if ok else e.failures + 1
        e.next_dial = now + (0.0 if ok else min(30.0, 10.0 * 2 ** (e.failures - 1)))

    def save(self) -> None:
        if self.path is None:
            return
        data: dict[str, Any] = {"peers": {p: {"maddrs": e.maddrs, "seen": e.seen} for p, e in self.entries.items()}}
        try:
            write_json(self.path, data, indent=1)
        except OSError as err:  # a full disk costs only the addresses of this save
            log.warning("address book not saved (%s)", err)


def with_peer_id(peer: str, maddrs: list[str]) -> list[str]:
    """The addresses as a DHT initial peer needs them: each ending with /p2p/<peer id>."""
    return [m if "/p2p/" in m else f"{m}/p2p/{peer}" for m in maddrs]
