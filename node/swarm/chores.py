"""The chores thread: a round's reports, run behind the next round's inner steps.

After applying round r the main loop only snapshots what the reports need and hands them over; one
worker thread then publishes the weight hash of round r (and checks round r-1's against the majority),
offers the shared state to joiners, refreshes the member record, looks at the chains the live trainers
follow (health.py) and writes the checkpoint, while the inner steps of the next round compute. A hash
mismatch or a lost fork found there is repaired by the main loop at the next round boundary
(``settle``), as the peer core decides (protocol/peer.py).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from gradnode.node.config import Config
from gradnode.node.swarm import adversary, statesync
from gradnode.node.swarm.health import ChainView
from gradnode.node.swarm.history import RoundLog
from gradnode.node.swarm.membership import Membership, kept_for_catchup
from gradnode.node.swarm.report import Phases
from gradnode.node.swarm.transport import Transport
from gradnode.protocol.records import WeightHash, pack

if TYPE_CHECKING:
    from gradnode.node.train.engine import Engine, Snapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HashReport:
    round: int
    included: list[tuple[str, str]]
    update_bytes: int
    param_hash: str
    previous_hash: str | None  # our hash of the round before, checked against the majority
    weighers: frozenset[str] | None = None  # who publishes a weight hash of the round (committee.weighers)
    weighers_before: frozenset[str] | None = None  # whose weight hashes of the round before count


@dataclass(frozen=True)
class Findings:
    """What a round's chores read for the main loop, which steps the peer core with it (protocol/peer.py): the
    weight reports of the round before ours (``reports``: peer -> hash, the voting ones; empty with no hash
    check) with our hash of it, and the chains among the live trainers."""

    round: int
    mine: str | None
    reports: dict[str, str]
    chains: ChainView


@dataclass(frozen=True)
class StateOffer:
    state: dict[str, Any]
    param_hash: str
    round: int


class Chores:
    """One worker thread; at most one round's job in flight."""

    def __init__(self, *, cfg: Config, members: Membership, transport: Transport, phases: Phases,
                 publish_member: Callable[[], None], save: Callable[["Snapshot"], None],
                 round_seconds: Callable[[], float], look_at_chains: Callable[[], ChainView]) -> None:
        self.cfg, self.sw, self.members, self.transport, self.phases = cfg, cfg.swarm, members, transport, phases
        self.publish_member, self.save, self.round_seconds = publish_member, save, round_seconds
        self.look_at_chains = look_at_chains
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chores")
        self._job: Future | None = None

    def hand_off(self, engine: "Engine", history: RoundLog) -> None:
        """Snapshot this round's reports and queue them (call ``settle`` first)."""
        assert self._job is None, "settle the previous round's chores first"
        newest = history.newest_report() if self.sw.hash_check else None  # rounds this peer applied itself
        report = HashReport(*newest) if newest is not None else None
        offer = None
        if not self.sw.client_mode:  # nobody can fetch from a client-mode peer
            offer = StateOffer(*adversary.offered(self.sw, engine))
        every = self.cfg.checkpoint.every_rounds
        snap = engine.snapshot() if every and engine.round % every == 0 else None
        self._job = self._pool.submit(self._run, report, offer, snap)

    def settle(self) -> Findings | None:
        """Wait for the previous round's job (done long ago, normally) and return what it found. A failed
        job is logged, never taken for a mismatch."""
        if self._job is None:
            return None
        with self.phases.time("chores_wait"):
            try:
                found = self._job.result()
            except Exception:  # a bug there must not kill the peer; the next round reports again
                log.exception("round chores failed")
                found = None
        self._job = None
        return found

    def _run(self, report: HashReport | None, offer: StateOffer | None, snap: "Snapshot | None") -> Findings:
        before = None
        if report is not None:
            with self.phases.time("hash_check"):
                before = self._report_hash(report)
        if offer is not None:
            with self.phases.time("offer_state"):
                statesync.offer(offer.state, offer.param_hash, offer.round, transport=self.transport,
                                membership=self.members, cfg=self.sw, run_id=self.cfg.run.run_id)
        with self.phases.time("record"):
            self.publish_member()
        with self.phases.time("chains"):
            chains = self.look_at_chains()
        if snap is not None:
            with self.phases.time("checkpoint"):
                self.save(snap)
        if report is None or before is None:
            return Findings(-1, None, {}, chains)
        return Findings(report.round - 1, report.previous_hash, {w.peer: w.param_hash for w in before}, chains)

    def _report_hash(self, r: HashReport) -> list[WeightHash] | None:
        """Publish the weight hash of our newest applied round (when its committee names us a witness); the
        reports of the round before that count, when we hold a hash of it to check against them."""
        me = self.members.identity.peer_id
        if r.weighers is None or me in r.weighers:  # a drawn committee's witnesses only (committee.weighers)
            ttl = kept_for_catchup(self.sw, self.round_seconds())
            self.members.write("weights", r.round, WeightHash(run_id=self.cfg.run.run_id, round=r.round, peer=me,
                                                              param_hash=r.param_hash, included=pack(r.included),
                                                              update_bytes=r.update_bytes), ttl=ttl)
        return None if r.previous_hash is None else self.members.reports(r.round - 1, among=r.weighers_before)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
