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


class Sybils:
    """'flood': FLOOD_KEYS identities of the attacker's own making, each a real DHT node in its process
    (its own key, so every record it signs is valid), each publishing a 'training' member record 1000
    rounds ahead of the attacker every heartbeat, and never an update; the first also stores an oversized value under
    the members key. ``for_peer`` returns None for every other fault."""

    def __init__(self, sw: SwarmConfig, run_id: str, output_dir: Path, initial: list[str]) -> None:
        from gradnode.node.swarm.membership import Membership
        from gradnode.node.swarm.transport import Transport

        self.run_id, self.members, self.transports = run_id, [], []
        cfg = sw.model_copy(update={"initial_peers": initial, "host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
                                    "announce_maddrs": [], "fault": "none"})
        for k in range(FLOOD_KEYS):
            t = Transport(cfg, load_or_create(output_dir / f"sybil-{k}.key"))
            self.transports.append(t)
            t.start()
            self.members.append(Membership(t, t.identity, run_id, sw.record_ttl_s))
        self.publish(0)  # in sight before the first round, and then every heartbeat

    @classmethod
    def for_peer(cls, sw: SwarmConfig, run_id: str, output_dir: Path, initial: list[str]) -> "Sybils | None":
        return cls(sw, run_id, output_dir, initial) if sw.fault == "flood" else None

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
