"""The catch-up replay of a peer restarted from its checkpoint (node/swarm/catchup.py), on real transports and
real engines: it reads what the swarm applied in the rounds it missed, fetches exactly those updates, checks
each like a live round and lands on the swarm's hash, for fewer bytes than the state. A gap or a lie ends it,
and the caller downloads the state instead."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from _tiny import tiny_config
from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import catchup
from gradnode.node.swarm.membership import Membership
from gradnode.node.swarm.rules import UpdateRules
from gradnode.protocol import attach_signature, decode_update, signing_digest
from gradnode.protocol.records import UpdateAnnouncement, WeightHash, pack, update_name

pytestmark = pytest.mark.swarm

ROUNDS = 3


def members_of(trio, run_id: str) -> list[Membership]:
    out = [Membership(t, t.identity, run_id, ttl=60.0) for t in trio]
    for m in out:  # every key is known from a member record, as in a run
        assert m.publish(round_=0, training=True, step_seconds=1.0, inner_steps=4, tokens_per_s=1.0, rejected=0,
                         loss=None)
    for m in out:
        m.members(max_age=0.0)
    return out


def swarm_rounds(tmp_path: Path, trio, members: list[Membership], *, lie_at: int | None = None):
    """a and c train ROUNDS rounds and apply both updates each round, as a swarm of two would; each serves its
    update, announces it and reports its weight hash with what it applied (``lie_at``: c reports a hash no
    honest replay reaches in that round, and a does not report it). Returns (the engine at the end, the rules)."""
    from gradnode.node.train.engine import Engine

    a, _, c = trio
    ma, _, mc = members
    cfg = tiny_config(tmp_path / "swarm")
    engines = {a: Engine(cfg, 0), c: Engine(cfg, 1)}
    rules = rules_of(engines[a])
    for r in range(ROUNDS):
        blobs = {}
        for t, m in ((a, ma), (c, mc)):
            engines[t].inner_round()
            blob = engines[t].make_update(sender=t.peer_id)
            blob = blobs[t] = attach_signature(blob, t.identity.sign(signing_digest(blob)))
            t.blobs.put(update_name(cfg.run.run_id, r, t.peer_id), blob)
            assert m.write("updates", r, UpdateAnnouncement(
                run_id=cfg.run.run_id, round=r, sender=t.peer_id, digest=hashlib.sha256(blob).hexdigest(),
                size=len(blob), tokens=1, time=t.now()))
        applied = [(t.peer_id, hashlib.sha256(b).hexdigest()) for t, b in blobs.items()]
        for t in (a, c):
            updates = [decode_update(blobs[s]) for s in (a, c)]
            engines[t].apply_aggregate(updates, [rules.weight(u) for u in updates])
        assert engines[a].state_hash() == engines[c].state_hash()
        for t, m in ((a, ma), (c, mc)):
            if lie_at == r and t is a:
                continue
            claimed = "f" * 64 if lie_at == r else engines[t].state_hash()
            assert m.write("weights", r, WeightHash(run_id=cfg.run.run_id, round=r, peer=t.peer_id,
                                                    param_hash=claimed, included=pack(applied),
                                                    update_bytes=sum(len(b) for b in blobs.values())))
    return engines[a], rules, cfg


def test_a_peer_behind_replays_the_missed_rounds_and_lands_on_the_swarm_hash(trio, tmp_path: Path) -> None:
    """b, at round 0, replays rounds 0-2 from the swarm's records and blobs: it ends on a's hash, having fetched
    the six updates and nothing more (fewer bytes than the state it would otherwise download)."""
    from gradnode.node.train.engine import Engine

    members = members_of(trio, "test-tiny")
    ahead, rules, cfg = swarm_rounds(tmp_path, trio, members)
    b, mb = trio[1], members[1]
    behind = Engine(tiny_config(tmp_path / "behind"), 2)
    assert catchup.start_matches(behind, mb)
    missed = catchup.plan(mb, 0, ROUNDS)
    assert missed is not None and [m.round for m in missed] == list(range(ROUNDS))
    assert all(len(m.included) == 2 for m in missed)
    down = b.bytes_down
    ok = catchup.replay(behind, missed, transport=b, membership=mb, cfg=SwarmConfig(), rules=rules, deadline_s=30.0)
    assert ok and behind.round == ROUNDS and behind.state_hash() == ahead.state_hash()
    fetched = b.bytes_down - down
    assert fetched == sum(m.update_bytes for m in missed)
    state_bytes = sum(t.numel() * t.element_size() for t in ahead.global_params.values())
    assert fetched < state_bytes, (fetched, state_bytes)
    # what b replayed it serves on, like a live round: a later peer can replay from b too
    assert all(b.blobs.get(update_name(cfg.run.run_id, m.round, s)) is not None for m in missed for s, _ in m.included)


def test_a_replay_that_misses_the_reported_hash_stops_there(trio, tmp_path: Path) -> None:
    """The only weight report of round 1 claims a hash the updates it lists do not give: the replay applies round
    0, stops at round 1 and says so (False), and the caller downloads the state."""
    from gradnode.node.train.engine import Engine

    members = members_of(trio, "test-tiny")
    swarm_rounds(tmp_path, trio, members, lie_at=1)
    b, mb = trio[1], members[1]
    behind = Engine(tiny_config(tmp_path / "behind"), 2)
    missed = catchup.plan(mb, 0, ROUNDS)
    assert missed is not None
    ok = catchup.replay(behind, missed, transport=b, membership=mb, cfg=SwarmConfig(), rules=rules_of(behind),
                        deadline_s=30.0)
    assert not ok and behind.round == 2  # rounds 0 and 1 applied; round 1's hash is not the one claimed


def test_a_round_nobody_reported_leaves_no_plan(trio, tmp_path: Path) -> None:
    """Without a weight report for every missed round there is nothing to replay to: no plan, a download."""
    members = members_of(trio, "test-tiny")
    swarm_rounds(tmp_path, trio, members)
    assert catchup.plan(members[1], 0, ROUNDS + 1) is None


def rules_of(engine) -> UpdateRules:
    return UpdateRules.of(engine.cfg, {n: tuple(t.shape) for n, t in engine.global_params.items()})
