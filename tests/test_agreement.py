"""The round's decision on real transports: who leads, and when a peer stops waiting for a round."""

from __future__ import annotations

import threading
import time

import pytest

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.agreement import Agreement
from gradnode.node.swarm.membership import Membership
from gradnode.protocol.records import Proposal

pytestmark = pytest.mark.swarm
RUN = "run"


def _decide(members: Membership, me: str, round_: int, eligible: list[str]) -> tuple[object, float]:
    cfg = SwarmConfig(max_wait_s=12.0, commit_grace_s=0.5)  # a deadline window of 2 s (min_deadline_s)
    agreement = Agreement(members=members, cfg=cfg, run_id=RUN, round_=round_, me=me, eligible=eligible,
                          may_lead=False, round_seconds=1.0, leaving=threading.Event())
    t0 = time.monotonic()
    return agreement.decide(threading.Event(), lambda: None), time.monotonic() - t0


def test_a_round_every_other_trainer_passed_is_given_up_not_waited_out(trio) -> None:
    """c was left behind at round 16 (it abstained: it cannot lead) while a and b went on on their chain,
    never proposing for 16. c stops waiting once both report rounds of 18 and more and no live peer's
    proposal turned up in two windows; while one of them is still at 17 (it may yet propose for 16) c
    waits to max_wait_s, as before; one peer alone claiming a far round does not end the wait either.
    A live proposer that is not among c's eligible leaders (c joined: it knows another round's senders)
    still leads: giving up comes after that fallback (it came before once, and a joiner gave up a round
    the others had decided)."""
    a, b, c = trio
    ma, mb, mc = (Membership(t, t.identity, RUN, ttl=30.0) for t in trio)
    common = dict(training=True, step_seconds=1.0, inner_steps=4, tokens_per_s=1.0, rejected=0, loss=None)

    assert ma.publish(round_=17, **common) and mb.publish(round_=21, **common)
    outcome, waited = _decide(mc, c.peer_id, 16, [a.peer_id, b.peer_id])
    assert outcome is None and waited >= 11.5, waited  # a (at 17) might still propose: the full wait

    assert ma.publish(round_=19, **common)
    outcome, waited = _decide(mc, c.peer_id, 16, [a.peer_id, b.peer_id])
    assert outcome is None and waited < 6.0, waited  # both passed it: given up once no live peer's proposal
    # turned up either (the grace and one more window: 4.2 s)

    assert mb.write("proposals", 16, Proposal(run_id=RUN, round=16, proposer=b.peer_id))
    outcome, waited = _decide(mc, c.peer_id, 16, [a.peer_id])
    assert outcome is not None and outcome.proposer == b.peer_id, (outcome, waited)
