"""Where a peer holds what it serves (node/swarm/transport.py): state offers apart from the blob store, and the
round's updates in it, never evicted."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import statesync
from gradnode.node.swarm.transport import BlobStore, StateStore
from gradnode.protocol.records import StateManifest, state_chunk_name, update_name

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


def test_state_chunks_stay_out_of_the_blob_store() -> None:
    """A state offer is served from the state store: the blob store keeps its bound for the round's blobs."""
    state = {"global_params": {"w": torch.randn(300, 200)}, "round": 3}
    donor = FakeDonor()
    manifest = statesync.offer(state, "cd" * 32, 3, transport=donor, membership=donor,
                               cfg=SwarmConfig(state_chunk_bytes=1 << 16), run_id=RUN)
    assert not [n for n in donor.blobs.names() if n.startswith("s/")]
    data = b"".join(donor.states.get(state_chunk_name(RUN, 3, d)) for d in manifest.chunks)
    assert len(manifest.chunks) > 1 and len(data) == manifest.size


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
