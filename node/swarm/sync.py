"""Getting level with the swarm: when a peer starts, resumes, or finds its weights off the majority.

A peer a few rounds behind (typically restarted from its own checkpoint) replays the missed rounds'
updates when they weigh less than the state (catchup.py); otherwise, and always for a fresh peer or
a forced re-sync, it downloads the swarm's newest agreed state (statesync.py). Either way the
peer's round log learns what it now holds.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import TYPE_CHECKING, Any

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import catchup, events, statesync
from gradnode.node.swarm.events import Kind
from gradnode.node.swarm.history import RoundLog
from gradnode.node.swarm.membership import Membership
from gradnode.node.swarm.report import Tally
from gradnode.node.swarm.rules import UpdateRules
from gradnode.node.swarm.transport import Transport
from gradnode.protocol import sync as sync_rules
from gradnode.protocol import peer as peer_core

if TYPE_CHECKING:
    from gradnode.node.train.engine import Engine

log = logging.getLogger(__name__)



class Sync:
    """Levels ``engine`` with the swarm and records what it adopted in ``history``."""

    def __init__(self, *, engine: "Engine", history: RoundLog, members: Membership, transport: Transport,
                 cfg: SwarmConfig, rules: UpdateRules, tally: Tally, stop: threading.Event | None = None) -> None:
        self.engine, self.history, self.members, self.transport = engine, history, members, transport
        self.cfg, self.rules, self.run_id, self.tally = cfg, rules, rules.run_id, tally
        self.stop = stop  # set when the peer leaves: a download in progress ends then (statesync.fetch)

    def level(self, want: peer_core.Resync) -> bool:
        """Carry out the peer core's ``Resync`` (protocol/peer.py: which states it may take, how long it looks):
        adopt the swarm's newest agreed state when it is ahead of ours (or whatever its round, for a repair),
        replaying the missed rounds when that is cheaper, else downloading the full state; with ``links``, a
        state of that chain (a fork lost to it). True when a state was adopted or replayed. This peer's
        progress not yet aggregated carries over onto the adopted weights (nothing computed is lost); what is
        lost on a fork is the losing chain's aggregated rounds since the split."""
        force, reason = want.reason.forced, want.reason.value
        links = set(want.links) if want.links is not None else None
        if not force and self._catch_up():
            return True
        eng = self.engine
        backup = eng.shared_state()

        def accept(state: dict[str, Any], manifest: Any) -> bool:
            try:
                eng.load_shared_state(state, keep_progress=True)
                ok = eng.state_hash() == manifest.param_hash
            except (ValueError, KeyError, RuntimeError) as err:
                log.warning("state from %s unusable: %s", manifest.peer[:12], err)
                ok = False
            if not ok:
                eng.load_shared_state(backup, keep_progress=True)
            return ok

        if not force:  # a start or resume: a short look, skipped in a fresh run (every start paid it, for nothing)
            me = self.transport.peer_id
            others = (m.round for p, m in self.members.members().items() if m.training and p != me)
            if not sync_rules.newer_in_sight(eng.round, others) and \
                    not statesync.newest_offers(self.members, self.cfg, me, want.lowest_round):
                return False
        got = statesync.fetch(transport=self.transport, membership=self.members, cfg=self.cfg, run_id=self.run_id,
                              min_round=want.lowest_round, deadline_s=want.look_s,
                              accept=accept, stats=self.tally.sync, links=links, stop=self.stop)
        if got is None:
            if force:
                log.warning("re-sync (%s) found no state offer; continuing", reason)
            return False
        _, manifest = got
        self.tally.resyncs += force
        h = self.history
        for r in [r for r in h.hashes if r >= eng.round - 1]:  # a chain given up: its newer rounds are moot
            del h.hashes[r]
            h.applied.pop(r, None)
        h.hashes[eng.round - 1] = manifest.param_hash
        h.trusted_from = eng.round - 1
        # who made the adopted round, by the ledger that came with the state: they set the pace
        h.senders = sorted(p for p, r in eng.contributors.items() if r == eng.round - 1)
        log.info("state adopted reason=%s round=%d from=%s hash=%s", reason, eng.round,
                 manifest.peer[:12], manifest.param_hash[:12], extra=events.tag(Kind.RESYNC, reason=reason))
        return True

    def _catch_up(self) -> bool:
        """Replay the rounds between our checkpoint and the swarm's newest state, when their updates are
        kept (swarm.catchup_rounds) and weigh less than the state; True when we are level again."""
        eng = self.engine
        if self.cfg.catchup_rounds == 0 or (eng.round == 0 and self.tally.resumed_round is None):
            return False  # a fresh peer has no history to build on: it downloads the state
        offers = statesync.newest_offers(self.members, self.cfg, self.transport.peer_id, eng.round + 1)
        if not offers:
            return False
        target = offers[0].round
        choice = functools.partial(sync_rules.replay_or_download, behind=target - eng.round,
                                   window=self.cfg.catchup_rounds, state_bytes=offers[0].size)
        if choice(replay_bytes=0) is sync_rules.CatchUp.DOWNLOAD:
            log.info("catch-up: %d rounds behind, beyond the window of %d", target - eng.round, self.cfg.catchup_rounds)
            return False
        missed = catchup.plan(self.members, eng.round, target)
        if missed is None or not catchup.start_matches(eng, self.members):
            return False
        cost = sum(m.update_bytes for m in missed)
        if choice(replay_bytes=cost) is sync_rules.CatchUp.DOWNLOAD:
            log.info("catch-up: %d bytes of updates >= %d bytes of state; downloading the state", cost, offers[0].size)
            return False
        start = eng.round
        ok = catchup.replay(eng, missed, transport=self.transport, membership=self.members, cfg=self.cfg,
                            rules=self.rules, deadline_s=min(60.0, self.cfg.max_wait_s))
        for m in missed[:eng.round - start]:
            self.history.record(m.round, m.param_hash, m.included, m.update_bytes)
        if ok:
            self.tally.catchups += len(missed)
            self.history.senders = [s for s, _ in missed[-1].included]
            log.info("caught up rounds=%d..%d by replay bytes=%d (state is %d) hash=%s", start, target - 1, cost,
                     offers[0].size, eng.state_hash()[:12], extra=events.tag(Kind.RESYNC, reason="catch-up replay",
                                                                             round=target - 1))
        return ok
