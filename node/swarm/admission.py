"""Who may take part in a run. Open runs (no authority key in the genesis): anyone with a key. Permissioned
runs: the run authority signs an Admission for each peer (`gradnode admit PEER_ID`), which travels in the
peer's member record; a member record without a valid one (signed by the authority, for this run and this
peer, not expired, not revoked) is dropped, so its author has no known key: its updates, reports, weight
votes and state offers fail verification, and its streams are refused (Transport.admits). The authority
revokes with a signed Revocation record in the DHT (`gradnode revoke PEER_ID`); peers read it every time
they read the member list.

The DHT keeps a record in memory, on the nodes nearest its key, for its time to live: once those nodes all
restarted (a bootstrap upgraded with the run's peers away), or 30 days after the last revoke, it holds no list,
and a peer started then admitted every revoked peer again. So a bootstrap (a serve-only peer) keeps the lists it
reads in its run folder (``KeptRevocations``), loads them when it starts again and stores in the DHT, under its
own key, each one the DHT lacks while it runs: signed by the authority, a list verifies whoever carries it, so a
bootstrap can withhold one, never forge or shorten one (the lists add up in every gate).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from gradnode.node import read_kept, save_kept
from gradnode.node.config import Config, ConfigError
from gradnode.node.swarm import events
from gradnode.node.swarm.identity import Identity, verify
from gradnode.protocol.genesis import Genesis
from gradnode.protocol.records import (KEPT_REVOCATIONS_MAX, Admission, RecordError, Revocation, dht_key, kept_blob,
                                       kept_revocations_of)

if TYPE_CHECKING:
    from gradnode.node.swarm.transport import Transport

log = logging.getLogger(__name__)


class Gate:
    """Admission checks of one run; ``authority`` None means an open run (everyone admitted)."""

    def __init__(self, run_id: str, authority: bytes | None, now: Callable[[], float]) -> None:
        self.run_id, self.authority, self.now = run_id, authority, now
        self.revoked: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        return self.authority is None

    def why_not(self, peer: str, admission: bytes) -> str | None:
        """None when ``peer`` may take part, else why not (one phrase)."""
        if self.authority is None:
            return None
        if peer in self.revoked:
            return "admission revoked"
        if not admission:
            return "no admission certificate"
        try:
            cert = Admission.from_bytes(admission)
        except RecordError:
            return "malformed admission certificate"
        if cert.run_id != self.run_id or cert.peer != peer:
            return "admission certificate of another run or peer"
        if not verify(self.authority, cert.signing_bytes(), cert.signature):
            return "admission certificate not signed by the run authority"
        if cert.expires < self.now():
            return "admission certificate expired"
        return None

    def take_revocations(self, found: list[bytes]) -> list[tuple[Revocation, bytes]]:
        """Add the peers of every valid Revocation among ``found`` (raw records from the DHT) to those revoked: a
        revocation is never undone (no command undoes one), so a list the authority published without a peer it
        revoked before (a revoke whose read of the stored list came back empty) re-admits nobody here. Returns the
        valid ones, each with its bytes."""
        if self.authority is None:
            return []
        valid = []
        for raw in found:
            try:
                rec = Revocation.from_bytes(raw)
            except RecordError:
                continue
            if rec.run_id != self.run_id or not verify(self.authority, rec.signing_bytes(), rec.signature):
                continue
            valid.append((rec, raw))
            with self._lock:
                if set(rec.revoked) - self.revoked:
                    log.warning("run authority revoked %d peer(s)", len(set(rec.revoked) - self.revoked),
                                extra=events.tag(events.Kind.BAN, reason="revoked"))
                    self.revoked = self.revoked | frozenset(rec.revoked)
        return valid


class KeptRevocations:
    """A bootstrap's copy of the run's revocation lists (module docstring): the valid lists it read, in ``path``,
    loaded into its gate when it starts. Every ``every_s`` it reads the DHT's and stores under its own key (one
    value a key: ``STORE_TTL_S``) a list it keeps that the read lacks, the fullest first, or its copy again half
    way to expiring. The authority's newest list holds every peer of those before it (``revoke`` publishes the
    union): lists that do not hold each other come only of revokes with one key at once on two machines, and the
    DHT then holds them in turn, one a refresh, each read adding to every gate."""

    FILE_NAME = "revocations.msgpack"
    REFRESH_S = 15.0
    STORE_TTL_S = 86400.0

    def __init__(self, gate: Gate, transport: Transport, path: Path, every_s: float = REFRESH_S) -> None:
        self.gate, self.transport, self.path, self.every_s = gate, transport, path, every_s
        self.key = dht_key(gate.run_id, "revocations")
        self.lists: list[bytes] = []  # fewest peers first, then oldest: the fullest last
        self._read_at = self._stored_at = -math.inf
        self._keep(read_kept(path, kept_revocations_of, "revocation lists"), save=False)
        if self.lists:
            log.info("kept revocation lists of run %s: %d peer(s) revoked", gate.run_id, len(gate.revoked))

    def refresh(self) -> None:
        """Read the DHT's lists and keep the new ones; store one the read lacks, the fullest first, or our copy again
        half way to expiring (a thread of the bootstrap's own, every ``every_s`` at most). A failed read changes
        nothing."""
        if self.gate.open or time.monotonic() - self._read_at < self.every_s:
            return
        self._read_at = time.monotonic()
        found = self.transport.read(self.key)
        if found is None:
            return
        self._keep([raw for _, raw in found], save=True)
        held = {raw for _, raw in found}
        missing = [raw for raw in reversed(self.lists) if raw not in held]
        own = next((raw for owner, raw in found if owner == self.transport.peer_id and raw in self.lists), None)
        store = missing[0] if missing else own if time.monotonic() - self._stored_at > self.STORE_TTL_S / 2 else None
        if store is not None and self.transport.store(self.key, store, ttl=self.STORE_TTL_S):
            self._stored_at = time.monotonic()

    def _keep(self, raws: list[bytes], save: bool) -> None:
        """Keep the valid lists of ``raws`` and those kept: each once, none whose peers another lists too (the
        newer of two alike), at most KEPT_REVOCATIONS_MAX (the fullest); the file written when they change."""
        valid = {raw: rec for rec, raw in self.gate.take_revocations(self.lists + raws)}
        order = sorted(valid, key=lambda raw: (len(set(valid[raw].revoked)), valid[raw].time, raw))

        def covered(i: int) -> bool:
            mine = set(valid[order[i]].revoked)
            return any(mine <= set(valid[other].revoked) for other in order[i + 1:])

        kept = [raw for i, raw in enumerate(order) if not covered(i)][-KEPT_REVOCATIONS_MAX:]
        if kept == self.lists:
            return
        self.lists = kept
        if save:
            save_kept(self.path, kept_blob(kept), "revocation lists")


def admit(authority: Identity, run_id: str, peer: str, expires: float) -> bytes:
    """An Admission of ``peer`` to ``run_id`` until ``expires``, signed by ``authority``."""
    cert = Admission(run_id=run_id, peer=peer, expires=expires)
    return cert.signed(authority.sign(cert.signing_bytes())).to_bytes()


def revocation(authority: Identity, run_id: str, revoked: list[str], time_: float) -> bytes:
    rec = Revocation(run_id=run_id, revoked=sorted(set(revoked)), time=time_)
    return rec.signed(authority.sign(rec.signing_bytes())).to_bytes()


def authority_of(cfg: Config) -> bytes | None:
    """The run authority's public key (DER), from the run's genesis; None for an open run."""
    if cfg.run.genesis is None:
        return None
    genesis = Genesis.from_json(cfg.run.genesis.read_bytes())
    return bytes.fromhex(genesis.authority) if genesis.authority else None


def gate_of(cfg: Config, now: Callable[[], float]) -> Gate:
    return Gate(cfg.run.run_id, authority_of(cfg), now)


def from_config(cfg: Config, identity: Identity, now: Callable[[], float]) -> tuple[Gate, bytes]:
    """The run's gate (its genesis names the authority, if any) and this peer's certificate. A peer of a
    permissioned run without a valid certificate of its own does not start: the others would ignore it."""
    gate = gate_of(cfg, now)
    if gate.open:
        return gate, b""
    if cfg.swarm.fault == "intruder":  # testing aid: modified code that joins all the same
        return gate, cfg.run.admission.read_bytes() if cfg.run.admission else b""
    if cfg.run.admission is None:
        raise ConfigError(f"run {cfg.run.run_id} admits only peers its authority certified: ask its operator for "
                          f"`gradnode admit {identity.peer_id}` and start with --admission FILE")
    try:
        cert = cfg.run.admission.read_bytes()
    except OSError as err:
        raise ConfigError(f"run.admission: cannot read {cfg.run.admission}: {err.strerror or err}") from None
    why = gate.why_not(identity.peer_id, cert)
    if why is not None:
        raise ConfigError(f"run.admission {cfg.run.admission}: {why} (for peer {identity.peer_id})")
    return gate, cert
