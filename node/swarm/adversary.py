"""Testing aids: how a deliberately misbehaving peer deviates (``swarm.fault``), in one place.

Honest code paths call these hooks; with ``swarm.fault = none`` (the default) each returns its input
unchanged. The integration tests and `gradnode simulate --faults` run real peer processes with a fault
set, and check that the honest peers reject or repair what they do. From ``swarm.fault_round`` on:

- 'corrupt' flips bytes of this peer's updates; 'forge' signs them with another key; 'tokens' declares
  2^40 tokens per update; 'dense' sends its updates with the dense codec; 'crossrun' sends, as its updates,
  the ones it signed in an earlier run of the same name (its folder's earlier-genesis.json).
- 'signflip' sends its own update negated; 'noise' sends Gaussian noise of its update's norm through the
  codec; 'freerider' sends another peer's update of the previous round, applied then, as its own; 'lazy'
  trains every round on one fixed batch.
- 'tamper_state' offers altered weights under the honest hash; 'badmomentum' offers honest weights with its
  outer momentum scaled by -1000 under the honest hash; 'futurestate' offers its state claimed for a round
  10^6 ahead (under the hash of that claim) and publishes a chain listing it.
- 'slowhold' claims every announced update at once and serves at 128 B/s; 'pushflood' pushes forged copies
  of its update, under its own name and others', to every peer each round.
- 'intruder' joins a permissioned run without an admission certificate; 'flood' publishes 'training'
  member records of 8 keys it made (and an oversized value) that never send an update; 'replayleave'
  stores other peers' old signed 'leaving' records again under keys of its own; 'sybilvotes' runs 8 keys of
  its making that report a weight hash nobody holds for every round and follow a chain of them.
- 'equivocate' publishes two reports for each round (the second naming only its own update), taking turns
  every 0.1 s for a second; 'lowid' grinds 24 keys for the lowest peer id and reports only its own update
  (a witness that censors).
- 'drift' nudges this peer's own weights once, at ``fault_round``: its hash check must notice and re-sync
  it from the majority.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from pathlib import Path
from typing import Any, Callable

import msgpack

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.identity import load_or_create
from gradnode.protocol import CodecParams, attach_signature, decode_update, encode_update, signing_digest

log = logging.getLogger(__name__)

INFLATED_TOKENS = 1 << 40  # 'tokens': what the attacker declares (the run allows a few thousand per round)


def sent_update(sw: SwarmConfig, round_: int, blob: bytes, output_dir: Path, sign: Callable[[bytes], bytes],
                earlier: Callable[[], bytes | None] = lambda: None) -> bytes:
    """The update a faulty peer sends instead of its honest, signed ``blob``:
    'corrupt' flips bytes of it; 'forge' signs it with a key that is not the sender's; 'tokens' declares
    INFLATED_TOKENS (validly signed: only the run's cap stops it); 'dense' sends the same values with the
    dense codec (validly signed, ~100x the bytes; only the codec check stops it); 'crossrun' sends the
    update it signed for the same round of an earlier run of the same name, config and seed (validly
    signed; only the run id, which the genesis makes differ, stops it). Robust learning, each
    validly signed with honest tokens: 'signflip' sends its own update negated (the same norm); 'noise'
    Gaussian noise through the codec at its own update's norm; 'freerider' another peer's update that the
    previous round applied (``earlier()``), re-labelled as its own for this round (no training of its own
    counts: what it sends was computed by someone else)."""
    if sw.fault in ("signflip", "noise", "freerider") and round_ >= sw.fault_round:
        lying = _robustness_attack(sw.fault, round_, blob, earlier())
        return blob if lying is None else attach_signature(lying, sign(signing_digest(lying)))
    if sw.fault not in ("corrupt", "forge", "tokens", "dense", "crossrun") or round_ < sw.fault_round:
        return blob
    if sw.fault == "corrupt":
        mid = len(blob) // 2
        return blob[:mid] + bytes(b ^ 0x5A for b in blob[mid:mid + 64]) + blob[mid + 64:]
    if sw.fault == "forge":
        other = load_or_create(output_dir / "forger.key")
        return attach_signature(blob, other.sign(signing_digest(blob)))
    if sw.fault == "tokens":
        lying = _with_header(blob, tokens=INFLATED_TOKENS)
    elif sw.fault == "crossrun":  # what it signed in the earlier run's round of the same number
        from gradnode.protocol.genesis import Genesis

        earlier = Genesis.from_json((output_dir / "earlier-genesis.json").read_bytes()).run_id
        lying = _with_header(blob, run=earlier)
    else:
        upd = decode_update(blob)
        lying = encode_update(upd.tensors, params=CodecParams(dense=True), run_id=upd.run_id, round=upd.round,
                              sender=upd.sender, tokens=upd.tokens)
    return attach_signature(lying, sign(signing_digest(lying)))


def _robustness_attack(fault: str, round_: int, blob: bytes, earlier: bytes | None) -> bytes | None:
    """The unsigned envelope of a 'signflip', 'noise' or 'freerider' update (see ``sent_update``); None: send
    the honest one (a free-rider with nothing to copy yet)."""
    if fault == "freerider":
        if earlier is None:
            return None
        own = decode_update(blob)
        return _with_header(earlier, sender=own.sender, round=round_, tokens=own.tokens)
    import torch

    own = decode_update(blob)
    meta = dict(params=own.params, run_id=own.run_id, round=own.round, sender=own.sender, tokens=own.tokens)
    if fault == "signflip":
        return encode_update({n: -t for n, t in own.tensors.items()}, **meta)
    g = torch.Generator().manual_seed(round_)
    noise = {n: torch.randn(t.shape, generator=g) for n, t in sorted(own.tensors.items())}
    first = decode_update(encode_update(noise, **meta))  # top-k of noise: rescaled to the honest norm after
    factor = own.norm / first.norm if first.norm > 0 else 1.0
    return encode_update({n: t * factor for n, t in noise.items()}, **meta)


def lazy(sw: SwarmConfig, engine: Any) -> None:
    """'lazy': train every round on one fixed batch (inner step 0's), whatever the peer was assigned."""
    if sw.fault == "lazy":
        from gradnode.node.train.data import FixedBatches

        engine.batches = FixedBatches.of(engine.batches)


def _with_header(blob: bytes, **changes: Any) -> bytes:
    """The envelope (unsigned) with fields of its msgpack header replaced (layout: protocol/wire.py)."""
    sig_len = struct.unpack_from("<H", blob, 6)[0]
    rest = blob[8 + sig_len:]
    (hdr_len,) = struct.unpack_from("<I", rest)
    header = {**msgpack.unpackb(rest[4:4 + hdr_len], raw=False), **changes}
    packed = msgpack.packb(header, use_bin_type=True)
    return blob[:6] + struct.pack("<H", 0) + struct.pack("<I", len(packed)) + packed + rest[4 + hdr_len:]


EQUIVOCATE_FLIPS = 10  # 'equivocate': its two reports take turns in the DHT, every 0.1 s (peers read every 0.2 s)


def equivocate(sw: SwarmConfig, round_: int, members: Any, run_id: str, me: str, base: str,
               included: list[tuple[str, str]]) -> None:
    """'equivocate': after its report, publish another for the same round, naming only its own update
    (nothing when that is what it reported), then the first again, and so on every 0.1 s for a second:
    the DHT keeps the newest, so peers deciding at different moments read different reports."""
    if sw.fault != "equivocate" or round_ < sw.fault_round:
        return
    from gradnode.protocol.records import Report, pack

    own = [(s, d) for s, d in included if s == me]
    versions = [pack(included), pack([] if set(own) == set(included) else own)]
    for flip in range(1, EQUIVOCATE_FLIPS + 1):
        time.sleep(0.1)
        members.write("reports", round_, Report(run_id=run_id, round=round_, witness=me, base=base,
                                                included=versions[flip % 2]))


LOWID_KEYS = 24  # keys the 'lowid' attacker grinds for the lowest peer id (RSA-2048: ~0.15 s each on one core)


def ground_identity(sw: SwarmConfig, path: Path) -> None:
    """'lowid': before its first start, grind LOWID_KEYS keys and keep the one with the lowest peer id at
    ``path`` (under the rule before witnesses the lowest id led every round and chose the round's set
    alone). Its reports name only its own update (``reported``): a witness that censors everyone else."""
    if sw.fault != "lowid" or path.exists():
        return
    tries = [path.with_name(f"{path.name}.try{k}") for k in range(LOWID_KEYS)]
    best = min(tries, key=lambda p: load_or_create(p).peer_id)
    os.replace(best, path)
    for p in tries:
        p.unlink(missing_ok=True)


def reported(sw: SwarmConfig, round_: int, me: str, included: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (sender, digest) pairs a witness reports: 'lowid' leaves every update but its own out."""
    if sw.fault != "lowid" or round_ < sw.fault_round:
        return included
    return [(s, d) for s, d in included if s == me]


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


FUTURE_ROUNDS = 10**6  # 'futurestate': how far ahead of the swarm its offered state claims to be
POISON = -1e3  # 'badmomentum': the factor its offered outer momentum is scaled by


def offered(sw: SwarmConfig, engine: Any) -> tuple[dict[str, Any], str, int]:
    """The shared state this peer offers to joiners, with its hash and round: the engine's, except for
    'tamper_state' (one weight nudged, the honest hash kept), 'badmomentum' (honest weights, the outer
    optimizer's momentum scaled by POISON, the honest hash kept), and 'futurestate' (``future``)."""
    if sw.fault == "futurestate" and engine.round >= sw.fault_round:
        return future(engine)
    state, state_hash, round_ = engine.shared_state(), engine.state_hash(), engine.round
    if round_ < sw.fault_round or sw.fault not in ("tamper_state", "badmomentum"):
        return state, state_hash, round_
    if sw.fault == "tamper_state":
        params = dict(state["global_params"])
        name = sorted(params)[0]
        params[name] = params[name] + 1e-3
        return {**state, "global_params": params}, state_hash, round_
    buffers = {k: v * POISON for k, v in state["outer"]["buffers"].items()}
    return {**state, "outer": {**state["outer"], "buffers": buffers}}, state_hash, round_


def future(engine: Any) -> tuple[dict[str, Any], str, int]:
    """'futurestate': the honest weights and momentum claimed for a round FUTURE_ROUNDS ahead, under the hash
    of that claim (it matches itself: only a check against the decided chain refuses it)."""
    from gradnode.node.train.engine import shared_state_hash

    state = engine.shared_state()
    round_ = engine.round + FUTURE_ROUNDS
    state_hash = shared_state_hash(engine.cfg.run.run_id, round_, state["global_params"], state["outer"]["buffers"],
                                   state["contributors"], state["reputation"], engine.previous, state["codec"])
    return {**state, "round": round_}, state_hash, round_


def published_chain(sw: SwarmConfig, engine: Any, tail: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The chain tail a peer's member record publishes: 'futurestate' claims the state it offers."""
    if sw.fault != "futurestate" or engine is None or engine.round < sw.fault_round:
        return tail
    _, state_hash, round_ = future(engine)
    return [(round_ - 1, state_hash)]


def drift(sw: SwarmConfig, round_: int, engine: Any) -> None:
    """'drift': nudge this peer's own shared weights once, after applying ``fault_round``; its hash check
    must notice and re-sync it from the majority."""
    if sw.fault == "drift" and round_ == sw.fault_round:
        engine.global_params[engine.names[0]].add_(1e-3)
        engine.changed()


FLOOD_KEYS = 8  # identities the 'flood' attacker makes in bulk: more than the honest peers of a test swarm
OVERSIZED_BYTES = 30 * 1024  # a members value past the 16 KiB record limit (the DHT itself takes 32 KiB)


def _own_node(sw: SwarmConfig, output_dir: Path, name: str, initial: list[str], signs_for: tuple[Any, ...] = ()) -> Any:
    """One more identity of the attacker's own making: a real DHT node in its process, with its own key
    (and writing the records of ``signs_for`` too)."""
    from gradnode.node.swarm.transport import Transport

    cfg = sw.model_copy(update={"initial_peers": initial, "host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
                                "announce_maddrs": [], "fault": "none"})
    t = Transport(cfg, load_or_create(output_dir / f"{name}.key"), signs_for=signs_for)
    t.start(timeout=20.0)  # a fork that hangs (Transport._start_dht) costs 30 s, not a minute
    return t


class _SignedAs:
    """The shared node of the keys in bulk, as one of those keys sees it: its stores go to that key's subkey,
    everything else is the node's (a Membership per key runs on it)."""

    def __init__(self, transport: Any, identity: Any) -> None:
        self._t, self.identity = transport, identity

    def store(self, key: str, value: bytes, ttl: float, timeout: float = 10.0) -> bool:
        return self._t.store(key, value, ttl, timeout, owner=self.identity)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


def _keys_node(sw: SwarmConfig, output_dir: Path, initial: list[str]) -> tuple[Any, list[Any]]:
    """FLOOD_KEYS identities of the attacker's own making, written through one more DHT node of its own
    (a node per key cost two cores' worth of processes for nothing: a key signs its records wherever they
    are stored from); the node and one view of it per key."""
    keys = [load_or_create(output_dir / f"sybil-{k}.key") for k in range(FLOOD_KEYS)]
    node = _own_node(sw, output_dir, "sybils", initial, signs_for=tuple(keys))
    return node, [_SignedAs(node, k) for k in keys]


def sybils(sw: SwarmConfig, run_id: str, output_dir: Path, transport: Any) -> "Sybils | Replayer | None":
    """The extra identities of the 'flood', 'sybilvotes' and 'replayleave' attackers, bootstrapped through the attacker's
    own ``transport`` (None for every other fault); the peer calls ``publish(round)`` every heartbeat and
    ``close()`` at its end."""
    if sw.fault == "flood":
        return Sybils(sw, run_id, output_dir, transport.maddrs())
    if sw.fault == "replayleave":
        return Replayer(sw, run_id, output_dir, transport)
    if sw.fault == "sybilvotes":
        return SybilVoters(sw, run_id, output_dir, transport.maddrs())
    return None


class Sybils:
    """'flood': FLOOD_KEYS identities of the attacker's own making, each publishing a 'training' member
    record 1000 rounds ahead of the attacker every heartbeat, and never an update (every record is
    validly signed and stored under its own key's subkey, all through one DHT node of the attacker's);
    the first also stores an oversized value under the members key."""

    def __init__(self, sw: SwarmConfig, run_id: str, output_dir: Path, initial: list[str]) -> None:
        from gradnode.node.swarm.membership import Membership

        self.run_id, self.start = run_id, sw.fault_round  # `--faults flood:P@rN`: from round N on
        self.node, views = _keys_node(sw, output_dir, initial)
        self.members = [Membership(v, v.identity, run_id, sw.record_ttl_s) for v in views]
        self.publish(0)  # in sight before the first round (from round 0 on), and then every heartbeat

    def publish(self, round_: int) -> None:
        """The keys' records for the attacker's round ``round_``: nothing before the fault's round."""
        if round_ >= self.start:
            self._records(round_)

    def _records(self, round_: int) -> None:
        from gradnode.protocol.records import dht_key

        for m in self.members:  # rounds far ahead: always among those that "kept up" (round >= r - 1)
            m.publish(round_=round_ + 1000, training=True, step_seconds=1.0, inner_steps=10, tokens_per_s=1e4,
                      rejected=0, loss=1.0)
        self.members[0].transport.store(dht_key(self.run_id, "members"), os.urandom(OVERSIZED_BYTES),
                                        self.members[0].ttl)

    def close(self) -> None:
        self.node.close()


def sybil_hash(round_: int) -> str:
    """The weight hash the 'sybilvotes' keys vote for after round ``round_`` (nobody holds such a state)."""
    import hashlib

    return hashlib.sha256(f"sybil-{round_}".encode()).hexdigest()


class SybilVoters(Sybils):
    """'sybilvotes': FLOOD_KEYS identities of the attacker's own making (more than the honest peers of a
    test swarm) that never send an update but, every heartbeat, report the weight hash sybil_hash(r) for
    the rounds from just before the attacker's to ten ahead, and publish member records following a chain
    of those hashes. One
    vote per key, they are the majority: honest peers would find their own hash off it and re-sync to a
    state nobody offers, waiting up to swarm.max_wait_s each time, and see their chain outvoted."""

    def _records(self, round_: int) -> None:
        from gradnode.protocol.records import WeightHash

        rounds = range(max(0, round_ - 2), round_ + 10)  # heartbeats are seconds apart, rounds faster
        for m in self.members:
            me = m.identity.peer_id
            m.publish(round_=round_, training=True, step_seconds=1.0, inner_steps=10, tokens_per_s=1e4, rejected=0,
                      loss=1.0, chain=[(r, sybil_hash(r)) for r in rounds][-8:])
            for r in rounds:
                m.write("weights", r, WeightHash(run_id=self.run_id, round=r, peer=me, param_hash=sybil_hash(r)))


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
                log.warning("replayleave: storing the leaving record of %s again under key %s every heartbeat",
                            peer[:12], self.carriers[peer].peer_id[:12])
            self.carriers[peer].store(dht_key(self.run_id, "members"), raw, self.sw.record_ttl_s)

    def close(self) -> None:
        self._closed.set()
        for t in self.carriers.values():
            t.close()
