"""Agreement on one round's set of updates: who may lead, the proposals, and the decision.

At its deadline each peer that may lead publishes a *proposal*: the updates it verified, by
fingerprint of their (sender, digest) pairs (16 bytes each: 512 updates fit a record). Every peer adopts the proposal of the round's *leader*: the lowest peer id among the
*eligible* proposers (the senders the previous round agreed on: alive and on time; the live trainers
in a peer's first round), waiting up to a grace period (the deadline window, at least
``commit_grace_s``) for lower-id eligible peers that have not proposed yet. A late straggler is not
eligible the round after it missed, so it cannot overturn a decision; a crashed leader never
proposes, so after the grace the next eligible id leads. Gracefully departed peers and peers that
abstained from the round are never waited for.

The rare disagreement (a leader's proposal seen by some peers only) shows up in the per-round weight
hashes and is repaired by re-syncing from the majority (chores.py, sync.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import msgpack

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.clock import window_s
from gradnode.node.swarm.membership import Membership
from gradnode.protocol.records import Proposal, leader, pack, proposal_list_name

log = logging.getLogger(__name__)

POLL_S = 0.2


class Agreement:
    """Round ``round_``'s proposals and decision, as seen by peer ``me``.

    ``eligible``: who may lead (the previous round's agreed senders); empty means "the live trainers,
    read when the decision starts". ``may_lead``: False for an observer (no update of its own this
    round) and for a peer just back from a restart or re-sync, whose proposal would come late and
    could split the round; such a peer never counts itself eligible."""

    def __init__(self, *, members: Membership, cfg: SwarmConfig, run_id: str, round_: int, me: str,
                 eligible: list[str] | None, may_lead: bool, round_seconds: float,
                 leaving: threading.Event) -> None:
        self.members, self.cfg, self.run_id, self.round, self.me = members, cfg, run_id, round_, me
        self.may_lead, self.round_seconds, self.leaving = may_lead, round_seconds, leaving
        self.eligible = set(eligible or ()) - (set() if may_lead else {me})

    def proposals(self) -> list[Proposal]:
        return [p for p in self.members.read("proposals", self.round, Proposal) if p.round == self.round]

    def decided_elsewhere(self, live: set[str]) -> bool:
        """An eligible peer already proposed and our proposal cannot lead (we are not eligible, e.g. just
        joined, or that peer's id is lower): the round is past its deadline, so collecting longer gains
        nothing. The leader itself never stops early this way: its proposal gets its full window."""
        who = self.eligible or live
        me_eligible = self.me in who
        return any(p.proposer in who and p.proposer != self.me and not p.abstain
                   and (not me_eligible or p.proposer < self.me) for p in self.proposals())

    def _passed_by(self) -> bool:
        """Every other live trainer is two or more rounds past this one (it applied this round on its own
        chain, or adopted a newer state): nobody will propose for it any more, so waiting out max_wait_s
        would only leave this peer further behind. One peer claiming a far round is not enough: all must."""
        others = [m for p, m in self.members.members().items() if m.training and p != self.me]
        return bool(others) and all(m.round >= self.round + 2 for m in others)

    def propose(self, included: list[tuple[str, str]]) -> None:
        """Publish the (sender, digest) pairs this peer verified; nothing once it announced its departure
        (the others stopped waiting for it: a late proposal could split them)."""
        if not self.may_lead or self.leaving.is_set():
            return
        # the pairs spelled out, served to whoever cannot resolve a fingerprint from the announcements it sees
        self.members.transport.blobs.put(proposal_list_name(self.run_id, self.round, self.me),
                                         msgpack.packb(sorted(included)))
        self.members.write("proposals", self.round, Proposal(run_id=self.run_id, round=self.round,
                                                             proposer=self.me, included=pack(included)))

    def decide(self, stop: threading.Event, tick: Callable[[], None]) -> Proposal | None:
        """The leader's proposal: the lowest eligible proposer id, waiting a grace period for lower ids
        that have not proposed yet. ``tick`` runs every poll (the exchange keeps fetching meanwhile)."""
        window = window_s(self.cfg, self.round_seconds)
        grace_end = time.monotonic() + max(self.cfg.commit_grace_s, window) + POLL_S
        hard_stop = time.monotonic() + self.cfg.max_wait_s
        if not self.eligible:
            self.eligible = ({p for p, m in self.members.members().items() if m.training} - {self.me}) \
                | ({self.me} if self.may_lead else set())
        while not stop.is_set():
            everyone = self.proposals()
            proposals = [p for p in everyone if p.proposer in self.eligible]
            best = leader(proposals)
            tick()
            # nobody waits for gracefully departed peers or for those that abstained from this round
            absent = self.members.leaving() | {p.proposer for p in proposals if p.abstain}
            lower = [s for s in self.eligible if (best is None or s < best.proposer) and s not in absent]
            now = time.monotonic()
            if best is not None and (not lower or now >= grace_end):
                return best
            if best is None and now >= grace_end + window:
                # no eligible peer proposed in two windows: they are gone (crashed, or the network split us
                # from them). The live trainers that did propose lead instead, by the same rule.
                live = {p for p, m in self.members.members().items() if m.training} | {self.me}
                best = leader([p for p in everyone if p.proposer in live])
                if best is not None:
                    log.warning("round=%d: none of the %d eligible leaders proposed; %s leads among the live",
                                self.round, len(self.eligible), best.proposer[:12])
                    return best
                if self._passed_by():
                    log.warning("round=%d: every other trainer is past it and nobody proposed; giving it up",
                                self.round)
                    return None
            if now >= hard_stop:
                return best
            time.sleep(POLL_S)
        return None


def abstain(members: Membership, run_id: str, round_: int, me: str) -> None:
    """Say at once that peer ``me`` sits round ``round_`` out: it can never lead it, nobody waits for it."""
    members.write("proposals", round_, Proposal(run_id=run_id, round=round_, proposer=me, abstain=True))
