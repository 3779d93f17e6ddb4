"""A peer of the swarm: the main loop of `gradnode bootstrap` and `gradnode join`.

One round, as `Peer.train` tells it (overlapped: round r's exchange runs while round r+1 computes):

    compute      inner steps of round r+1, cut short at the swarm's deadline if this peer is slow
    finish       wait for round r's decision and apply it (the outer step); a missed own update goes
                 back into local progress
    publish      make, sign and announce round r+1's update; its exchange starts in the background
    hand off     the chores of round r (weight hash, state offer, member record, checkpoint) run on
                 their own thread behind round r+2's inner steps

A peer too slow to make round r+1's deadline even with its fewest steps abstains from it and computes
for round r+2 instead, learning round r+1's decision as an observer: it stays in phase.

The machinery lives below this file: the exchange and its agreement (exchange.py, agreement.py), the
round clock (clock.py), the chores thread (chores.py), getting level with the swarm (sync.py, on
statesync.py and catchup.py), and what the peer reports (report.py, history.py). SIGINT/SIGTERM
announce the departure at once (nobody waits for this peer any more), stop the inner steps, finish
the pending round when it can, and leave a checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from gradnode.node.config import Config, peer_id_of
from gradnode.node.shutdown import Shutdown
from gradnode.node.swarm import admission, adversary, events, finished, health
from gradnode.node.swarm.addressbook import AddressBook, with_peer_id
from gradnode.node.swarm.agreement import abstain
from gradnode.node.swarm.chores import Chores
from gradnode.node.swarm.clock import Clock
from gradnode.node.swarm.equivocation import Equivocators, OwnReports
from gradnode.node.swarm.events import Kind
from gradnode.node.swarm.exchange import Outcome, Rejections, RoundExchange
from gradnode.node.swarm.rules import UpdateRules
from gradnode.node.swarm.history import RoundLog
from gradnode.node.swarm.identity import Identity, load_or_create
from gradnode.node.swarm.membership import Membership
from gradnode.node.swarm.metrics import Exporter, Gauges, Role, RoundSinks
from gradnode.node.swarm.progress import Reporter, Stage
from gradnode.node.swarm.report import PeerSummary, Phases, Tally, append_metrics
from gradnode.node.swarm.sync import Sync
from gradnode.node.swarm.transport import Transport, TransportError
from gradnode.protocol import peer as peer_core
from gradnode.protocol import committee as committee_rule
from gradnode.protocol import roster as roster_rule
from gradnode.protocol.roster import VOTE_ROUNDS
from gradnode.protocol.committee import Committee
from gradnode.protocol import skew
from gradnode.protocol import sync as sync_rules
from gradnode.protocol import votes
from gradnode.protocol.peer import Check, Reason, Resync, Why
from gradnode.protocol.records import Finished, update_name
from gradnode.protocol.witness import eligible_witnesses

if TYPE_CHECKING:  # torch: imported by the training loop only, not by `--help`
    from gradnode.node.train.engine import Engine, RoundStats, Snapshot

log = logging.getLogger(__name__)

CLOCK_CHECK_S = 60.0  # how often a peer pings a few others for their clocks (protocol/skew.py)
CLOCK_PEERS = 5  # peers pinged a check: up to 2 initial peers, the rest voting trainers in sight
FINISHED_TTL_S = 7 * 86400.0  # how long a peer's 'finished' record outlives it (a peer back after the run's end)
UNSURE_LOOKS = 2  # looks in a row that an initial peer did not answer and that found the run not over, taken as no
# answer (the run's end kept by a silent bootstrap); one more goes by the records it read (a dead initial peer). Each
# waits twice as long as the one before for the initial peers' answers (finished.FETCH_S, then 10 s, 20 s)
CONNECT_SAY_S = 10.0  # a peer that reaches nobody at its start says so, and tries again, at most this far apart
HEARTBEAT_S = 10.0  # member record refresh and re-dialling of absent peers, at most this far apart
KEEP_S = 5.0  # a bootstrap looks this often whether its kept records are due for a refresh (_keep_run_records)
DIAL_WINDOW_S = 6 * 3600.0  # address-book peers seen within this are re-dialled while absent
# blobs served per round (updates, reports spelled out, decided sets, counted reports):
# "<kind>/<run>/<round>/..."; dropped past the catch-up window
ROUND_BLOBS = ("u/", "p/", "d/", "w/")


def _version() -> str:
    from gradnode.node import __version__

    return __version__


def shard_of(peer_id: str) -> int:
    """A stable data-shard number for a peer id (31 bits of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:4], "big") >> 1


def identity_for(cfg: Config) -> Identity:
    path = cfg.swarm.identity_path or cfg.run.output_dir / "identity.key"
    adversary.ground_identity(cfg.swarm, path)
    return load_or_create(path)


class Peer:
    """One swarm member: transport, membership, engine, and the round loop."""

    def __init__(self, cfg: Config, *, peer_index: int | None = None, device: str | None = None,
                 metrics_path: Path | None = None, evaluate: bool = True) -> None:
        self.cfg, self.sw, self.device = cfg, cfg.swarm, device
        self.identity = identity_for(cfg)
        # The data shard: given explicitly (simulations), else derived from the stable identity, so that
        # volunteers started with the same command never train on the same slice.
        self.peer_index = peer_index if peer_index is not None else shard_of(self.identity.peer_id)
        self.transport = Transport(self.sw, self.identity)
        self.membership: Membership | None = None
        self.kept: finished.Kept | None = None  # a bootstrap's 'finished' records (serve-only peers)
        self.revocations: admission.KeptRevocations | None = None  # and its revocation lists (serve-only peers)
        self.equivocators: Equivocators | None = None  # made by start()
        self.sybils: adversary.Sybils | adversary.Replayer | None = None  # 'flood', 'sybilvotes', 'replayleave' only
        self.workers: dict[str, int] = {}  # sender -> newest round whose update this process verified (_voters)
        self.engine: Engine | None = None
        self.clock: Clock | None = None  # made by start()
        self.stop, self.leaving = threading.Event(), threading.Event()
        self.signalled = False  # SIGTERM or SIGINT asked this peer to end
        self.rejections = Rejections(self.sw.ignore_after, self.sw.ignore_rounds)
        self.metrics_path, self.do_eval = metrics_path, evaluate
        self.tally, self.phases, self.history = Tally(), Phases(), RoundLog()
        self.progress = Reporter(cfg.run.output_dir)  # what it does right now, for the people watching
        self.last_loss: float | None = None
        self.last_stats: RoundStats | None = None
        self.val_first: float | None = None
        self.val_last: float | None = None
        self.saved_round = -1
        self.book = AddressBook(cfg.run.output_dir / "addressbook.json", self.identity.peer_id)
        self.chains = health.ChainView()  # the chains among the live trainers, as last looked at
        self.roster = roster_rule.Roster()  # the swarm's size under a committee, from the newcomers' tickets
        self._lists: dict[int, bool] = {}  # round -> its record is listed for it (roster.lists)
        self._committees: dict[int, Committee | None] = {}  # the last rounds' committees (roster.sampled)
        self.gauges = Gauges(role=Role.SERVE if self.sw.serve_only else Role.TRAIN, tally=self.tally,
                             rejected=self.rejections.by_sender,
                             traffic=lambda: (self.transport.bytes_up, self.transport.bytes_down))
        self.gauges.refresh = self._refresh_gauges
        self.exporter = Exporter(cfg.metrics, self.gauges, cfg.run.run_id, self.identity.peer_id, _version())
        self.sinks: RoundSinks | None = None
        self.waiting = False  # for peers: before the first round, or alone mid-run
        self.run_over: tuple[int, str] | None = None  # (round, hash) the run ended on, told by its contributors
        self._state_since = time.time()  # when the state this peer holds was made (run_over's ``since``)
        self.skew: skew.Estimate | None = None  # this clock against the peers', as last measured
        self._clock_checked = -math.inf
        self._clock_thread: threading.Thread | None = None
        # the rules between rounds: when this peer leaves its chain, re-syncs, lingers (protocol/peer.py)
        self.core = peer_core.PeerCore(self.identity.peer_id, peer_core.Params(max_wait_s=self.sw.max_wait_s))
        # draws the rows of this witness's loss checks: no sender can tune an update to them
        self.secret = int.from_bytes(os.urandom(8), "big")
        self._judging = threading.Lock()  # the loss check (_judge): one shadow model for every round
        self._shadow: Any = None

    # --- lifecycle --------------------------------------------------------------------------------

    def install_signal_handlers(self) -> Shutdown:
        """SIGTERM or SIGINT (to this process or its group): announce the departure at once (nobody waits for
        this peer any more), stop the inner steps, finish the pending round and checkpoint, within one round
        plus swarm.shutdown_grace_s; a second signal ends the process at once (node/shutdown.py)."""
        def leave(_signum: int) -> None:
            self.signalled = True
            self.stop.set()
            if self.membership is not None and not self.leaving.is_set():
                self.leaving.set()
                # not from the handler itself: the main thread may hold the DHT lock right now
                threading.Thread(target=self._publish_member, args=(False,), name="leave", daemon=True).start()
        return Shutdown(on_request=leave, grace_s=self._shutdown_grace_s).install()

    def _shutdown_grace_s(self) -> float:
        """How long a stopping peer may take: one round, as the round clock last measured it, plus the grace."""
        round_s = self.clock.round_seconds() if self.clock is not None and not self.sw.serve_only else 0.0
        return round_s + self.sw.shutdown_grace_s

    def start(self) -> None:
        self.transport.on_push = self._accept_push
        gate, cert = admission.from_config(self.cfg, self.identity, self.transport.now)  # before any network
        self._check_genesis_weights()
        self.exporter.start()  # a port in use fails here, before any network too
        self.sinks = RoundSinks(self.cfg.metrics, self.cfg.run.run_id, self.identity.peer_id)
        self._connect()
        self.membership = Membership(self.transport, self.identity, self.cfg.run.run_id, self.sw.record_ttl_s,
                                     gate=gate, admission=cert)
        self.transport.admits = self.membership.admitted
        self.membership.workers = lambda: self.history.senders  # whose records set the pace (round.view_of: counted)
        self.membership.voters = self._voters  # whose reports and chains count (Membership.votes)
        if self.cfg.committee.budget().drawn:  # listed only while drawn or announcing (protocol/roster.py)
            self.membership.own_key = True
            self.membership.listed = self._listed
            self.membership.roster_size = self._roster_size
        self.equivocators = Equivocators(self.membership, self.cfg.run.run_id, self.cfg.run.output_dir / "banned.json")
        self.rejections.banned = self.equivocators.peers  # ignored for good: caught equivocating
        self.equivocators.watch(self.stop)
        self.own_reports = OwnReports(self.cfg.run.output_dir / "reported.json")
        self.sybils = adversary.sybils(self.sw, self.cfg.run.run_id, self.cfg.run.output_dir, self.transport)
        self.clock = Clock(self.membership, self.sw, self.identity.peer_id, self.cfg.inner.steps, self.stop)
        self.chores = Chores(cfg=self.cfg, members=self.membership, transport=self.transport, phases=self.phases,
                             publish_member=lambda: self._publish_member(training=True), save=self._save_checkpoint,
                             round_seconds=self.clock.round_seconds, look_at_chains=self._look_at_chains)
        if self.sw.serve_only:  # the run's end outlives a restart of the bootstrap (node/swarm/finished.py)
            self.kept = finished.Kept(self.membership, self.transport, self.cfg.run.output_dir / finished.FILE_NAME,
                                      FINISHED_TTL_S)
            # and so do the run's revocations (node/swarm/admission.py)
            self.revocations = admission.KeptRevocations(gate, self.transport, self.cfg.run.output_dir /
                                                         admission.KeptRevocations.FILE_NAME)
        self._publish_member(training=not self.sw.serve_only)

    def _connect(self) -> None:
        """Start the transport through the initial peers and the address book; while none answers, try again,
        waiting twice as long each time (at most CONNECT_SAY_S, which is also how often it says so), until
        swarm.connect_timeout_s is up (a bootstrap being restarted comes back). A taken port or a refused address
        fails at once: waiting does not change it."""
        extra = [m for peer, maddrs in self.book.newest(8) for m in with_peer_id(peer, maddrs)]
        end = time.monotonic() + self.sw.connect_timeout_s
        pause, said = 2.0, -math.inf
        while True:
            try:
                self.transport.start(extra_peers=extra)
                return
            except TransportError as err:
                if not err.unanswered or self.stop.is_set() or time.monotonic() + pause > end:
                    raise
                if time.monotonic() - said >= CONNECT_SAY_S:
                    said = time.monotonic()
                    log.warning("cannot reach run %s yet: no answer via %s; trying again for %.0f s more "
                                "(swarm.connect_timeout_s)", self.cfg.run.run_id, self._via(), end - time.monotonic())
                self.stop.wait(pause)
                pause = min(2 * pause, CONNECT_SAY_S)

    def _via(self) -> str:
        known = len(self.book.entries)
        return (", ".join(self.sw.initial_peers) or "no initial peer") + \
            (f" and {known} address-book entr{'y' if known == 1 else 'ies'}" if known else "")

    def close(self) -> None:
        try:
            if self.membership is not None:
                self._publish_member(training=False, leaving=True)
        finally:
            if self.sybils is not None:
                self.sybils.close()
            self.transport.close()
            self.exporter.close()
            if self.sinks is not None:
                self.sinks.close()

    def serve(self) -> None:
        """Serve-only peer (bootstrap): keep the DHT and the membership record alive until stopped, and
        the address book of the peers it saw (a restarted bootstrap dials them: one swarm again), the run's end and
        its revocations."""
        threading.Thread(target=self._keep_run_records, name="kept", daemon=True).start()
        self._heartbeat(training=False, until=self.stop)

    def _keep_run_records(self) -> None:
        """A bootstrap's 'finished' records and revocation lists, read and stored again (finished.Kept,
        admission.KeptRevocations: each every 15 s at most), at once (a restarted bootstrap's DHT holds none) and
        then every KEEP_S, on a thread of its own: a DHT read or store may take seconds, and the heartbeat keeps
        the member record fresh. A failure costs only that refresh."""
        while True:
            for kept, what in ((self.kept, "'finished' records"), (self.revocations, "revocation lists")):
                try:
                    if kept is not None:
                        kept.refresh()
                except Exception as err:
                    log.info("keeping %s failed: %r", what, err)
            if self.stop.wait(KEEP_S):
                return

    def _heartbeat(self, training: bool, until: threading.Event) -> None:
        """Until ``until`` is set: refresh the membership record every third of its lifetime (liveness must
        not depend on how long a round takes), re-dial the known peers no longer in sight, write health."""
        while not until.wait(min(HEARTBEAT_S, self.sw.record_ttl_s / 3)):  # = Membership.heartbeat_s
            self._publish_member(training=training)
            if self.sybils is not None:
                self.sybils.publish(self.engine.round if self.engine else 0)
            try:
                self._keep_connected()
            except Exception as err:  # a DHT hiccup must not end the heartbeat
                log.debug("keep-connected failed: %r", err)
            try:
                self._refresh_gauges()
            except Exception as err:  # nor may the metrics
                log.debug("metrics refresh failed: %r", err)
            if time.monotonic() - self._clock_checked >= CLOCK_CHECK_S:
                self._start_clock_check()
            if training:
                self._write_health()

    def _start_clock_check(self) -> None:
        """The clock check on a thread of its own: its pings wait up to 10 s for a silent peer, which neither the
        heartbeat (the member record must stay fresh) nor the training loop may."""
        if self._clock_thread is not None and self._clock_thread.is_alive():
            return
        self._clock_checked = time.monotonic()
        self._clock_thread = threading.Thread(target=self._check_clock, name="clock-check", daemon=True)
        self._clock_thread.start()

    def _check_clock(self) -> None:
        """Ping a few peers for their clocks (protocol/skew.py): the initial peers (the operator's choice) and
        voting trainers in sight (keys with work behind them, as the votes count), one sample per peer; the DHT's
        known peers when there are none (a clock a record's lifetime ahead sees no record). The DHT's records
        expire by wall-clock time, and hivemind checks clocks only at its start: a clock that ran off since hides
        every record (a peer that waits for peers for good, or trains alone) or cuts rounds short. Off by more
        than hivemind allows at the start: a warning, and health.json says so."""
        try:
            me = self.identity.peer_id
            initial = [p for p in dict.fromkeys(map(peer_id_of, self.sw.initial_peers)) if p is not None and p != me]
            voters = self._voters()
            seen = sorted(p for p, m in self.membership.fresh().items()
                          if p != me and p not in initial and m.training and (not voters or p in voters))
            targets = initial[:2] + random.sample(seen, min(len(seen), CLOCK_PEERS - min(2, len(initial))))
            found = skew.estimate(self.transport.clock_samples(targets, limit=CLOCK_PEERS))
        except Exception as err:  # a DHT hiccup: no figure this time
            log.debug("clock check failed: %r", err)
            return
        self.skew = found if found.peers else None
        if found.off():
            log.warning("%s: records look %s to this peer", health.clock_words(found),
                        "expired early" if found.ahead_s > 0 else "to live longer",
                        extra=events.tag(Kind.CLOCK, ahead_s=round(found.ahead_s, 3)))

    def _keep_connected(self) -> None:
        """Note who is in sight in the address book, and dial the known peers that are not (back-off per
        peer), the configured initial peers included: after a bootstrap restart with an empty DHT, or once
        a network split heals, the two sides find each other again this way."""
        members = self.membership.fresh()
        self.book.note((p, list(m.maddrs)) for p, m in members.items())
        now, wall = time.monotonic(), time.time()
        absent = [p for p, e in self.book.entries.items() if p not in members and wall - e.seen < DIAL_WINDOW_S]
        targets = self.book.due(absent, limit=8, now=now)
        for maddr in self.sw.initial_peers:
            peer = peer_id_of(maddr)
            if peer is not None and peer not in members and peer != self.identity.peer_id and \
                    all(peer != p for p, _ in targets):
                targets.append((peer, [maddr]))
        for peer, ok in self.transport.dial(targets).items():
            self.book.dialled(peer, ok, now)
            if ok:
                log.info("reconnected peer=%s", peer[:12])
        if self.sw.serve_only:
            self.book.save()

    # --- the training loop ------------------------------------------------------------------------

    def train(self) -> PeerSummary:
        done = threading.Event()  # the heartbeat runs from the start: a peer waiting for others stays visible
        self._start_clock_check()  # before the first wait for peers: a clock that hides every record is named
        beat = threading.Thread(target=self._heartbeat, args=(True, done), name="heartbeat", daemon=True)
        beat.start()
        try:  # the record stays fresh until the run is wrapped up: a re-sync there must show, and we still serve
            summary = self._wrap_up(self._rounds())
        finally:
            done.set()
            beat.join(timeout=30.0)  # a 'training' record written after close()'s 'leaving' one would undo it
        self._write_health(finished=True)  # `gradnode health` says it ended, not that it hung
        return summary

    def _rounds(self) -> float:
        """The training loop; returns its wall time."""
        self._prepare()
        target = self.sw.rounds or math.inf
        pending: RoundExchange | None = None  # round r's exchange, running while round r+1 computes
        t_start = self.gauges.training_since = time.monotonic()
        while not self.stop.is_set() and self.engine.round + self._in_flight(pending) < target:
            self._wait_for_peers()  # never train alone by accident (swarm.min_peers)
            nxt = self._round_to_compute(pending, target)
            stats = self._compute(nxt.round)
            if pending is not None:
                self._finish(pending)
                pending = None
            if nxt.sat_out is not None and self.engine.round == nxt.sat_out and not self.stop.is_set():
                self._finish(self._observe(nxt.sat_out))
            if self.stop.is_set() or self.engine.round != nxt.round or not stats.steps:
                continue  # re-synced or stopping: this round's progress stays local
            with self.phases.time("update"):
                pending = self._publish(stats.tokens)
            if not self.sw.overlap:
                self._finish(pending)
                pending = None
            self._hand_off_chores(target)
        return self._drain(pending, t_start, target)

    def _prepare(self) -> None:
        """Resume our own checkpoint or start fresh, wait for the swarm, get level with it."""
        from gradnode.node.train import checkpoint
        from gradnode.node.train.engine import Engine

        cfg = self.cfg
        ckpt = cfg.run.output_dir / "checkpoints"
        resume = cfg.checkpoint.resume and bool(checkpoint.list_checkpoints(ckpt))
        self.engine = Engine.resume(cfg, ckpt, self.peer_index, self.device) if resume \
            else Engine(cfg, self.peer_index, self.device)
        adversary.lazy(self.sw, self.engine)
        if resume:
            self.tally.resumed_round = self.saved_round = self.engine.round
            self._state_since = checkpoint.made_at(ckpt, self.engine.round) or self._state_since
        self.rules = UpdateRules.of(cfg, {n: tuple(t.shape) for n, t in self.engine.global_params.items()},
                                    self.engine.compressor)
        self.sync = Sync(engine=self.engine, history=self.history, members=self.membership, transport=self.transport,
                         cfg=self.sw, rules=self.rules, tally=self.tally, stop=self.stop)
        self._wait_for_peers(resumed=resume)
        if self.stop.is_set():  # stopping, or the run is over (_ended_without_us)
            return
        self.progress.stage(Stage.GETTING_LEVEL, self.engine.round, "the newest state the swarm offers")
        self._sync_state(self.core.resync(Reason.JOIN, self.engine.round))
        self.tally.joined_round = self.engine.round
        log.info("training from round=%d of %s", self.engine.round, self.sw.rounds or "no set number of rounds",
                 extra=events.tag(Kind.START, peer=self.identity.peer_id, run=self.cfg.run.run_id,
                                  rounds=self.sw.rounds, version=_version(),
                                  metrics=str(self.metrics_path.resolve()) if self.metrics_path else None))
        self._publish_member(training=True)
        if self.do_eval:
            self.progress.stage(Stage.EVALUATING, self.engine.round, "before training")
            self.val_first = self.engine.evaluate()
            log.info("round=%d val_loss=%.4f (before training)", self.engine.round, self.val_first,
                     extra=events.tag(Kind.EVAL, rounds_applied=self.engine.round, val_loss=self.val_first))

    def _check_genesis_weights(self) -> None:
        """A fresh peer starts from the weights the run's genesis names (same model code, config and seed). It is
        checked before any network, so that a machine whose torch builds other weights says so at once; a peer
        that resumes a checkpoint holds the run's weights already."""
        from gradnode.node.config import ConfigError
        from gradnode.node.train import checkpoint
        from gradnode.node.train.engine import initial_weights_hash
        from gradnode.protocol.genesis import Genesis

        ckpt = self.cfg.run.output_dir / "checkpoints"
        if self.cfg.run.genesis is None or self.cfg.checkpoint.resume and checkpoint.list_checkpoints(ckpt):
            return
        want, got = Genesis.from_json(self.cfg.run.genesis.read_bytes()).weights_hash, initial_weights_hash(self.cfg)
        if got != want:
            raise ConfigError(f"initial weights hash {got[:16]} differs from the run's genesis ({want[:16]}): another "
                              "gradnode or torch version builds this model differently")

    def _in_flight(self, pending: RoundExchange | None) -> int:
        """1 when ``pending`` will move the engine on a round; 0 when there is none, or when a re-sync
        adopted a newer state meanwhile (its outcome will be dropped: that round is not ours to count)."""
        return int(pending is not None and pending.round == self.engine.round)

    def _round_to_compute(self, pending: RoundExchange | None, target: float) -> peer_core.Compute:
        """The round whose inner steps come next, and the round sat out to get there, as the peer core says
        (``to_compute``)."""
        computing = self.engine.round + self._in_flight(pending)
        with self.phases.time("deadline_poll"):
            late = self.clock.too_late_for(computing)
        nxt = peer_core.to_compute(computing, target, late)
        if nxt.sat_out is not None:
            self._abstain(nxt.sat_out)
        return nxt

    def _compute(self, round_: int) -> RoundStats:
        """Inner steps for ``round_``, stopped by the round clock (a slow peer runs fewer)."""
        should_stop = self.clock.for_round(round_)
        self.progress.stage(Stage.COMPUTING, round_, steps=self.cfg.inner.steps)
        steps, last = 0, time.monotonic()

        def counted() -> bool:  # asked before every inner step: the step it lets run is the next one
            nonlocal steps, last
            if should_stop():
                return True
            now, steps = time.monotonic(), steps + 1
            self.progress.step(steps, now - last if steps > 1 else self.clock.step_s)
            last = now
            return False
        try:
            stats = self.engine.inner_round(should_stop=counted)
        finally:
            should_stop.close()
        self.tally.inner_s += stats.seconds
        self.last_stats = stats
        if stats.steps:
            self.clock.step_s = stats.seconds / stats.steps
            self.last_loss = stats.loss
        return stats

    def _publish(self, tokens: int) -> RoundExchange:
        """Make, sign and announce this round's update; its exchange runs in the background. A key of the
        pool that the round's committee did not draw, or a newcomer outside the round's draw
        (``committee.announces``), sends nothing: its work waits as ``outer.undrawn`` says, and it observes
        the round (as a witness, when drawn as one)."""
        from gradnode.protocol import attach_signature, signing_digest

        drawn = self.engine.committee(self.cfg.committee.budget())
        me = self.identity.peer_id
        if not committee_rule.announces(drawn, self._chain_base(self.engine.round), me, self.membership.roster(me)):
            self.engine.sit_out()
            self.tally.undrawn += 1
            log.info("round=%d undrawn: observing it (%s)", self.engine.round,
                     "a drawn witness" if self.identity.peer_id in drawn.witnesses else "not a witness")
            return self._exchange(self.engine.round, None, 0)
        blob = self.engine.make_update(sender=self.identity.peer_id)
        blob = attach_signature(blob, self.identity.sign(signing_digest(blob)))
        blob = adversary.sent_update(self.sw, self.engine.round, blob, self.cfg.run.output_dir, self.identity.sign,
                                     earlier=self._applied_update_of_another)
        return self._exchange(self.engine.round, blob, tokens)

    def _applied_update_of_another(self) -> bytes | None:
        """Testing aid ('freerider'): another peer's update that the previous round applied, as served here."""
        last = self.engine.round - 1
        pairs = self.history.applied.get(last, ([], 0))[0]
        others = [s for s, _ in pairs if s != self.identity.peer_id]
        return self.transport.blobs.get(update_name(self.cfg.run.run_id, last, others[0])) if others else None

    def _observe(self, round_: int) -> RoundExchange:
        """Learn the decision of a round we abstained from, exactly as the others reached it."""
        return self._exchange(round_, None, 0, observes=True)

    def _chain_base(self, round_: int) -> str:
        """The chain round ``round_``'s reports are made on: the state the previous round agreed on (ours, now)."""
        return self.history.hashes.get(round_ - 1) or self.engine.state_hash()

    def _exchange(self, round_: int, blob: bytes | None, tokens: int, observes: bool = False) -> RoundExchange:
        """Round ``round_``'s exchange, with this peer's update ``blob`` (None: it sends none). Whether it
        witnesses is the committee rule's (``committee.reports``); one that ``observes`` never does."""
        assert self.engine.round == round_, (self.engine.round, round_)
        base = self._chain_base(round_)
        drawn = self.engine.committee(self.cfg.committee.budget())
        eligible = eligible_witnesses(self.engine.contributors, round_)
        witness = committee_rule.reports(self.identity.peer_id, drawn, sends=blob is not None, observes=observes)
        if drawn is not None and drawn.pool:  # its drawn witnesses, and none of the others
            eligible = sorted(drawn.witnesses)
        lists = {k: v for k, v in self._lists.items() if round_ - 2 <= k < round_}  # not past it (a re-sync back)
        lists[round_] = roster_rule.lists(self.identity.peer_id, drawn, announces=blob is not None)
        self._lists = lists  # a new dict: the chores thread reads the old one (``_listed``)
        self._committees = {**{k: c for k, c in self._committees.items() if round_ - VOTE_ROUNDS < k < round_},
                            round_: drawn}  # whose votes count (``_voters``)
        # a report is final: back from a restart within a round it reported on, a peer does not report again
        witness = witness and self.own_reports.first(round_, base)
        ex = RoundExchange(transport=self.transport, membership=self.membership, cfg=self.sw,
                           run_id=self.cfg.run.run_id, round_=round_, blob=blob, tokens=tokens,
                           round_seconds=self.clock.round_seconds(), rules=self.rules, rejections=self.rejections,
                           stop=threading.Event(), base=base, leaving=self.leaving, witness=witness,
                           eligible=eligible, committee=drawn,
                           equivocators=self.equivocators, judge=self._judge(round_))
        ex.start()
        return ex

    def _judge(self, round_: int) -> Callable[[Any, float | None], str | None] | None:
        """This witness's loss check of the others' updates of ``round_`` (swarm.score_rows; None: off): a
        rejection reason for an update that makes the model worse on rows of its own secret drawing, from the
        shared weights the round started from (the engine's, until the round is applied). The rows' baseline
        is computed at the first update checked; the checks run on the exchange thread, beside the inner
        steps, and their seconds are reported as the 'score' phase."""
        if not self.sw.score_rows:
            return None
        from gradnode.node.train.score import Scorer, ScoreParams, shadow

        params = ScoreParams(rows=self.sw.score_rows, z=self.sw.score_z)
        made: list[Scorer] = []

        def judge(update: Any, clip_norm: float | None) -> str | None:
            with self._judging:  # one shadow model, run by the exchange threads of overlapping rounds
                t0 = time.monotonic()
                if self._shadow is None:
                    self._shadow = shadow(self.engine)
                if not made:
                    made.append(Scorer(self.engine, round_, self.secret, params, model=self._shadow))
                verdict = made[0].score(update, clip_norm=clip_norm)
                self.phases.add("score", time.monotonic() - t0)
            if verdict.accept:
                return None
            log.info("update judged harmful round=%d sender=%s gain=%.5f stderr=%.5f", round_, update.sender[:12],
                     verdict.gain, verdict.stderr)
            return "harmful"
        return judge

    def _voters(self) -> frozenset[str]:
        """Whose weight reports and chains count (protocol/votes.py): the contributors of the last rounds (the
        engine's ledger) and the senders whose updates this peer verified outside its sets and the screens
        count (``_note_workers``), on any chain; no banned key. Empty before any round was applied, when every
        record counts."""
        if self.engine is None:
            return frozenset()
        found = votes.voters(self.engine.contributors, self.workers, self.engine.round - 1, self._banned())
        return roster_rule.sampled(found, self._committees.values(), self.history.senders)

    def _banned(self) -> list[str]:
        """Keys the reputation table banned, and those caught equivocating."""
        return [*self.engine.reputation.banned(), *(self.equivocators.peers() if self.equivocators else ())]

    def _note_workers(self, ex: RoundExchange, decided: Collection[str] = ()) -> None:
        """The senders of round ``ex``'s verified updates outside the ``decided`` set and the ledger (which give
        their votes) that the robust rule would count among all the round's verified updates, as it counts a
        set (``Engine.kept``; not one this witness's loss check judged harmful): they work beside this peer,
        whatever chain they follow (``_voters``). A rules-valid update the screens leave out (a replay, a
        flipped sign, noise) earns no vote, as it earns no place in the ledger. Called before the round is
        applied (the screens of the state the round starts from); the screens run only when there are such
        senders (a fork, a key new to this chain): they cost about what the round's apply does (1.7 s against
        1.9 s for 4 updates of the default model's 3.2M weights on a loaded 2-core machine), so not for a
        contributor's late update (protocol/votes.py ``workers_after``)."""
        if self.engine is None or ex.round != self.engine.round:
            return
        held = {s: v.update for s, v in list(ex.verified.items()) if s not in ex.doubted}
        pool = [held[s] for s in sorted(held)]
        try:
            self.workers = votes.workers_after(self.workers, ex.round, held, ex.me, decided, self.engine.contributors,
                                               kept=lambda: self.engine.kept(pool, [self.rules.weight(u) for u in pool]))
        except ValueError as err:  # updates that do not fit this state's tensors: nobody's work here
            log.info("round=%d verified updates not screened for votes: %s", ex.round, err)

    def _abstain(self, round_: int) -> None:
        """Sit round ``round_`` out, saying so at once so that nobody waits for our report (unless we reported
        on it before a restart: that report stands)."""
        self.tally.abstained += 1
        if self.own_reports.abstaining(round_):
            abstain(self.membership, self.cfg.run.run_id, round_, self.identity.peer_id)
        log.info("round=%d abstained: its deadline is nearer than %d step(s) of %.2f s; computing for round=%d",
                 round_, self.sw.min_steps, self.clock.step_s, round_ + 1)

    def _finish(self, ex: RoundExchange) -> None:
        """Wait for round r's decision and apply it."""
        ex = self._on_the_chain_held(ex)
        t0 = time.monotonic()
        self.progress.stage(Stage.WAITING_FOR_ROUND, ex.round, f"{len(ex.verified)} update(s) verified so far; it gives "
                            f"up after swarm.max_wait_s={self.sw.max_wait_s:.0f} s", quiet=ex.round > self.tally.joined_round)
        outcome = ex.result(timeout=self.sw.max_wait_s + 10)
        wait = time.monotonic() - t0
        self.tally.wait_s += wait
        self.phases.add("wait", wait)
        with self.phases.time("apply"):
            self._apply(ex, outcome, wait)

    def _on_the_chain_held(self, ex: RoundExchange) -> RoundExchange:
        """``ex``, or an observer of its round on the chain this peer holds now. A re-sync between a round's
        publication and its decision can adopt the very state that round starts from, of another chain: ``ex``
        counts the reports made on the chain left, where this peer is alone, so it would apply its own set and
        fork again, found at every hash check (seen in the mix of adversaries under load: one honest peer
        re-synced three times in 10 rounds, each time deciding the next round with one witness). The observer
        applies what the others decide on the chain held, as for a round sat out."""
        if ex.round != self.engine.round:
            return ex  # the engine moved past it: _apply drops the outcome
        held = self._chain_base(ex.round)
        if ex.agreement.base == held:
            return ex
        log.warning("round=%d was exchanged on hash=%s; the state adopted since holds hash=%s: observing the "
                    "round on it", ex.round, ex.agreement.base[:12], held[:12])
        self._note_workers(ex)  # what it verified on the chain left: peers working beside this one
        ex.stop_event.set()
        return self._observe(ex.round)

    def _apply(self, ex: RoundExchange, outcome: Outcome | None, wait: float) -> None:
        """The outer step of round r with the agreed updates, and its bookkeeping."""
        if outcome is None or not outcome.decided:
            log.warning("round=%d undecided: applying no update (hash check will re-sync)", ex.round)
            outcome = Outcome(ex.round, [], [], [], False, 0, False, 0.0)
        if self.engine.round != ex.round:
            log.warning("round=%d outcome dropped: engine moved to round=%d", ex.round, self.engine.round)
            return
        self._note_workers(ex, outcome.senders)
        self.engine.apply_aggregate(outcome.updates, outcome.weights)
        if outcome.own_included and any(sc.sender == ex.me and sc.weight == 0.0 for sc in self.engine.last_screens):
            outcome.own_included = False  # in the set, but the robust rule screened it out: its content goes back
        adversary.drift(self.sw, ex.round, self.engine)
        self.history.senders = list(outcome.senders)
        included = [(s, ex.verified[s].digest) for s in outcome.senders]
        size = sum(len(self.transport.blobs.get(update_name(self.cfg.run.run_id, ex.round, s)) or b"")
                   for s in outcome.senders)
        self.history.record(ex.round, self.engine.state_hash(), included, size,
                            committee_rule.weighers(ex.committee, outcome.senders))
        self.roster.observe(ex.committee, ex.agreement.base, ex.agreement.core.newcomers)
        t = self.tally
        if outcome.own_included:
            t.contributed += 1
            t.first_contribution = ex.round if t.first_contribution is None else t.first_contribution
        elif not ex.observer:
            t.own_excluded += 1
            self._return_own(ex)
        t.rounds_done += 1
        log.info("round=%d applied=%d witnesses=%d%s own_included=%s wait_s=%.2f hash=%s", ex.round,
                 len(outcome.updates), outcome.witnesses, " (counted again)" if outcome.recounted else "",
                 "abstained" if ex.observer else outcome.own_included, wait, self.history.hashes[ex.round][:12])
        every = self.cfg.metrics.eval_every
        if every and t.rounds_done % every == 0:
            self.val_last = self.engine.evaluate()
            log.info("round=%d val_loss=%.4f", ex.round, self.val_last,
                     extra=events.tag(Kind.EVAL, rounds_applied=ex.round + 1, val_loss=self.val_last))
        self._write_metrics(ex.round, outcome, wait, ex.committee)

    def _return_own(self, ex: RoundExchange) -> None:
        """Error feedback for an excluded update: add what we sent back onto ``start`` so the next
        pseudo-gradient (start - local) carries it again."""
        own = ex.verified.get(ex.me)
        if own is None:
            return
        for name, t in own.update.tensors.items():
            self.engine.start[name].add_(t.to(self.engine.start[name].device, self.engine.start[name].dtype))

    def _hand_off_chores(self, target: float) -> None:
        """Between rounds: settle the previous round's chores (re-syncing if they found our hash off the
        majority), hand this round's over, and stop serving updates older than the catch-up window. After the
        run's last round they are settled at once (``peer_core.settle_at_once``)."""
        self._settle_chores()
        self.chores.hand_off(self.engine, self.history)
        if peer_core.settle_at_once(self.engine.round - 1, target):
            self._settle_chores()
        keep = max(3, self.sw.catchup_rounds + 1)  # applied updates stay served for the catch-up window
        self.transport.blobs.drop(lambda n: not n.startswith(ROUND_BLOBS) or
                                  int(n.split("/")[2]) >= self.engine.round - keep)
        self.history.forget_before(self.engine.round - keep)

    def _settle_chores(self) -> None:
        """Act on what the previous round's chores found, as the peer core decides (protocol/peer.py): stay,
        re-sync to the majority's state, or look again and follow the winning chain."""
        found = self.chores.settle()
        if found is None:
            return
        self.chains = found.chains
        act = self.core.step(peer_core.HashChecked(time.monotonic(), found.round, self.engine.round, found.mine,
                                                   found.reports, found.chains.chains()))
        if isinstance(act, peer_core.Stay) and act.why is Why.CHAIN_WINS:
            log.info("weight hash of round=%d differs from the majority, but this peer's chain wins by the "
                     "chain rule (%d of %d trainers): staying", found.round, self.chains.mine, self.chains.trainers)
        elif isinstance(act, Resync):
            log.warning("weight hash of round=%d differs from the majority and this peer is off the winning "
                        "chain: re-syncing", found.round)
            self._sync_state(act)
        elif isinstance(act, peer_core.LookAgain):
            self._follow_winning_chain()

    def _follow_winning_chain(self) -> bool:
        """Off the chain most live trainers follow in enough looks in a row: look again on fresh records (the
        chores' look is a round old) and, still off it, adopt a state of that chain, as the peer core decides
        (``ChainsLooked``). Our unsent progress carries over; the losing chain's rounds since the split are
        lost."""
        chains = self._look_at_chains()
        act = self.core.step(peer_core.ChainsLooked(time.monotonic(), self.engine.round, chains.chains()))
        if not isinstance(act, Resync):
            if act.why is Why.NO_STATE_YET:
                log.info("this peer follows another chain than %d of %d trainers; no state most of them list yet",
                         len(chains.winners), chains.trainers)
            return False
        log.warning("this peer follows another chain than %d of %d trainers: adopting theirs", len(chains.winners),
                    chains.trainers)
        return self._sync_state(act)

    def _sync_state(self, want: Resync) -> bool:
        """Carry out a ``Resync`` (Sync.level); an adopted state is the core's to know (``StateAdopted``)."""
        before = self.engine.round
        adopted = self.sync.level(want)
        if adopted:
            self.core.step(peer_core.StateAdopted(time.monotonic(), self.engine.round - 1))
        if adopted and self.engine.round < before:  # a chain given up: its newer checkpoints are moot
            from gradnode.node.train import checkpoint

            checkpoint.drop_after(self.cfg.run.output_dir / "checkpoints", self.engine.round)
            # but not the updates it holds of those rounds (its own and others', each signed for its round): the
            # winning chain's sets can hold them (its round of the merge took this side's updates too), and this
            # peer, redoing those rounds on the adopted state, needs them; an update it makes again replaces its
            # own, and the rounds' ends drop them as any others (_hand_off_chores)
        return adopted

    def _look_at_chains(self) -> health.ChainView:
        """The chains among the live trainers (chores thread); health.json says what was found, and the
        address book (saved with the checkpoint) learns who was in sight."""
        members = self.membership.fresh()
        self.book.note((p, list(m.maddrs)) for p, m in members.items())
        votes = self.membership.votes()  # a chain counts the recent contributors following it, not keys
        view = health.chain_view({p: m for p, m in members.items() if votes(p)}, self.identity.peer_id,
                                 self.history.tail(), self.membership.serving())
        self.chains = view
        self._write_health()
        return view

    def _write_health(self, finished: bool = False) -> None:
        health.write(self.cfg.run.output_dir, view=self.chains, round_=self.engine.round if self.engine else 0,
                     expected=self.sw.expected_peers, waiting=self.waiting, clock=self.skew, finished=finished)

    def _drain(self, pending: RoundExchange | None, t_start: float, target: float) -> float:
        """The pipeline drains: the last round's exchange has no next round to hide behind (once per
        run). Returns the training loop's wall time."""
        t0, wait_before = time.monotonic(), self.tally.wait_s
        if pending is not None:
            self._finish(pending)
            self._hand_off_chores(target)
        self._settle_chores()  # a stop before the last round left some handed off: acted on now
        self.tally.drain_s, self.tally.drain_wait_s = time.monotonic() - t0, self.tally.wait_s - wait_before
        return time.monotonic() - t_start

    def _wrap_up(self, wall: float) -> PeerSummary:
        self.progress.stage(Stage.FINISHING, self.engine.round, "a checkpoint, the last hash check, serving the others")
        if self.saved_round != self.engine.round:
            self._save_checkpoint()
        if self._last_round_off_majority():  # no next round's hash check will repair the last one
            self._save_checkpoint()
        reached = bool(self.sw.rounds) and self.engine.round >= self.sw.rounds
        said = self._say_finished() if reached else None
        if self.do_eval and not self.signalled:  # a signal asks for a checkpoint and an end, not a figure
            self.val_last = self.engine.evaluate()
        self._linger()
        if said is not None and said != self.engine.state_hash():  # lingering, it adopted another chain's state
            self._say_finished()
        log.info("run %s for this peer at round=%d", "over" if reached else "stopped", self.engine.round,
                 extra=events.tag(Kind.END, rounds_applied=self.engine.round, reached=reached,
                                  val_loss=self.val_last if self.do_eval else None))
        return self._summary(wall)

    def _say_finished(self) -> str:
        """A signed record that this peer reached the run's last round, kept in the DHT for days: a peer that
        comes back after everyone finished learns that the run is over (``_ended_without_us``) instead of waiting
        for peers for good. Returns the weight hash it names."""
        eng = self.engine
        rec = Finished(run_id=self.cfg.run.run_id, peer=self.identity.peer_id, public_key=self.identity.public_der,
                       round=eng.round, param_hash=eng.state_hash(), time=self.transport.now())
        if not self.membership.write("finished", None, rec, ttl=FINISHED_TTL_S):
            log.warning("could not store this peer's 'finished' record")
        return rec.param_hash

    def _ended_without_us(self, wait_s: float) -> tuple[tuple[int, str] | None, bool]:
        """The run's end as its contributors told it (protocol/sync.py ``run_over``), for a waiting peer of a run
        that stops at a round (swarm.rounds; who asks: ``_wait_for_peers``); None when the run is not over for it.
        The records are the DHT's and those a bootstrap among the initial peers keeps (node/swarm/finished.py: a
        restarted one has none in its DHT); only ledger keys' are verified (a flood of other keys' costs nothing).
        With it, whether every initial peer answered within ``wait_s`` (``kept_elsewhere``): a None of a look some
        did not is no answer."""
        if not self.sw.rounds or self.engine is None or not self.engine.contributors:
            return None, True
        ledger = set(self.engine.contributors)
        now = self.transport.now()
        kept, whole = finished.kept_elsewhere(self.membership, self.transport, self.sw.initial_peers, ledger,
                                              timeout=wait_s)
        records = [*self.membership.read("finished", None, Finished, fresh=True, authors=ledger), *kept]
        newest = sync_rules.newest_per_key(((r.peer, r.time, (r.round, r.param_hash)) for r in records), now)
        told = {peer: (round_, hash_, t) for peer, (t, (round_, hash_)) in newest.items()}
        return sync_rules.run_over(told, ledger, self.identity.peer_id, self.sw.rounds, since=self._state_since,
                                   now=now, banned={*self._banned(), *self.membership.gate.revoked}), whole

    def _last_round_off_majority(self) -> bool:
        """The run's last round gets its hash check too: once the others reported it (bounded wait), a peer
        off their majority re-syncs; True when it did."""
        last = self.engine.round - 1
        mine = self.history.hashes.get(last)
        if not self.sw.hash_check or mine is None or self.stop.is_set():
            return False
        # who to hear from: the makers of the last round (they may have finished and left already: their
        # reports stay in the DHT), and the live trainers whose reports count (recent contributors: a flood of
        # 'training' records of keys that never contributed held this wait to its end) that reached the last
        # round (a peer killed rounds ago stays in sight until its record goes stale, 30 s by default, and
        # held this wait to its end: it never reports again)
        # (with a drawn committee: its witnesses of the last round only, the only ones that report it)
        me, votes, among = self.identity.peer_id, self.membership.votes(), self.history.weighers.get(last)
        others = {p for p, m in self.membership.fresh(max_age=0).items() if m.training and votes(p)
                  and m.round >= last} | set(self.history.senders)
        others.discard(me)
        if among is not None:
            others &= among
        end, reports = time.monotonic() + min(30.0, self.sw.max_wait_s), []  # ends once most reported
        while time.monotonic() < end and not self.stop.is_set():
            reports = self.membership.reports(last, among=among)
            if len({w.peer for w in reports} & others) > len(others) // 2:
                break
            time.sleep(0.5)
        chains = self._look_at_chains()
        act = self.core.step(peer_core.HashChecked(time.monotonic(), last, self.engine.round, mine,
                                                   {w.peer: w.param_hash for w in reports}, chains.chains(),
                                                   Check.LAST))
        if not isinstance(act, Resync):
            return False
        log.warning("weight hash of the last round=%d differs from the majority: re-syncing", last)
        synced = self._sync_state(act)
        if synced:
            self._publish_member(training=True)  # the peers lingering for us see our new chain at once
        return synced

    # --- helpers ----------------------------------------------------------------------------------

    def _accept_push(self, name: str, blob: bytes) -> bool:
        """A client-mode peer pushed its update: hold and serve it when it verifies (transport thread)."""
        parts = name.split("/")
        if self.engine is None or len(parts) != 4 or parts[0] != "u" or parts[1] != self.cfg.run.run_id \
                or not parts[2].isdigit():
            return False
        round_ = int(parts[2])
        if not self.engine.round - 2 <= round_ <= self.engine.round + 2 or parts[3] in self.rejections.ignored(round_):
            return False
        upd, reason = self.rules.check(blob, sender=parts[3], round_=round_, key_of=self.membership.public_key)
        if upd is None:
            self.rejections.add(parts[3], reason or "malformed", round_)
            return False
        self.transport.blobs.put(name, blob)
        log.info("pushed update held round=%d sender=%s", round_, parts[3][:12])
        return True

    def _wait_for_peers(self, resumed: bool = False) -> None:
        """Wait, saying so, until swarm.min_peers training peers (this one included) are in sight, or one
        of an already running swarm; no timeout: a peer never trains alone by accident. Before the first
        round, and whenever this peer finds itself the only trainer keeping up with the run (a split network,
        everyone else gone); while it waits mid-run it takes any newer state the swarm offers, so a peer
        left behind catches up instead of waiting. min_peers=1 trains alone. A peer that sees nobody, or that
        just ``resumed`` its checkpoint and sees only trainers short of the run's last round (others back after
        the run's end, like itself), first asks whether the run is over (``_ended_without_us``)."""
        if self.sw.min_peers <= 1:
            return
        me, next_say, next_look, waited = self.identity.peer_id, 0.0, 0.0, time.monotonic()
        # looks that found the run over (_ended_without_us) with none between that found it not over, and looks in
        # a row that found nothing because an initial peer did not answer
        looks, unsure, over, said = 0, 0, None, False
        running = self.engine is not None and self.engine.round > 0
        while not self.stop.is_set():
            members = self.membership.fresh(max_age=0 if self.waiting else 0.5)
            # mid-run, only those keeping up count: a peer whose view holds nothing but records of peers
            # rounds behind it (a split network) would otherwise race ahead alone. A record lags its peer by
            # up to two rounds (written by the chores after a round is applied, while the next computes): with
            # a margin of one, a fast round made the others look gone, and the peer dropped its pending round
            # to "catch up" (the intruder test failed so, in CI too)
            others = [m for p, m in members.items() if m.training and p != me
                      and (not running or m.round >= self.engine.round - 3)]
            enough = len(others) + 1 >= self.sw.min_peers or any(m.round > 0 for m in others)
            if not sync_rules.asks_if_over([m.round for m in others], enough, resumed, self.sw.rounds):
                looks = unsure = 0
            elif time.monotonic() >= next_look:  # a look every 10 s; two say the run is over (not one read of the
                # members that came back empty); each look after one an initial peer did not answer waits twice as
                # long for it (a loaded bootstrap: 5, 10, 20 s)
                found, whole = self._ended_without_us(finished.FETCH_S * 2 ** unsure)
                if found is not None:
                    over, looks, unsure = found, looks + 1, 0
                elif whole or unsure >= UNSURE_LOOKS:
                    looks = unsure = 0
                else:  # an initial peer (a bootstrap keeping the run's end) did not answer in time: no answer, not
                    unsure += 1  # 'not over' (taken so, one silent look made a peer back after the run's end train)
                    log.info("whether run %s is over: an initial peer did not answer; looking again in 10 s",
                             self.cfg.run.run_id)
                next_look = time.monotonic() + 10.0
            if looks >= 2 and over is not None:
                self.run_over = over
                log.warning("run %s is over: most of its contributors this peer knows reached its last round "
                            "(round %d, weights %s), %d trainer%s in sight; this peer stops at round %d",
                            self.cfg.run.run_id, over[0], over[1][:16], len(others), "" if len(others) == 1 else "s",
                            self.engine.round)
                self.stop.set()
                self.leaving.set()
                self._publish_member(training=False)  # nobody else back takes this one for a trainer
                return
            if enough and not looks and not unsure:
                if self.waiting:
                    log.info("peers of run %s in sight: %d, after %.0f s; training", self.cfg.run.run_id,
                             len(others) + 1, time.monotonic() - waited)
                self.waiting = False
                return
            if not self.waiting:
                self.waiting = True
                self._write_health()
            if enough:  # a look found the run over, or could not tell: another one before training with them
                if looks and not said:
                    log.info("run %s looks over (most of this peer's contributors reached round %d); looking "
                             "again in 10 s before training with the %d in sight", self.cfg.run.run_id, over[0],
                             len(others))
                    said = True
                self.stop.wait(1.0)
                continue
            self.progress.stage(Stage.WAITING_FOR_PEERS, self.engine.round if self.engine else 0,
                                f"{len(others) + 1} of {self.sw.min_peers} training peers in sight", quiet=True)
            if time.monotonic() >= next_say:
                clock = self.skew
                serving = sum(1 for p, m in members.items() if p != me and not m.training)
                log.warning("waiting for peers of run %s: %d of the %d training peers needed in sight (swarm.min_peers "
                            "counts this one), via %s%s; start another `gradnode join` (a bootstrap trains only "
                            "with --train), or set swarm.min_peers=1 to train alone%s", self.cfg.run.run_id,
                            len(others) + 1, self.sw.min_peers, self._via(),
                            f"; {serving} peer{'s' if serving > 1 else ''} in sight only serve{'' if serving > 1 else 's'}"
                            if serving else "",
                            f"; {health.clock_words(clock)}" if clock is not None and clock.off() else "")
                next_say = time.monotonic() + 10.0
                if running:
                    self._sync_state(self.core.resync(Reason.CATCH_UP, self.engine.round))  # the swarm may be ahead
            self.stop.wait(1.0)

    def _listed(self) -> bool:
        """Whether this peer's member record goes in the member table now (protocol/roster.py ``listed``)."""
        return roster_rule.listed(self._lists)

    def _roster_size(self, seen: int) -> int:
        """The swarm's size under a committee (roster.Roster): the contributors ledger plus the keys outside it
        that the newcomers' tickets say compute; ``seen`` while no estimate exists."""
        return self.roster.size(len(self.engine.contributors) if self.engine is not None else None, seen)

    def _publish_member(self, training: bool, leaving: bool = False) -> None:
        eng = self.engine
        leaving = leaving or self.leaving.is_set()  # once announced, every later record says so too
        self.membership.publish(round_=eng.round if eng else 0, training=training and not leaving,
                                step_seconds=self.clock.step_s if self.clock else 0.0, inner_steps=self.cfg.inner.steps,
                                tokens_per_s=self._tokens_per_s(),
                                rejected=self.rejections.total(), loss=self.last_loss, leaving=leaving,
                                ignoring=self.rejections.ignored(eng.round if eng else 0),
                                chain=adversary.published_chain(self.sw, eng, self.history.tail()),
                                scores=sorted(eng.reputation.scores.items(), key=lambda kv: (kv[1], kv[0]))[:16]
                                if eng else [])

    def _tokens_per_s(self) -> float:
        step_s = self.clock.step_s if self.clock is not None else 0.0
        return self.cfg.inner.batch_size * self.cfg.model.seq_len * self.cfg.inner.grad_accum / step_s if step_s \
            else 0.0

    def _save_checkpoint(self, snap: Snapshot | None = None) -> None:
        """Write a checkpoint (of ``snap``, else of now). Disk full or folder unwritable: say so clearly and
        keep training on the state in memory."""
        snap = snap or self.engine.snapshot(copy=False)
        try:
            self.engine.write_snapshot(snap, self.cfg.run.output_dir / "checkpoints")
            self.book.save()
            self.saved_round = snap.round
        except OSError as err:
            log.error("checkpoint of round=%d not written (%s: %s); training goes on from memory, fix the folder "
                      "%s or run.output_dir", snap.round, type(err).__name__, err.strerror or err,
                      self.cfg.run.output_dir / "checkpoints")

    def _linger(self) -> None:
        """Keep serving after the last round until every other live trainer holds our newest state too, and
        follow the winning chain if this peer finds itself off it: the peer core decides (protocol/peer.py
        ``Lingering``); this loop reads the member records every LINGER_POLL_S and carries its answers out."""
        t0, me, shown = time.monotonic(), self.identity.peer_id, ()
        self.core.step(peer_core.Finished(t0))
        while not self.stop.is_set():
            votes = self.membership.votes()
            others = {p: m for p, m in self.membership.fresh(max_age=0).items() if m.training and p != me}
            tails = {p: tuple(m.chain) for p, m in others.items() if votes(p)}
            tails[me] = tuple(self.history.tail())
            act = self.core.step(peer_core.Lingering(time.monotonic(), self.engine.round,
                                                     peer_core.Chains(tails, self.membership.serving()),
                                                     {p: m.round for p, m in others.items()}))
            if isinstance(act, peer_core.Leave):
                if act.waiting:
                    log.warning("run over; %d live trainer(s) still not on our state %s: leaving them",
                                len(act.waiting), ",".join(p[:12] for p in act.waiting))
                elif time.monotonic() - t0 > 1.0:
                    log.info("lingered %.1f s after the last round, until every live trainer held our state",
                             time.monotonic() - t0)
                return
            if isinstance(act, peer_core.LookAgain):
                if self._follow_winning_chain():
                    self._publish_member(training=True)  # the others see our new chain at once
                continue
            if act.waiting != shown:  # a line when who is waited for changes, not every poll
                shown = act.waiting
                rounds = {p: m.round for p, m in others.items()}
                log.info("run over; serving our state until these live trainers hold it: %s",
                         ",".join(f"{p[:12]}@r{rounds[p]}" if p in rounds else p[:12] for p in act.waiting))
            time.sleep(peer_core.LINGER_POLL_S)

    def _refresh_gauges(self) -> None:
        """Fill in what the metrics port serves beyond the tally (heartbeat, every round, and scrapes)."""
        g, eng = self.gauges, self.engine
        members = self.membership.fresh() if self.membership is not None else {}
        g.peers_seen = {Role.TRAIN: sum(m.training for m in members.values()),
                        Role.SERVE: sum(not m.training for m in members.values())}
        g.bad_records = sum(self.membership.bad_records.values()) if self.membership is not None else 0
        if eng is not None:
            g.round = eng.round
        elif self.sw.serve_only:  # a bootstrap: the newest round it sees the trainers at
            rounds = sorted(m.round for m in members.values() if m.training)  # the median: one record's claim
            g.round = rounds[(len(rounds) - 1) // 2] if rounds else g.round     # of a far round moves nothing
        g.train_loss, g.val_loss = self.last_loss, self.val_last if self.val_last is not None else self.val_first
        g.tokens_per_s = self._tokens_per_s()
        g.waiting_for_peers = self.waiting
        g.hash_agrees = self.chains.on_winner if self.history.hashes else None

    def _write_metrics(self, round_: int, outcome: Outcome, wait: float, drawn: Committee | None = None) -> None:
        t, stats = self.tally, self.last_stats
        self._refresh_gauges()
        # the round's committee as this peer drew it (its size is the budget's, never N's): the applied senders
        # are its contributors and at most ``slots`` newcomers from outside its pool
        committee_ = None if drawn is None else {
            "contributors": sorted(drawn.contributors), "witnesses": sorted(drawn.witnesses), "pool": len(drawn.pool),
            "slots": drawn.newcomers, "newcomers": [s for s in outcome.senders if s not in drawn.pool]}
        row = {
            "round": round_, "loss": self.last_loss, "hash": self.history.hashes.get(round_),
            "applied": len(outcome.updates), "senders": outcome.senders, "witnesses": outcome.witnesses,
            "recounted": outcome.recounted,
            "steps": stats.steps if stats else 0,
            "tokens": stats.tokens if stats else 0, "own_included": outcome.own_included,
            # in the decided set, but the robust rule gave it weight 0: why (direction, reputation, ...)
            "own_screened": next((sc.reason for sc in self.engine.last_screens
                                  if sc.sender == self.identity.peer_id and sc.weight == 0.0), None),
            "wait_s": wait,
            "inner_s": t.inner_s, "bytes_up": self.transport.bytes_up, "bytes_down": self.transport.bytes_down,
            "traffic": self.transport.traffic(),
            "rejected": self.rejections.total(), "resyncs": t.resyncs, "catchups": t.catchups,
            "joined_round": t.joined_round, "started": t.started, "step_ratio": round(self.engine.last_step_ratio, 6),
            "skipped_steps": self.engine.skipped_steps, "ignoring": self.rejections.ignored(round_),
            "phase_s": self.phases.totals(), "leaving": sorted(self.membership.leaving()), "time": time.time(),
            "screened": {sc.sender: sc.reason for sc in self.engine.last_screens if sc.reason},
            "banned": self.engine.reputation.banned(),
            "val_loss": self.gauges.val_loss, "utilization": round(self.gauges.utilization(), 4),
            "contributed": t.contributed, "excluded": t.own_excluded, "abstained": t.abstained,
            "undrawn": t.undrawn, "committee": committee_}
        append_metrics(self.metrics_path, row)
        if self.sinks is not None:
            self.sinks.log(row)

    def _summary(self, wall: float) -> PeerSummary:
        t, tr, n = self.tally, self.transport, max(1, self.tally.rounds_done)
        clock = self.skew  # one measurement: the clock-check thread swaps it whole
        return PeerSummary(
            peer=self.identity.peer_id, rounds=self.engine.round, final_loss=self.last_loss,
            val_loss_first=self.val_first, val_loss_last=self.val_last, param_hash=self.engine.state_hash(),
            bytes_up=tr.bytes_up, bytes_down=tr.bytes_down, utilization=t.inner_s / wall if wall > 0 else 0.0,
            comm_wait_s_per_round=t.wait_s / n,
            utilization_steady=t.inner_s / (wall - t.drain_s) if wall > t.drain_s else 0.0,
            comm_wait_s_per_round_steady=(t.wait_s - t.drain_wait_s) / max(1, t.rounds_done - 1),
            rejected_updates=self.rejections.total(), rejected_by_sender=self.rejections.by_sender(),
            resyncs=t.resyncs, own_excluded=t.own_excluded, contributed=t.contributed, abstained=t.abstained,
            undrawn=t.undrawn, hashes=dict(self.history.hashes), joined_round=t.joined_round, first_contribution=t.first_contribution,
            catchups=t.catchups, state_downloads=t.sync["downloads"], rejected_state_offers=t.sync["rejected_offers"],
            resumed_round=t.resumed_round, state_bytes_up=tr.state_bytes_up,
            own_update_bytes_up=tr.own_update_bytes_up, dht_reads=tr.dht_reads, dht_reads_shared=tr.reads_shared,
            state_bytes_down=tr.state_bytes_down, records=tr.records.totals(), records_by_table=tr.records.tables(),
            peak_updates_held=tr.blobs.peak_updates,
            clock_ahead_s=clock.ahead_s if clock else None,
            clock_error_s=clock.error_s if clock else None,
            run_over_at=self.run_over[0] if self.run_over else None,
            phase_s_per_round={k: v / n for k, v in sorted(self.phases.totals().items())})
