"""Shared state over the swarm: serve this peer's weights in chunks, download a verified copy.

A peer that has applied round r offers its shared state (theta_g, outer optimizer state, round) as
chunks served by the transport (its StateStore, apart from the round's blobs), described by a signed
manifest in the DHT (round, weight hash, size, chunk size, and the digest of the chunk list, itself
served as a blob: a manifest stays small whatever the state's size). A joiner (or a peer that fell out of step) picks the newest round (never one beyond
what the other members report: ``beyond_reach``) and the weight hash the swarm reported for it (the majority of the per-round weight-hash records; offers with another
hash are ignored), fetches the chunks in parallel from every peer offering that hash (each chunk
verified by its digest, so a tampered chunk is dropped and fetched elsewhere; each donor uploads at
most ``swarm.state_upload_slots`` chunks at once, so a burst of joiners spreads over the donors),
loads them with torch's safe loader and checks the resulting weight hash before training on it. An
offer whose weights do not hash to what it advertised is discarded with its donors, and another
donor is used.
"""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable

import torch

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.membership import Membership
from gradnode.node.swarm.transport import Transport
from gradnode.protocol import chain
from gradnode.protocol import sync as sync_rules
from gradnode.protocol.chain import Link
from gradnode.protocol.records import RecordError, StateManifest, chunk_digests, chunk_list, majority_hash, state_chunk_name

log = logging.getLogger(__name__)


class _Chunks:
    """A file torch.save writes into, cut into chunks of ``size`` bytes as it goes, each hashed once full: the
    serialised state exists as its chunks only, never as a second whole copy."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.chunks: list[bytes] = []
        self.digests: list[bytes] = []
        self._open = bytearray()

    def write(self, data: bytes) -> int:
        view = memoryview(data).cast("B")
        written = view.nbytes
        while view.nbytes:
            take = min(self.size - len(self._open), view.nbytes)
            if not self._open and take == self.size:  # a whole chunk: one copy
                self._add(bytes(view[:take]))
            else:
                self._open += view[:take]
                if len(self._open) == self.size:
                    self._add(bytes(self._open))
                    self._open = bytearray()
            view = view[take:]
        return written

    def flush(self) -> None:
        pass

    def _add(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.digests.append(hashlib.sha256(chunk).digest())

    def done(self) -> "_Chunks":
        if self._open or not self.chunks:
            self._add(bytes(self._open))
            self._open = bytearray()
        return self


def serialize(state: dict[str, Any], chunk_bytes: int) -> _Chunks:
    """``state`` as torch.save writes it, in chunks of ``chunk_bytes`` with their sha256 digests."""
    out = _Chunks(chunk_bytes)
    torch.save(state, out)
    return out.done()


def deserialize(data: bytes) -> dict[str, Any]:
    """torch's weights-only loader: tensors and plain containers, never arbitrary objects."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # any loader failure means bad peer data
        raise ValueError(f"undecodable state: {err}") from None
    if not isinstance(state, dict):
        raise ValueError("state must be a mapping")
    return state


def offer(state: dict[str, Any], param_hash: str, round_: int, *, transport: Transport, membership: Membership,
          cfg: SwarmConfig, run_id: str) -> StateManifest:
    """Serve ``state`` in chunks, with its chunk list, and publish its manifest; offers older than the previous
    round's stop being served."""
    out = serialize(state, cfg.state_chunk_bytes)
    listed = chunk_list(out.digests)
    root = hashlib.sha256(listed).hexdigest()
    blobs = {state_chunk_name(run_id, round_, d.hex()): c for d, c in zip(out.digests, out.chunks)}
    blobs[state_chunk_name(run_id, round_, root)] = listed
    transport.states.offer(round_, blobs)
    manifest = StateManifest(run_id=run_id, round=round_, peer=membership.identity.peer_id, param_hash=param_hash,
                             size=sum(map(len, out.chunks)), chunk_bytes=cfg.state_chunk_bytes, chunk_list=root,
                             time=transport.now())
    membership.write("state", None, manifest)
    return manifest


def expected_hash(membership: Membership, round_: int) -> str | None:
    """The weight hash a state offered for ``round_`` must have: the majority report after round ``round_ - 1``
    (None when nobody reported one, e.g. before the first round or with swarm.hash_check off)."""
    if round_ < 1:
        return None
    found = majority_hash(membership.reports(round_ - 1))
    return None if found is None else found[0]


def winning_links(membership: Membership, me: str) -> set[Link] | None:
    """The states (round, hash) more than half of the peers of the chain most other live trainers follow list
    (protocol/chain.py ``adoptable``: one key's tail can list a made-up state after the honest chain's newest);
    None when no other member publishes its chain (the weight reports decide then), empty when the tails vouch
    for no state yet (nothing is adopted). A peer looking for a state does not vote: its own chain is
    the one in doubt (with one other peer in sight, its own vote would make a tie it can win)."""
    votes = membership.votes()
    members = membership.fresh()
    tails = {p: m.chain for p, m in members.items() if m.training and m.chain and p != me and votes(p)}
    return chain.adoptable(tails, {p for p, m in members.items() if m.reachable})


def beyond_reach(membership: Membership, me: str) -> Callable[[StateManifest], bool]:
    """Whether an offer claims a round too far past what the other voting trainers report (protocol/sync.py
    ``beyond_reach``); a member still at round 0 without a chain, a joiner, reports nothing."""
    votes = membership.votes()
    reported = {p: m.round for p, m in membership.members().items()
                if m.training and p != me and votes(p) and (m.round > 0 or m.chain)}
    return lambda offer: sync_rules.beyond_reach(offer, reported)


def newest_offers(membership: Membership, cfg: SwarmConfig, me: str, min_round: int = 0,
                  exclude: set[str] | frozenset[str] = frozenset(),
                  links: set[Link] | None = None) -> list[StateManifest]:
    """The offers of the newest round (>= ``min_round``, none ``beyond_reach``) on the chain the swarm
    follows: a state whose (round, hash) most of the winning chain's peers list (``links``, by default read off
    the member records: ``winning_links``); without any published chain, the hash of the previous round's
    majority report, or the one most offerers give."""
    is_beyond = beyond_reach(membership, me)
    manifests = [m for m in membership.read("state", None, StateManifest)
                 if m.peer != me and m.peer not in exclude and m.size <= cfg.max_state_bytes and m.round >= min_round
                 and m.chunk_bytes <= cfg.state_chunk_bytes]
    beyond = [m for m in manifests if is_beyond(m)]
    if beyond:
        log.info("state offers more than %d rounds past every other member's round ignored: %s", sync_rules.RECORD_LAG,
                 ",".join(f"{m.peer[:12]}@{m.round}" for m in beyond))
        manifests = [m for m in manifests if m not in beyond]
    links = winning_links(membership, me) if links is None else links
    good = sync_rules.trusted_offers(manifests, links=links, expected=lambda r: expected_hash(membership, r))
    if manifests and not good:
        log.info("state offers of rounds %s all disagree with the swarm's chain or hash",
                 ",".join(map(str, sorted({m.round for m in manifests}))))
    return good


def fetch(*, transport: Transport, membership: Membership, cfg: SwarmConfig, run_id: str, min_round: int = 0,
          deadline_s: float = 120.0, accept: Callable[[dict[str, Any], StateManifest], bool] = lambda s, m: True,
          stats: Counter | None = None, links: set[Link] | None = None,
          stop: threading.Event | None = None) -> tuple[dict[str, Any], StateManifest] | None:
    """Download the swarm's newest agreed state; None when nobody offers one in time, or once ``stop`` is set
    (the peer is leaving: a donor out of reach is not waited for).

    Offers of the chosen round that list the same chunks form a group; the largest group is fetched
    first (ties: the lowest peer id), each chunk from any member of the group. A group whose state
    does not load, or that ``accept`` refuses (its weights do not hash to the advertised hash: a
    tampered offer), is discarded with all its donors, and the next group or round is tried.
    ``stats`` counts 'downloads', 'rejected_offers' and 'incomplete'.
    """
    stats = stats if stats is not None else Counter()
    deadline = time.monotonic() + deadline_s
    bad: set[str] = set()
    stop = stop if stop is not None else threading.Event()
    while time.monotonic() < deadline and not stop.is_set():
        offers = newest_offers(membership, cfg, transport.peer_id, min_round, bad, links)
        if not offers:
            stop.wait(0.5)
            continue
        for group in sync_rules.download_order(offers):
            if stop.is_set():
                break
            got = _download(group, transport=transport, membership=membership, cfg=cfg, run_id=run_id,
                            deadline=min(deadline, time.monotonic() + max(10.0, deadline_s / 2)), stop=stop)
            ref = group[0]
            if got is None:
                stats["incomplete"] += 1
                continue
            try:
                state = deserialize(got)
                ok = accept(state, ref)
            except ValueError as err:
                log.warning("state of round=%d from %s undecodable: %s", ref.round, ref.peer[:12], err)
                ok = False
            if ok:
                stats["downloads"] += 1
                log.info("state downloaded round=%d bytes=%d from=%d peers", ref.round, len(got), len(group))
                return state, ref
            stats["rejected_offers"] += 1
            bad.update(m.peer for m in group)
            log.warning("state offer rejected round=%d hash=%s donors=%s: weights do not match the advertised "
                        "hash; trying another donor", ref.round, ref.param_hash[:12],
                        ",".join(m.peer[:12] for m in group))
        # no group gave a whole state (a chunk every donor served wrong ends a download at once): read the
        # offers again after a pause, not in a tight loop
        stop.wait(min(1.0, max(0.0, deadline - time.monotonic())))
    return None


def _download(group: list[StateManifest], *, transport: Transport, membership: Membership, cfg: SwarmConfig,
              run_id: str, deadline: float, stop: threading.Event | None = None) -> bytes | None:
    """All chunks of one offer, each from any donor of the group (random order per chunk, so joiners spread
    over donors; a donor at its upload slots answers 'busy' and the chunk goes to the next one)."""
    ref = group[0]
    holders = membership.sources(sorted({m.peer for m in group}))
    if not holders:
        return None
    listed = transport.fetch(holders, state_chunk_name(run_id, ref.round, ref.chunk_list),
                             max_bytes=ref.chunk_list_bytes, deadline=deadline,
                             verify=lambda data: _digests(data, ref) is not None)
    digests = None if listed is None else _digests(listed, ref)
    if digests is None:
        log.warning("state fetch round=%d: no donor served the chunk list", ref.round)
        return None
    distinct = list(dict.fromkeys(digests))  # equal chunks (runs of zeros) are fetched once
    jobs = [(holders[i % len(holders):] + holders[:i % len(holders)], state_chunk_name(run_id, ref.round, d))
            for i, d in enumerate(distinct)]
    want = {state_chunk_name(run_id, ref.round, d): d for d in distinct}
    got = transport.fetch_many(jobs, max_bytes=ref.chunk_bytes, deadline=deadline,
                               verify=lambda name, data: hashlib.sha256(data).hexdigest() == want[name], stop=stop)
    if len(got) != len(want):
        log.warning("state fetch incomplete round=%d chunks=%d/%d", ref.round, len(got), len(want))
        return None
    data = b"".join(got[state_chunk_name(run_id, ref.round, d)] for d in digests)
    return data if len(data) == ref.size else None


def _digests(data: bytes, manifest: StateManifest) -> list[str] | None:
    try:
        return chunk_digests(data, manifest)
    except RecordError:
        return None
