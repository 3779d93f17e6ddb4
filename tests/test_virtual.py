"""The deterministic simulator (node/sim/virtual.py): the real round core for many peers on a virtual clock.
A failing scenario names its seed; `gradnode simulate --virtual --seed S` replays it exactly."""

from __future__ import annotations

import collections
import json
import math
import os
from dataclasses import replace

import pytest

from gradnode.node.sim import scenario, sight, states, virtual
from gradnode.protocol import peer as peer_core
from gradnode.protocol import round as core

# CI's depth: the sweeps below run about 900 seeded scenarios in 63 CPU-seconds alone (the bar: at least 500
# within 2 minutes). GRADNODE_SIM_DEPTH=K runs K times as many seeds of every sweep, for a deeper search
# before a change to the round's rules (K=2: about 1,850 scenarios, 131 CPU-seconds).
DEPTH = float(os.environ.get("GRADNODE_SIM_DEPTH", "1"))


def seeds(n: int) -> range:
    """The first n x DEPTH seeds, at least one."""
    return range(max(1, round(n * DEPTH)))


SEEDS = 100


def test_the_same_seed_gives_the_same_run() -> None:
    sc = virtual.Scenario(peers=8, rounds=15, seed=7, late_p=0.1)
    a, b = virtual.run(sc), virtual.run(sc)
    a.pop("wall_s"), b.pop("wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    liars = virtual.Scenario(peers=8, rounds=8, seed=7, late_p=0.1, liars=((0, "equivocate"), (2, "censor")))
    a, b = virtual.run(liars), virtual.run(liars)
    a.pop("wall_s"), b.pop("wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert virtual.run(virtual.Scenario(peers=8, rounds=15, seed=8, late_p=0.1))["events"] != a["events"] or \
        virtual.run(virtual.Scenario(peers=8, rounds=15, seed=8, late_p=0.1))["virtual_s"] != a["virtual_s"]


@pytest.mark.parametrize("peers", [3, 6])
def test_with_timely_records_every_peer_applies_the_same_set_every_round(peers: int) -> None:
    """Safety, checked after every applied round: with every record delivered within a fraction of the
    grace period, no two peers on one chain apply different sets, and nobody re-syncs."""
    for seed in seeds(SEEDS):
        out = virtual.run(virtual.Scenario(peers=peers, rounds=10, seed=seed, late_p=0.0))
        assert out["violations"] == [] and out["resyncs"] == 0 and out["final_hashes"] == 1, f"seed={seed}: {out}"


def test_records_late_as_often_as_the_dhts_split_no_round() -> None:
    """Safety with the DHT's late records (1 in 100 reaches a reader up to 8 s late): every honest peer that
    applies a round on a chain applies the same set, in every seed. A report the DHT hid from one reader past its
    grace moved an update listed by half the witnesses across the majority, and that peer applied another set:
    16 peers, 20 rounds, seeds 2 and 3 (and 0, 5, 6, 7): 1-2 violations each. A peer now asks the missing
    witnesses for their reports before it counts (round.AskWitnesses at the grace's end), counts every report on
    its chain in a round with no ledger, and waits for a witness whose update it saw announced though its
    record is out of sight. Without the ask, seed 11 splits 3 rounds (3, 7 and 16 one each)."""
    from gradnode.protocol import round as core

    for seed in (2, 3, *seeds(20)):
        out = virtual.run(virtual.Scenario(peers=16, rounds=20, seed=seed))
        assert out["violations"] == [] and out["final_hashes"] == 1 and out["waited_out"] == 0, f"seed={seed}: {out}"
    decide = core.RoundCore._decide

    def never_asks(self: core.RoundCore, now: float) -> list:  # as if the missing witnesses were asked already
        self.asked_at, self.ask_until = max(self.asked_at, self.reported_at), -math.inf
        return decide(self, now)

    unmoved = core.RoundCore.unmoved
    core.RoundCore._decide = never_asks  # type: ignore[method-assign]
    core.RoundCore.unmoved = lambda self, missing: True  # type: ignore[method-assign]  # and counts at once
    try:
        out = virtual.run(virtual.Scenario(peers=16, rounds=20, seed=11))
    finally:
        core.RoundCore._decide, core.RoundCore.unmoved = decide, unmoved  # type: ignore[method-assign]
    assert out["violations"], "without the ask and the unmoved count no late report split a round: the " \
                              "scenario no longer tests it"


def test_a_big_swarm_split_in_half_with_churn_applies_every_round_one_way() -> None:
    """64 peers, 40 rounds: a 32|32 split from round 10 healed at round 20, two kills with restarts, a late joiner
    and a 5x straggler. Each side trains on as its own swarm; on each side every round is applied one way (151
    violations before the ask, 2 in round 0 before a round with no ledger counted every report), and the run
    ends on one hash."""
    half = ",".join(map(str, range(32))), ",".join(map(str, range(32, 64)))
    faults = f"partition:{half[0]}|{half[1]}@r10,heal@r20,kill:3@r5,restart:3@r8,kill:40@r12,restart:40@r16," \
             "join:60@r3,slow:7x5"
    out = virtual.run(virtual.Scenario(peers=64, rounds=40, seed=11, **scenario.parse_faults(faults, 64)))
    assert out["violations"] == [] and out["final_hashes"] == 1 and not out["stalled"], out


def test_no_count_ends_while_the_missing_reports_could_move_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same 64-peer scenario, seed 39: in round 12 the fetches of the 32-63 side queued past the deadline,
    so each peer verified only its own update. One peer counted its own report alone and applied its update;
    31 others counted 31 one-update reports and applied none (30 violations). A count ends now only when the
    reports still missing cannot move its set (round.RoundCore.unmoved). Since a fetcher waits on a random copy
    under way, not all on the first, seed 39 no longer queues so; seeds 12, 13 and 14 split a round without the
    rule."""
    from gradnode.protocol import round as core

    half = ",".join(map(str, range(32))), ",".join(map(str, range(32, 64)))
    faults = scenario.parse_faults(f"partition:{half[0]}|{half[1]}@r10,heal@r20,kill:3@r5,restart:3@r8,"
                                  "kill:40@r12,restart:40@r16,join:60@r3,slow:7x5", 64)
    out = virtual.run(virtual.Scenario(peers=64, rounds=40, seed=12, **faults))
    assert out["violations"] == [] and out["final_hashes"] == 1 and not out["stalled"], out
    monkeypatch.setattr(core.RoundCore, "unmoved", lambda self, missing: True)
    out = virtual.run(virtual.Scenario(peers=64, rounds=40, seed=12, **faults))
    assert out["violations"], "without the rule the scenario splits no round: it no longer tests it"


def test_a_report_that_comes_late_can_split_a_round_and_the_hash_check_repairs_it() -> None:
    """The rules are not safe in every case when the DHT hides records: in the run's first round (no ledger yet),
    a peer that saw neither a witness's member record, nor its announcement, nor its report by its second count
    does not know the witness exists, and with one report fewer it may apply another set. With 1 record in 10
    late, 1 seed in 100 of 6 peers (67) splits round 0 so. In every seed the hash check re-syncs the minority,
    and the run ends on one hash (liveness)."""
    split_seeds = []
    for seed in seeds(SEEDS):
        out = virtual.run(virtual.Scenario(peers=6, rounds=10, seed=seed, late_p=0.1))
        assert out["final_hashes"] == 1 and out["rounds_to_converge"] is not None, f"seed={seed}: {out}"
        assert out["resyncs"] >= 1 or not out["violations"], f"seed={seed}: {out}"  # repaired, not by luck
        if out["violations"]:
            split_seeds.append(seed)
    assert split_seeds, "no late report ever split a round: the scenario no longer tests the repair"


SPLITS = {"2|2": (4, ((0, 1), (2, 3))), "3|5": (8, ((0, 1, 2), (3, 4, 5, 6, 7))), "2|2|1": (5, ((0, 1), (2, 3), (4,)))}


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_a_split_swarm_trains_on_and_merges_onto_one_hash_within_a_few_rounds_of_the_heal(split: str) -> None:
    """The network splits at round 3 and heals at round 12 of 30; records live 9 s (heartbeats every 3 s), as
    in the process test of a partition. Each side trains on as its own swarm (two chains); after the heal
    every peer sees both chains, the one more peers follow wins (a tie: the lowest id), and the others adopt
    its state (chain.Follow). With timely records, in every seed: one hash at the end, no stall, within 3
    rounds of the heal (5 for 3|5). A cut falling mid-round loses the records in flight, and two peers of one
    side can then apply different sets of that round (a violation, like a late record's): the hash check
    repairs it. Measured over 60 seeds: 2|2 and 2|2|1 within 2 rounds; 3|5 within 5 (1: 13 seeds, 2: 9, 3: 16,
    4: 20, 5: 2). The 3|5 figure is the node's: a peer that sits a round out observes it and applies it with the
    round before, then hands its chores over once (Peer._hand_off_chores), so that round's look at the chains is
    lost, and the minority sits many rounds out after the heal (431 peer-rounds of rounds 12-20 in the 60 seeds).
    A simulator that checked the hash after every apply, kinder than the node, merged 3|5 within 2 rounds."""
    peers, groups = SPLITS[split]
    bound = 5 if split == "3|5" else 3
    ks = []
    for seed in seeds(SEEDS // 2):
        out = virtual.run(virtual.Scenario(peers=peers, rounds=30, seed=seed, late_p=0.0, record_ttl_s=9.0,
                                           partition=groups, partition_at=3, heal_at=12))
        assert out["final_hashes"] == 1 and not out["stalled"] and out["waited_out"] == 0, f"seed={seed}: {out}"
        assert out["rounds_to_converge"] is not None and out["rounds_to_converge"] <= bound, f"seed={seed}: {out}"
        assert out["resyncs"] >= min(len(g) for g in groups), f"seed={seed}: {out}"  # the losers moved over
        ks.append(out["rounds_to_converge"])
    print(f"{split}: rounds from the heal to one hash, max {max(ks)}, mean {sum(ks) / len(ks):.2f}")


def test_peers_past_a_round_hold_no_round_open_for_one_left_behind() -> None:
    """A peer left behind after a healed split (late records split its side's last rounds, and it was repaired
    later than the others) waits in its round for the live trainers' announcements. The ones two rounds past
    it will never announce in it. Counted (``View.ahead`` left out of the view: the rule before), some seeds
    see honest peers wait out max_wait_s on a round while the others run on (in the process test, one pair
    of a split did so while the other ran to the end: the run ended 2|2). With the rule, no seed does."""
    from gradnode.protocol import round as core

    def waited_out(blind: bool) -> list[int]:
        """The seeds in which a peer waited a round out; without the rule, the first such seed is enough (seed 102
        first: since a peer asks the missing witnesses before it counts, 3 of the first 231 seeds wait a round out
        without the rule, 102 among them; 6 of the first 120 did before). With the rule, seeds 93 and 123 too:
        they stalled on two hashes when a round's core, opened again after a re-sync, lost its timer to the old
        one's (test_a_round_core_opened_again_keeps_a_timer_of_its_own)."""
        view = virtual.Simulation._view
        if blind:
            def _view(self: virtual.Simulation, p: virtual.VPeer, r: int) -> core.View:
                v = view(self, p, r)
                return core.View(trainers=v.trainers, counted=v.counted, present=v.present, live=v.live)
            virtual.Simulation._view = _view  # type: ignore[method-assign]
        try:
            found = []
            for seed in (102, *seeds(30)) if blind else (*seeds(30), 93, 123):
                out = virtual.run(virtual.Scenario(peers=4, rounds=30, seed=seed, late_p=0.1, record_ttl_s=9.0,
                                                   partition=((0, 1), (2, 3)), partition_at=3, heal_at=12))
                assert out["final_hashes"] == 1 and not out["stalled"], f"seed={seed} blind={blind}: {out}"
                if out["waited_out"]:
                    found.append(seed)
                    if blind:
                        break
            return found
        finally:
            virtual.Simulation._view = view  # type: ignore[method-assign]

    assert waited_out(blind=False) == []
    assert waited_out(blind=True), "without the rule no seed waited out a round: the scenario no longer tests it"


def test_a_round_core_opened_again_keeps_a_timer_of_its_own() -> None:
    """A peer that re-syncs opens the rounds after the adopted state again, each with a new core. The cores wait
    for time with timers (Wake). Keyed by the peer's generation, the old core's pending timer stood for the new
    core's (an earlier one was kept, a later one dropped), fired for the old core, and the new one, waiting for
    its grace to end with nothing more to read, never decided: seeds 93 and 123 of a healed 2|2 split with late
    records stalled on two hashes. Each core has a timer of its own now."""
    sim = virtual.Simulation(virtual.Scenario(peers=4, rounds=4, seed=0))
    p = sim.peers["p0000"]
    first = sim._open(p, 0, sender=False)
    second = sim._open(p, 0, sender=False)  # opened again, as after a re-sync (the same generation here)
    timed = [args[1] for _, _, fn, args in sim._heap if fn == sim._tick]
    assert p.cores[0] is second and any(c is first for c in timed) and any(c is second for c in timed)


@pytest.mark.parametrize("late_s", [2.0, 4.0, 10.0])
def test_a_peer_that_starts_late_is_in_every_round_within_a_few(late_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer whose process starts 1, 2 or 5 rounds after the others begins at round 0 all the same (here without
    the look for a newer state a starting node makes when a record in sight is ahead: only the cut time and
    abstaining bring it into phase). Seen once in CI under a full suite's load (docs/notes/swarm.md, "Not done yet"): a
    peer 4 s late whose update missed every round of a short run. In the simulator it is in every set from round
    6 on in every seed (measured over 40 seeds: the first set it is in is round 1 at most for 2-3 s, 4 for
    4-6 s, 6 for 10 s, and it misses none after), and the run ends on one hash. Without the cut time
    (round.cut_at None for every peer: inner steps never cut short, and no round sat out for being late) a peer
    4 s late misses a round after round 6 in some of the 20 seeds (3 when measured)."""

    def missing() -> list[int]:
        """The seeds in which the late peer's update is out of a set from round 6 on."""
        out_of_phase = []
        for seed in seeds(20):
            sim = virtual.Simulation(virtual.Scenario(peers=4, rounds=12, seed=seed, late_p=0.0,
                                                      starts=((1, late_s),)))
            out = sim.run()
            sets = sim.peers["p0000"].sets
            assert out["final_hashes"] == 1 and not out["violations"], f"seed={seed}: {out}"
            if not all("p0001" in sets.get(r, ()) for r in range(6, 12)):
                out_of_phase.append(seed)
        return out_of_phase

    assert missing() == []
    if late_s == 4.0:
        monkeypatch.setattr(virtual.core, "cut_at", lambda *a, **k: None)
        assert missing(), "without the cut time the late peer is in phase all the same: the test shows nothing"


CHURN = {"kill and restart": "kill:2@r4,restart:2@r7", "stop": "stop:3@r5",
         "joiners": "join:5@r2,join:6@r2,join:7@r9",
         "all of it": "kill:1@r3,restart:1@r8,join:6@r4,stop:4@r6,kill:7@r10"}


@pytest.mark.parametrize("name", sorted(CHURN))
def test_churn_keeps_every_round_safe_and_the_live_peers_on_one_hash(name: str) -> None:
    """Peers killed (their record goes stale), stopped (they say so), restarted with their disk, or joining
    with nothing: a (re)started peer reads the records for a heartbeat and gets level with the newest state
    offered on the winning chain, replaying the rounds it missed or downloading the state. With timely records,
    in every seed: no violation, the live peers on one hash, nobody waits a round out, and every (re)started
    peer that found the swarm ahead got level one way or the other."""
    restarts = sum(item.startswith(("restart", "join")) for item in CHURN[name].split(","))
    for seed in seeds(SEEDS // 4):
        out = virtual.run(virtual.Scenario(peers=8, rounds=20, seed=seed, late_p=0.0,
                                           **scenario.parse_faults(CHURN[name], 8)))
        assert out["violations"] == [] and out["final_hashes"] == 1 and not out["stalled"], f"seed={seed}: {out}"
        assert out["waited_out"] == 0 and out["downloads"] + out["catchups"] == restarts, f"seed={seed}: {out}"


def test_a_restarted_peer_replays_what_it_missed_within_the_window_and_downloads_beyond_it() -> None:
    """protocol/sync.py's choice, as the node makes it (node/swarm/sync.py): a peer restarted with its disk a few
    rounds behind replays the missed rounds (their updates weigh less than the state); one further behind than
    swarm.catchup_rounds, one with catch-up off, and a joiner with no history download the state. Safe and on
    one hash either way."""
    cases = [("kill:2@r4,restart:2@r7", {}, "catchups"), ("kill:2@r4,restart:2@r7", {"catchup_rounds": 0}, "downloads"),
             ("kill:2@r2,restart:2@r15", {}, "downloads"), ("join:5@r6", {}, "downloads")]
    for spec, extra, how in cases:
        for seed in seeds(5):
            out = virtual.run(virtual.Scenario(peers=8, rounds=20, seed=seed, late_p=0.0, **extra,
                                               **scenario.parse_faults(spec, 8)))
            assert out["violations"] == [] and out["final_hashes"] == 1, f"{spec} {extra} seed={seed}: {out}"
            assert out[how] == 1 and out["downloads"] + out["catchups"] == 1, f"{spec} {extra} seed={seed}: {out}"


LIARS = 30  # seeds per kind of liar


@pytest.mark.parametrize("kind", scenario.WITNESS_LIES)
def test_a_minority_of_lying_witnesses_splits_nothing_and_keeps_out_nothing(kind: str) -> None:
    """Two liars of eight, one of them the lowest id (under the first-in-line rule it led every round), each a
    real core whose reports (or served updates) a policy rewrites: 'censor' lists only its own update,
    'equivocate' sends that lie to half the peers and the honest report to the others, 'withhold' announces
    and never serves. With timely records, in every seed: no two honest peers apply different sets, no
    honest update that every honest peer verified is left out, one hash, and a withheld update is in no set."""
    for seed in seeds(LIARS):
        out = virtual.run(virtual.Scenario(peers=8, rounds=10, seed=seed, late_p=0.0, liars=((0, kind), (5, kind))))
        assert out["violations"] == [] and out["kept_out"] == 0, f"seed={seed}: {out}"
        assert out["final_hashes"] == 1 and out["resyncs"] == 0 and not out["stalled"], f"seed={seed}: {out}"
        if kind == "withhold":
            assert out["liar_rounds"] == 0, f"seed={seed}: {out}"


def test_without_the_witness_rule_the_same_liars_censor_and_split() -> None:
    """The attacks succeeding without the defence: under the rule before witnesses (the lowest-id witness's
    report is the round's set) the same censor keeps honest updates out of every seed's rounds, and the
    same equivocator makes honest peers apply different sets."""
    censored = split = 0
    runs = seeds(LIARS // 3)
    for seed in runs:
        sc = dict(peers=8, rounds=10, seed=seed, late_p=0.0, rule="leader")
        censored += virtual.run(virtual.Scenario(**sc, liars=((0, "censor"),)))["kept_out"] > 0
        split += bool(virtual.run(virtual.Scenario(**sc, liars=((0, "equivocate"),)))["violations"])
    assert censored == len(runs) and split > 0, (censored, split)


CONTENT_SEEDS = 10
SCREENS = {"signflip": {"direction", "reputation"}, "noise": {"direction", "reputation"}, "freerider": {"replay"}}


@pytest.mark.parametrize("kind", scenario.CONTENT_LIES)
def test_updates_that_do_not_help_count_for_little_and_without_the_screens_in_every_round(kind: str) -> None:
    """Robust learning's swarm attacks, one attacker of eight with a valid key and honest tokens, its update
    in the decided sets like anyone's (it reports honestly): 'signflip' sends its update negated, 'noise' a
    random vector of its norm, 'freerider' another peer's update that its previous round applied (which points
    nearly where this round's do: only the replay screen tells it apart). Every honest peer applies the round
    through protocol/screening.py's screens and the reputation table (shared state), as the node does. In
    every seed: the attacker counts in at most a quarter of the rounds (measured over 40 seeds: signflip in
    none, freerider in round 0 only, when it has nothing to copy and sends its own, noise in at most 2 of 16),
    each time left out for its kind's reason, no honest update is screened out, no two honest peers apply
    different sets, one hash. Without the screens ('mean', the rule before them) each counts in every round
    it is decided."""
    honest = 7
    for seed in seeds(CONTENT_SEEDS):
        out = virtual.run(virtual.Scenario(peers=8, rounds=16, seed=seed, late_p=0.0, liars=((3, kind),)))
        assert out["violations"] == [] and out["final_hashes"] == 1 and out["honest_screened"] == 0, f"seed={seed}: {out}"
        assert out["counted"]["p0003"] <= honest * 16 // 4, f"seed={seed}: {out['counted']}"
        assert set(out["liar_screens"]) <= SCREENS[kind], f"seed={seed}: {out['liar_screens']}"
        assert all(n == honest * 16 for q, n in out["counted"].items() if q != "p0003"), f"seed={seed}: {out['counted']}"
    for seed in seeds(CONTENT_SEEDS // 4):
        out = virtual.run(virtual.Scenario(peers=8, rounds=16, seed=seed, late_p=0.0, liars=((3, kind),),
                                           aggregation="mean"))
        assert out["counted"]["p0003"] == out["contributed"]["p0003"] == honest * 16, f"seed={seed}: {out['counted']}"


def test_an_attacker_whose_updates_counted_before_is_banned_by_its_reputation() -> None:
    """The same attackers honest for two rounds first (their updates counted: they are in the contributors
    ledger, so the reputation's strikes count against them): from round 2 on each counts in no round, and the
    noise sender, whose vector passes the direction screen now and then, is then left out by its reputation
    (two strikes in a row ban it) in some seeds. Without the reputation table it would count in those rounds."""
    banned = 0
    for kind in scenario.CONTENT_LIES:
        for seed in seeds(CONTENT_SEEDS // 2):
            out = virtual.run(virtual.Scenario(peers=8, rounds=16, seed=seed, late_p=0.0, liars=((3, kind),),
                                               lies_from=2))
            assert out["violations"] == [] and out["final_hashes"] == 1 and out["honest_screened"] == 0, out
            assert out["counted"]["p0003"] == 2 * 7, f"{kind} seed={seed}: {out['counted']}"  # rounds 0 and 1 only
            assert set(out["liar_screens"]) <= SCREENS[kind], f"{kind} seed={seed}: {out['liar_screens']}"
            banned += out["liar_screens"].get("reputation", 0)
    assert banned > 0, "no attacker was left out by its reputation: the scenario no longer tests the table"


def test_a_mix_of_liars_and_unhelpful_updates_keeps_every_round_safe() -> None:
    """Four attackers of ten in one swarm, each of another kind (a sign-flipper, a noise sender, a free rider
    and an equivocating witness): in every seed, with timely records, no two honest peers apply different
    sets, no honest update is kept out or screened out, one hash, and each unhelpful update counts in at most a
    quarter of the rounds (the equivocator's own update is honest: it counts)."""
    liars = ((3, "signflip"), (5, "noise"), (7, "freerider"), (8, "equivocate"))
    for seed in seeds(CONTENT_SEEDS):
        out = virtual.run(virtual.Scenario(peers=10, rounds=16, seed=seed, late_p=0.0, liars=liars))
        assert out["violations"] == [] and out["kept_out"] == 0 and out["honest_screened"] == 0, f"seed={seed}: {out}"
        assert out["final_hashes"] == 1 and not out["stalled"], f"seed={seed}: {out}"
        assert all(out["counted"][f"p{i:04d}"] <= 6 * 16 // 4 for i in (3, 5, 7)), f"seed={seed}: {out['counted']}"


def test_the_simulator_needs_no_torch() -> None:
    """The simulator runs the real protocol code (the round core, the chain rule, the robust rule's screens)
    with no torch in the process: it imports none."""
    import subprocess
    import sys

    code = ("import sys; from gradnode.node.sim import virtual; "
            "virtual.run(virtual.Scenario(peers=4, rounds=3, liars=((1, 'signflip'),))); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


STRAGGLER_SEEDS = 20


@pytest.mark.parametrize("factor", [5.0, 20.0])
def test_a_straggler_cuts_its_steps_or_sits_rounds_out_and_holds_nobody_up(factor: float) -> None:
    """Peer 2 runs every inner step 5x (20x) slower than the others (`--faults slow:2x5`, the process test of
    a straggler). It cuts its steps short at the round's cut time (round.cut_at) and, when even its fewest steps
    would miss the deadline, sits the round out (round.too_late) and observes it. In every seed: safe, one
    hash, no round waited out, and every other peer's update in every round's set. At 5x it still makes most
    rounds with fewer steps (every round here); at 20x one step outlasts a round: it sits rounds out and its
    late updates make hardly any (1 peer-round in 40 runs of 20 rounds, measured)."""
    slow_in, sat_out = 0, 0
    runs = seeds(STRAGGLER_SEEDS)
    for seed in runs:
        sc = virtual.Scenario(peers=8, rounds=20, seed=seed, late_p=0.0, slow=((2, factor),))
        out = virtual.run(sc)
        assert out["violations"] == [] and out["final_hashes"] == 1 and not out["stalled"], f"seed={seed}: {out}"
        assert out["waited_out"] == 0 and out["resyncs"] == 0, f"seed={seed}: {out}"
        fast = {p: n for p, n in out["contributed"].items() if p != "p0002"}
        assert set(fast.values()) == {sc.peers * sc.rounds}, f"seed={seed}: {fast}"  # in every honest set
        slow_in += out["contributed"]["p0002"] // sc.peers
        sat_out += out["abstained"]
    if factor == 5.0:
        assert 2 * slow_in >= len(runs) * 20, slow_in
    else:
        assert sat_out > 0 and slow_in <= len(runs) * 20 // 20, (sat_out, slow_in)


def test_without_the_cut_time_a_straggler_makes_few_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cut time is what keeps a 5x straggler in the rounds: running all its steps, its update comes
    after the others decided (most rounds); its steps cut at the cut time, it makes them (the test above)."""
    from gradnode.protocol import round as core

    monkeypatch.setattr(core, "cut_at", lambda *a, **k: None)
    slow_in = sum(virtual.run(virtual.Scenario(peers=8, rounds=20, seed=seed, late_p=0.0, slow=((2, 5.0),)))
                  ["contributed"]["p0002"] // 8 for seed in range(10))
    assert slow_in < 10 * 20 // 2, slow_in


@pytest.mark.parametrize("drift", [1.0, 5.0])
def test_clocks_a_few_seconds_apart_keep_every_round_safe(drift: float) -> None:
    """Every peer's wall clock off by up to 1 s (5 s): announcements' ages and records' expiry are read on
    the reader's clock from the writer's stamps, as the DHT does. With timely records, in every seed: safe,
    one hash, no round waited out. (At 20 s apart the deadlines differ enough between peers to split rounds,
    and a peer whose clock runs a record ttl ahead sees every record expired: docs/notes/swarm.md, "Not done".)"""
    for seed in seeds(STRAGGLER_SEEDS):
        out = virtual.run(virtual.Scenario(peers=8, rounds=20, seed=seed, late_p=0.0, drift_s=drift))
        assert out["violations"] == [] and out["final_hashes"] == 1 and out["waited_out"] == 0, f"seed={seed}: {out}"


def test_swizzle_clogging_ends_on_one_hash_within_a_few_rounds_of_the_last_unclog() -> None:
    """FoundationDB's swizzle-clogging: from round 3 a random half of the 28 links between 8 peers clog one every
    2 s (what they carry waits), then unclog one every 2 s in another order. Peers then see different records:
    rounds split (the known weakness of today's rule, as with late records) and the hash check re-syncs the
    minority. In every seed: no stall, no round waited out, one hash at the end, and the last re-sync within
    4 rounds of the last unclog. Measured over 200 seeds: 4 in seed 30, 2 in 5, 1 in 13, 0 in the rest. The worst
    was 5 (seeds 5 and 143) when the simulator's look after a hash mismatch took a state of any round, often the
    one a round before the newest (records lag), and the round after it then had to come over links still
    clogged; the node's look takes a state of its own round on (Sync.level), and so does the simulator's: it
    waits for that state (2,206 looks found none at first in the 200 seeds, 89 with a state of any round), and
    the runs take 117 virtual seconds on average against 97 (the hash check's findings also wait for the next
    hand-off, as the node's). The worst was 9 when a peer that found no state offer stalled for max_wait_s
    instead of reading the offers again, as the node does, and 6 in seed 14 when a hash mismatch's look kept
    the winners of its start, who had moved on, instead of reading the winning chain afresh at each read."""
    splits = 0
    for seed in seeds(15):
        out = virtual.run(virtual.Scenario(peers=8, rounds=30, seed=seed, late_p=0.0, record_ttl_s=9.0, swizzle_at=3))
        assert out["final_hashes"] == 1 and not out["stalled"] and out["waited_out"] == 0, f"seed={seed}: {out}"
        assert out["rounds_to_converge"] is not None and out["rounds_to_converge"] <= 4, f"seed={seed}: {out}"
        splits += bool(out["violations"])
    assert splits, "no round split: the clogging no longer tests the repair"


def test_sybil_keys_move_no_peer_when_only_contributors_vote() -> None:
    """16 keys of the attacker's making (the process tests' 'sybilvotes'): they never send an update, publish
    'training' member records on a chain of hashes nobody holds and report those hashes every round: more
    votes than the 8 honest peers. Counted one per key ('everyone'), they pull the honest peers off their
    chain in every seed, towards a state nobody offers (the peers stall looking for it). Counted one per
    recent contributor (the contributors ledger, as the node), nobody moves. Their records hold no deadline
    off either (Membership.counted: only senders and announcers); in round 0, before anyone sent, they count
    toward the anchor, and the deadline falls a round and a window after the first announcement at the latest
    (``RoundCore.deadline``): without that, round 0 was waited out by all 8 peers in every seed (max_wait_s)."""
    for seed in seeds(10):
        sc = dict(peers=8, rounds=20, seed=seed, late_p=0.0, sybils=16)
        out = virtual.run(virtual.Scenario(**sc, votes="contributors"))
        assert out["violations"] == [] and out["final_hashes"] == 1 and out["resyncs"] == 0, f"seed={seed}: {out}"
        assert out["no_offer"] == 0 and out["waited_out"] == 0, f"seed={seed}: {out}"
        assert virtual.run(virtual.Scenario(**sc, votes="everyone"))["no_offer"] > 0, f"seed={seed}"


def test_a_peer_that_forked_alone_in_round_0_counts_the_peers_working_beside_it() -> None:
    """Votes counted by the contributors ledger alone (``votes='ledger'``, the node's rule before): in seed 234 of a
    healed 2|2 split with late records (seed 15 before the missing witnesses were asked before a count; 1 seed of
    the first 235 now), a peer applied another set than the others in round 0 (itself and
    peer 2), trained alone on its own chain from then on and ended the run on a second hash: its ledger named
    only itself and peer 2, so the chain the three others followed had one vote against its own one, and the
    tie went its way. Counting the senders whose updates it verified too (protocol/votes.py, the node's rule
    now), the others' chain has three votes and it follows them; every seed of the sweep ends on one hash,
    and the sybil keys, which send no update, still move nobody (the test above)."""
    sc = virtual.Scenario(peers=4, rounds=30, late_p=0.1, record_ttl_s=9.0, partition=((0, 1), (2, 3)),
                          partition_at=3, heal_at=12, seed=234)
    before = virtual.run(replace(sc, votes="ledger"))
    assert before["final_hashes"] == 2 and before["rounds_to_converge"] is None, before
    for seed in (234, *seeds(4)):
        out = virtual.run(replace(sc, seed=seed, votes="contributors"))
        assert out["final_hashes"] == 1 and out["rounds_to_converge"] is not None, f"seed={seed}: {out}"


def test_a_flood_of_records_far_ahead_holds_no_round_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 keys of the attacker's making (the process tests' 'flood') publish 'training' member records 1000
    rounds ahead every heartbeat and never send an update. By the node's rule (round.view_of) a record two or
    more rounds past the round holds nothing open, and only the last round's senders and this round's
    announcers count toward a deadline: no round is waited out, every seed safe and on one hash. Counting
    every 'training' record in sight as keeping up (the rule before), two thirds of the 'live' trainers never
    announce, no deadline falls, and nearly every round waits out max_wait_s (92 of 96 peer-rounds, seed 0)."""
    sc = dict(peers=8, rounds=12, late_p=0.0, sybils=16, sybils_ahead=1000, votes="contributors")
    for seed in seeds(5):
        out = virtual.run(virtual.Scenario(**sc, seed=seed))
        assert out["violations"] == [] and out["final_hashes"] == 1 and not out["stalled"], f"seed={seed}: {out}"
        assert out["waited_out"] == 0, f"seed={seed}: {out}"
    real = virtual.core.Views.view

    def every_record_counts(self, leaving=(), banned=()):  # type: ignore[no-untyped-def]
        v = real(self, leaving, banned)
        return replace(v, trainers=v.live - {self.me}, counted=v.live - {self.me}, ahead=frozenset())

    monkeypatch.setattr(virtual.core.Views, "view", every_record_counts)
    out = virtual.run(virtual.Scenario(**sc, seed=0))
    assert out["waited_out"] > 2 * sc["peers"], out


@pytest.mark.parametrize("liars,ahead", [("futurestate:3", 10**6), ("futurestate:3", 5),
                                         ("futurestate:3,futurestate:4", 10**6)])
def test_a_state_claimed_ahead_of_the_chain_is_taken_by_no_joiner(liars: str, ahead: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """'futurestate' liars: honest witnesses and updates whose records list, after their chain's tail, a state
    ``ahead`` rounds on under a hash of their making, and offer it. The chain rule groups such a tail with the honest
    chain (they agree on every round they share), so a state any winner lists was trusted. Two rules refuse the
    offers now: no round more than RECORD_LAG past every other voting trainer's record (protocol/sync.py
    beyond_reach: a million rounds on), and only a state more than half of the winners list, or while no verdict
    stands more than half of all tails (chain.adoptable: 5 rounds on, within RECORD_LAG; and two such keys, whose
    made-up round under two hashes leaves every honest tail unsure, so no verdict stands). In every seed no joiner or
    restarted peer takes a made-up state, all three get level, and the run ends on one hash. Without the rules every
    joiner takes a made-up state (40 of 40 seeds measured). Two keys' 'fork' keeps every verdict off: a peer that
    the churn forked stays off the chain to the end (seed 13 of seeds 10-13; 20 and 36 of 40 before the missing
    witnesses were asked before a count) unless a peer off the reports' majority for three looks with no verdict
    re-syncs (chain.Follow, UNSETTLED_LOOKS)."""
    churn = "join:6@r4,kill:2@r3,restart:2@r9,join:7@r12"
    monkeypatch.setattr(sight, "FUTURE_ROUNDS", ahead)

    def run(seed: int) -> dict:
        return virtual.run(virtual.Scenario(peers=8, rounds=20, seed=seed, late_p=0.0,
                                            **scenario.parse_faults(f"{liars},{churn}", 8)))

    for seed in seeds(10):
        out = run(seed)
        assert out["made_up"] == 0 and out["downloads"] + out["catchups"] == 3, f"seed={seed}: {out}"
        assert not out["stalled"] and out["final_hashes"] == 1, f"seed={seed}: {out}"
    if "," in liars:  # seed 13: a forked peer, and no verdict while the two keys lie
        assert run(13)["final_hashes"] == 1
        with monkeypatch.context() as patched:
            patched.setattr(virtual.chain, "UNSETTLED_LOOKS", 10**9)
            assert run(13)["final_hashes"] == 2
    # without the rules: every winner's link trusted, with no verdict every tail's (before, the hash most offerers
    # gave, one liar's offer alone then: protocol/sync.py asks for two now), and no ceiling on the round
    monkeypatch.setattr(virtual.chain, "adoptable", lambda tails, serving=None: {
        link for p in virtual.chain.winner(tails) or tails for link in tails[p]})
    monkeypatch.setattr(virtual.chain, "vouched",
                        lambda tails, peers: {link for p in peers for link in tails.get(p, ())})
    monkeypatch.setattr(virtual.sync_rules, "beyond_reach", lambda offer, reported: False)
    out = run(0)
    assert out["made_up"] == 3 and out["final_hashes"] > 1, out


def test_claims_of_round_time_move_no_pace_but_the_last_rounds_senders() -> None:
    """Every member record claims its writer's round time, and a peer paces a round (its deadline window, its cut
    time) on the lower median of the claims in its sight of the last round's senders (round.pace, as
    Clock.round_seconds). With a 3x straggler, whose steps the cut time cuts: 16 sybil keys claiming an hour a
    round or a hundredth of a second (never senders), or two of eight contributors claiming an hour ('stretch'),
    change nothing: the same virtual time, no round waited out, the same steps cut short. Counting every record
    in sight (``pace='everyone'``), the hour holds every round open until max_wait_s and the hundredth cuts
    nearly every honest peer's steps short. A counted sender whose record claims no time yet (written before its
    first step) counts at the peer's own time (round.pace; test_round_core guards it): taking only the claims made
    (the rule before), the first peer to apply round 0 paced its next round on its own time and the liars'
    hours, claimed before anyone computed, and waited it out; since a peer asks the missing witnesses before it
    counts, the others' records claim their times by then, in every seed of 40 measured."""
    sc = dict(peers=8, rounds=16, late_p=0.0, slow=((3, 3.0),), sybils=16, votes="contributors")
    figures = ("waited_out", "virtual_s", "cut_short", "abstained", "resyncs", "final_hashes")
    stretch = ((1, "stretch"), (5, "stretch"))
    for seed in seeds(3):
        base = virtual.run(virtual.Scenario(**sc, seed=seed))
        assert base["waited_out"] == 0 and base["final_hashes"] == 1 and base["cut_short"] > 0, f"seed={seed}: {base}"
        for kw in (dict(sybil_pace_s=3600.0), dict(sybil_pace_s=0.01), dict(liars=stretch)):
            out = virtual.run(virtual.Scenario(**sc, seed=seed, **kw))
            assert out["violations"] == [] and all(out[k] == base[k] for k in figures), f"seed={seed} {kw}: {out}"
        hour = virtual.run(virtual.Scenario(**sc, seed=seed, sybil_pace_s=3600.0, pace="everyone"))
        assert hour["waited_out"] > sc["peers"] * sc["rounds"], f"seed={seed}: {hour}"
        blink = virtual.run(virtual.Scenario(**sc, seed=seed, sybil_pace_s=0.01, pace="everyone"))
        assert blink["cut_short"] > 4 * base["cut_short"], f"seed={seed}: {blink}"



@pytest.mark.parametrize("update_bytes", [20_000, 2_000_000])
def test_links_of_unequal_speed_that_lose_transfers_keep_every_round_safe(update_bytes: int) -> None:
    """Each peer's link up to 10x slower and 10x farther than the fastest, 5% of transfers lost and retried a
    second later. Safe in every seed, no stall, no round waited out, one hash. (With updates of 2 MB the
    slowest link's update misses every round's deadline: its peer contributes nothing, docs/notes/swarm.md.)"""
    for seed in seeds(10):
        out = virtual.run(virtual.Scenario(peers=8, rounds=20, seed=seed, late_p=0.0, link_spread=10.0, loss_p=0.05,
                                           update_bytes=update_bytes))
        assert not out["violations"] and out["final_hashes"] == 1, f"seed={seed}: {out}"
        assert not out["stalled"] and out["waited_out"] == 0, f"seed={seed}: {out}"


def test_the_virtual_faults_name_what_is_modelled() -> None:
    assert scenario.parse_liars("censor:0, equivocate:3", 8) == ((0, "censor"), (3, "equivocate"))
    assert scenario.parse_liars("signflip:1,freerider:2,noise:5", 8) == ((1, "signflip"), (2, "freerider"), (5, "noise"))
    assert scenario.parse_faults("censor:4,partition:0,1|2,3,4@r3,heal@r9", 5) == {
        "liars": ((4, "censor"),), "partition": ((0, 1), (2, 3, 4)), "partition_at": 3, "heal_at": 9}
    assert scenario.parse_faults("slow:1x5,censor:0,slow:3x2.5", 8) == {"liars": ((0, "censor"),),
                                                                       "slow": ((1, 5.0), (3, 2.5))}
    assert scenario.parse_faults("drift:2,clock:3=-40,clock:1=+5", 4) == {
        "liars": (), "drift_s": 2.0, "clock_off": ((3, -40.0), (1, 5.0))}
    assert scenario.parse_faults("swizzle:1.5@r4", 4) == {"liars": (), "swizzle_at": 4, "swizzle_s": 1.5}
    assert scenario.parse_faults("sybils:16", 4) == {"liars": (), "sybils": 16}
    assert scenario.parse_faults("flood:8", 4) == {"liars": (), "sybils": 8, "sybils_ahead": 1000}
    assert scenario.parse_faults("sybils:16,claims:3600", 4) == {"liars": (), "sybils": 16, "sybil_pace_s": 3600.0}
    assert scenario.parse_liars("stretch:2", 4) == ((2, "stretch"),)
    assert scenario.parse_faults("links:10,loss:0.05", 4) == {"liars": (), "link_spread": 10.0, "loss_p": 0.05}
    assert scenario.parse_faults("kill:2@r4,restart:2@r6,stop:3@r5,join:1@r2", 4)["life"] == (
        ("join", 1, 2), ("kill", 2, 4), ("stop", 3, 5), ("restart", 2, 6))
    for spec, words in [("partition:0,1|2@r3", "list every peer"), ("heal@r4", "needs an earlier partition"),
                        ("partition:0|1,2,3@r2,heal@r3,partition:0,1|2,3@r5", "one partition"),
                        ("kill:bootstrap@r2", "no bootstrap"), ("restart:1@r3", "restart"),
                        ("slow:1x0.5", "1..100"), ("slow:1", "slow:1x5"), ("drift:1,drift:2", "once"),
                        ("clock:3", "clock:P=S"), ("clock:7=1", "does not exist"), ("swizzle", "swizzle@rN"),
                        ("swizzle@r2,swizzle@r5", "once"), ("links:0.5", "links:S"), ("loss:1", "loss:P"),
                        ("claims:x", "claims:S"), ("claims:1.2.3", "claims:S"), ("sybils:2,claims:1,claims:2", "once"),
                        ("claims:5", "add sybils:N")]:
        with pytest.raises(ValueError, match=words):
            scenario.parse_faults(spec, 4)
    for spec, words in [("kill:1@r2", "not modelled"), ("censor:9", "does not exist"),
                        ("censor:1,withhold:1", "has a fault already"), ("censor:0,censor:1", "fewer than half")]:
        with pytest.raises(ValueError, match=words):
            scenario.parse_liars(spec, 8 if "fewer" not in words else 4)


def _repair(p: virtual.VPeer) -> peer_core.Resync:
    """The look the peer core asks for after a hash mismatch, for p at its engine's round."""
    return p.core.resync(peer_core.Reason.HASH_MISMATCH, max(p.hashes) + 1)


def _fork(sim: virtual.Simulation, p: virtual.VPeer, winners: tuple[str, ...]) -> peer_core.Resync:
    """The fork sync towards ``winners``'s chain: the states most of their tails list."""
    return p.core.resync(peer_core.Reason.FORK, max(p.hashes) + 1,
                         virtual.chain.vouched(sim._tails(p, with_me=False), winners))


def test_a_peer_off_the_majority_looks_for_the_chain_the_others_follow_not_its_own() -> None:
    """A peer off the majority by its weight hash looks for a state of the chain the other voting trainers
    follow, read again at each look, and casts no vote itself (statesync.winning_links: its own chain is the
    one in doubt). p0000 on chain A with p0001; p0002-p0004 on chain B, their links to p0000 clogged, so its
    look finds no offer at first. Then the links unclog and p0004's record goes: B is followed by 2 others, A
    by 1. Counting its own vote (2 against 2, A's lowest id) it adopted its own chain's state from p0001. (Records
    living 120 s: the first look's download retries B's unreachable donors for 30 s, and the records stand in
    for ones their writers keep publishing.)"""
    from gradnode.protocol.reputation import Reputation

    sim = virtual.Simulation(virtual.Scenario(peers=5, rounds=4, seed=0, record_ttl_s=120.0))
    p = sim.peers["p0000"]
    chains = {"A": ((0, "a0"), (1, "a1")), "B": ((0, "b0"), (1, "b1"))}
    p.hashes = {-1: "genesis", **dict(chains["A"])}
    for q, name in (("p0001", "A"), ("p0002", "B"), ("p0003", "B"), ("p0004", "B")):
        tail = chains[name]
        p.records[q] = (0.0, tail, (tail, {-1: "genesis", **dict(tail)}, {0: b"", 1: b""}, {}, Reputation(), {}), 2.0)
    sim.clogged = {frozenset(("p0000", q)) for q in ("p0002", "p0003", "p0004")}
    sim._resync(p, 1, _repair(p))
    assert p.hashes[1] == "a1" and sim.no_offer == 1  # B's offers out of reach: it looks again later
    sim.clogged = set()
    del p.records["p0004"]
    while sim._heap and p.resyncs == 0:
        sim.now, _, fn, args = virtual.heapq.heappop(sim._heap)
        fn(*args)
    assert p.resyncs == 1 and p.hashes[1] == "b1", p.hashes


def test_a_donor_is_known_by_its_record_only_and_one_out_of_reach_costs_a_timeout() -> None:
    """A peer looking for a state knows a donor by its member record only, not whether its process runs or its link
    carries (a simulator that left dead and cut-off donors out let a peer take an older state from a live one at
    once: kinder than the node). The node asks the newest round's donors (statesync.fetch): a chunk asked of one
    out of reach goes to the next a stream's open timeout later (transport._OPEN_S), and with none in reach the
    download retries them until it gives up (max(10 s, half the look)); an older round's offer is not taken
    instead."""
    from gradnode.protocol.reputation import Reputation

    old, new = ((0, "b0"),), ((0, "b0"), (1, "b1"))

    def looking() -> tuple[virtual.Simulation, virtual.VPeer]:
        sim = virtual.Simulation(virtual.Scenario(peers=4, rounds=4, seed=0))
        p = sim.peers["p0000"]
        for q, tail in (("p0001", new), ("p0002", new), ("p0003", old)):
            state = (tail, {-1: "genesis", **dict(tail)}, {k: b"" for k, _ in tail}, {}, Reputation(), {})
            p.records[q] = (0.0, tail, state, 2.0)
        return sim, p

    sim, p = looking()
    links = set(new)
    state, dead = sim._newest_offer(p, links)
    assert state[0] == new and dead == 0
    sim.peers["p0001"].alive = False  # p0002 serves round 1's state
    state, dead = sim._newest_offer(p, links)
    assert state[0] == new and dead == 1
    sim.peers["p0002"].alive = False  # both donors of round 1 dead: p0003's round 0 is no answer
    assert sim._newest_offer(p, links) == (None, 2)
    sim.peers["p0001"].alive = sim.peers["p0002"].alive = True
    sim.clogged = {frozenset(("p0000", "p0001"))}  # a cut link is the same
    assert sim._newest_offer(p, links)[1] == 1
    p.records.clear()
    assert sim._newest_offer(p, links) == (None, 0)

    # a re-sync after a hash mismatch (a look of max_wait_s): one dead donor costs its timeout before the download
    sim, p = looking()
    sim.peers["p0001"].alive = False
    sim._resync(p, 0, _repair(p))
    assert p.resyncs == 1 and p.hashes[1] == "b1"
    assert p.busy_until == sim.now + states.OPEN_S + sim._transfer_s(None, p.id, sim.sc.state_bytes)
    # both dead: the download retries them for max(10, 60 / 2) s, and the offers are read again a second later
    sim, p = looking()
    sim.peers["p0001"].alive = sim.peers["p0002"].alive = False
    sim._resync(p, 0, _repair(p))
    assert p.resyncs == 0 and sim.no_offer == 1 and min(t for t, *_ in sim._heap) == 31.0


@pytest.mark.parametrize("committee", [(), (4, 6, 1)])
def test_a_peers_kept_sight_is_its_records_read_anew(committee: tuple[int, ...]) -> None:
    """A peer's sight of the member records is kept between readings and brought up to date with the records
    that changed (Sight._sight): at 1,024 peers re-reading all of them at every change took a fifth of the run.
    At every reading, through a split, kills, a leave, clocks apart and records that expire (9 s), the kept
    sight must equal the records read anew."""
    faults = scenario.parse_faults("partition:0,1,2,3,4,5|6,7,8,9,10,11@r3,heal@r6,kill:2@r2,restart:2@r5,"
                                   "stop:9@r7,join:11@r4", 12)
    sim = virtual.Simulation(virtual.Scenario(peers=12, rounds=10, seed=3, late_p=0.05, record_ttl_s=9.0,
                                              drift_s=2.0, committee=committee, **faults))
    kept, readings = sim._sight, 0

    def checked(p: virtual.VPeer) -> tuple[dict, dict]:
        nonlocal readings
        got = kept(p)
        anew = sim._read_sight(replace(p, records=dict(p.records)))
        assert got == anew, (sim.now, p.id)
        readings += 1
        return got

    sim._sight = checked
    out = sim.run()
    assert readings > 1000 and out["violations"] == [] and out["final_hashes"] == 1, (readings, out)


@pytest.mark.parametrize("committee", [(), (4, 6, 1)])
def test_a_peers_kept_views_and_cut_times_are_the_ones_made_anew(committee: tuple[int, ...]) -> None:
    """A peer keeps its view of a round (round.Views) and brings it up to date with the records that moved
    and the announcers that came; it keeps a round's cut time while what it is made of stays. At 512 peers,
    making both anew at every poll took a fifth of the run. Through a split, kills, a leave, clocks apart
    and records that expire (9 s), each must equal the one made anew from the records."""
    faults = scenario.parse_faults("partition:0,1,2,3,4,5|6,7,8,9,10,11@r3,heal@r6,kill:2@r2,restart:2@r5,"
                                   "stop:9@r7,join:11@r4", 12)
    sim = virtual.Simulation(virtual.Scenario(peers=12, rounds=10, seed=3, late_p=0.05, record_ttl_s=9.0,
                                              drift_s=2.0, committee=committee, compute_s=6.0, **faults))
    kept_view, kept_cut, checks = sim._view, sim._cut_at, collections.Counter()

    def view(p: virtual.VPeer, r: int) -> core.View:
        got = kept_view(p, r)
        anew = core.view_of(sim._sight(p)[1], p.id, r, announced=sim._announced(p, r), workers=p.senders,
                            voters=p.voters or ())
        assert got == anew, (sim.now, p.id, r)
        checks["views"] += 1
        return got

    def cut_at(p: virtual.VPeer, r: int, predict: bool, pace: float) -> float | None:
        got = kept_cut(p, r, predict, pace)
        p.cut = None
        assert got == kept_cut(p, r, predict, pace), (sim.now, p.id, r)
        checks["cuts"] += 1
        return got

    sim._view, sim._cut_at = view, cut_at
    out = sim.run()
    assert checks["views"] > 1000 and checks["cuts"] > 500, checks
    assert out["violations"] == [] and out["final_hashes"] == 1, out


def test_the_simulators_hash_check_is_the_nodes_allies_count_and_a_mismatch_takes_its_own_rounds_state() -> None:
    """The simulator's hash check reads what the node's does (one that read less gave kinder figures):
    - a report of round r by a peer that moved to our chain since, holding our state of r, counts for our hash
      (protocol/peer.py off_majority: the 'f' pair's report would win a 2-2 tie by the lowest id, but p0001 follows our
      'a' chain now);
    - after a hash mismatch the look takes a state of the peer's own newest round on (Sync.level, sync.lowest_round):
      a peer that applied round 1 off the majority does not take round 0's state, as a lost fork does;
    - the findings are acted on at the next apply's hand-off (Peer._hand_off_chores), not at once."""
    from gradnode.protocol.reputation import Reputation

    sim = virtual.Simulation(virtual.Scenario(peers=4, rounds=30, seed=0))
    me = sim.peers["p0003"]
    a, f = ((10, "a10"), (11, "a11"), (12, "a12")), ((10, "f10"), (11, "f11"), (12, "f12"))
    me.hashes.update(a)
    for q, tail, reported in (("p0000", f, "f11"), ("p0001", a, "f11"), ("p0002", a, "a11")):
        me.records[q] = (0.0, tail, None, 2.0)
        me.weights[11][q] = reported
    me.weights[11]["p0003"] = "a11"
    got = sim._read_check(me, 11)
    assert peer_core.off_majority(got.reports, got.mine, got.chains, 11, me.id) is None  # 'a11' wins
    me.hold("p0001", (0.0, f, None, 2.0))  # still on the 'f' chain: its report counts as it stands, and wins
    got = sim._read_check(me, 11)
    assert peer_core.off_majority(got.reports, got.mine, got.chains, 11, me.id) == "f11"

    # the look after a mismatch: p0000 applied round 1 on a chain of its own; only round 0's state is offered
    sim = virtual.Simulation(virtual.Scenario(peers=4, rounds=30, seed=0))
    p = sim.peers["p0000"]
    p.hashes.update({0: "b0", 1: "x1"})
    old = ((0, "b0"),)
    for q in ("p0001", "p0002", "p0003"):
        p.records[q] = (0.0, old, (old, {-1: "genesis", 0: "b0"}, {0: b""}, {}, Reputation(), {}), 2.0)
    sim._resync(p, 1, _repair(p))
    assert p.resyncs == 0 and sim.no_offer == 1  # it reads the offers again until round 1's state is offered
    sim._resync(p, 1, _fork(sim, p, ("p0001", "p0002", "p0003")))
    assert p.resyncs == 1 and max(p.hashes) == 0  # a lost fork takes the winners' state, whatever its round

    # acted on a round later: the check of round r handed over at the apply of r + 1 is settled at the next
    sim = virtual.Simulation(virtual.Scenario(peers=4, rounds=30, seed=0))
    p = sim.peers["p0000"]
    settled: list[int] = []
    sim._settle_check = lambda p_, r, found: settled.append(r)  # type: ignore[method-assign]
    sim._check(p, 4)
    assert settled == [] and p.chores is not None and p.chores.round == 4
    sim._check(p, 5)
    assert settled == [4] and p.chores.round == 5
    p.busy_until = sim.now + 30.0  # a look for a state that found none holds the main loop: read after it
    sim._check(p, 7)
    assert settled == [4, 5] and p.chores is None
    sim.now = 30.0
    sim._hand_off(p, 7, p.gen)
    assert p.chores is not None and p.chores.round == 7
    sim._check(p, 28)  # the run's last round applied (29): the drain settles both at once
    assert settled == [4, 5, 7, 28] and p.chores is None



def test_asking_the_witnesses_waits_for_those_out_of_reach_and_a_liar_serves_its_lie() -> None:
    """A peer that asks the missing witnesses for their reports (AskWitnesses, Agreement.ask: a stream each) hears
    the ones in reach, a liar telling it what its policy tells it over the DHT (a simulator that served the
    liar's honest report instead hid the lie), and goes on when every stream has ended: the transport asks again
    a witness that served nothing (dead, cut off, a key with no process behind it, or holding no report yet)
    until the ask's deadline."""
    sim = virtual.Simulation(virtual.Scenario(peers=4, rounds=4, seed=0))
    p, q = sim.peers["p0000"], sim.peers["p0001"]
    c = virtual.core.RoundCore(sim.sc.params, 0, p.id, frozenset(), True, "genesis", 2.0, 0.0)
    held = q.cores[0] = virtual.core.RoundCore(sim.sc.params, 0, q.id, frozenset(), True, "genesis", 2.0, 0.0)
    pairs = ((p.id, "aa" * 16), (q.id, "bb" * 16))
    honest = held.reports[q.id] = virtual.core.Report(q.id, "genesis", virtual.pack(pairs), digest=virtual.pack(pairs))
    heard: list[tuple[float, list]] = []
    sim._asked = lambda p_, c_, got: heard.append((sim.now, got))  # type: ignore[method-assign]

    def ask(witnesses: tuple[str, ...], deadline: float) -> tuple[float, list]:
        heard.clear()
        sim._heap.clear()
        sim.now = 2 * sim.sc.latency_s  # asked at 0, answered a round trip later
        sim._answer(p, c, witnesses, deadline)
        while sim._heap and not heard:
            sim.now, _, fn, args = virtual.heapq.heappop(sim._heap)
            fn(*args)
        return heard[0]

    assert ask(("p0001",), 5.0) == (2 * sim.sc.latency_s, [honest])  # every witness heard: at once
    sim.peers["p0002"].alive = False
    for witnesses in (("p0001", "p0002"), ("p0001", "s0000"), ("p0001", "p0003")):  # dead, sybil, no report
        assert ask(witnesses, 5.0) == (5.0, [honest])  # the deadline
    sim.clogged = {frozenset(("p0000", "p0001"))}
    assert ask(("p0001",), 5.0) == (5.0, [])  # a cut link: nothing heard
    sim.clogged = set()
    q.lie = "censor"  # its report as its policy rewrites it, published the simulator's way
    sim._publish(q, held, pairs)
    lie = virtual.core.Report(q.id, "genesis", virtual.pack(pairs[1:]), digest=virtual.pack(pairs[1:]))
    assert ask(("p0001",), 5.0)[1] == [lie]


def test_a_restarted_peer_reads_what_reaches_it_after_it_starts() -> None:
    """A peer reads what reached it at its polls (a mailbox per poll). The DHT holds a record for whoever reads
    it: one that reaches a peer after its process (re)started is read at its next poll, as any other; one that
    came while it was down, and its dead process's own fetch, are not. (The restart emptied the mailbox once:
    81 of 84 entries dropped over 24 restarts had arrived after it, weight reports among them.)"""
    sim = virtual.Simulation(virtual.Scenario(peers=2, rounds=1, seed=0, late_p=0.0))
    a, b = sim.peers["p0000"], sim.peers["p0001"]
    got: list[tuple[str, float]] = []
    b.alive, b.mail = False, {}  # killed, as _churn does
    sim._post(b, 1.0, a, lambda q, now: got.append(("came while down", now)))
    sim._post(b, 3.0, a, lambda q, now: got.append(("came after the restart", now)))
    sim._post(b, 3.0, None, lambda q, now: got.append(("the dead process's fetch", now)))
    sim.now = 2.0
    sim._start(b, fresh=False)
    while sim._heap and sim._heap[0][0] <= 4.0:
        sim.now, _, fn, args = virtual.heapq.heappop(sim._heap)
        fn(*args)
    assert got == [("came after the restart", 3.0)], got


def test_a_peer_waits_for_a_second_trainer_before_its_first_round() -> None:
    """Peer._wait_for_peers: no peer trains alone by accident. With first rounds shorter than a record's way (the
    small model of `bench traffic`, 0.2 s of steps), peers that started at once decided round 0 alone, each its
    own update, and split it (17 of 20 seeds); waiting until swarm.min_peers trainers are in sight, none does."""
    def split(min_peers: int) -> list[int]:
        return [seed for seed in seeds(20) if virtual.run(virtual.Scenario(
            peers=4, rounds=6, seed=seed, compute_s=0.2, min_peers=min_peers,
            params=virtual.core.Params(min_deadline_s=1.0, max_wait_s=120.0)))["violations"]]

    assert split(2) == []
    assert split(1), "peers that start at once no longer split round 0: the scenario no longer tests the wait"
