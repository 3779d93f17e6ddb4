"""The round's decision on real transports: the round's core (protocol/round.py) run by its shell
(agreement.py) over real DHT records and streams. Witness reports counted at the deadline and again
before the round is applied, reports read from their witnesses, equivocation proven and shared, and when a
peer stops waiting for a round. Each round here is past collecting at once: its updates were announced a
minute ago (their deadline passed) and verified as each test says."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import transport
from gradnode.node.swarm.agreement import Agreement, Verdict
from gradnode.node.swarm.equivocation import Equivocators
from gradnode.node.swarm.membership import Membership
from gradnode.protocol import round as core
from gradnode.protocol.records import Report, pack

pytestmark = pytest.mark.swarm


@pytest.fixture(autouse=True)
def _every_read_from_the_dht(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests take a round's steps one after another, each read right after the stores before it: every read
    begins after them (in a node a peer's reads of a key within one poll share one: tests/test_transport.py)."""
    monkeypatch.setattr(transport, "READ_SHARE_S", 0.0)


RUN = "run"
BASE = "ab" * 32


def _agreement(members: Membership, me: str, eligible: list[str], *, witness: bool, round_: int = 5,
               grace_s: float = 0.5, equivocators: Equivocators | None = None, max_wait_s: float = 60.0) -> Agreement:
    cfg = SwarmConfig(max_wait_s=max_wait_s, commit_grace_s=grace_s)  # a deadline window of 2 s (min_deadline_s)
    return Agreement(members=members, cfg=cfg, run_id=RUN, round_=round_, me=me, eligible=eligible, witness=witness,
                     round_seconds=1.0, leaving=threading.Event(), base=BASE, equivocators=equivocators)


def _collected(g: Agreement, announced: list[str], verified: list[tuple[str, str]] = ()) -> None:
    """g's round past collecting: ``announced`` announced a minute ago (the deadline passed), ``verified``
    fetched and verified; a witness publishes its report now (what it verified)."""
    now = time.monotonic()
    g.poll(now, [core.Announced(now, s, now - 60.0) for s in announced] +
           [core.Verified(now, s, d) for s, d in verified])
    assert g.core.phase is not core.Phase.COLLECT, g.core.phase


def _decide(agreement: Agreement) -> tuple[Verdict | None, str]:
    """The first count's verdict and how it ended (Agreement.ended): what the tests assert instead of how
    long it took, which depends on the machine's load."""
    return agreement.decide(threading.Event(), lambda: []), agreement.ended


def _members(transports) -> list[Membership]:
    out = [Membership(t, t.identity, RUN, ttl=30.0) for t in transports]
    for m in out:  # everyone's key is known from a member record, as in a run
        assert m.publish(round_=5, training=True, step_seconds=1.0, inner_steps=4, tokens_per_s=1.0, rejected=0,
                         loss=None)
    for m in out:
        m.members(max_age=0.0)
    return out


def _update(peer: str) -> tuple[str, str]:
    return peer, "d" * 64


def test_a_round_every_other_trainer_passed_is_given_up_not_waited_out(trio) -> None:
    """c was left behind at round 16 (it abstained: an observer) while a and b went on on their chain, never
    reporting on 16. c stops waiting once both report rounds of 18 and more and no live peer's report turned
    up in two windows; while one of them is still at 17 (it may yet report on 16) c waits to max_wait_s, as
    before; one peer alone claiming a far round does not end the wait either. A live witness that is not
    among c's eligible ones (c joined: it knows another round's contributors) still counts: giving up comes
    after that fallback (it came before once, and a joiner gave up a round the others had decided)."""
    a, b, c = trio
    ma, mb, mc = (Membership(t, t.identity, RUN, ttl=30.0) for t in trio)
    common = dict(training=True, step_seconds=1.0, inner_steps=4, tokens_per_s=1.0, rejected=0, loss=None)

    both = [a.peer_id, b.peer_id]
    assert ma.publish(round_=17, **common) and mb.publish(round_=21, **common)
    g = _agreement(mc, c.peer_id, both, witness=False, round_=16, max_wait_s=8.0)
    _collected(g, both)
    outcome, ended = _decide(g)
    assert outcome is None and ended is core.HowDecided.MAX_WAIT, ended  # a (at 17) might still report: the full wait

    # b's record is published again too: ttl 30 s, and the full wait above plus a loaded machine's DHT calls
    # could age the first one out (b then no longer live: the wait runs to max_wait_s, a correct 'max wait')
    assert ma.publish(round_=19, **common) and mb.publish(round_=21, **common)
    # both passed it: given up once no live peer's report turned up either (the grace and one more window,
    # about 4 s); a max_wait_s of a minute leaves a loaded machine room to see that before the wait runs out
    g = _agreement(mc, c.peer_id, both, witness=False, round_=16)
    _collected(g, both)
    outcome, ended = _decide(g)
    assert outcome is None and ended is core.HowDecided.PASSED_BY, ended

    assert ma.publish(round_=19, **common) and mb.publish(round_=21, **common)  # live again, as above
    assert mb.write("reports", 16, Report(run_id=RUN, round=16, witness=b.peer_id, base=BASE,
                                          included=pack([_update(b.peer_id)])))
    g = _agreement(mc, c.peer_id, [a.peer_id], witness=False, round_=16)
    _collected(g, both)
    outcome, ended = _decide(g)
    assert outcome is not None and outcome.witnesses == 1 and outcome.fps == pack([_update(b.peer_id)])


def test_a_report_the_dht_does_not_show_is_read_from_its_witness(trio) -> None:
    """After a split heals, the side that adopted the other's chain could not see the winners' reports in the
    DHT (stored once, on nodes its lookups did not reach yet): its observers waited out max_wait_s on a round
    the others had decided, fell behind, and the run ended split (CI, and --faults partition runs with one
    side faster). Every witness also serves its signed report; a peer that sees no report at its grace period
    asks the witnesses. Here a's report is only served, never stored in the DHT: c decides on it within the
    grace period and a fetch. b serving a's report as its own is no report of b's, and counts for nothing.
    The count ends once the served reports leave nothing missing that could move it."""
    from gradnode.protocol.records import report_record_name

    a, b, c = trio
    ma, mb, mc = (Membership(t, t.identity, RUN, ttl=30.0) for t in trio)
    common = dict(training=True, step_seconds=1.0, inner_steps=4, tokens_per_s=1.0, rejected=0, loss=None)
    assert ma.publish(round_=17, **common) and mb.publish(round_=17, **common)
    mc.members(max_age=0.0)
    signed = ma.sign(Report(run_id=RUN, round=16, witness=a.peer_id, base=BASE, included=pack([_update(a.peer_id)])))
    b.blobs.put(report_record_name(RUN, 16, b.peer_id), signed.to_bytes())  # a's report under b's name
    g = _agreement(mc, c.peer_id, [b.peer_id], witness=False, round_=16)
    assert g.ask({b.peer_id}, wait_s=30.0) == [] and g.reports() == {}  # not b's: refused
    a.blobs.put(report_record_name(RUN, 16, a.peer_id), signed.to_bytes())
    # b serves its own report too: with b's report missing, a's alone could be outvoted, and no count stands
    own = mb.sign(Report(run_id=RUN, round=16, witness=b.peer_id, base=BASE,
                         included=pack([_update(a.peer_id), _update(b.peer_id)])))
    b.blobs.put(report_record_name(RUN, 16, b.peer_id), own.to_bytes())
    assert mc.read("reports", 16, Report) == []  # the DHT shows none
    g = _agreement(mc, c.peer_id, [a.peer_id, b.peer_id], witness=False, round_=16, max_wait_s=60.0)
    _collected(g, [a.peer_id, b.peer_id])
    verdict, ended = _decide(g)
    assert verdict is not None and verdict.witnesses == 2 and verdict.fps == pack([_update(a.peer_id)]), ended
    assert ended is core.HowDecided.ASKED, ended  # read from its witness after the grace, not counted at max_wait_s


def test_a_peer_reads_the_dht_while_its_ask_is_out(trio, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ask runs beside the rounds' loop, which goes on reading the DHT: a report that comes that way ends the
    wait at once. Found in the simulator, once its shell was made to wait for each ask as the node's did: with a
    straggler among 8 peers, the others waited up to a window in each round they asked for its report, and in
    one round two fast peers' updates came too late for everyone's set. Here c's ask of b never comes back, and
    b's report reaches c through the DHT meanwhile."""
    a, b, c = trio
    ma, mb, mc = _members(trio)
    ids = [a.peer_id, b.peer_id]
    everything = [_update(a.peer_id), _update(b.peer_id)]
    released = threading.Event()

    async def hanging(jobs, **_):  # b's stream stalls: the ask does not end before the test lets it
        while not released.is_set():
            await asyncio.sleep(0.05)
        return {}

    monkeypatch.setattr(c, "fetch_many_async", hanging)
    try:
        _collected(_agreement(ma, a.peer_id, ids, witness=True), ids, everything)  # a's report, in the DHT
        gc = _agreement(mc, c.peer_id, ids, witness=False)
        _collected(gc, ids)
        end = time.monotonic() + 60.0
        while gc._asking is None and time.monotonic() < end:  # a's report alone could be outvoted: c asks b
            gc.poll(time.monotonic())
            time.sleep(0.05)
        assert gc._asking is not None and gc.core.decided is None
        _collected(_agreement(mb, b.peer_id, ids, witness=True), ids, everything)  # b's report, in the DHT
        verdict, ended = _decide(gc)
        assert not gc._asking.done(), "decided only once the ask ended"
        assert ended is core.HowDecided.ALL_REPORTED and verdict is not None and verdict.fps == pack(everything)
    finally:
        released.set()


def test_a_censoring_witness_keeps_out_nothing_the_others_verified(trio) -> None:
    """All three are eligible and verified all three updates; c reports only its own (the 'lowid' attacker).
    Under the rule before witnesses the round's set was the first-in-line proposer's list, and a censor first
    in line left every other update out (c's list, below). Counting reports, each peer decides all three."""
    a, b, c = trio
    ids = [t.peer_id for t in trio]
    ma, mb, mc = _members(trio)
    everything = [_update(p) for p in ids]
    ga, gb, gc = (_agreement(m, t.peer_id, ids, witness=True) for m, t in ((ma, a), (mb, b), (mc, c)))
    _collected(gc, ids, [_update(c.peer_id)])  # c verified only its own (or says so)
    _collected(ga, ids, everything)
    _collected(gb, ids, everything)
    assert gc.reports()[c.peer_id].included == pack([_update(c.peer_id)])  # the censor's list
    for g in (ga, gb, gc):
        verdict, ended = _decide(g)
        assert verdict is not None and verdict.fps == pack(everything) and verdict.witnesses == 3, ended
        assert ended is not core.HowDecided.MAX_WAIT, ended  # every eligible witness reported: counted, not waited out


def test_a_report_that_came_late_for_one_peer_splits_nobody(trio, monkeypatch: pytest.MonkeyPatch) -> None:
    """c's update reached a in time but not b (a slow fetch): a's report lists a and c, b's lists a and b, and
    c's own all three. b counts at its deadline while c's report is not in sight: from a's and b's reports it
    decides the updates both list, {a}; a, counting all three, decides {a, b, c}, and so does c. Applied as
    counted at the deadline, the round split (the rule before: the one way honest views of a round differ).
    Every peer counts the reports again just before applying the round, a round later: c's report is in for
    b too, and all three apply {a, b, c}."""
    a, b, c = trio
    ids = [t.peer_id for t in trio]
    ma, mb, mc = _members(trio)
    ga, gb, gc = (_agreement(m, t.peer_id, ids, witness=True, grace_s=0.0) for m, t in ((ma, a), (mb, b), (mc, c)))
    full = [_update(p) for p in ids]
    _collected(ga, ids, [_update(a.peer_id), _update(c.peer_id)])
    _collected(gb, ids, [_update(a.peer_id), _update(b.peer_id)])
    first_b, ended = _decide(gb)  # c has not reported yet: b counts a's and b's when its grace period ends
    assert first_b is not None and first_b.fps == pack([_update(a.peer_id)]) and first_b.witnesses == 2, ended
    _collected(gc, ids, full)
    first_a, _ = _decide(ga)
    first_c, _ = _decide(gc)
    assert first_a.fps == first_c.fps == pack(full) != first_b.fps  # the split, as each first count gives it
    # the second count reads the DHT itself, never the answer of a read that began before it (shared reads)
    monkeypatch.setattr(transport, "READ_SHARE_S", 3600.0)
    second_b = gb.settle()
    assert second_b is not None and second_b.fps == pack(full) and second_b.witnesses == 3
    assert ga.settle() is first_a and gc.settle() is first_c  # unchanged where nothing came late


def test_reports_of_keys_outside_the_eligible_witnesses_move_nobody(trio, tmp_path) -> None:
    """a and b are the eligible witnesses (the recent contributors); d and e are keys that never contributed
    (Sybils, or joiners) and report only d's update, twice as many reports as a's and b's agreeing one. c, an
    observer, counts a's and b's: d's update is not in the set, at either count."""
    from gradnode.node.swarm.identity import load_or_create
    from gradnode.node.swarm.transport import Transport

    a, b, c = trio
    extra = []
    try:
        for name in ("d", "e"):
            t = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=a.maddrs()),
                          load_or_create(tmp_path / name))
            extra.append(t)
            t.start()
        d, e = extra
        ma, mb, mc, md, me = _members([a, b, c, d, e])
        both = [a.peer_id, b.peer_id]
        ours = [_update(a.peer_id), _update(b.peer_id)]
        for m, t in ((ma, a), (mb, b)):
            _agreement(m, t.peer_id, both, witness=True).report(ours)
        for m, t in ((md, d), (me, e)):
            _agreement(m, t.peer_id, [d.peer_id, e.peer_id], witness=True).report([_update(d.peer_id)])
        gc = _agreement(mc, c.peer_id, both, witness=False)
        _collected(gc, [a.peer_id, b.peer_id, d.peer_id])
        first, ended = _decide(gc)
        assert first is not None and first.fps == pack(ours) and first.witnesses == 2, ended
        assert ended is not core.HowDecided.MAX_WAIT, ended
        assert gc.settle() is first
    finally:
        for t in extra:
            t.close()


def test_a_witness_that_rewrites_its_report_is_caught_and_no_longer_counted(trio) -> None:
    """b reports; a counts it at the deadline. b then publishes a second, different report for the round (the
    DHT keeps the newest). a's second count, before applying, reads the second version: two reports b signed
    for one round and chain, so a bans b, never counts it again and counts the round without it. c only ever
    read the second version; it learns of the ban from a's equivocation record and checks the proof itself.
    An abstention and a report for one round are two versions too (a witness that sits a round out and then
    reports on it, moving the electorate and its vote)."""
    a, b, c = trio
    ids = [a.peer_id, b.peer_id]
    ma, mb, mc = _members(trio)
    ea, ec = Equivocators(ma, RUN), Equivocators(mc, RUN)
    ga = _agreement(ma, a.peer_id, ids, witness=True, equivocators=ea)
    gb = _agreement(mb, b.peer_id, ids, witness=True)
    both = [_update(a.peer_id), _update(b.peer_id)]
    _collected(ga, ids, both)
    _collected(gb, ids, both)
    first, _ = _decide(ga)
    assert first is not None and first.fps == pack(both) and b.peer_id not in ea
    assert mb.write("reports", 5, Report(run_id=RUN, round=5, witness=b.peer_id, base=BASE,
                                         included=pack([_update(b.peer_id)])))
    gc = _agreement(mc, c.peer_id, ids, witness=False, equivocators=ec)
    assert gc.reports()[b.peer_id].included == pack([_update(b.peer_id)]) and b.peer_id not in ec
    second = ga.settle()
    assert b.peer_id in ea and b.peer_id not in ga.reports()  # no longer counted
    assert second is not None and second.fps == first.fps  # a's own report lists both: the same set
    ec.refresh()  # c learns it from a's equivocation record and checks the proof itself
    assert ec.peers() == [b.peer_id]
    assert b.peer_id not in _agreement(mc, c.peer_id, ids, witness=True, equivocators=ec).reports()
    # a witness that sat round 6 out and then reports on it
    gb6 = _agreement(mb, b.peer_id, ids, witness=True, round_=6)
    ea6 = Equivocators(mc, RUN)
    ga6 = _agreement(mc, c.peer_id, [a.peer_id, c.peer_id], witness=False, round_=6, equivocators=ea6)
    from gradnode.node.swarm.agreement import abstain

    abstain(mb, RUN, 6, b.peer_id)
    assert ga6.abstaining() == {b.peer_id}
    gb6.report(both)
    ga6.reports()
    assert b.peer_id in ea6


def test_a_witness_that_leaves_before_it_reports_says_it_abstains(trio) -> None:
    """A witness that announced its departure reports nothing more; one that had not reported says so once,
    with an abstaining report: else a drawn round whose other reports differ on one update waits for it to
    twice max_wait_s (round.GONE_WAITS), as the others saw it on the round's base."""
    a, b, c = trio
    ma, mb, _ = _members((a, b, c))
    g = _agreement(ma, a.peer_id, [a.peer_id, b.peer_id, c.peer_id], witness=True)
    g.leaving.set()
    g.poll(time.monotonic())
    g.poll(time.monotonic())
    got = mb.read("reports", 5, Report)
    assert [(r.witness, r.abstain) for r in got] == [(a.peer_id, True)], got
    assert not g.core.witness
