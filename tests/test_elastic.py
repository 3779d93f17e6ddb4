"""The elastic swarm: crash and restart, late joins, bad state offers (tampered, claimed far ahead; poisoned
momentum: test_engine.py), a replayed leaving record, and the fault-schedule grammar of `gradnode simulate
--faults` (client-mode peers and a graceful leave: tests/test_swarm_faults.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from conftest import explain, settles
from gradnode.node.train import checkpoint
from gradnode.node.sim import faults
from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.identity import load_or_create
from gradnode.node.swarm.transport import Transport

pytestmark = pytest.mark.process  # starts processes or daemons (selectable for flake-hunt: -m process)

# --- pure: the fault grammar and checkpoints ---------------------------------------------------------


def test_fault_spec_parses_and_is_reproducible_by_seed() -> None:
    s = faults.parse("kill:2@r3,restart:2@r5,join:5@r2,slow:1x5,bw:3=1mbit,corrupt:4@r2,kill:bootstrap@r4", 8, 10)
    assert [(e.action, e.target, e.round) for e in s.events] == [
        ("join", "peer-5", 2), ("kill", "peer-2", 3), ("kill", "bootstrap", 4), ("restart", "peer-2", 5)]
    assert s.late == {5: 2}
    assert s.overrides == {1: ["swarm.slowdown=5.0"], 3: ["swarm.bandwidth=1mbit"],
                           4: ["swarm.fault=corrupt", "swarm.fault_round=2"]}
    s = faults.parse("partition:0,1,2|3,4,5,6,7@r3,kill:bootstrap@r4,heal@r6,restart:bootstrap@r6", 8, 10)
    assert [(e.action, e.target, e.round) for e in s.events] == [
        ("partition", "network", 3), ("kill", "bootstrap", 4), ("heal", "network", 6), ("restart", "bootstrap", 6)]
    assert s.events[0].groups == ((0, 1, 2), (3, 4, 5, 6, 7)) and s.partitioned
    picks = [faults.parse("kill:?@r2", 8, 10, seed).events[0].target for seed in range(6)]
    assert picks == [faults.parse("kill:?@r2", 8, 10, seed).events[0].target for seed in range(6)]
    assert len(set(picks)) > 1


@pytest.mark.parametrize("spec, message", [
    ("kill:9@r3", "peer 9 does not exist"),
    ("restart:2@r3", "restart needs an earlier kill:2"),
    ("kill:2", "needs a round"),
    ("slow:1", "slow:1x5"),
    ("bw:1=fast", "bad rate"),
    ("explode:1@r2", "unknown action 'explode'"),
    ("join:1@r0", "at round 1 or later"),
    ("stop:bootstrap@r4", "only 'kill' and 'restart' apply to the bootstrap"),
    ("restart:bootstrap@r4", "restart needs an earlier kill:bootstrap"),
    ("partition:0,1|2@r3", "list every peer 0..7 once"),
    ("partition:0,1,2,3|4,5,6,7@r3,partition:0|1,2,3,4,5,6,7@r4", "already split from round 3"),
    ("heal@r4", "heal needs an earlier partition"),
    ("partition:0,1,2,3|4,5,6,7", "needs a round"),
    ("partition:a|b@r2", "write the groups as peer indices"),
    ("kill:1@r10", "not before the last round"),
    ("kill:1@r2,,", "empty item"),
    ("corrupt:1@r2,forge:1@r3", r"already has an update fault \(corrupt\)"),
    ("join:1@r3,kill:1@r2", "comes before that"),
])
def test_fault_spec_errors_name_the_item(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        faults.parse(spec, 8, 10)


def test_half_written_checkpoint_is_never_loaded(tmp_path: Path) -> None:
    state = {"w": torch.arange(4.0)}
    checkpoint.save(tmp_path, 2, state, {"run_id": "r"}, keep=3)
    # killed while writing round 4: the temporary folder holds a truncated state and no meta
    tmp = tmp_path / ".tmp-round-00000004-4242"
    tmp.mkdir()
    (tmp / "state.pt").write_bytes(b"PK\x03\x04 truncated")
    # and a damaged newer folder (e.g. disk error after the rename) is skipped too
    bad = checkpoint.save(tmp_path, 6, {"w": torch.ones(4)}, {"run_id": "r"}, keep=3)
    data = (bad / "state.pt").read_bytes()
    (bad / "state.pt").write_bytes(data[: len(data) // 2])
    loaded, meta = checkpoint.load_latest(tmp_path, "r")
    assert meta["round"] == 2 and torch.equal(loaded["w"], state["w"])
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["round-00000006", "round-00000002"]


# --- transports in this process: upload slots spread joiners, pushes are verified -----------------


@pytest.mark.swarm
def test_busy_donor_sends_joiners_elsewhere_and_pushes_are_checked(tmp_path: Path) -> None:
    made: list[Transport] = []
    try:
        capped = SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], bandwidth="8mbit", state_upload_slots=1)
        a = Transport(capped, load_or_create(tmp_path / "a"))
        made.append(a)
        a.start()
        rest = SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=a.maddrs())
        b = Transport(rest, load_or_create(tmp_path / "b"))
        made.append(b)
        b.start()
        c = Transport(rest.model_copy(update={"client_mode": True}), load_or_create(tmp_path / "c"))
        made.append(c)
        c.start()
        assert c.maddrs() == []  # a client-mode peer listens nowhere
        one, two = b"1" * 2_000_000, b"2" * 300_000
        a.states.offer(3, {"s/run/3/one": one, "s/run/3/two": two})  # state chunks: served from the state store
        b.states.offer(3, {"s/run/3/two": two})
        src_a, src_b = (a.peer_id, a.maddrs()), (b.peer_id, b.maddrs())
        # 'one' only from a (which uploads one state chunk at a time at 1 MB/s); 'two' from either
        got = c.fetch_many([([src_a], "s/run/3/one"), ([src_a, src_b], "s/run/3/two")], max_bytes=10**7,
                           deadline=time.monotonic() + 120, verify=lambda n, d: True)
        assert got == {"s/run/3/one": one, "s/run/3/two": two}
        # a server counts a piece once its write drained, which can be just after the fetcher has it all
        end = time.monotonic() + 60
        while a.state_bytes_up + b.state_bytes_up < len(one) + len(two) and time.monotonic() < end:
            time.sleep(0.05)
        assert a.state_bytes_up in (len(one), len(one) + len(two))
        if a.state_bytes_up == len(one):
            assert b.state_bytes_up == len(two)
        # a client pushes its own update to a reachable peer; that peer's check decides whether it holds it
        b.on_push = lambda name, data: data.startswith(b"ok")
        assert c.push([src_b], f"u/run/1/{c.peer_id}", b"ok-update", deadline=time.monotonic() + 60) == 1
        assert c.push([src_b], f"u/run/2/{c.peer_id}", b"garbage", deadline=time.monotonic() + 60) == 0
        assert c.push([src_b], f"u/run/3/{a.peer_id}", b"ok-update", deadline=time.monotonic() + 60) == 0  # not its own
    finally:
        for t in made:
            t.close()


def _members(tmp_path: Path, cfg: SwarmConfig, made: list[Transport], peers: list[tuple]) -> list:
    """A transport and a member record for each (name, round, chain) of ``peers``, the first the others' initial
    peer; each record's store is tried again until it succeeds (a loaded machine fails one now and then). The
    transports go into ``made`` (the caller closes them)."""
    from gradnode.node.swarm.membership import Membership

    nodes = []
    for name, round_, tail in peers:
        ident = load_or_create(tmp_path / name)
        t = Transport(cfg if not made else cfg.model_copy(update={"initial_peers": made[0].maddrs()}), ident)
        made.append(t)
        t.start()
        m = Membership(t, ident, "run", ttl=60)
        assert settles(lambda: m.publish(round_=round_, training=True, step_seconds=0.1, inner_steps=4,
                                         tokens_per_s=1.0, rejected=0, loss=None, chain=tail))
        nodes.append(m)
    return nodes


def _fetching(joiner, cfg: SwarmConfig):
    """A joiner's look for a state past round 0 (statesync.fetch, 60 s at most), to call again."""
    from gradnode.node.swarm import statesync

    return lambda: statesync.fetch(transport=joiner.transport, membership=joiner, cfg=cfg, run_id="run", min_round=1,
                                   deadline_s=60)


def _fetch_until(fetch, round_: int) -> tuple:
    """``fetch()`` again until it returns a state of ``round_`` (a DHT read on a loaded machine can miss a record or
    an offer once); the last result."""
    taken = []
    assert settles(lambda: taken.append(fetch()) or (taken[-1] is not None and taken[-1][1].round == round_),
                   within_s=120), taken[-1]
    return taken[-1]


@pytest.mark.swarm
def test_tampered_offer_is_discarded_for_another_donor(tmp_path: Path) -> None:
    """Two donors offer round 3 under the hash the swarm reported; the one tried first (lower id) serves
    altered weights. The joiner discards that offer and its donor, and takes the honest one."""
    from collections import Counter

    from gradnode.node.swarm import statesync
    from gradnode.protocol.records import WeightHash

    def weights_hash(state: dict) -> str:
        import hashlib

        return hashlib.sha256(state["w"].numpy().tobytes()).hexdigest()

    cfg = SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], state_chunk_bytes=65536)
    made: list[Transport] = []
    try:
        nodes = _members(tmp_path, cfg, made, [(name, 3, []) for name in ("a", "b", "c")])
        donors = sorted(nodes[:2], key=lambda m: m.identity.peer_id)
        tamperer, honest = donors
        joiner = nodes[2]
        state = {"w": torch.arange(40_000, dtype=torch.float32), "round": 3}
        good = weights_hash(state)
        for m in donors:
            m.write("weights", 2, WeightHash(run_id="run", round=2, peer=m.identity.peer_id, param_hash=good))
        statesync.offer(state, good, 3, transport=honest.transport, membership=honest, cfg=cfg, run_id="run")
        bad_state = {"w": state["w"] + 1.0, "round": 3}
        statesync.offer(bad_state, good, 3, transport=tamperer.transport, membership=tamperer, cfg=cfg, run_id="run")
        stats: Counter = Counter()
        got = statesync.fetch(transport=joiner.transport, membership=joiner, cfg=cfg, run_id="run", min_round=1,
                              deadline_s=120, accept=lambda st, man: weights_hash(st) == man.param_hash, stats=stats)
        assert got is not None
        loaded, manifest = got
        assert torch.equal(loaded["w"], state["w"]) and manifest.peer == honest.identity.peer_id
        assert stats["rejected_offers"] == 1 and stats["downloads"] == 1
        assert tamperer.transport.state_bytes_up > 0  # it was tried first, and discarded
    finally:
        for t in made:
            t.close()


def test_a_state_claimed_far_ahead_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """futurestate, on real transports: donors a and a2 offer round 3; keys b and b2 offer the same weights
    claimed for round 10^6 under the hash of that claim (it matches itself), and b says it is at round 10^6 in
    its member record (b2 says round 3). Nobody has published a chain or a weight report yet, so the chain rule
    cannot tell them apart, and the look takes the newest round two offerers agree on (one key's offer alone is
    its own word: protocol/sync.py ``trusted_offers``). Without the ceiling the joiner takes round 10^6 (b's and
    b2's offers agree); with it, an offer may claim no round more than 10 past what another member reports: b's
    (the others say 3) is refused, b2's alone is one offer, and the joiner takes round 3."""
    from gradnode.node.swarm import statesync
    from gradnode.protocol.records import StateManifest

    cfg = SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], state_chunk_bytes=65536)
    made: list[Transport] = []
    try:
        peers = [("a", 3, []), ("a2", 3, []), ("b", 10**6, []), ("b2", 3, []), ("c", 0, [])]
        *honest, liar, liar2, joiner = _members(tmp_path, cfg, made, peers)
        state = {"w": torch.arange(1000, dtype=torch.float32)}
        for m in honest:
            statesync.offer({**state, "round": 3}, "a" * 64, 3, transport=m.transport, membership=m, cfg=cfg,
                            run_id="run")
        for m in (liar, liar2):
            statesync.offer({**state, "round": 10**6}, "f" * 64, 10**6, transport=m.transport, membership=m,
                            cfg=cfg, run_id="run")
        assert settles(lambda: len(joiner.members(max_age=0)) == 5)
        assert settles(lambda: len(joiner.read("state", None, StateManifest)) == 4)  # all four offers in sight
        fetch = _fetching(joiner, cfg)

        got = fetch()
        assert got is not None and got[1].round == 3 and got[1].peer in {m.identity.peer_id for m in honest}
        with monkeypatch.context() as patched:
            patched.setattr(statesync, "beyond_reach", lambda membership, me: lambda offer: False)
            _fetch_until(fetch, 10**6)  # the attack, without the ceiling
    finally:
        for t in made:
            t.close()


def test_a_state_one_key_claims_a_few_rounds_ahead_of_the_chain_is_refused(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """futurestate within reach, on real transports: donors a and b hold round 4 (tails to round 3) and offer it;
    key l's member record lists the same tail and then round 8 under a hash of its making, and offers that state
    (within RECORD_LAG of the others: beyond_reach lets it by). Its tail agrees with every honest one, so the chain
    rule counts it on the winning chain. The joiner adopts only a state more than half of the winners list
    (chain.adoptable): a's and b's. Without that rule (every winner's link trusted, as before) it takes l's."""
    from gradnode.node.swarm import statesync
    from gradnode.protocol.records import StateManifest

    cfg = SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], state_chunk_bytes=65536)
    honest_tail = [(r, f"{r:02d}" * 32) for r in range(4)]
    made: list[Transport] = []
    try:
        peers = [("a", 4, honest_tail), ("b", 4, honest_tail), ("l", 9, honest_tail + [(8, "e" * 64)]), ("j", 0, [])]
        *donors, liar, joiner = _members(tmp_path, cfg, made, peers)
        state = {"w": torch.arange(1000, dtype=torch.float32), "round": 4}
        for m in donors:
            statesync.offer(state, honest_tail[-1][1], 4, transport=m.transport, membership=m, cfg=cfg, run_id="run")
        statesync.offer({**state, "round": 9}, "e" * 64, 9, transport=liar.transport, membership=liar, cfg=cfg,
                        run_id="run")
        assert settles(lambda: len(joiner.members(max_age=0)) == 4)
        assert settles(lambda: len(joiner.read("state", None, StateManifest)) == 3)  # all three offers in sight
        fetch = _fetching(joiner, cfg)

        got = fetch()
        assert got is not None and got[1].round == 4 and got[1].peer != liar.identity.peer_id
        with monkeypatch.context() as patched:  # every link of a winner trusted: the rule before
            patched.setattr(statesync.chain, "adoptable", lambda tails, serving=None: {
                link for p in statesync.chain.winner(tails, serving) for link in tails[p]} or None)
            assert _fetch_until(fetch, 9)[1].peer == liar.identity.peer_id  # the attack
    finally:
        for t in made:
            t.close()


# --- real swarms -----------------------------------------------------------------------------------

# Rounds of ~2-3 s (steps stretched by sleeping, cheap on CPU): a process needs ~10-20 s to start on 2
# busy cores, so a peer restarted or joining at round r arrives a few rounds later (3 joiners started at
# round 2 arrived at round 8 once), with rounds left to train.
PACED = ["inner.steps=10", "swarm.slowdown=30", "swarm.state_chunk_bytes=65536"]
# what the robust rule may give an honest peer's update in the decided set: counted (None), or weight 0 for its
# direction, its size or its reputation; never 'replay' or 'duplicate' (protocol/screening.py's REASONS)
HONEST_SCREENS = (None, "direction", "small", "reputation")


@pytest.mark.swarm
def test_kill_restart_stop_late_join_bootstrap_loss_and_a_replayed_leaving_record(run_swarm, metrics_of) -> None:
    """kill -9 a peer and the bootstrap mid-run: the others go on with identical weights; the killed peer,
    restarted with the same command (the bootstrap's address, nothing else), finds the swarm through its
    address book, resumes from its checkpoint and gets level (replaying the missed rounds, or by the state);
    the bootstrap, restarted with an empty DHT, reconnects to the peers it knew; a late joiner given only the
    bootstrap's address finds the whole swarm through it, downloads the state and ends on the swarm's hash
    (when its update first counts depends on the machine's load: the simulator's to assert).
    In the same swarm, replayleave: peer 4 stops (SIGTERM: it publishes a signed 'leaving' record) and comes
    back; peer 5 keeps that record and stores it again every heartbeat under a key of its own making. A
    record stored under another key than its author's is refused, so once peer 4 is back no honest peer takes
    it for gone (each metrics row lists the peers its author takes for leaving; tests/test_transport.py holds
    the same attack on three DHT nodes, whatever the schedule).
    Without the owner check the replay is read as peer 4's departure for the record's lifetime (60 s)."""
    # the restarted process needs ~10 s to start: 9 rounds of ~1.2 s went by once, one past the default
    # catch-up window of 8, so the peer downloaded the state; a 20-round window keeps the replay path likely
    summary = run_swarm(peers=6, rounds=20, extra=[*PACED, "swarm.catchup_rounds=20"], timeout_s=450,
                        faults="kill:bootstrap@r2,kill:1@r2,restart:1@r3,restart:bootstrap@r3,join:3@r3,"
                               "replayleave:5,stop:4@r2,restart:4@r3")
    peers = summary["peers"]
    assert [p["role"] for p in peers] == ["honest"] * 5 + ["replayleave"]
    assert summary["live_peers"] == 5 and summary["identical_hashes"], explain(summary)
    steady, restarted, late, returned = peers[0], peers[1], peers[3], peers[4]
    assert steady["rounds"] == 20
    # the restarted peer (same identity) and the late joiner (fresh) are level again: both among the live peers
    # above, at round 20 on the swarm's hash. How each got level is the schedule's: by replaying the missed rounds,
    # by the state, or by running on from its start-up look (3 s) when no offer on the winning chain turned up in
    # it (offers lag the chain tails on a loaded machine), sitting out the rounds already late and applying the
    # others' sets of them, with no replay or download counted. Which path the rules take, and when, is the
    # simulator's to assert over seeds (tests/test_virtual.py, the churn scenarios: replay when cheaper than the
    # state, else download); asserted here: the restart was one, resuming its checkpoint when it had saved one, and
    # neither the restarted peer nor the late joiner ended off the swarm. When the joiner's update first counts
    # depends on the machine's load too (within 2 rounds on an idle machine, 12 once on a busy one); asserted, that
    # an honest peer's update is never screened as a replay or a duplicate of another's
    assert restarted["restarts"] == 1
    # its second life resumed the checkpoint its first one saved (an atomic write: there whole, or not at all)
    lives = re.split(r"^run folder: \S+$", (Path(summary["out_dir"]) / "peer-1.log").read_text(errors="replace"),
                     flags=re.M)  # the line each start writes (its end writes the folder's size after it)
    assert len(lives) == 3, "peer-1 did not start twice"
    if "checkpoint saved" in lives[1]:
        assert restarted["resumed_round"] is not None, explain(summary)
    assert restarted["rounds"] == late["rounds"] == 20 and \
        restarted["param_hash"] == late["param_hash"] == steady["param_hash"], explain(summary)
    rows = metrics_of(summary, 3)
    reasons = [(r["round"], r["own_included"], r["own_screened"]) for r in rows]
    assert all(r["own_screened"] in HONEST_SCREENS for r in rows), reasons
    # the stopped and returned peer: once back (its first round of its second life applied: its 'training' record
    # went out before that round), no honest peer takes it for gone, though peer 5 stores its old 'leaving'
    # record again under a key of its own (when peer 5 caught that record: it is in the DHT for seconds only)
    folder = Path(summary["out_dir"])
    assert returned["restarts"] == 1
    rows4 = metrics_of(summary, 4)
    second = [row for row in rows4 if row["started"] == rows4[-1]["started"]]
    back_at = second[0]["time"]
    replayed = "replayleave: storing the leaving record" in (folder / "peer-5.log").read_text(errors="replace")
    for i in (0, 2):
        later = [row for row in metrics_of(summary, i) if row["time"] > back_at][1:]  # a round's margin
        assert all(returned["peer"] not in row["leaving"] for row in later), [row["leaving"] for row in later]
        if replayed:  # the replay reached the honest peers, and they refused it
            assert "stored by another peer" in (folder / f"peer-{i}.log").read_text(errors="replace")
    # its updates after it came back: decided sets take them again when the load lets them (1 to 4 of the run's
    # last 4 rounds, measured); the robust rule may give them weight 0 for a while (it counted before it left, so
    # two weak updates of its resumed optimizer in a row are strikes, as for the late joiner): never 'replay'
    own = [(row["round"], row["own_included"], row["own_screened"]) for row in second]
    assert all(screened in HONEST_SCREENS for _, _, screened in own), own
    assert summary["val_loss_last"] < summary["val_loss_first"]


def test_adversary_faults_need_no_round_and_name_the_role() -> None:
    s = faults.parse("tokens:3,dense:4@r2,corrupt:1@r1", 5, 6)
    assert s.overrides[3] == ["swarm.fault=tokens", "swarm.fault_round=0"]
    assert s.overrides[4] == ["swarm.fault=dense", "swarm.fault_round=2"]
    assert [s.role(i) for i in range(5)] == ["honest", "corrupt", "honest", "tokens", "dense"]
