"""Testing aids: how a deliberately misbehaving peer deviates (``swarm.fault``), in one place.

Honest code paths call these hooks; with ``swarm.fault = none`` (the default) each returns its input
unchanged. The integration tests and `gradnode simulate --faults` run real peer processes with a fault
set, and check that the honest peers reject or repair what they do.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, Callable

import msgpack

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.identity import load_or_create
from gradnode.protocol import CodecParams, attach_signature, decode_update, encode_update, signing_digest

INFLATED_TOKENS = 1 << 40  # 'tokens': what the attacker declares (the run allows a few thousand per round)


def sent_update(sw: SwarmConfig, round_: int, blob: bytes, output_dir: Path, sign: Callable[[bytes], bytes]) -> bytes:
    """The update a faulty peer sends instead of its honest, signed ``blob``:
    'corrupt' flips bytes of it; 'forge' signs it with a key that is not the sender's; 'tokens' declares
    INFLATED_TOKENS (validly signed: only the run's cap stops it); 'dense' sends the same values with the
    dense codec (validly signed, ~100x the bytes; only the codec check stops it)."""
    if sw.fault not in ("corrupt", "forge", "tokens", "dense") or round_ < sw.fault_round:
        return blob
    if sw.fault == "corrupt":
        mid = len(blob) // 2
        return blob[:mid] + bytes(b ^ 0x5A for b in blob[mid:mid + 64]) + blob[mid + 64:]
    if sw.fault == "forge":
        other = load_or_create(output_dir / "forger.key")
        return attach_signature(blob, other.sign(signing_digest(blob)))
    if sw.fault == "tokens":
        lying = _with_header(blob, tokens=INFLATED_TOKENS)
    else:
        upd = decode_update(blob)
        lying = encode_update(upd.tensors, params=CodecParams(dense=True), run_id=upd.run_id, round=upd.round,
                              sender=upd.sender, tokens=upd.tokens)
    return attach_signature(lying, sign(signing_digest(lying)))


def _with_header(blob: bytes, **changes: Any) -> bytes:
    """The envelope (unsigned) with fields of its msgpack header replaced (layout: protocol/wire.py)."""
    sig_len = struct.unpack_from("<H", blob, 6)[0]
    rest = blob[8 + sig_len:]
    (hdr_len,) = struct.unpack_from("<I", rest)
    header = {**msgpack.unpackb(rest[4:4 + hdr_len], raw=False), **changes}
    packed = msgpack.packb(header, use_bin_type=True)
    return blob[:6] + struct.pack("<H", 0) + struct.pack("<I", len(packed)) + packed + rest[4 + hdr_len:]


def claim(sw: SwarmConfig, round_: int, blobs: Any, name: str, size: int) -> bool:
    """'slowhold': hold a placeholder of every announced update at once (random bytes of its announced size,
    replaced by the real blob once fetched) to list it in the holdings and trickle it out (the transport
    serves at SLOWHOLD_BYTES_PER_S). True when this peer claims updates it does not hold."""
    if sw.fault != "slowhold" or round_ < sw.fault_round:
        return False
    if blobs.get(name) is None:
        blobs.put(name, os.urandom(size))
    return True


PUSHFLOOD_COPIES = 6  # forged pushes of its own update per target and round (the quota lets 3 through)


def flood_pushes(sw: SwarmConfig, round_: int, blob: bytes, name: str, others: list[str],
                 push: Callable[[str, bytes], int]) -> None:
    """'pushflood': push PUSHFLOOD_COPIES copies of its update with a forged signature (random bytes where
    the signature goes: only the signature check stops it) under its own name, and one under each other
    peer's name; ``push(name, data)`` sends to every reachable peer."""
    if sw.fault != "pushflood" or round_ < sw.fault_round:
        return
    sig_len = struct.unpack_from("<H", blob, 6)[0]
    forged = blob[:8] + os.urandom(sig_len) + blob[8 + sig_len:]
    for _ in range(PUSHFLOOD_COPIES):
        push(name, forged)
    for peer in others:
        push(name.rsplit("/", 1)[0] + "/" + peer, forged)


def offered_state(sw: SwarmConfig, round_: int, state: dict[str, Any]) -> dict[str, Any]:
    """'tamper_state': the shared state offered to joiners with one weight nudged (honest hash kept)."""
    if sw.fault != "tamper_state" or round_ < sw.fault_round:
        return state
    params = dict(state["global_params"])
    name = sorted(params)[0]
    params[name] = params[name] + 1e-3
    return {**state, "global_params": params}


def drift(sw: SwarmConfig, round_: int, engine: Any) -> None:
    """'drift': nudge this peer's own shared weights once, after applying ``fault_round``; its hash check
    must notice and re-sync it from the majority."""
    if sw.fault == "drift" and round_ == sw.fault_round:
        engine.global_params[engine.names[0]].add_(1e-3)


FLOOD_KEYS = 8  # identities the 'flood' attacker makes in bulk: more than the honest peers of a test swarm
OVERSIZED_BYTES = 30 * 1024  # a members value past the 16 KiB record limit (the DHT itself takes 32 KiB)


def _own_node(sw: SwarmConfig, output_dir: Path, name: str, initial: list[str]) -> Any:
    """One more identity of the attacker's own making: a real DHT node in its process, with its own key."""
    from gradnode.node.swarm.transport import Transport

    cfg = sw.model_copy(update={"initial_peers": initial, "host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
                                "announce_maddrs": [], "fault": "none"})
    t = Transport(cfg, load_or_create(output_dir / f"{name}.key"))
    t.start()
    return t


def sybils(sw: SwarmConfig, run_id: str, output_dir: Path, transport: Any) -> "Sybils | Replayer | None":
    """The extra identities of the 'flood' and 'replayleave' attackers, bootstrapped through the attacker's
    own ``transport`` (None for every other fault); the peer calls ``publish(round)`` every heartbeat and
    ``close()`` at its end."""
    if sw.fault == "flood":
        return Sybils(sw, run_id, output_dir, transport.maddrs())
    if sw.fault == "replayleave":
        return Replayer(sw, run_id, output_dir, transport)
    return None


class Sybils:
    """'flood': FLOOD_KEYS identities of the attacker's own making, each publishing a 'training' member
    record 1000 rounds ahead of the attacker every heartbeat, and never an update (every record is
    validly signed: each has its own key); the first also stores an oversized value under the members key."""

    def __init__(self, sw: SwarmConfig, run_id: str, output_dir: Path, initial: list[str]) -> None:
        from gradnode.node.swarm.membership import Membership

        self.run_id = run_id
        self.transports = [_own_node(sw, output_dir, f"sybil-{k}", initial) for k in range(FLOOD_KEYS)]
        self.members = [Membership(t, t.identity, run_id, sw.record_ttl_s) for t in self.transports]
        self.publish(0)  # in sight before the first round, and then every heartbeat

    def publish(self, round_: int) -> None:
        from gradnode.protocol.records import dht_key

        for m in self.members:  # rounds far ahead: always among those that "kept up" (round >= r - 1)
            m.publish(round_=round_ + 1000, training=True, step_seconds=1.0, inner_steps=10, tokens_per_s=1e4,
                      rejected=0, loss=1.0)
        self.transports[0].store(dht_key(self.run_id, "members"), os.urandom(OVERSIZED_BYTES),
                                 self.members[0].ttl)

    def close(self) -> None:
        for t in self.transports:
            t.close()


class Replayer:
    """'replayleave': keeps the newest signed 'leaving' member record of every other peer it sees (read
    every half second: a peer that stops and comes back publishes one for seconds only), and stores it
    again every heartbeat, each under a key of its own making (one DHT subkey per key; a peer's own
    subkey only its key can write). Without the owner check every peer would take the returned peer for
    gone while the record is young (record_ttl_s)."""

    def __init__(self, sw: SwarmConfig, run_id: str, output_dir: Path, transport: Any) -> None:
        import threading

        self.sw, self.run_id, self.output_dir, self.transport = sw, run_id, output_dir, transport
        self.kept: dict[str, tuple[float, bytes]] = {}  # peer -> (record time, its signed leaving record)
        self.carriers: dict[str, Any] = {}  # peer -> the transport whose key stores its replay
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="replayer", daemon=True).start()

    def _watch(self) -> None:
        from gradnode.protocol.records import MemberRecord, RecordError, dht_key

        while not self._closed.wait(0.5):
            for owner, raw in self.transport.get(dht_key(self.run_id, "members")):
                try:
                    rec = MemberRecord.from_bytes(raw)
                except RecordError:
                    continue
                if rec.leaving and owner == rec.peer_id != self.transport.peer_id \
                        and rec.time > self.kept.get(owner, (0.0,))[0]:
                    self.kept[owner] = (rec.time, raw)

    def publish(self, round_: int) -> None:
        from gradnode.protocol.records import dht_key

        for peer, (_, raw) in list(self.kept.items()):
            if peer not in self.carriers:
                self.carriers[peer] = _own_node(self.sw, self.output_dir, f"replayer-{len(self.carriers)}",
                                                self.transport.maddrs())
            self.carriers[peer].store(dht_key(self.run_id, "members"), raw, self.sw.record_ttl_s)

    def close(self) -> None:
        self._closed.set()
        for t in self.carriers.values():
            t.close()
