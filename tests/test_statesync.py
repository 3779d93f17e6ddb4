"""State offers (node/swarm/statesync.py) and where a peer holds what it serves (node/swarm/transport.py): a
state of any size has a small valid manifest and stays out of the blob store; the round's updates stay in it."""

from __future__ import annotations

import hashlib
import mmap
from types import SimpleNamespace

import pytest
import torch

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import statesync
from gradnode.node.swarm.transport import BlobStore, StateStore
from gradnode.protocol.records import RecordError, StateManifest, chunk_digests, state_chunk_name, update_name

PEER = "Qm" + "1" * 44
RUN = "run"


class FakeDonor:
    """What offer() needs of a transport and a member list."""

    def __init__(self) -> None:
        self.blobs, self.states = BlobStore(1 << 30), StateStore()
        self.identity = SimpleNamespace(peer_id=PEER)
        self.written: list[StateManifest] = []

    def now(self) -> float:
        return 1.7e9

    def write(self, table: str, round_: int | None, record: StateManifest) -> bool:
        self.written.append(record)
        return True


def test_a_two_gigabyte_state_has_a_valid_manifest_and_stays_out_of_the_blob_store() -> None:
    """A 2 GB state (zeros, mapped lazily: reading them takes no memory) gives a manifest of a few hundred bytes
    that round-trips and validates (64 hex digits per chunk passed the 16 KiB record bound at about 1 GB), and
    its chunks and chunk list are served from the state store, not the blob store the round's updates use."""
    numel = 500_000_000
    zeros = mmap.mmap(-1, 4 * numel, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    state = {"global_params": {"w": torch.frombuffer(zeros, dtype=torch.float32)}, "round": 7}
    donor = FakeDonor()
    cfg = SwarmConfig()
    manifest = statesync.offer(state, "ab" * 32, 7, transport=donor, membership=donor, cfg=cfg, run_id=RUN)
    del state, zeros
    data = manifest.to_bytes()
    assert len(data) < 1024 and StateManifest.from_bytes(data) == manifest == donor.written[0]
    assert manifest.size > 4 * numel and manifest.chunk_count == -(-manifest.size // cfg.state_chunk_bytes)
    assert not [n for n in donor.blobs.names() if n.startswith("s/")]
    listed = donor.states.get(state_chunk_name(RUN, 7, manifest.chunk_list))
    digests = chunk_digests(listed, manifest)
    assert len(digests) == manifest.chunk_count  # equal chunks (zeros) share one name and one copy
    assert set(donor.states.names()) == {state_chunk_name(RUN, 7, d) for d in [*digests, manifest.chunk_list]}
    last = donor.states.get(state_chunk_name(RUN, 7, digests[-1]))
    assert hashlib.sha256(last).hexdigest() == digests[-1]


def test_a_small_state_round_trips_through_its_chunks() -> None:
    """What a joiner puts together from the chunks its manifest lists is the state offered, bit for bit."""
    state = {"global_params": {"w": torch.randn(300, 200), "b": torch.randn(7)}, "round": 3}
    donor = FakeDonor()
    cfg = SwarmConfig(state_chunk_bytes=1 << 16)
    manifest = statesync.offer(state, "cd" * 32, 3, transport=donor, membership=donor, cfg=cfg, run_id=RUN)
    digests = chunk_digests(donor.states.get(state_chunk_name(RUN, 3, manifest.chunk_list)), manifest)
    data = b"".join(donor.states.get(state_chunk_name(RUN, 3, d)) for d in digests)
    assert manifest.chunk_count == len(digests) > 1 and len(data) == manifest.size
    got = statesync.deserialize(data)
    assert all(torch.equal(got["global_params"][n], t) for n, t in state["global_params"].items())


def test_the_own_update_is_never_evicted_while_the_rounds_work_is_held() -> None:
    """A store bounded at 1 MiB (1 GiB, scaled down 1024x) holding the peer's own update and 59 others of 18.35 KB
    (a 1B model's, scaled): the round's updates are pinned and all stay; other blobs go, oldest first."""
    store = BlobStore(1 << 20)
    size = 18_350
    own = update_name(RUN, 4, PEER)
    store.put(own, b"o" * size, pinned=True)
    for i in range(59):
        store.put(update_name(RUN, 4, f"peer{i}"), bytes([i]) * size, pinned=True)
        store.put(f"p/{RUN}/4/peer{i}", b"r" * 40_000)  # a report list, not the round's work
    assert store.get(own) == b"o" * size
    assert all(store.get(update_name(RUN, 4, f"peer{i}")) is not None for i in range(59))
    assert store.get(f"p/{RUN}/4/peer0") is None and store.get(f"p/{RUN}/4/peer58") is not None
    store.drop(lambda name: not name.startswith(f"u/{RUN}/4/"))
    assert store.get(own) is None and store.peak_updates == 60


def test_the_state_store_serves_the_two_newest_offers() -> None:
    states = StateStore()
    for r in range(4):
        states.offer(r, {f"s/{RUN}/{r}/x": bytes([r])})
    assert states.get(f"s/{RUN}/1/x") is None and states.get(f"s/{RUN}/2/x") == b"\2" and states.get(f"s/{RUN}/3/x")


def test_a_chunk_list_that_is_not_the_manifests_is_refused() -> None:
    """A donor's chunk list counts only if it is exactly the one the manifest names: its length and its sha256."""
    listed = bytes(range(32)) * 3
    manifest = StateManifest(run_id=RUN, round=1, peer=PEER, param_hash="ab" * 32, size=3 << 16, chunk_bytes=1 << 16,
                             chunk_list=hashlib.sha256(listed).hexdigest(), time=1.0)
    assert len(chunk_digests(listed, manifest)) == 3
    for bad in (listed[:-32], listed + listed[:32], listed[:-1] + b"x"):
        with pytest.raises(RecordError):
            chunk_digests(bad, manifest)
