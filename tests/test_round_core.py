"""The round's rules as a pure state machine (protocol/round.py): events in, actions out, time explicit."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gradnode.protocol import round as rc
from gradnode.protocol.records import pack, unpack

P = rc.Params(min_deadline_s=2.0, deadline_slack=1.5, commit_grace_s=3.0, max_wait_s=60.0)
PEERS = ["a", "b", "c", "d", "e"]


def core(me: str = "a", eligible: tuple[str, ...] = tuple(PEERS), sender: bool = True) -> rc.RoundCore:
    c = rc.RoundCore(P, 7, me, frozenset(eligible), sender, "base", 2.0, 0.0)
    others = frozenset(p for p in PEERS if p != me)
    c.step(rc.Members(0.0, rc.View(trainers=others, counted=others, present=others, live=frozenset(PEERS))))
    return c


def report(w: str, senders: list[str], base: str = "base") -> rc.Report:
    fps = pack((s, f"d{s}") for s in senders)
    return rc.Report(w, base, fps, digest=fps)


def kinds(actions: list) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_collect_ends_when_everyone_is_verified_and_the_report_lists_what_was() -> None:
    c = core()
    c.own_update(0.0, "da")
    for s in PEERS[1:4]:
        c.step(rc.Announced(0.1, s, 0.1))
        c.step(rc.Verified(0.2, s, f"d{s}"))
    assert c.phase is rc.Phase.COLLECT  # e has not sent yet: the deadline is not reached
    out = c.step(rc.Verified(0.3, "e", "de"))
    assert c.phase is rc.Phase.DECIDING and c.collect_why is rc.CollectEnd.EVERYONE
    assert [a for a in out if isinstance(a, rc.PublishReport)][0].pairs == tuple((s, f"d{s}") for s in PEERS)


def test_the_deadline_falls_a_window_after_half_the_live_trainers_announced() -> None:
    c = core()
    c.own_update(0.0, "da")
    c.step(rc.Announced(0.5, "b", 0.5))
    assert c.deadline() is None
    c.step(rc.Announced(1.0, "c", 1.0))  # 3 of 5: the anchor is the third first sighting
    assert c.deadline() == 1.0 + 2.0
    out = c.step(rc.Tick(2.9))
    assert c.phase is rc.Phase.COLLECT and kinds(out)[-1] == "Wake" and out[-1].at == 3.0
    c.step(rc.Tick(3.0))  # b and c were never verified: the awaited fetches have ended (none started)
    assert c.phase is rc.Phase.DECIDING and c.collect_why is rc.CollectEnd.DEADLINE


def test_a_peer_cuts_its_steps_half_way_to_the_deadline_and_abstains_when_too_slow() -> None:
    """The cut time (node/swarm/clock.py reads it): half way from the round's first announcement to its
    deadline; before half the live trainers announced it, predicted from the previous round's deadline plus a
    median round, less half a window; nothing to go by: None (no cut)."""
    window, round_s = rc.window_s(P, 2.0), 2.0  # 2 s: min_deadline_s
    seen = {"b": 10.0, "c": 10.5, "d": 11.0}
    assert rc.cut_at(seen, 5, window, round_s) == 13.0 - 0.5 * (13.0 - 10.0)  # deadline 11 + 2 (3rd of 5)
    assert rc.cut_at({"b": 10.0}, 5, window, round_s) is None
    previous = ({"b": 8.0, "c": 8.2, "d": 8.4}, 5)  # the previous round's deadline: 10.4
    assert rc.cut_at({"b": 10.0}, 5, window, round_s, previous) == 10.4 + 2.0 - 1.0
    assert rc.cut_at({}, 5, window, round_s, ({}, 5)) is None
    # one more step of 0.3 s started at 11.3 ends past a cut at 11.5; at 11.1 it does not
    assert rc.past_cut(11.3, 0.3, 11.5) and not rc.past_cut(11.1, 0.3, 11.5) and not rc.past_cut(99.0, 1.0, None)
    # its fewest steps (2 of 0.5 s) do not fit before the cut: it sits the round out; one that fits does not
    assert rc.too_late(11.0, 0.5, 2, 11.5) and not rc.too_late(10.0, 0.5, 2, 11.5)
    assert not rc.too_late(11.0, 0.0, 2, 11.5)  # no step measured yet: never


def test_the_set_is_what_a_strict_majority_of_the_reports_lists() -> None:
    c = core()
    c.own_update(0.0, "da")
    for s in PEERS[1:]:
        c.step(rc.Verified(0.1, s, f"d{s}"))
    # a censoring witness leaves d out, another lists only its own: d stays in (4 of 5 list it), e too
    c.step(rc.ReportSeen(0.2, report("b", ["a", "b", "c", "d", "e"])))
    c.step(rc.ReportSeen(0.2, report("c", ["a", "b", "c", "d", "e"])))
    c.step(rc.ReportSeen(0.2, report("d", ["a", "b", "c", "d", "e"])))
    out = c.step(rc.ReportSeen(0.3, report("e", ["e"])))
    decided = [a for a in out if isinstance(a, rc.Decided)]
    assert decided and decided[0].how is rc.HowDecided.ALL_REPORTED and decided[0].witnesses == 5
    assert decided[0].fps == pack((s, f"d{s}") for s in PEERS)


def _all_verified_and_e_unreported() -> tuple[rc.RoundCore, float]:
    """Every update verified, every witness but 'e' reported: the core and its grace's end."""
    c = core()
    c.own_update(0.0, "da")
    for s in PEERS[1:]:
        c.step(rc.Verified(0.1, s, f"d{s}"))
    for w in "bcd":
        c.step(rc.ReportSeen(0.2, report(w, PEERS)))
    return c, c.reported_at + max(P.commit_grace_s, 2.0) + rc.POLL_S


def test_a_missing_witness_is_waited_for_up_to_the_grace_then_asked() -> None:
    c, grace_end = _all_verified_and_e_unreported()
    assert c.phase is rc.Phase.DECIDING
    assert not any(isinstance(a, rc.Decided) for a in c.step(rc.Tick(grace_end - 0.01)))
    out = c.step(rc.Tick(grace_end))  # asked first: the DHT may hide a report from one reader for seconds
    assert [a.witnesses for a in out if isinstance(a, rc.AskWitnesses)] == [("e",)] and c.decided is None
    out = c.asked(grace_end + 0.5, [report("e", PEERS)])
    assert [(a.how, a.witnesses) for a in out if isinstance(a, rc.Decided)] == [(rc.HowDecided.ASKED, 5)]


def test_a_peer_that_asked_a_missing_witness_and_heard_nothing_counts_what_it_has() -> None:
    """An ask that never comes back (the shell lost it) holds the round one ask's wait, no longer."""
    c, grace_end = _all_verified_and_e_unreported()
    c.step(rc.Tick(grace_end))
    assert c.decided is None and not kinds(c.step(rc.Tick(c.ask_until - 0.01))).count("Decided")
    out = c.step(rc.Tick(c.ask_until))
    assert [(a.how, a.witnesses) for a in out if isinstance(a, rc.Decided)] == [(rc.HowDecided.GRACE, 4)]


def test_a_second_different_report_is_equivocation_and_the_witness_is_dropped() -> None:
    c = core()
    c.step(rc.ReportSeen(0.1, report("b", PEERS)))
    out = c.step(rc.ReportSeen(0.2, report("b", ["b"])))
    assert kinds(out)[0] == "Equivocated" and "b" in c.banned and "b" not in c.reports
    c.step(rc.ReportSeen(0.3, report("b", PEERS)))  # never counted again
    assert "b" not in c.reports


def test_reports_on_another_chain_never_count() -> None:
    c = core()
    c.step(rc.ReportSeen(0.1, report("b", PEERS, base="other")))
    assert c.reports == {}


def test_settle_counts_a_report_that_came_after_the_first_count() -> None:
    c = core()
    c.own_update(0.0, "da")
    for s in PEERS[1:]:
        c.step(rc.Verified(0.1, s, f"d{s}"))
    c.step(rc.ReportSeen(0.2, report("b", ["a", "b", "c"])))
    c.step(rc.ReportSeen(0.2, report("c", ["a", "b", "c", "d"])))
    grace_end = c.reported_at + 3.0 + rc.POLL_S
    c.step(rc.Tick(grace_end))  # d and e are asked, and answer nothing
    c.asked(grace_end, [])  # a, b, c counted: d is listed by 2 of 3 -> in; e by 1 -> out
    assert c.decided is not None and c.decided.witnesses == 3
    first = c.decided.fps
    c.step(rc.ReportSeen(grace_end + 1, report("d", ["a", "b", "c"])))
    c.step(rc.ReportSeen(grace_end + 1, report("e", ["a", "b", "c"])))
    fps, n = c.settle()
    assert n == 5 and fps != first and fps == pack((s, f"d{s}") for s in "abc")


def d_listed_by_two_of_three() -> rc.RoundCore:
    """Every peer announced and verified, and d is listed by 2 of the 3 reports counted: d's and e's reports, both
    announced and in sight, could still move it."""
    c = core()
    c.own_update(0.0, "da")
    for s in PEERS[1:]:
        c.step(rc.Announced(0.1, s, 0.1))
        c.step(rc.Verified(0.1, s, f"d{s}"))
    c.step(rc.ReportSeen(0.2, report("b", ["a", "b", "c"])))
    c.step(rc.ReportSeen(0.2, report("c", ["a", "b", "c", "d"])))
    return c


def test_no_count_stands_while_the_missing_reports_could_move_it() -> None:
    """A count ends only when the reports still missing cannot change its set. Found at 64 peers (seed 39, round
    12 of a split): one peer counted its own report alone and applied its update, while 31 peers counted 31
    reports listing only their own and applied none. Here d is listed by 2 of 3 counted reports: in by 2 of 3, but
    d's and e's reports, both announced and in sight, could leave it at 2 of 5, out."""

    c = d_listed_by_two_of_three()
    assert not c.unmoved(2) and c.unmoved(0)
    grace_end = c.reported_at + 3.0 + rc.POLL_S
    out = c.step(rc.Tick(grace_end))
    assert [a.witnesses for a in out if isinstance(a, rc.AskWitnesses)] == [("d", "e")]
    c.asked(grace_end, [])  # nothing came back: the set could still move, so nothing is decided
    c.step(rc.Tick(c.ask_until))
    assert c.decided is None
    out = c.step(rc.Tick(c.asked_at + c.window))  # asked again a window later
    assert "AskWitnesses" in kinds(out) and c.decided is None
    c.step(rc.ReportSeen(grace_end + 3, report("d", ["a", "b", "c"])))  # d at 2 of 4, one still out: moved
    assert c.decided is None
    out = c.step(rc.ReportSeen(grace_end + 3, report("e", ["a", "b", "c", "d"])))
    assert [(a.how, a.witnesses) for a in out if isinstance(a, rc.Decided)] == [(rc.HowDecided.ALL_REPORTED, 5)]
    assert c.decided.fps == pack((s, f"d{s}") for s in "abcd")  # d listed by a, c and e: 3 of 5
    # with no report coming at all, max_wait_s ends the wait, as it does for a round with nothing to count
    late = d_listed_by_two_of_three()
    late.step(rc.Tick(grace_end))  # asked, and nothing comes back
    late.step(rc.Tick(late.reported_at + P.max_wait_s))
    assert late.decided is not None and late.decided.how is rc.HowDecided.MAX_WAIT


def test_an_ask_that_took_its_whole_wait_hands_the_turn_back_to_the_shell() -> None:
    """The next ask comes a window after the last one ended, so the shell reads the DHT in between. Found in a
    real 4-peer split (tests/test_partition.py, in CI): an ask of a cut witness takes its whole wait, a window;
    the core then asked again at once from ``asked``, the shell's loop never returned to read the member records,
    so the cut witness stayed in sight, and the count held its round to max_wait_s (60 s) while the other side
    ran to the end of the run."""
    c = d_listed_by_two_of_three()
    grace_end = c.reported_at + 3.0 + rc.POLL_S
    asks = [a for a in c.step(rc.Tick(grace_end)) if isinstance(a, rc.AskWitnesses)]
    assert asks and c.decided is None
    now = grace_end + asks[0].wait_s  # the ask took its whole wait, and nothing came back
    for _ in range(3):
        assert "AskWitnesses" not in kinds(c.asked(now, [])), "asked again before the shell read the DHT"
        now += c.window + 0.01
        asks = [a for a in c.step(rc.Tick(now)) if isinstance(a, rc.AskWitnesses)]
        assert asks, "the missing witnesses are asked again a window after the last ask ended"
        now += asks[0].wait_s
    assert c.decided is None


def test_a_restarted_witness_counts_the_report_it_made_before_the_restart() -> None:
    """Back from a restart within a round it reported on, a peer reports no more (a report is final), but the
    report it made stands for everyone, itself included. Found in an attacker's review: it left its own report
    out, so d, listed by a, b and c (3 of 5, in for every other peer), was 2 of 4 for it, and it applied
    another set. A plain kill and restart did it, with no attacker."""
    sets = []
    for restarted in (False, True):
        c = rc.RoundCore(P, 7, "a", frozenset(PEERS), True, "base", 2.0, 0.0, witness=not restarted)
        others = frozenset(PEERS) - {"a"}
        c.step(rc.Members(0.0, rc.View(trainers=others, counted=others, present=others, live=frozenset(PEERS))))
        c.own_update(0.0, "da")
        for s_ in PEERS[1:]:
            c.step(rc.Announced(0.1, s_, 0.1))
            c.step(rc.Verified(0.1, s_, f"d{s_}"))
        for w, listed in (("a", "abcd"), ("b", "abcd"), ("c", "abcd"), ("d", "abc"), ("e", "abc")):
            c.step(rc.ReportSeen(0.2, report(w, list(listed))))
        assert c.decided is not None, restarted
        sets.append(c.settle())
    assert sets[0] == sets[1] == (pack((s_, f"d{s_}") for s_ in "abcd"), 5), sets


def test_peers_two_rounds_past_the_round_hold_no_deadline_off() -> None:
    """A peer left behind (after a healed split, or a long stall) is alone in its round: the others are two or
    more rounds past it and will never announce in it. Counted as live, they kept the deadline from falling
    (half the live trainers never announced) and it waited out max_wait_s on every round."""
    c = core()
    c.step(rc.Members(0.0, rc.View(trainers=frozenset("bcde"), counted=frozenset("bcde"), present=frozenset("bcde"),
                                   live=frozenset(PEERS), ahead=frozenset("bcde"))))
    out = c.own_update(0.0, "da")  # the only one live in this round: it has everyone's update, its own
    assert c.phase is rc.Phase.DECIDING and c.collect_why is rc.CollectEnd.EVERYONE and "PublishReport" in kinds(out)
    stuck = core()  # the same peer with nobody ahead: it waits for the others' announcements
    stuck.own_update(0.0, "da")
    assert stuck.deadline() is None
    # a key whose record claims a far round but that announced here is in the round: it anchors the deadline
    # only as one that is waited for (found in review: a far claim plus an announcement pulled deadlines in)
    lied = core()
    lied.step(rc.Members(0.0, rc.View(trainers=frozenset("bcde"), counted=frozenset("bcde"), present=frozenset("bcde"),
                                      live=frozenset(PEERS), ahead=frozenset("b"))))
    lied.step(rc.Announced(0.0, "b", 0.0))
    lied.own_update(0.1, "da")
    assert lied._live()[1] == set(PEERS) and lied.deadline() is None  # 2 of 5 announced: no anchor yet


def test_a_round_nobody_on_our_chain_will_report_on_is_given_up() -> None:
    """Both peers of one side of a healed split sat a round out; the other side reported on its own chain. No
    report on ours will come: the round is given up two windows past the grace ('passed by'), not waited
    out to max_wait_s while the others run on."""
    c = core(me="a", eligible=("a", "b", "c", "d"), sender=False)  # an observer: it sat the round out
    c.step(rc.Members(0.0, rc.View(trainers=frozenset("bcd"), counted=frozenset("bcd"), present=frozenset("bcd"),
                                   live=frozenset("abcd"))))
    c.step(rc.ReportSeen(0.1, rc.Report("b", "base", abstain=True)))  # its ally sat it out too
    for w in "cd":  # the other side announced and reported, on its chain
        c.step(rc.Announced(0.1, w, 0.1))
        c.step(rc.ReportSeen(0.2, report(w, ["c", "d"], base="their chain")))
    assert c.elsewhere == {"c", "d"} and c.reports.keys() == {"b"}
    c.step(rc.Tick(c.deadline()))  # collecting ends at the deadline: it fetches nothing (an observer here)
    assert c.phase is rc.Phase.DECIDING
    out = c.step(rc.Tick(c.reported_at + max(P.commit_grace_s, c.window) + rc.POLL_S + c.window))
    assert [(a.how, a.fps) for a in out if isinstance(a, rc.Decided)] == [(rc.HowDecided.PASSED_BY, None)]
    assert c.decided is not None and c.decided.how is rc.HowDecided.PASSED_BY


def test_a_leaving_peer_gives_its_last_round_up_once_every_other_trainer_left_too() -> None:
    """A whole swarm stopped at once (Ctrl+C on `gradnode simulate`, `docker compose down`): every peer announced
    its departure, so nobody reports on the round in flight. A leaving peer with no report to count and no
    other trainer in sight gives the round up at the grace's end ('all left'), instead of waiting out
    max_wait_s past the supervisor's grace; one with another trainer still in sight waits for its report."""
    def leaving_alone(others_train: bool) -> rc.RoundCore:
        c = core(me="a", eligible=("a", "b", "c"))
        c.own_update(0.0, "da")
        c.step(rc.Announced(0.1, "b", 0.1))
        c.stop_reporting()  # the signal: its 'leaving' record is out
        live = frozenset("ab" if others_train else "a")
        c.step(rc.Members(0.5, rc.View(trainers=live - {"a"}, counted=live - {"a"}, present=frozenset("abc"),
                                       live=live, leaving=frozenset("bc") - live)))
        if c.phase is rc.Phase.COLLECT:  # b's update is awaited until the deadline's window ends (never verified)
            c.step(rc.Tick(c.deadline() + c.window))
        assert c.phase is rc.Phase.DECIDING and not c.reports  # it publishes nothing once leaving
        return c

    c = leaving_alone(others_train=False)
    grace_end = c.reported_at + max(P.commit_grace_s, c.window) + rc.POLL_S
    assert not [a for a in c.step(rc.Tick(grace_end - 0.01)) if isinstance(a, rc.Decided)]  # a late report may come
    out = c.step(rc.Tick(grace_end))
    assert [(a.how, a.fps) for a in out if isinstance(a, rc.Decided)] == [(rc.HowDecided.ALL_LEFT, None)]
    c = leaving_alone(others_train=True)  # b trains on: its report is waited for, then counted
    assert c.step(rc.Tick(c.reported_at + 30.0)) and c.phase is rc.Phase.DECIDING
    out = c.step(rc.ReportSeen(31.0, report("b", ["a", "b"])))
    assert [a.how for a in out if isinstance(a, rc.Decided)] == [rc.HowDecided.ALL_REPORTED]


def test_a_key_that_never_sent_holds_no_deadline_off_and_votes_nothing() -> None:
    """Who keeps up and who counts, from the member records in sight (``view_of``): a flood of 'training'
    records of keys that never sent an update (z, y) are trainers, so the round runs to its deadline while
    they are in sight, but they are not counted: they never keep a deadline from falling, and they hold no
    given-up round open. One counts once it announces in the round. Before any round is applied, all count."""
    records = {"a": (7, True), "b": (7, True), "c": (6, True), "z": (7, True), "y": (9, True), "w": (1, False)}
    v = rc.view_of(records, "a", 7, workers={"a", "b", "c"}, voters={"a", "b", "c"})
    assert v.trainers == {"b", "c", "z"} and v.counted == {"b", "c"}  # y claims round 9: past this one
    assert v.ahead == {"y"} and v.voting == {"a", "b", "c"} and v.live == {"a", "b", "c", "z", "y"}
    assert v.present == {"a", "b", "c", "z", "y"}  # w's record is more than four rounds behind
    v = rc.view_of(records, "a", 7, announced={"z", "y"}, workers={"a", "b", "c"})
    assert v.trainers == {"b", "c", "z", "y"} and v.counted == {"b", "c", "z", "y"}  # it announced: in the round
    assert v.voting == v.live  # no contributor known: everyone votes
    v = rc.view_of(records | {"c": (3, True)}, "a", 7)  # before any round: everyone, a silent record too
    assert v.trainers == v.counted == {"b", "c", "z"}
    v = rc.view_of(records | {"c": (3, True)}, "a", 7, workers={"c"})  # a sender of the last round keeps up
    assert v.trainers == {"b", "c", "z"} and v.counted == {"c"}
    c = core(sender=False)  # a round whose only other trainers are uncounted keys: waited to the deadline
    c.step(rc.Members(0.0, rc.view_of({"a": (7, True), "z": (7, True)}, "a", 7, workers={"a"})))
    c.step(rc.Tick(1.0))
    assert c.phase is rc.Phase.COLLECT and c._live() == ({"z"}, set())


def test_keys_that_never_announce_hold_the_first_round_open_for_a_round_and_a_window_at_most() -> None:
    """Before anyone contributed (round 0) every 'training' record counts toward the deadline's anchor: 4 peers
    and 8 keys of the attacker's making (they never announce) make k = 6 of 12, never reached. The deadline
    falls at the latest a round and a window after the first announcement (here 0.5 + 2 + 2), not
    max_wait_s later; in later rounds the records of keys that never sent count for nothing anyway (above)."""
    honest = {p: (0, True) for p in ("a", "b", "c", "d")}
    keys = {f"z{i}": (0, True) for i in range(8)}

    def first_round(view: rc.View) -> rc.RoundCore:
        c = rc.RoundCore(P, 0, "a", frozenset(), True, "genesis", 2.0, 0.0)
        c.step(rc.Members(0.0, view))
        c.own_update(0.5, "da")
        for s in ("b", "c", "d"):
            c.step(rc.Announced(1.0, s, 1.0))
            c.step(rc.Verified(1.1, s, f"d{s}"))
        return c

    view = rc.view_of(honest | keys, "a", 0)
    assert view.fresh and len(view.counted) == 11
    c = first_round(view)
    assert c.deadline() == 0.5 + 2.0 + 2.0
    c.step(rc.Tick(4.5))
    assert c.phase is rc.Phase.DECIDING and c.collect_why is rc.CollectEnd.DEADLINE
    held = first_round(replace(view, fresh=False))  # the rule before: the anchor alone
    assert held.deadline() is None
    held.step(rc.Tick(59.9))
    assert held.phase is rc.Phase.COLLECT
    c = first_round(rc.view_of(honest, "a", 0))  # honest peers alone: the anchor falls first, as before
    assert c.deadline() == 1.0 + 2.0
    assert not rc.view_of(honest | keys, "a", 1).fresh  # a later round: never (a key counts once it sent)


def test_the_pace_is_the_lower_median_of_the_counted_trainers() -> None:
    assert rc.pace({"a": 1.0, "b": 4.0}, {"a", "b"}, 9.0) == 1.0  # of two, the faster
    assert rc.pace({"a": 1.0, "b": 4.0, "c": 2.0, "z": 0.1}, {"a", "b", "c"}, 9.0) == 2.0  # z: not counted
    assert rc.pace({"a": 0.0}, {"a"}, 9.0) == 9.0  # nobody reports one: our own
    assert rc.pace({"b": 5.0}, {"a", "b"}, 9.0) == 5.0  # a counted trainer out of sight: not counted
    # a counted trainer whose record claims no time yet counts at ours: two claims of an hour made before anyone
    # computed are two of five, not two of three
    assert rc.pace({"me": 2.0, "a": 0.0, "b": 0.0, "x": 3600.0, "y": 3600.0}, {"me", "a", "b", "x", "y"}, 2.0) == 2.0


def test_a_key_that_does_not_vote_holds_no_given_up_round_open() -> None:
    """The round every other trainer passed is given up even while a fresh key's 'training' record is in sight
    at the round (``View.voting``: the recent contributors); counted as one that may still report, it held
    every given-up round to max_wait_s."""
    def left_behind(voting: frozenset[str] | None) -> str:
        c = core(me="a", eligible=("a", "b", "c"), sender=False)
        c.step(rc.Members(0.0, rc.View(trainers=frozenset("z"), counted=frozenset(), present=frozenset("bcz"),
                                       live=frozenset("abcz"), ahead=frozenset("bc"), voting=voting)))
        for w in "bc":
            c.step(rc.Announced(0.0, w, 0.0))
        c.step(rc.Tick(c.deadline()))
        end = c.reported_at + max(P.commit_grace_s, c.window) + rc.POLL_S + c.window
        c.step(rc.Tick(end))
        return c.decided.how if c.decided else c.phase
    assert left_behind(frozenset("abc")) is rc.HowDecided.PASSED_BY
    assert left_behind(None) is rc.Phase.DECIDING  # every live key holds it open


def test_a_witness_banned_elsewhere_is_never_counted() -> None:
    """A witness another peer proved to equivocate (``View.banned``) is dropped from the reports in hand and
    never counted again: b's report would keep e out otherwise."""
    c = core()
    for w, senders in (("b", ["a", "b"]), ("c", ["a", "b", "e"]), ("d", ["a", "b", "e"])):
        c.step(rc.ReportSeen(0.0, report(w, senders)))
    others = frozenset("bcde")
    c.step(rc.Members(0.1, rc.View(trainers=others, counted=others, present=others, live=frozenset(PEERS),
                                   banned=frozenset("b"))))
    c.step(rc.ReportSeen(0.2, report("b", ["a", "b"])))
    assert "b" not in c.reports and c.banned == {"b"}


def test_one_poll_is_judged_as_a_whole() -> None:
    """An announcement and its verification seen in one poll, after the deadline fell: collecting ends with
    the update in the report (judged event by event, it ended between the two and left it out)."""
    def started() -> rc.RoundCore:
        c = core(eligible=("a", "b"))
        c.step(rc.Members(0.0, rc.View(trainers=frozenset("b"), counted=frozenset("b"), present=frozenset("b"),
                                       live=frozenset("ab"))))
        return c
    poll = [rc.Announced(9.0, "a", 0.0), rc.Verified(9.0, "a", "da"), rc.Announced(9.0, "b", 0.0),
            rc.Verified(9.0, "b", "db"), rc.Tick(9.0)]
    out = started().steps(poll)
    assert [a.pairs for a in out if isinstance(a, rc.PublishReport)] == [(("a", "da"), ("b", "db"))]
    one_by_one, c = [], started()
    for ev in poll:
        one_by_one += c.step(ev)
    assert [a.pairs for a in one_by_one if isinstance(a, rc.PublishReport)] == [()]


def test_a_waiting_core_never_asks_to_be_woken_now_and_never_asks_in_vain() -> None:
    """Nobody reports (the witnesses are cut off): the core is woken only when a rule can change its mind, never
    at once (a wake at 'now' once made the shell poll the DHT every 10 ms until max_wait_s), and it never asks
    the witnesses in the step that ends the round (the shell would block on answers nobody counts)."""
    c = core(me="a", eligible=("a", "b", "c"), sender=False)
    c.step(rc.Members(0.0, rc.View(trainers=frozenset("bc"), counted=frozenset("bc"), present=frozenset("bc"),
                                   live=frozenset("abc"))))
    now, turns = 0.0, 0
    out = c.step(rc.Tick(now))
    while c.phase is not rc.Phase.DECIDED:
        wake = [a.at for a in out if isinstance(a, rc.Wake)]
        assert wake and wake[0] > now, (now, out)
        now, turns = wake[0], turns + 1
        out = c.step(rc.Tick(now))
        assert not ({"AskWitnesses", "Decided"} <= set(kinds(out))), out
    assert c.decided.how is rc.HowDecided.MAX_WAIT and turns < 60, turns


def test_a_peer_that_leaves_counts_no_report_of_its_own() -> None:
    """A witness that announced its departure publishes nothing, so it must not count its own report either:
    with it, x would be in its set (its and a's lists: 2 of 3) while nobody else's has it (1 of 2)."""
    def decided(leaving: bool) -> bytes | None:
        c = core(me="m", eligible=("m", "a", "b"))
        c.step(rc.Members(0.0, rc.View(trainers=frozenset("ab"), counted=frozenset("ab"), present=frozenset("ab"),
                                       live=frozenset("mab"))))
        if leaving:
            c.stop_reporting()
        c.step(rc.Verified(0.0, "x", "dx"))
        c.own_update(0.0, "dm")
        c.step(rc.ReportSeen(0.1, report("a", ["x"])))
        c.step(rc.ReportSeen(0.1, report("b", [])))  # most others reported: collecting ends
        c.step(rc.Tick(30.0))
        return c.decided.fps if c.decided else None
    assert unpack(decided(False)) == unpack(pack([("x", "dx")]))
    assert decided(True) == pack([])


@settings(max_examples=200, deadline=None)
@given(order=st.permutations(list(range(7))), seed=st.integers(0, 3))
def test_the_same_events_give_the_same_actions(order: list[int], seed: int) -> None:
    """Determinism: one event sequence, run twice on fresh cores, gives identical actions; and once this
    peer verified every update (its own report is fixed), the set it settles on does not depend on the
    order in which the same reports and announcements arrived."""
    verified: list = [rc.Verified(0.1, s, f"d{s}") for s in PEERS[1:]]
    rest: list = [rc.ReportSeen(0.2, report(w, PEERS[: 2 + (i + seed) % 4])) for i, w in enumerate(PEERS[1:])]
    rest += [rc.Announced(0.05, s, 0.05) for s in PEERS[1:4]]

    def play(evs: list) -> tuple[list, tuple | None]:
        c = core()
        out = c.own_update(0.0, "da")
        for e in evs:
            out += c.step(e)
        out += c.step(rc.Tick(100.0))
        return out, c.settle()

    shuffled = verified + [rest[i] for i in order]
    first, settled = play(shuffled)
    assert play(shuffled) == (first, settled)
    assert settled == play(verified + rest)[1]


class CoreMachine(RuleBasedStateMachine):
    """Any schedule of announcements, fetches, reports (some on another chain, some rewritten) and ticks: the
    core keeps its invariants after every step, and hypothesis shrinks a failing schedule to a minimal one."""

    def __init__(self) -> None:
        super().__init__()
        self.c = core()
        self.now = 0.0
        self.actions = list(self.c.own_update(0.0, "da"))
        self.decisions = 0

    def _step(self, event) -> None:
        out = self.c.step(event)
        self.actions += out
        self.decisions += sum(isinstance(a, rc.Decided) for a in out)
        for a in out:
            if isinstance(a, rc.Wake):
                assert a.at >= self.now  # a wake-up is never in the past
            if isinstance(a, rc.Decided) and a.fps is not None:
                counted = self.c._counted()
                assert len(counted) == a.witnesses
                for fp in unpack(a.fps):  # in the set: listed by a strict majority of the reports counted
                    assert 2 * sum(fp in unpack(r.fps) for r in counted) > len(counted)

    @rule(sender=st.sampled_from(PEERS[1:]), dt=st.floats(0, 2))
    def announce(self, sender: str, dt: float) -> None:
        self.now += dt
        self._step(rc.Announced(self.now, sender, self.now))

    @rule(sender=st.sampled_from(PEERS[1:]), ok=st.booleans())
    def fetch(self, sender: str, ok: bool) -> None:
        self._step(rc.FetchStarted(self.now, sender))
        self._step(rc.Verified(self.now, sender, f"d{sender}") if ok else rc.FetchEnded(self.now, sender))

    @rule(w=st.sampled_from(PEERS[1:]), listed=st.sets(st.sampled_from(PEERS)), chain=st.sampled_from(["base", "x"]))
    def report(self, w: str, listed: set[str], chain: str) -> None:
        self._step(rc.ReportSeen(self.now, report(w, sorted(listed), base=chain)))

    @rule(dt=st.floats(0, 30))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._step(rc.Tick(self.now))

    @invariant()
    def decided_once_and_by_majority(self) -> None:
        assert self.decisions <= 1
        if self.c.decided is not None and self.c.decided.fps:
            assert self.c.phase is rc.Phase.DECIDED
        settled = self.c.settle()
        if settled is None:
            return
        fps, n = settled
        counted = [r for r in self.c.reports.values() if not r.abstain and r.witness in self.c.eligible]
        # every update in the set is listed by a strict majority of the reports it was counted from, and no
        # banned witness or report of another chain is among them
        assert all(r.base == "base" and r.witness not in self.c.banned for r in counted)
        for fp in unpack(fps):
            assert sum(fp in unpack(r.fps) for r in counted) * 2 > len(counted) or n != len(counted)


TestCoreMachine = CoreMachine.TestCase
TestCoreMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_the_core_floor_benchmark_runs_every_core_to_a_decision() -> None:
    """scripts/core_floor.py (the cost of a round's events for N real cores, no network): every core gets
    every other peer's four events and decides, also when a poll brings a core only its own update."""
    import runpy
    from pathlib import Path

    floor = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "core_floor.py"))
    for polls in (4, 16):
        _, events, decided = floor["one_round"](16, polls)
        assert events == 4 * 16 * 15 and decided == 16, polls


def test_what_the_core_counts_follows_the_report_the_shell_published_or_dropped() -> None:
    """The core remembers its counts between changes (``_remembered``); the shell replaces this peer's report with
    the one it published (an adversary's edit included) or drops it (agreement.report), and the count follows
    at once, though neither change moves the counts it is remembered by."""
    c = core()
    c.own_update(0.0, "da")
    for s in PEERS[1:]:
        c.step(rc.Announced(0.1, s, 0.1))
        c.step(rc.Verified(0.2, s, f"d{s}"))
    assert c.phase is rc.Phase.DECIDING
    assert c.count() == (pack((s, f"d{s}") for s in PEERS), 1)
    c.reports["a"] = report("a", ["a"])  # what the shell published: its own update only
    assert c.count() == (pack([("a", "da")]), 1)
    del c.reports["a"]
    c.step(rc.ReportSeen(0.3, report("b", ["a", "b"])))  # as many reports as before, none of them this peer's
    assert c.count() == (pack([("a", "da"), ("b", "db")]), 1)


def _no_ledger_core(view_live: frozenset[str]) -> rc.RoundCore:
    """A round with no ledger (the run's first): its eligible witnesses come from the view when deciding starts."""
    c = rc.RoundCore(P, 0, "a", frozenset(), True, "base", 2.0, 0.0)
    others = view_live - {"a"}
    c.step(rc.Members(0.0, rc.View(trainers=others, counted=others, present=others, live=view_live)))
    return c


def test_with_no_ledger_every_report_on_the_chain_counts() -> None:
    """A late member record hid 'e' from this peer's view; its report reached it. The peers that saw 'e' count
    its report: so must this one, or one report fewer moves an update listed by half across the majority (the
    simulator: 6 peers, 10% of records late, seed 93)."""
    c = _no_ledger_core(frozenset("abcd"))
    c.own_update(0.0, "da")
    for s in "bcd":
        c.step(rc.Verified(0.1, s, f"d{s}"))
    for w in "bcd":
        c.step(rc.ReportSeen(0.2, report(w, ["a", "b", "c", "d"])))
    c.step(rc.ReportSeen(0.3, report("e", ["a", "b", "c", "d", "e"])))
    assert "e" not in c.eligible
    assert c.count() is not None and c.count()[1] == 5


def test_an_announcer_out_of_sight_is_waited_for() -> None:
    """A witness whose member record this peer has not seen (late) but whose update it saw announced is in the
    round: its report is waited for up to the grace (then asked), never taken as absent."""
    c = core()
    c.step(rc.Members(0.0, rc.View(trainers=frozenset("bcd"), counted=frozenset("bcd"), present=frozenset("bcd"),
                                   live=frozenset("abcd"))))
    c.step(rc.Announced(0.05, "e", 0.05))
    c.own_update(0.0, "da")
    for s in "bcde":
        c.step(rc.Verified(0.1, s, f"d{s}"))
    for w in "bcd":
        c.step(rc.ReportSeen(0.2, report(w, PEERS)))
    assert c.phase is rc.Phase.DECIDING and c.decided is None and "e" not in c._absent()


_writers = st.sampled_from([f"k{i}" for i in range(8)] + ["me"])
_record = st.tuples(st.integers(0, 12), st.booleans())


@settings(max_examples=200, deadline=None)
@given(first=st.dictionaries(_writers, _record), round_=st.integers(0, 8), workers=st.sets(_writers),
       voters=st.sets(_writers), announced=st.sets(_writers),
       changes=st.lists(st.tuples(_writers, st.none() | _record, st.sets(_writers, max_size=2)), max_size=12))
def test_a_kept_view_is_the_view_made_anew_after_any_changes(first, round_, workers, voters, announced,
                                                            changes) -> None:
    """round.Views, brought up to date one record or announcer at a time, says what view_of says of the
    records and announcers as they are then."""
    records, here = dict(first), set(announced)
    kept = rc.Views(records, "me", round_, announced=here, workers=workers, voters=voters)
    for writer, record, came in changes:
        if record is None:
            records.pop(writer, None)
        else:
            records[writer] = record
        kept.moved(records, [writer])
        here |= came
        kept.announced(records, here)
        assert kept.view() == rc.view_of(records, "me", round_, announced=here, workers=workers, voters=voters)
