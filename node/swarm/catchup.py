"""Cheap catch-up: replay the updates of the rounds a peer missed instead of downloading the full state.

With its weight hash of round r every peer reports what it applied (``WeightHash.included``: the
(sender, digest) pairs of the round, and their total size), and it keeps serving those update blobs
for ``swarm.catchup_rounds`` rounds. A peer at round a that finds the swarm at round b
(a < b <= a + window), typically one restarted from its own checkpoint, reads the majority report of
every missed round. When the missed updates weigh less than the state on offer it fetches them from
the peers that reported the majority hash (they hold them) and from their senders, checks each one
exactly like a live round (digest, then the run's rules: signature, envelope and shapes, run and round, codec, tokens), and applies them
round by round through ``Engine.apply_aggregate``, checking the weight hash after every round. A
gap, a bad update or a hash mismatch ends the replay; the caller then downloads the full state.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.membership import Membership
from gradnode.node.swarm.rules import UpdateRules
from gradnode.node.swarm.transport import Transport
from gradnode.protocol.records import UpdateAnnouncement, majority_hash, resolve, update_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MissedRound:
    """What the swarm applied in one round, as the majority of its peers reported it."""

    round: int
    param_hash: str
    included: list[tuple[str, str]]
    update_bytes: int
    holders: list[str]


def plan(membership: Membership, start: int, end: int) -> list[MissedRound] | None:
    """The majority report of every round in [start, end); None when a round has no usable report."""
    missed = []
    for r in range(start, end):
        reports = membership.reports(r)
        found = majority_hash(reports)
        if found is None:
            log.info("catch-up: no weight report for round=%d", r)
            return None
        agree = [w for w in reports if w.param_hash == found[0]]
        # the same weights come from one applied set; the most common report of it wins all the same
        sets = Counter(w.included for w in agree)
        fps, _ = max(sets.items(), key=lambda kv: (kv[1], kv[0]))
        size = max(w.update_bytes for w in agree if w.included == fps)
        included = round_updates(membership, r, fps)
        if included is None:
            return None
        missed.append(MissedRound(r, found[0], included, size, sorted(w.peer for w in agree)))
    return missed


def round_updates(membership: Membership, round_: int, fps: bytes) -> list[tuple[str, str]] | None:
    """The (sender, digest) pairs that fingerprints of round ``round_`` name, from the round's signed
    announcements (kept as long as the weight reports); None when one of them is no longer announced."""
    known = [(a.sender, a.digest) for a in membership.read("updates", round_, UpdateAnnouncement)
             if a.round == round_]
    pairs, unknown = resolve(fps, known)
    if unknown:
        log.info("catch-up: %d update(s) of round=%d no longer announced", unknown, round_)
        return None
    return pairs


def start_matches(engine: Any, membership: Membership) -> bool:
    """Our weights are the swarm's at our round (the report of round - 1 agrees), or there is no report."""
    if engine.round < 1:
        return True
    found = majority_hash(membership.reports(engine.round - 1))
    return found is None or found[0] == engine.state_hash()


def replay(engine: Any, missed: list[MissedRound], *, transport: Transport, membership: Membership,
           cfg: SwarmConfig, rules: UpdateRules, deadline_s: float) -> bool:
    """Fetch, verify and apply the missed rounds in order; True when the engine ends on the last round's
    hash. On False the engine may have applied a prefix of the rounds (each one verified)."""
    want: dict[str, str] = {}
    jobs = []
    for m in missed:
        sources = membership.sources(sorted(set(m.holders) | {s for s, _ in m.included}))
        for sender, digest in m.included:
            name = update_name(rules.run_id, m.round, sender)
            want[name] = digest
            jobs.append((sources, name))
    got = transport.fetch_many(jobs, max_bytes=cfg.max_update_bytes, deadline=time.monotonic() + deadline_s,
                               verify=lambda name, data: hashlib.sha256(data).hexdigest() == want[name])
    if len(got) != len(want):
        log.warning("catch-up: fetched %d of %d updates", len(got), len(want))
        return False
    for m in missed:
        updates, weights = [], []
        for sender, _ in m.included:
            blob = got[update_name(rules.run_id, m.round, sender)]
            upd, reason = rules.check(blob, sender=sender, round_=m.round, key_of=membership.public_key)
            if upd is None:
                log.warning("catch-up: update of round=%d from %s rejected reason=%s", m.round, sender[:12], reason)
                return False
            updates.append(upd)
            weights.append(rules.weight(upd))
            transport.blobs.put(update_name(rules.run_id, m.round, sender), blob)  # serve it on, like a live round
        assert engine.round == m.round, f"replay out of order: engine at {engine.round}, round {m.round}"
        engine.apply_aggregate(updates, weights)
        if engine.state_hash() != m.param_hash:
            log.warning("catch-up: round=%d replayed to hash=%s, the swarm has %s", m.round,
                        engine.state_hash()[:12], m.param_hash[:12])
            return False
    return True
