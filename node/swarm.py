"""A peer of the swarm: the main loop of `gradnode bootstrap` and `gradnode join`.

Each round, top to bottom (overlapped: round r's exchange runs while round r+1's inner steps do):

    inner steps of round r+1 (cut short at the swarm's deadline if this peer is slow)
    wait for round r's outcome, apply it (outer step); a missed own update goes back into local progress
    publish the weight hash of round r, compare round r-1's with the majority, re-sync if it differs
    make, sign and announce the update of round r+1; its exchange starts in the background
    offer the new state, refresh the membership record, checkpoint, log

A peer too slow to make round r+1's deadline even with its fewest steps abstains from it and computes
for round r+2 instead, learning round r+1's decision as an observer (exchange.py): it stays in phase.

Joining: a fresh peer downloads the swarm's state (statesync.py); a peer that resumes from its own
checkpoint a few rounds behind replays the missed rounds' updates instead (catchup.py) when that is
smaller. SIGINT/SIGTERM announce the departure at once (membership ``leaving``: nobody waits for this
peer any more), stop the inner steps, finish the pending round when it can, and leave a checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import signal
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradnode.node.config import Config
from gradnode.node.exchange import Outcome, Rejections, RoundExchange, check_update, deadline_from
from gradnode.node.identity import Identity, load_or_create
from gradnode.node.membership import Membership
from gradnode.node.transport import Transport
from gradnode.protocol.records import Proposal, UpdateAnnouncement, WeightHash, majority_hash, update_name

if TYPE_CHECKING:
    from gradnode.node.engine import Snapshot  # torch: imported by the training loop only, not by `--help`

log = logging.getLogger(__name__)


@dataclass
class PeerSummary:
    peer: str
    rounds: int
    final_loss: float | None
    val_loss_first: float | None
    val_loss_last: float | None
    param_hash: str
    bytes_up: int
    bytes_down: int
    utilization: float  # time in inner steps / wall time of the training loop
    comm_wait_s_per_round: float
    # the same without the end of the run, when the last round's exchange has nothing left to overlap with
    utilization_steady: float
    comm_wait_s_per_round_steady: float
    rejected_updates: int
    rejected_by_sender: dict[str, dict[str, int]] = field(default_factory=dict)
    resyncs: int = 0
    own_excluded: int = 0
    contributed: int = 0  # rounds whose agreed set held this peer's update
    abstained: int = 0  # rounds this peer sat out to get back in phase (too slow for their deadline)
    hashes: dict[int, str] = field(default_factory=dict)
    joined_round: int = 0  # the first round this process trained (after resuming and syncing)
    first_contribution: int | None = None  # the first round whose agreed set held this peer's update
    catchups: int = 0  # missed rounds caught up by replaying their updates
    state_downloads: int = 0  # full states downloaded (joining, or too far behind to replay)
    rejected_state_offers: int = 0  # offers whose weights did not match their advertised hash
    resumed_round: int | None = None  # round of the own checkpoint this process resumed from
    state_bytes_up: int = 0  # state served to joiners
    own_update_bytes_up: int = 0  # copies of this peer's own updates uploaded (the rest of bytes_up is relaying)
    # main-thread seconds per round outside the inner steps, by phase (what utilisation loses, and where)
    phase_s_per_round: dict[str, float] = field(default_factory=dict)


def shard_of(peer_id: str) -> int:
    """A stable data-shard number for a peer id (31 bits of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "big") >> 1


def identity_for(cfg: Config) -> Identity:
    return load_or_create(cfg.swarm.identity_path or cfg.run.output_dir / "identity.key")


class Peer:
    """One swarm member: transport, membership, engine, and the round loop."""

    def __init__(self, cfg: Config, *, peer_index: int | None = None, device: str | None = None,
                 metrics_path: Path | None = None, evaluate: bool = True) -> None:
        self.cfg, self.device = cfg, device
        self.sw = cfg.swarm
        self.identity = identity_for(cfg)
        # The data shard: given explicitly (simulations), else derived from the stable identity, so that
        # volunteers started with the same command never train on the same slice.
        self.peer_index = peer_index if peer_index is not None else shard_of(self.identity.peer_id)
        self.transport = Transport(self.sw, self.identity)
        self.membership: Membership | None = None
        self.engine: Any = None
        self.stop = threading.Event()
        self.rejections = Rejections()
        self.metrics_path = metrics_path
        self.do_eval = evaluate
        self.hashes: dict[int, str] = {}
        self.resyncs = 0
        self.own_excluded = 0
        self.contributed = 0
        self.abstained = 0
        self.inner_s = 0.0
        self.wait_s = 0.0
        self.drain_s = self.drain_wait_s = 0.0
        self.step_s = 0.0
        self.last_loss: float | None = None
        self.val_first: float | None = None
        self.val_last: float | None = None
        self.rounds_done = 0
        self.saved_round = -1
        self.last_senders: list[str] = []
        self.last_steps = 0
        self.last_tokens = 0
        self.leaving = threading.Event()
        self.applied: dict[int, tuple[list[tuple[str, str]], int]] = {}  # round -> (included, bytes), reported
        self.sync_stats: Counter = Counter()
        self.phase_s: Counter = Counter()
        self._chores = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chores")
        self._chore: Future | None = None
        self._trusted_from = 0  # rounds before this were replaced by a re-sync: their hash checks are moot
        # just adopted a state or caught up: our next proposal would come late, so we do not lead that round
        self._rejoined = False
        self.catchups = 0
        self.joined_round = 0
        self.first_contribution: int | None = None
        self.resumed_round: int | None = None

    # --- lifecycle --------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            log.info("signal=%d: announcing departure, finishing the round and checkpointing", signum)
            self.stop.set()
            if self.membership is not None and not self.leaving.is_set():
                self.leaving.set()
                # not from the handler itself: the main thread may hold the DHT lock right now
                threading.Thread(target=self._publish_member, args=(False,), name="leave", daemon=True).start()
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def start(self) -> None:
        self.transport.on_push = self._accept_push
        self.transport.start()
        self.membership = Membership(self.transport, self.identity, self.cfg.run.run_id, self.sw.record_ttl_s)
        self._publish_member(training=not self.sw.serve_only)

    def close(self) -> None:
        try:
            if self.membership is not None:
                self._publish_member(training=False, leaving=True)
        finally:
            self.transport.close()

    def serve(self) -> None:
        """Serve-only peer (bootstrap): keep the DHT and the membership record alive until stopped."""
        self._heartbeat(training=False, until=self.stop)

    def _heartbeat(self, training: bool, until: threading.Event) -> None:
        """Refresh the membership record every third of its lifetime until ``until`` is set: liveness must
        not depend on how long a round takes (a slow round would otherwise expire the record)."""
        while not until.wait(min(10.0, self.sw.record_ttl_s / 3)):
            self._publish_member(training=training)

    # --- the training loop ------------------------------------------------------------------------

    def train(self) -> PeerSummary:
        from gradnode.node.engine import Engine

        from gradnode.node import checkpoint

        cfg = self.cfg
        ckpt = cfg.run.output_dir / "checkpoints"
        resume = cfg.checkpoint.resume and bool(checkpoint.list_checkpoints(ckpt))
        self.engine = Engine.resume(cfg, ckpt, self.peer_index, self.device) if resume \
            else Engine(cfg, self.peer_index, self.device)
        if resume:
            self.resumed_round = self.engine.round
            self.saved_round = self.engine.round
        self.shapes = {n: tuple(t.shape) for n, t in self.engine.global_params.items()}
        self._wait_for_peers()
        self._sync_state(reason="join")
        self.joined_round = self.engine.round
        self._publish_member(training=True)
        if self.do_eval:
            self.val_first = self.engine.evaluate()
        target = self.sw.rounds or math.inf
        pending: RoundExchange | None = None
        t_start = time.monotonic()
        training_done = threading.Event()
        threading.Thread(target=self._heartbeat, args=(True, training_done), name="heartbeat", daemon=True).start()
        while not self.stop.is_set() and self.engine.round + (pending is not None) < target:
            computing = self.engine.round + (pending is not None)
            skipped = None
            if computing + 1 < target and self._too_late_for(computing):
                skipped, computing = computing, computing + 1
                self._abstain(skipped)
            clock = self._round_clock(computing)
            try:
                stats = self.engine.inner_round(should_stop=clock)
            finally:
                clock.close()
            self.inner_s += stats.seconds
            self.last_steps, self.last_tokens = stats.steps, stats.tokens
            if stats.steps:
                self.step_s = stats.seconds / stats.steps
                self.last_loss = stats.loss
            if pending is not None:
                self._finish(pending)
                pending = None
            if skipped is not None and self.engine.round == skipped and not self.stop.is_set():
                self._finish(self._observe(skipped))
            if self.stop.is_set() or self.engine.round != computing or not stats.steps:
                continue  # re-synced or stopping: this round's progress stays local
            with self._phase("update"):
                pending = self._publish_update(stats.tokens)
            if not self.sw.overlap:
                self._finish(pending)
                pending = None
            self._after_round()
        # the pipeline drains: the last round's exchange has no next round to hide behind (once per run)
        drain_t0, wait_before = time.monotonic(), self.wait_s
        if pending is not None:
            self._finish(pending)
            self._after_round()
        self._settle_chores()
        self.drain_s, self.drain_wait_s = time.monotonic() - drain_t0, self.wait_s - wait_before
        training_done.set()
        wall = time.monotonic() - t_start
        if self.saved_round != self.engine.round:
            self._save_checkpoint()
        if self.do_eval:
            self.val_last = self.engine.evaluate()
        self._linger()
        return self._summary(wall)

    def _publish_update(self, tokens: int) -> RoundExchange:
        from gradnode.protocol import attach_signature, signing_digest

        blob = self.engine.make_update(sender=self.identity.peer_id)
        blob = attach_signature(blob, self.identity.sign(signing_digest(blob)))
        blob = self._inject_fault(blob)
        ex = RoundExchange(transport=self.transport, membership=self.membership, cfg=self.sw,
                           run_id=self.cfg.run.run_id, round_=self.engine.round, blob=blob, tokens=tokens,
                           round_seconds=self._round_seconds(), shapes=self.shapes, rejections=self.rejections,
                           stop=threading.Event(), eligible=self.last_senders, leaving=self.leaving,
                           lead=not self._rejoined)
        self._rejoined = False
        ex.start()
        return ex

    @contextlib.contextmanager
    def _phase(self, name: str):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.phase_s[name] += time.monotonic() - t0

    def _abstain(self, round_: int) -> None:
        """Sit round ``round_`` out, saying so at once so that nobody waits for our proposal."""
        self.abstained += 1
        self.membership.write("proposals", round_, Proposal(run_id=self.cfg.run.run_id, round=round_,
                                                            proposer=self.identity.peer_id, included=[],
                                                            abstain=True))
        log.info("round=%d abstained: its deadline is nearer than %d step(s) of %.2f s; computing for round=%d",
                 round_, self.sw.min_steps, self.step_s, round_ + 1)

    def _observe(self, round_: int) -> RoundExchange:
        """Learn the decision of a round we abstained from, exactly as the others reached it."""
        ex = RoundExchange(transport=self.transport, membership=self.membership, cfg=self.sw,
                           run_id=self.cfg.run.run_id, round_=round_, blob=None, tokens=0,
                           round_seconds=self._round_seconds(), shapes=self.shapes, rejections=self.rejections,
                           stop=threading.Event(), eligible=self.last_senders, leaving=self.leaving)
        ex.start()
        return ex

    def _finish(self, ex: RoundExchange) -> None:
        """Wait for round r's decision and apply it; a missed own update returns to local progress."""
        t0 = time.monotonic()
        outcome = ex.result(timeout=self.sw.max_wait_s + 10)
        wait = time.monotonic() - t0
        self.wait_s += wait
        self.phase_s["wait"] += wait
        with self._phase("apply"):
            self._apply(ex, outcome, wait)

    def _apply(self, ex: RoundExchange, outcome: Outcome | None, wait: float) -> None:
        """The outer step of round r with the agreed updates, and its bookkeeping."""
        if outcome is None or not outcome.decided:
            log.warning("round=%d undecided: applying no update (hash check will re-sync)", ex.round)
            outcome = Outcome(ex.round, [], [], [], False, None, False, 0.0)
        if self.engine.round != ex.round:
            log.warning("round=%d outcome dropped: engine moved to round=%d", ex.round, self.engine.round)
            return
        self.engine.apply_aggregate(outcome.updates, outcome.weights)
        if self.sw.fault == "drift" and ex.round == self.sw.fault_round:
            self.engine.global_params[self.engine.names[0]].add_(1e-3)  # testing aid: silently diverge once
        self.last_senders = list(outcome.senders)
        included = [(s, ex.verified[s].digest) for s in outcome.senders]
        sizes = [len(self.transport.blobs.get(update_name(self.cfg.run.run_id, ex.round, s)) or b"")
                 for s in outcome.senders]
        self.applied[ex.round] = (included, sum(sizes))
        if outcome.own_included:
            self.contributed += 1
            if self.first_contribution is None:
                self.first_contribution = ex.round
        elif not ex.observer:
            self.own_excluded += 1
            self._return_own(ex)
        self.rounds_done += 1
        self.hashes[ex.round] = self.engine.param_hash()
        log.info("round=%d applied=%d leader=%s own_included=%s wait_s=%.2f hash=%s", ex.round,
                 len(outcome.updates), (outcome.leader or "-")[:12],
                 "abstained" if ex.observer else outcome.own_included, wait, self.hashes[ex.round][:12])
        self._write_metrics(ex.round, outcome, wait)

    def _return_own(self, ex: RoundExchange) -> None:
        """Error feedback for an excluded update: add what we sent back onto ``start`` so the next
        pseudo-gradient (start - local) carries it again."""
        own = ex.verified.get(ex.me)
        if own is None:
            return
        for name, t in own.update.tensors.items():
            self.engine.start[name].add_(t.to(self.engine.start[name].device, self.engine.start[name].dtype))

    def _after_round(self) -> None:
        """Between rounds: hand this round's reports (weight hash, state offer, membership record,
        checkpoint) to the chores thread, which runs them while the next round's inner steps compute.
        Only snapshots cross over; a hash mismatch it finds is repaired here, at the next boundary."""
        self._settle_chores()
        report = None
        if self.sw.hash_check and self.applied:  # report only rounds this peer applied (or replayed) itself
            last = max(self.applied)
            report = (last, *self.applied[last], self.hashes[last], self.hashes.get(last - 1))
        offer = None
        if not self.sw.client_mode:  # nobody can fetch from a client-mode peer
            state = self.engine.shared_state()
            if self.sw.fault == "tamper_state" and self.engine.round >= self.sw.fault_round:
                state = _tampered(state)
            offer = (state, self.engine.param_hash(), self.engine.round)
        every = self.cfg.checkpoint.every_rounds
        snap = self.engine.snapshot() if every and self.engine.round % every == 0 else None
        self._chore = self._chores.submit(self._chores_job, report, offer, snap)
        keep = max(3, self.sw.catchup_rounds + 1)  # applied updates stay served for the catch-up window
        self.transport.blobs.drop(lambda n: not n.startswith("u/") or
                                  int(n.split("/")[2]) >= self.engine.round - keep)
        for r in [r for r in self.applied if r < self.engine.round - keep]:
            del self.applied[r]

    def _chores_job(self, report: tuple | None, offer: tuple | None, snap: Snapshot | None) -> int | None:
        """The chores thread's work for one round; the round whose hash lost the vote, if ours did."""
        mismatch = None
        if report is not None:
            with self._phase("hash_check"):
                mismatch = self._report_hash(*report)
        if offer is not None:
            with self._phase("offer_state"):
                self._offer_state(*offer)
        with self._phase("record"):
            self._publish_member(training=True)
        if snap is not None:
            with self._phase("checkpoint"):
                self._save_checkpoint(snap)
        return mismatch

    def _settle_chores(self) -> None:
        """Wait for the chores of the previous round (done long ago, normally); re-sync if they found our
        weights off the majority."""
        if self._chore is None:
            return
        t0 = time.monotonic()
        try:
            mismatch = self._chore.result()
        except Exception:  # a bug there must not kill the peer; the next round reports again
            log.exception("round chores failed")
            mismatch = None
        self._chore = None
        self.phase_s["chores_wait"] += time.monotonic() - t0
        # a round before our last re-sync was checked on weights we have replaced since: nothing to repair
        if mismatch is not None and mismatch >= self._trusted_from:
            log.warning("weight hash of round=%d differs from the majority: re-syncing", mismatch)
            self._sync_state(reason="hash mismatch", force=True)

    def _report_hash(self, last: int, included: list, size: int, param_hash: str, before: str | None) -> int | None:
        """Publish the weight hash of our newest applied round; the round before when our hash of it
        disagrees with the majority."""
        # kept long enough for a peer that was away catchup_rounds rounds to read what it missed
        ttl = max(self.sw.record_ttl_s, 3.0 * self.sw.catchup_rounds * max(self._round_seconds(),
                                                                             self.sw.min_deadline_s))
        self.membership.write("weights", last, WeightHash(run_id=self.cfg.run.run_id, round=last,
                                                          peer=self.identity.peer_id, param_hash=param_hash,
                                                          included=included, update_bytes=size), ttl=ttl)
        if before is None:
            return None
        reports = self.membership.read("weights", last - 1, WeightHash)
        found = majority_hash([r for r in reports if r.round == last - 1])
        if found is None or found[0] == before:
            return None
        return last - 1

    def _offer_state(self, state: dict[str, Any], param_hash: str, round_: int) -> None:
        """Serve a state to joiners (chunked, hash-named) and publish its manifest."""
        from gradnode.node import statesync

        statesync.offer(state, param_hash, round_, transport=self.transport, membership=self.membership, cfg=self.sw,
                        run_id=self.cfg.run.run_id)

    def _save_checkpoint(self, snap: Snapshot | None = None) -> None:
        """Write a checkpoint (of ``snap``, else of now). Disk full or folder unwritable: say so clearly and
        keep training on the state in memory."""
        snap = snap or self.engine.snapshot(copy=False)
        try:
            self.engine.write_snapshot(snap, self.cfg.run.output_dir / "checkpoints")
            self.saved_round = snap.round
        except OSError as err:
            log.error("checkpoint of round=%d not written (%s: %s); training goes on from memory, fix the folder "
                      "%s or run.output_dir", snap.round, type(err).__name__, err.strerror or err,
                      self.cfg.run.output_dir / "checkpoints")

    def _sync_state(self, reason: str, force: bool = False) -> None:
        """Adopt the swarm's newest agreed state when it is ahead of ours (or when ``force``): replay the
        missed rounds when that is cheaper (catchup.py), else download the full state (statesync.py)."""
        from gradnode.node import statesync

        if not force and self._catch_up():
            return
        backup = self.engine.shared_state()

        def accept(state: dict[str, Any], manifest: Any) -> bool:
            try:
                self.engine.load_shared_state(state)
                ok = self.engine.param_hash() == manifest.param_hash
            except (ValueError, KeyError, RuntimeError) as err:
                log.warning("state from %s unusable: %s", manifest.peer[:12], err)
                ok = False
            if not ok:
                self.engine.load_shared_state(backup)
            return ok

        got = statesync.fetch(transport=self.transport, membership=self.membership, cfg=self.sw,
                              run_id=self.cfg.run.run_id, min_round=self.engine.round if force else
                              self.engine.round + 1, deadline_s=self.sw.max_wait_s if force else 3.0,
                              accept=accept, stats=self.sync_stats)
        if got is None:
            if force:
                log.warning("re-sync found no state offer; continuing")
            return
        _, manifest = got
        self.resyncs += force
        self.hashes[self.engine.round - 1] = manifest.param_hash
        self._trusted_from = self.engine.round - 1
        self._rejoined = True
        self.last_senders = self._agreed_senders(self.engine.round - 1)
        log.info("state adopted reason=%s round=%d from=%s hash=%s", reason, self.engine.round,
                 manifest.peer[:12], manifest.param_hash[:12])

    def _catch_up(self) -> bool:
        """Replay the rounds between our checkpoint and the swarm's newest state, when their updates are
        kept (swarm.catchup_rounds) and weigh less than the state; True when we are level again."""
        from gradnode.node import catchup, statesync

        eng = self.engine
        if self.sw.catchup_rounds == 0 or (eng.round == 0 and self.resumed_round is None):
            return False  # a fresh peer has no history to build on: it downloads the state
        offers = statesync.newest_offers(self.membership, self.sw, self.identity.peer_id, eng.round + 1)
        if not offers:
            return False
        target = offers[0].round
        if target - eng.round > self.sw.catchup_rounds:
            log.info("catch-up: %d rounds behind, beyond the window of %d", target - eng.round, self.sw.catchup_rounds)
            return False
        missed = catchup.plan(self.membership, eng.round, target)
        if missed is None or not catchup.start_matches(eng, self.membership):
            return False
        cost = sum(m.update_bytes for m in missed)
        if cost >= offers[0].size:
            log.info("catch-up: %d bytes of updates >= %d bytes of state; downloading the state", cost, offers[0].size)
            return False
        start = eng.round
        ok = catchup.replay(eng, missed, transport=self.transport, membership=self.membership, cfg=self.sw,
                            run_id=self.cfg.run.run_id, shapes=self.shapes, deadline_s=min(60.0, self.sw.max_wait_s))
        for m in missed[:eng.round - start]:
            self.hashes[m.round] = m.param_hash
            self.applied[m.round] = (m.included, m.update_bytes)
        if ok:
            self.catchups += len(missed)
            self.last_senders = [s for s, _ in missed[-1].included]
            self._rejoined = True
            log.info("caught up rounds=%d..%d by replay bytes=%d (state is %d) hash=%s", start, target - 1, cost,
                     offers[0].size, eng.param_hash()[:12])
        return ok

    def _agreed_senders(self, round_: int) -> list[str]:
        """Who made round ``round_`` by the swarm's reports (the next round's eligible leaders); [] if unknown."""
        reports = [w for w in self.membership.read("weights", round_, WeightHash) if w.round == round_]
        found = majority_hash(reports)
        if found is None:
            return []
        return sorted({s for w in reports if w.param_hash == found[0] for s, _ in w.included})

    def _accept_push(self, name: str, blob: bytes) -> bool:
        """A client-mode peer pushed its update: hold and serve it when it verifies (transport thread)."""
        parts = name.split("/")
        if self.engine is None or len(parts) != 4 or parts[0] != "u" or parts[1] != self.cfg.run.run_id \
                or not parts[2].isdigit():
            return False
        round_ = int(parts[2])
        if not self.engine.round - 2 <= round_ <= self.engine.round + 2:
            return False
        upd, reason = check_update(blob, sender=parts[3], run_id=self.cfg.run.run_id, round_=round_,
                                   shapes=self.shapes, members=self.membership, max_bytes=self.sw.max_update_bytes)
        if upd is None:
            self.rejections.add(parts[3], reason or "malformed")
            return False
        self.transport.blobs.put(name, blob)
        log.info("pushed update held round=%d sender=%s", round_, parts[3][:12])
        return True

    # --- helpers ----------------------------------------------------------------------------------

    def _round_seconds(self) -> float:
        own = self.step_s * self.cfg.inner.steps
        return self.membership.round_seconds(own or self.sw.min_deadline_s)

    def _round_clock(self, round_: int) -> "_RoundClock":
        """should_stop for inner steps: stop on a signal, or when one more step would end after this peer's
        stop time for ``round_`` (a slow peer runs fewer steps instead of stalling the others). The DHT
        is read by a watcher thread, never between two steps: inner steps only compute."""
        return _RoundClock(self, _StopTime(self, round_))

    def _too_late_for(self, round_: int) -> bool:
        """True when round ``round_``'s deadline is already running and nearer than our fewest steps:
        our update would arrive after the others decided, so we had better compute for the next round."""
        if not self.step_s:
            return False
        now = time.monotonic()
        stop_time = _StopTime(self, round_, predict=False)
        with self._phase("deadline_poll"):
            stop_time.refresh(now)
        stop_at = stop_time(now)
        return stop_at is not None and now + self.sw.min_steps * self.step_s > stop_at

    def _wait_for_peers(self) -> None:
        need = self.sw.min_peers
        end = time.monotonic() + self.sw.max_wait_s
        while need > 1 and not self.stop.is_set() and time.monotonic() < end:
            live = [m for m in self.membership.members(max_age=0).values() if m.training]
            if len(live) >= need or any(m.round > 0 for m in live):  # enough, or the swarm already runs
                return
            time.sleep(0.3)

    def _publish_member(self, training: bool, leaving: bool = False) -> None:
        eng = self.engine
        leaving = leaving or self.leaving.is_set()  # once announced, every later record says so too
        self.membership.publish(round_=eng.round if eng else 0, training=training and not leaving,
                                step_seconds=self.step_s,
                                inner_steps=self.cfg.inner.steps,
                                tokens_per_s=(self.cfg.inner.batch_size * self.cfg.model.seq_len *
                                              self.cfg.inner.grad_accum / self.step_s) if self.step_s else 0.0,
                                rejected=self.rejections.total(), loss=self.last_loss, leaving=leaving)

    def _inject_fault(self, blob: bytes) -> bytes:
        """Testing aid (swarm.fault): a misbehaving peer for the integration tests."""
        fault = self.sw.fault
        if fault not in ("corrupt", "forge") or self.engine.round < self.sw.fault_round:
            return blob
        if fault == "corrupt":
            mid = len(blob) // 2
            return blob[:mid] + bytes(b ^ 0x5A for b in blob[mid:mid + 64]) + blob[mid + 64:]
        if fault == "forge":
            from gradnode.protocol import attach_signature, signing_digest

            other = load_or_create(self.cfg.run.output_dir / "forger.key")
            return attach_signature(blob, other.sign(signing_digest(blob)))
        return blob

    def _linger(self) -> None:
        """Keep serving after the last round until the others have it too (bounded)."""
        end = time.monotonic() + min(self.sw.max_wait_s, 30.0)
        while time.monotonic() < end and not self.stop.is_set():
            rounds = [m.round for p, m in self.membership.members(max_age=0).items()
                      if m.training and p != self.identity.peer_id]
            if all(r >= self.engine.round for r in rounds):
                break
            time.sleep(0.5)

    def _write_metrics(self, round_: int, outcome: Outcome, wait: float) -> None:
        if self.metrics_path is None:
            return
        row = {"round": round_, "loss": self.last_loss, "hash": self.hashes.get(round_), "applied": len(outcome.updates),
               "senders": outcome.senders, "steps": self.last_steps, "tokens": self.last_tokens,
               "own_included": outcome.own_included, "wait_s": wait, "inner_s": self.inner_s,
               "bytes_up": self.transport.bytes_up, "bytes_down": self.transport.bytes_down,
               "rejected": self.rejections.total(), "resyncs": self.resyncs, "catchups": self.catchups,
               "joined_round": self.joined_round, "phase_s": dict(self.phase_s), "time": time.time()}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def _summary(self, wall: float) -> PeerSummary:
        return PeerSummary(peer=self.identity.peer_id, rounds=self.engine.round, final_loss=self.last_loss,
                           val_loss_first=self.val_first, val_loss_last=self.val_last,
                           param_hash=self.engine.param_hash(), bytes_up=self.transport.bytes_up,
                           bytes_down=self.transport.bytes_down,
                           utilization=self.inner_s / wall if wall > 0 else 0.0,
                           comm_wait_s_per_round=self.wait_s / max(1, self.rounds_done),
                           utilization_steady=self.inner_s / (wall - self.drain_s) if wall > self.drain_s else 0.0,
                           comm_wait_s_per_round_steady=(self.wait_s - self.drain_wait_s) / max(1, self.rounds_done - 1),
                           rejected_updates=self.rejections.total(),
                           rejected_by_sender=self.rejections.by_sender(), resyncs=self.resyncs,
                           own_excluded=self.own_excluded, contributed=self.contributed,
                           abstained=self.abstained, hashes=dict(self.hashes), joined_round=self.joined_round,
                           first_contribution=self.first_contribution, catchups=self.catchups,
                           state_downloads=self.sync_stats["downloads"],
                           rejected_state_offers=self.sync_stats["rejected_offers"], resumed_round=self.resumed_round,
                           state_bytes_up=self.transport.state_bytes_up,
                           own_update_bytes_up=self.transport.own_update_bytes_up,
                           phase_s_per_round={k: v / max(1, self.rounds_done) for k, v in sorted(self.phase_s.items())})


class _Deadline:
    """The swarm's deadline of one round as a peer sees it, from the DHT's announcements; None until
    half the live training peers have announced. ``poll`` reads the DHT, calling the object does not."""

    def __init__(self, peer: Peer, round_: int, window: float) -> None:
        self.peer, self.round, self.window = peer, round_, window
        self.seen: dict[str, float] = {}
        self.live = 1

    def __call__(self) -> float | None:
        return deadline_from(self.seen, self.live, self.window, self.peer.sw)

    def poll(self, now: float) -> None:
        peer = self.peer
        dht_now = peer.transport.now()
        for ann in peer.membership.read("updates", self.round, UpdateAnnouncement):
            # when it was announced, not when we first looked: a peer that joined or fell behind
            # sees the deadline already passed and cuts its round short to catch up
            age = min(max(0.0, dht_now - ann.time), 600.0)
            self.seen.setdefault(ann.sender, now - age)
        self.live = 1 + sum(1 for p, m in peer.membership.members().items()
                            if m.training and p != peer.identity.peer_id and m.round >= self.round - 1)


class _StopTime:
    """When a peer should have finished its inner steps of a round: half a deadline window before the
    round's deadline, which leaves time to apply the previous round and announce. Before anyone has
    announced the round, its deadline is predicted as the previous round's plus one median round (a slow
    peer must stop in time, not notice the deadline once it has passed)."""

    def __init__(self, peer: Peer, round_: int, predict: bool = True) -> None:
        round_s = peer._round_seconds()
        self.window = max(peer.sw.min_deadline_s, (peer.sw.deadline_slack - 1.0) * round_s)
        self.round_s = round_s
        self.current = _Deadline(peer, round_, round_s)
        self.previous = _Deadline(peer, round_ - 1, round_s) if predict and round_ > 0 else None
        self._lock = threading.Lock()

    def refresh(self, now: float) -> None:
        """Re-read the DHT (the watcher thread does this every 0.5 s during inner steps)."""
        with self._lock:
            self.current.poll(now)
            if self.previous is not None and self.current() is None:
                self.previous.poll(now)

    def __call__(self, now: float) -> float | None:
        with self._lock:
            deadline = self.current()
            if deadline is not None:
                return deadline - 0.5 * (deadline - min(self.current.seen.values()))
            before = self.previous() if self.previous is not None else None
        if before is None:
            return None
        return before + self.round_s - 0.5 * self.window


class _RoundClock:
    """should_stop of one inner round (see Peer._round_clock), with the thread that keeps its stop time
    fresh from the DHT; ``close()`` when the round ends."""

    POLL_S = 0.5

    def __init__(self, peer: Peer, stop_time: _StopTime) -> None:
        self.peer, self.stop_time = peer, stop_time
        self.steps, self.last, self.step_s = 0, time.monotonic(), peer.step_s
        self._closed = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="round-clock", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._closed.is_set():
            try:
                self.stop_time.refresh(time.monotonic())
            except Exception as err:  # a DHT hiccup: keep the last view, try again
                log.debug("deadline poll failed: %r", err)
            self._closed.wait(self.POLL_S)

    def close(self) -> None:
        self._closed.set()

    def __call__(self) -> bool:
        peer = self.peer
        now = time.monotonic()
        if peer.sw.slowdown > 1 and self.steps:
            time.sleep((peer.sw.slowdown - 1) * (now - self.last))
            now = time.monotonic()
        if self.steps:
            self.step_s = now - self.last
        self.last = now
        self.steps += 1
        if peer.stop.is_set():
            return True
        if self.steps <= peer.sw.min_steps:
            return False
        stop_at = self.stop_time(now)
        return stop_at is not None and now + self.step_s > stop_at


def _tampered(state: dict[str, Any]) -> dict[str, Any]:
    """Testing aid (swarm.fault=tamper_state): the shared state with one weight nudged."""
    params = dict(state["global_params"])
    name = sorted(params)[0]
    params[name] = params[name] + 1e-3
    return {**state, "global_params": params}


def summary_json(s: PeerSummary) -> str:
    d = asdict(s)
    d["hashes"] = {str(k): v for k, v in d["hashes"].items()}
    return json.dumps(d)
