"""Who may take part in a run. Open runs (no authority key in the genesis): anyone with a key. Permissioned
runs: the run authority signs an Admission for each peer (`gradnode admit PEER_ID`), which travels in the
peer's member record; a member record without a valid one (signed by the authority, for this run and this
peer, not expired, not revoked) is dropped, so its author has no known key: its updates, reports, weight
votes and state offers fail verification, and its streams are refused (Transport.admits). The authority
revokes with a signed Revocation record in the DHT (`gradnode revoke PEER_ID`); peers read it every time
they read the member list.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from gradnode.node.config import Config, ConfigError
from gradnode.node.swarm.identity import Identity, verify
from gradnode.protocol.genesis import Genesis
from gradnode.protocol.records import Admission, RecordError, Revocation

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

    def take_revocations(self, found: list[bytes]) -> None:
        """Add the peers of every valid Revocation among ``found`` (raw records from the DHT) to those revoked: a
        revocation is never undone (no command undoes one), so a list the authority published without a peer it
        revoked before (a revoke whose read of the stored list came back empty) re-admits nobody here."""
        if self.authority is None:
            return
        for raw in found:
            try:
                rec = Revocation.from_bytes(raw)
            except RecordError:
                continue
            if rec.run_id != self.run_id or not verify(self.authority, rec.signing_bytes(), rec.signature):
                continue
            with self._lock:
                if set(rec.revoked) - self.revoked:
                    log.warning("run authority revoked %d peer(s)", len(set(rec.revoked) - self.revoked))
                    self.revoked = self.revoked | frozenset(rec.revoked)


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
