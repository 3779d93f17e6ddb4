"""The run's end, kept past the DHT's memory.

A peer that reaches the run's last round stores a signed 'finished' record in the DHT (peer.py
``_say_finished``); a peer back after the run's end reads them to learn that it is over (``_ended_without_us``).
hivemind keeps a record in memory on the nodes nearest its key only: once every finisher left, a bootstrap
restarted for an upgrade or after a crash holds none: a peer back alone waited for peers for good, and two back
together trained on to the end on a chain of their own.

So a bootstrap (a serve-only peer) keeps the verified records it reads in its run folder, loads them when it
starts again, and serves them as one blob (``records.kept_finished_name``); a peer asking whether the run is over
asks each of its initial peers for that blob besides the DHT, and merges what they serve. Each record carries its
author's key and is verified on it, so a bootstrap can only withhold records (the reader then goes by the DHT, as
without one), never forge one; the reader's own rule (protocol/sync.py ``run_over``: its ledger's keys, the age of
its state, the clock bound) judges them as it judges the DHT's.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection
from pathlib import Path

from gradnode.node import read_kept, save_kept
from gradnode.node.config import peer_id_of
from gradnode.node.swarm.membership import Membership
from gradnode.node.swarm.transport import Transport
from gradnode.protocol import sync as rules
from gradnode.protocol.records import (FINISHED_MAX_BYTES, KEPT_FINISHED_MAX, Finished, RecordError,
                                       kept_blob, kept_finished_name, kept_finished_of)

log = logging.getLogger(__name__)

FILE_NAME = "finished.msgpack"
FETCH_S = 5.0  # how long a reader's first look waits for its initial peers' kept lists (a bootstrap down costs this)
REFRESH_S = 15.0  # a bootstrap reads the DHT's 'finished' records this often (finishers linger: peer.py _linger)


def _verified(membership: Membership, raws: list[bytes], authors: Collection[str] | None = None) -> list[Finished]:
    """The records of ``raws`` that parse and verify on the key they carry (of ``authors`` only: a flood of
    other keys' records costs no signature check)."""
    out = []
    for raw in raws:
        try:
            rec = Finished.from_bytes(raw)
        except RecordError:
            continue
        if (authors is None or rec.peer in authors) and membership.verify_record(rec):
            out.append(rec)
    return out


class Kept:
    """A bootstrap's 'finished' records: read from the DHT every ``every_s``, written to ``path`` when they change,
    served as one blob (the transport's blob store)."""

    def __init__(self, membership: Membership, transport: Transport, path: Path, ttl: float,
                 every_s: float = REFRESH_S) -> None:
        self.membership, self.transport, self.path, self.ttl, self.every_s = membership, transport, path, ttl, every_s
        self.name = kept_finished_name(membership.run_id)
        self.records: list[bytes] = []
        self._read_at = -math.inf
        self._keep(_verified(membership, read_kept(path, kept_finished_of, "'finished' records")), save=False)
        if self.records:
            log.info("kept 'finished' records of run %s: %d, served again", membership.run_id, len(self.records))

    def refresh(self) -> None:
        """Add the records in the DHT now, every ``every_s`` at most (heartbeat thread: its DHT read may take
        seconds, and the bootstrap's member record must stay fresh)."""
        if time.monotonic() - self._read_at < self.every_s:
            return
        self._read_at = time.monotonic()
        self._keep(self.membership.read("finished", None, Finished, fresh=True), save=True)

    def _keep(self, new: list[Finished], save: bool) -> None:
        old = [Finished.from_bytes(raw) for raw in self.records]
        records = rules.kept_finished(((r.peer, r.time, r.to_bytes()) for r in old),
                                      ((r.peer, r.time, r.to_bytes()) for r in new),
                                      now=self.transport.now(), ttl=self.ttl, cap=KEPT_FINISHED_MAX)
        if records == self.records and self.transport.blobs.get(self.name) is not None:
            return
        self.records = records
        blob = kept_blob(records)
        self.transport.blobs.put(self.name, blob)
        if save:
            save_kept(self.path, blob, "'finished' records")


def kept_elsewhere(membership: Membership, transport: Transport, initial_peers: list[str],
                   authors: Collection[str], timeout: float | None = None) -> tuple[list[Finished], bool]:
    """The 'finished' records of ``authors`` that this peer's initial peers keep (a bootstrap serves them; any other
    peer holds none), verified: every initial peer is asked once, all at once, and their lists are merged (one
    that serves a short or junk list hides nobody else's); nothing from one that does not answer in ``timeout``
    (``FETCH_S`` by default).
    With them, whether every initial peer asked answered (False: a bootstrap that keeps the run's end may be among
    the silent ones, so records missing from this look may be there all the same)."""
    sources: dict[str, list[str]] = {}
    for maddr in initial_peers:
        peer = peer_id_of(maddr)
        if peer is not None:
            sources.setdefault(peer, []).append(maddr)
    if not sources or not authors:
        return [], True
    try:
        blobs, whole = transport.ask_each(list(sources.items()), kept_finished_name(membership.run_id),
                                          max_bytes=KEPT_FINISHED_MAX * (FINISHED_MAX_BYTES + 8),
                                          timeout=FETCH_S if timeout is None else timeout)
    except Exception as err:  # the transport's loop did not answer in time: this look goes by the DHT alone
        log.debug("kept 'finished' records not read: %r", err)
        return [], False
    out = []
    for blob in blobs.values():
        try:
            out += _verified(membership, kept_finished_of(blob), authors) if blob is not None else []
        except RecordError:
            continue
    return out, whole
