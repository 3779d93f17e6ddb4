"""Adversarial peers as real processes with their own keys (`simulate --faults tokens:P,dense:P,slowhold:P`).

Each test asserts what holds whatever the machine's load does to the schedule (issue 22): safety (the honest
peers that finished end on one hash; an update the rules reject is in no decided set), the attacker's
influence bounded by a number (rejections only for the attack's reason, at most a bounded count of them; the
rounds it counted in), and progress in rounds with a wide margin (the honest peers' own updates in at least
half of their peer-rounds; the model learns). How long rounds took, and in exactly which round something happened,
depend on the scheduler: those figures are printed by `gradnode bench swarm`, never asserted here."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import explain


def summary_dir(summary: dict) -> Path:
    return Path(summary["out_dir"])

pytestmark = pytest.mark.swarm

IGNORE_AFTER = 3  # swarm.ignore_after's default


def honest_in_half(summary: dict, metrics_of, honest: range) -> tuple[bool, list]:
    """Progress with a margin a loaded machine keeps: the honest peers' own updates were in at least half of
    their peer-rounds (an update that misses a busy round's deadline is carried by the error feedback into
    the next). Counted over the honest peers together, not each: a peer whose first update missed round 0
    by more than a deadline window can stay out of phase for a whole short run (seen once in CI under a full
    suite's load, with a slow holder in the swarm: one honest peer of three in 0 of 6 rounds, the other two
    in all); that is a liveness gap of the round clock, for the deterministic round core (issue 23) to close
    and test, not a schedule this test can pin. The second value: (peer, round, own_included) for the message."""
    rows = [(i, row["round"], row["own_included"]) for i in honest for row in metrics_of(summary, i)]
    return 2 * sum(own is True for _, _, own in rows) >= len(rows) > 0, rows


def rejected_only_for(by_sender: dict, sender: str, reason: str) -> int:
    """How often ``sender``'s updates were rejected, asserting that each time it was for ``reason``. Bounded:
    after IGNORE_AFTER strikes the sender is ignored for 10 rounds (a run here is shorter), so at most the
    strikes before that and what was in flight with them (pushes_per_round, 3) are counted."""
    got = by_sender.get(sender, {})
    assert set(got) <= {reason}, got
    assert sum(got.values()) <= 2 * IGNORE_AFTER, got
    return sum(got.values())


def adversaries(run_swarm, kinds: list[str], rounds: int, honest: int = 3, **kw) -> tuple[dict, list[dict]]:
    """``honest`` honest peers, then one adversary per entry of ``kinds`` (its kind, optionally @rN): the
    summary and its peers, once the roles are right and the honest peers, all there, ended on one hash.
    Kinds that do not interfere share one swarm: a swarm costs ~25 s to start on 2 cores, a round ~2 s."""
    spec = ",".join(k.replace("@", f":{honest + i}@") if "@" in k else f"{k}:{honest + i}" for i, k in enumerate(kinds))
    summary = run_swarm(peers=honest + len(kinds), rounds=rounds, faults=spec, **kw)
    peers = summary["peers"]
    assert [p["role"] for p in peers] == ["honest"] * honest + [k.split("@")[0] for k in kinds]
    assert summary["live_peers"] == honest and summary["identical_hashes"], explain(summary)
    return summary, peers


def test_updates_the_rules_reject_get_no_weight(run_swarm, metrics_of) -> None:
    """Four attackers whose updates the rules refuse, in one swarm with three honest peers:
    - tokens (peer 3) declares 2^62 tokens, more than a round allows: 'inflated_tokens';
    - dense (peer 4) sends a dense update in a sparse run: 'wrong_codec';
    - pushflood (peer 5) pushes, every round, 6 copies of its update with a forged signature under its own name
      and one under each other peer's name to every peer: pushes of another's update are refused unread, of
      its own 3 a round are read, and each fails its signature before any decoding: 'forged' (its genuine,
      announced update is honest and may count);
    - crossrun (peer 6): the simulator makes the run with a genesis, as `gradnode run init` does (open: no
      authority), and peer 6 keeps the genesis of an earlier run of the same name, config and seed and sends
      as its updates the ones it signed for that run (its own valid signature). The genesis's nonce makes the
      run ids differ: 'replayed' (test_genesis.py shows that without a genesis the same bytes pass).
    Each is refused for its reason only, a bounded number of times (after swarm.ignore_after rejections its
    sender is ignored: nothing more fetched from it), and the refused ones never weigh in a decided set."""
    summary, peers = adversaries(run_swarm, ["tokens", "dense", "pushflood", "crossrun"], 6)
    run = summary_dir(summary)
    assert (run / "genesis.json").exists() and (run / "peer-6" / "earlier-genesis.json").exists()
    bad = {peers[3]["peer"]: "inflated_tokens", peers[4]["peer"]: "wrong_codec", peers[5]["peer"]: "forged",
           peers[6]["peer"]: "replayed"}
    total = dict.fromkeys(bad, 0)
    for i, p in enumerate(peers[:3]):
        log = (run / f"peer-{i}.log").read_text()
        for who, reason in bad.items():
            n = rejected_only_for(p["rejected_by_sender"], who, reason)
            total[who] += n
            if n >= IGNORE_AFTER:  # then ignored: nothing more fetched from it
                assert f"ignoring sender={who}" in log
        rows = metrics_of(summary, i)
        never = {peers[3]["peer"], peers[4]["peer"], peers[6]["peer"]}  # everything they send is refused
        assert all(not never & set(row["senders"]) for row in rows), rows
    assert all(total.values()), total  # each attacker's bytes reached some honest peer and were refused
    progress, own = honest_in_half(summary, metrics_of, range(3))
    assert progress, own
    assert summary["val_loss_last"] < summary["val_loss_first"]


def test_lying_witnesses_keep_out_no_honest_update_and_an_equivocator_is_caught(run_swarm, metrics_of) -> None:
    """Two lying witnesses of five.
    equivocate (peer 3): from round 1 publishes two reports for each round, the second naming only its own
    update, taking turns in the DHT every 0.1 s for a second (peers reading at different moments count
    different versions). Under the rule before witnesses the round's set was one proposer's list: a liar
    first in line made peers apply different sets. A peer that reads both versions, or whose audit finds
    that the deciders counted different versions, holds two reports peer 3 signed for one round: it never
    counts it again, ignores its updates and reports it; the others check that proof and do the same. Once
    all honest peers ignore it, its update is in no round.
    lowid (peer 4): grinds keys for the lowest peer id (under the lowest-id rule it led every round) and from
    round 1 reports only its own update. Under the first-in-line rule it censored every honest update in the
    rounds it led (1 to 5 of 12, measured); an update is now in the round when a strict majority of the
    witnesses' reports lists it, so a minority of witnesses, whatever their ids, keeps out nothing.
    Measured on an idle machine: every honest update in every round, the equivocator caught in rounds 1-3.
    Asserted, with a busy machine's margins: caught before the run ends; no update of it after; in at least
    half the rounds the honest updates are in; the honest peers' own updates in half their peer-rounds."""
    rounds = 12
    summary, peers = adversaries(run_swarm, ["equivocate", "lowid@r1"], rounds)
    liar = peers[3]["peer"]
    honest = {p["peer"] for p in peers[:3]}
    caught = []
    for i in range(3):
        rows = metrics_of(summary, i)
        # every honest update, taken together, in at least half the rounds (under the first-in-line rule the
        # censor emptied every round it led of them)
        assert 2 * sum(len(honest & set(row["senders"])) for row in rows) >= len(honest) * len(rows), rows
        first = next((row["round"] for row in rows if liar in row["ignoring"]), None)
        assert first is not None, f"peer-{i} never caught it"  # caught before the run ends
        caught.append(first)
        log = (summary_dir(summary) / f"peer-{i}.log").read_text()
        assert f"witness={liar[:12]} equivocated" in log, f"peer-{i} ignores it without having checked a proof"
    for i in range(3):  # once every honest peer ignores it, its update is in no round
        later = [row for row in metrics_of(summary, i) if row["round"] > max(caught) + 1]
        assert all(liar not in row["senders"] for row in later), (caught, later)
    progress, own = honest_in_half(summary, metrics_of, range(3))
    assert progress, own
    assert summary["val_loss_last"] < summary["val_loss_first"]


def test_floods_of_member_records_and_sybil_votes_move_no_honest_peer(run_swarm, metrics_of) -> None:
    """Two attackers with keys of their own making, in one swarm with three honest peers (each runs 8 extra
    identities as real DHT nodes: two such attackers are the most two cores carry beside a swarm).
    flood (peer 3): trains honestly and runs 8 more identities (valid keys) that publish 'training' member
    records 1000 rounds ahead every heartbeat and never an update, plus an oversized members value. Counting
    every record, the 'live' trainers need announcements for a deadline that the real peers never give:
    measured before Membership.counted, every round of every honest peer ran to swarm.max_wait_s (20 s
    here): 15.6-22.2 s. Counting only the last round's senders and this round's announcers, round 0 (nobody
    has sent yet: every record counts) still waits, 25 s; rounds 1-4 took 2.4-2.8 s, every honest update in.
    sybilvotes (peer 4): trains honestly and runs 8 more keys that never send an update but report a weight
    hash nobody holds for every round and publish member records following a chain of those hashes: more
    votes than the honest peers, one per key. Votes count one per recent contributor (a peer whose update
    the decided chain applied in the last 64 rounds), so the honest peers neither find their hash off the
    majority nor their chain outvoted: no re-sync, no wait for a state nobody offers. Counted per vote,
    they moved every honest peer every round (a re-sync towards a hash nobody holds).
    The waits depend on the machine's load (`gradnode simulate -n 4 --faults flood:3 --json` prints them,
    comm_wait_s_per_round per peer); asserted is what holds whatever the load: one hash; an honest peer
    moved off its hash in at most a quarter of the rounds (a busy machine can split a round honestly now
    and then, and a re-sync repairs it: the sybils alone would move it every round); the honest peers' own
    updates in at least half their peer-rounds; learning."""
    rounds = 8
    summary, peers = adversaries(run_swarm, ["flood", "sybilvotes"], rounds, extra=["swarm.max_wait_s=20"])
    for i, p in enumerate(peers[:3]):
        log = (summary_dir(summary) / f"peer-{i}.log").read_text()
        # a move: a re-sync begun (the hash check's, the last round's) or a chain adopted; not the line that
        # says its hash differs but its chain wins, so it stays
        moved = log.count("re-syncing") + log.count("adopting theirs")
        assert moved <= rounds // 4 and p["resyncs"] <= rounds // 4, (f"peer-{i} was moved", moved, p["resyncs"])
    progress, own = honest_in_half(summary, metrics_of, range(3))
    assert progress, own
    assert summary["val_loss_last"] < summary["val_loss_first"]


def _counted(rows: list[dict], who: str) -> list[int]:
    """The rounds in which ``who``'s update counted in the aggregate: in the decided set and not screened out
    by the robust rule (a 'small' update counts, in proportion to its norm)."""
    return [row["round"] for row in rows if who in row["senders"] and row["screened"].get(who, "small") == "small"]


def test_updates_that_do_not_help_count_for_little(run_swarm, metrics_of) -> None:
    """Robust learning in the swarm (issue 14): four honest peers and three attackers with valid keys and
    honest tokens: 'signflip' (peer 4) sends its own update negated, 'noise' (peer 5) Gaussian noise through
    the codec at its own update's norm, 'freerider' (peer 6) another peer's update that the previous round
    applied. The default 'robust' aggregation screens the decided set (direction, replays, duplicates) with a
    reputation kept in the shared state. Measured (one attacker of four, 8 rounds): 'signflip' and 'noise'
    screened out for their direction whenever decided, and banned by the reputation from round 1: counted in
    none; 'freerider' screened out as a replay from round 1 (in round 0 it has nothing to copy and sends its
    own): counted once. Without the screen each is counted in every round its update is decided. Asserted:
    every honest peer decides alike, each attacker counts in at most half the rounds, the honest peers keep
    their own updates in at least half their peer-rounds and learn. ('lazy', real training on one fixed batch, is
    counted like an honest update by design: its figures are in `gradnode bench robust`.)"""
    rounds = 8
    summary, peers = adversaries(run_swarm, ["signflip", "noise", "freerider"], rounds, honest=4)
    for bad in peers[4:]:
        counted, hashes = [], []
        for i in range(4):
            rows = metrics_of(summary, i)
            counted.append(set(_counted(rows, bad["peer"])))
            hashes.append({row["round"]: row["hash"] for row in rows})
        # the rounds every honest peer applied itself (none re-synced past them) to the same weights: a round a
        # busy machine split (repaired by a re-sync later) was decided apart on the two sides, as it may be
        both = {r for r in set.intersection(*(set(h) for h in hashes)) if len({h[r] for h in hashes}) == 1}
        assert len({frozenset(c & both) for c in counted}) == 1, (bad["role"], counted)  # decided alike
        assert len(counted[0]) <= rounds // 2, (bad["role"], counted)
    progress, own = honest_in_half(summary, metrics_of, range(4))
    assert progress, own
    assert summary["val_loss_last"] < summary["val_loss_first"]
