import pytest
import torch

from _tiny import tiny_config
from gradnode.node.train.engine import Engine
from gradnode.protocol import decode_update


def sync_rounds(engines, rounds):
    for _ in range(rounds):
        for e in engines:
            e.inner_round()
        updates = [decode_update(e.make_update(sender=f"peer-{i}")) for i, e in enumerate(engines)]
        for e in engines:
            e.apply_aggregate(updates)


@pytest.mark.parametrize("outer", [{"algorithm": "sparseloco"},
                                   {"algorithm": "diloco", "lr": 0.7, "momentum": 0.9, "nesterov": True}])
def test_rounds_lower_the_validation_loss(outer):
    cfg = tiny_config(outer=outer)
    engines = [Engine(cfg, peer_index=i) for i in range(2)]
    before = engines[0].evaluate()
    sync_rounds(engines, 5)
    after = engines[0].evaluate()
    assert after < before - 0.5, (before, after)
    assert engines[0].param_hash() == engines[1].param_hash()
    assert engines[0].round == 5


def test_synchronous_round_leaves_local_equal_to_global():
    e = Engine(tiny_config())
    sync_rounds([e], 1)
    for n, p in e.model.named_parameters():
        assert torch.equal(p.detach(), e.global_params[n]), n


def test_arrival_order_does_not_change_the_weights():
    cfg = tiny_config()
    peers = [Engine(cfg, peer_index=i) for i in range(3)]
    for p in peers:
        p.inner_round()
    updates = [decode_update(p.make_update(sender=f"peer-{i}")) for i, p in enumerate(peers)]
    a, b = Engine(cfg, peer_index=7), Engine(cfg, peer_index=8)
    assert a.param_hash() == b.param_hash()
    a.apply_aggregate(updates, weights=[1.0, 2.0, 3.0])
    b.apply_aggregate(list(reversed(updates)), weights=[3.0, 2.0, 1.0])
    assert a.param_hash() == b.param_hash()
    assert a.param_hash() != Engine(cfg).param_hash()


def test_overlapped_order_keeps_own_progress_and_global_weights_shared():
    cfg = tiny_config()
    a, b = Engine(cfg, peer_index=0), Engine(cfg, peer_index=1)
    for e in (a, b):
        e.inner_round()
    pending = [decode_update(e.make_update(sender=s)) for e, s in ((a, "a"), (b, "b"))]
    for _ in range(3):
        for e in (a, b):
            e.inner_round()  # round r+1 runs while round r is "exchanged"
        for e in (a, b):
            before = {n: p.detach() - e.start[n] for n, p in e.params.items()}
            e.apply_aggregate(pending)
            for n, p in e.params.items():  # local progress survives the rebase
                assert torch.allclose(p.detach() - e.start[n], before[n], atol=1e-6)
        assert a.param_hash() == b.param_hash()
        pending = [decode_update(e.make_update(sender=s)) for e, s in ((a, "a"), (b, "b"))]


def test_straggler_stops_early_and_no_updates_round_is_a_no_op():
    e = Engine(tiny_config())
    calls = iter([False, False, True])
    stats = e.inner_round(should_stop=lambda: next(calls))
    assert stats.steps == 2 and stats.tokens == 2 * 4 * 32 and stats.tokens_per_s > 0
    assert e.inner_round(max_steps=1).steps == 1
    h = e.param_hash()
    e.apply_aggregate([])
    assert e.param_hash() == h and e.round == 1


def test_update_for_another_round_is_rejected():
    a, b = Engine(tiny_config()), Engine(tiny_config())
    a.inner_round()
    update = decode_update(a.make_update(sender="a"))
    b.apply_aggregate([])
    with pytest.raises(ValueError, match="round 0"):
        b.apply_aggregate([update])


def test_shared_state_lets_a_joiner_catch_up():
    cfg = tiny_config(outer={"algorithm": "diloco", "momentum": 0.9, "nesterov": True, "lr": 0.7})
    old = Engine(cfg)
    sync_rounds([old], 2)
    joiner = Engine(cfg, peer_index=5)
    joiner.load_shared_state(old.shared_state())
    assert joiner.param_hash() == old.param_hash() and joiner.round == 2
    sync_rounds([old, joiner], 1)
    assert joiner.param_hash() == old.param_hash()
    with pytest.raises(ValueError, match="run.run_id"):
        Engine(tiny_config(run={"run_id": "other"})).load_shared_state(old.shared_state())


def test_update_is_compressed_and_tagged():
    e = Engine(tiny_config())
    e.inner_round()
    payload = e.make_update(sender="me")
    d = decode_update(payload)
    assert (d.sender, d.round, d.tokens) == ("me", 0, 4 * 4 * 32)
    n = sum(t.numel() for t in e.global_params.values())
    assert len(payload) < 4 * n / 20  # SparseLoCo: far below fp32


def test_ddp_is_not_a_peer_algorithm():
    with pytest.raises(ValueError, match="outer.algorithm"):
        Engine(tiny_config(outer={"algorithm": "ddp"}))


def test_the_shared_state_hash_covers_outer_momentum_the_round_and_the_run() -> None:
    """badmomentum: a donor offers honest weights with poisoned outer momentum (DiLoCo). Peers used to
    publish and check the hash of the weights alone, so the joiner's check (load the offer, compare its
    hash with the one the swarm agreed on) passed and the joiner's next outer steps went astray. The
    state hash covers the outer optimizer's state, the round and the run too: the offer is refused."""
    cfg = tiny_config(outer={"algorithm": "diloco", "momentum": 0.9, "nesterov": True})
    donor = Engine(cfg)
    donor.outer.step(donor.global_params, {n: torch.full_like(t, 1e-3) for n, t in donor.global_params.items()})
    assert donor.outer.buffers
    state, agreed = donor.shared_state(), donor.state_hash()
    poisoned = {**state, "outer": {"buffers": {n: -50.0 * b for n, b in state["outer"]["buffers"].items()}}}
    joiner = Engine(cfg)
    joiner.load_shared_state(poisoned)
    assert joiner.param_hash() == donor.param_hash()  # the weights alone: the poisoned offer passes
    assert joiner.state_hash() != agreed  # the shared state: it is refused
    joiner.load_shared_state(state)
    assert joiner.state_hash() == agreed
    joiner.load_shared_state({**state, "round": state["round"] + 1})  # same weights, another round
    assert joiner.state_hash() != agreed
    other_run = Engine(tiny_config(run={"run_id": "another-run"}, outer={"algorithm": "diloco", "momentum": 0.9,
                                                                        "nesterov": True}))
    assert other_run.param_hash() == Engine(cfg).param_hash() and other_run.state_hash() != Engine(cfg).state_hash()


def test_the_contributors_ledger_is_shared_state_and_travels_with_it() -> None:
    """Who contributed lately decides who witnesses the next rounds and whose votes count. Each peer used to
    keep that list for itself, so one that had just adopted a state knew only that round's senders and
    counted other witnesses than the rest (it had to defer to them). The ledger is now part of the shared
    state: every apply notes the round's senders, a joiner receives it with the weights, the state hash
    covers it, and it forgets peers after CONTRIBUTOR_ROUNDS rounds; a malformed one is refused."""
    from gradnode.node.train.engine import CONTRIBUTOR_ROUNDS

    cfg = tiny_config()
    engines = [Engine(cfg, peer_index=i) for i in range(2)]
    for r in range(3):
        updates = []
        for i, e in enumerate(engines):
            e.inner_round()
            updates.append(decode_update(e.make_update(sender=f"peer-{i}")))
        for e in engines:
            e.apply_aggregate(updates if r != 1 else updates[:1])
    assert engines[0].contributors == {"peer-0": 2, "peer-1": 2}
    joiner = Engine(cfg, peer_index=7)
    joiner.load_shared_state(engines[0].shared_state())
    assert joiner.contributors == engines[0].contributors and joiner.state_hash() == engines[0].state_hash()
    merged = {"peer-0=2\npeer-1": 2}  # the old line encoding hashed this like the honest ledger
    forged = Engine(cfg, peer_index=9)
    forged.load_shared_state({**engines[0].shared_state(), "contributors": merged})
    assert forged.state_hash() != joiner.state_hash()
    lying = Engine(cfg, peer_index=8)
    lying.load_shared_state({**engines[0].shared_state(), "contributors": {"peer-0": 2}})
    assert lying.param_hash() == joiner.param_hash() and lying.state_hash() != joiner.state_hash()
    for bad in ({"peer-0": "2"}, {"": 1}, {"peer-0": -1}, {"peer-0": 3}, ["peer-0"], None):
        with pytest.raises(ValueError, match="contributors"):
            Engine(cfg).load_shared_state({**engines[0].shared_state(), "contributors": bad})
    e = engines[0]
    for _ in range(CONTRIBUTOR_ROUNDS - 1):
        e.apply_aggregate([])
    assert e.contributors == {"peer-0": 2, "peer-1": 2}  # round 2 is CONTRIBUTOR_ROUNDS - 1 rounds back
    e.apply_aggregate([])
    assert e.contributors == {}


def test_the_state_one_round_back_is_shared_state_and_the_committee_is_drawn_from_it() -> None:
    """A peer that adopts the state after round r computes round r + 1, whose committee is drawn from the
    state after round r - 1 (protocol/committee.py, LAG = 2): a state it never held. So every state names
    the one before it (its hash and its contributors), under the state hash: a joiner draws what the others
    draw, and an offer that lies about the state before it is refused like any other."""
    from gradnode.protocol import committee as cm

    cfg, budget = tiny_config(), cm.Budget(1, 1, 0)
    engines = [Engine(cfg, peer_index=i) for i in range(2)]
    assert engines[0].previous.hash == cm.GENESIS and engines[0].committee(budget).pool == frozenset()
    hashes: dict[int, str] = {}
    for r in range(3):
        updates = []
        for i, e in enumerate(engines):
            e.inner_round()
            updates.append(decode_update(e.make_update(sender=f"peer-{i}")))
        before, ledger = engines[0].state_hash(), frozenset(engines[0].contributors)
        for e in engines:
            e.apply_aggregate(updates[: 1 + (r > 0)])
        hashes[r] = engines[0].state_hash()
        assert engines[0].previous.hash == before and engines[0].previous.pool == ledger
    e = engines[0]  # round 3's committee: from the state after round 1, whose ledger held peer-0 and peer-1
    assert e.committee(budget) == cm.draw(budget, 3, hashes[1], {"peer-0", "peer-1"})
    joiner = Engine(cfg, peer_index=7)
    joiner.load_shared_state(e.shared_state())
    assert joiner.state_hash() == e.state_hash() and joiner.committee(budget) == e.committee(budget)
    lying = Engine(cfg, peer_index=8)
    lying.load_shared_state({**e.shared_state(), "previous": {"hash": hashes[1], "pool": ["peer-1"]}})
    assert lying.param_hash() == e.param_hash() and lying.state_hash() != e.state_hash()
    for bad in (None, {"hash": 1, "pool": []}, {"hash": "h", "pool": [""]}, {"hash": "h", "pool": "peer-0"}):
        with pytest.raises(ValueError, match="previous"):
            Engine(cfg).load_shared_state({**e.shared_state(), "previous": bad})
    # the hash it names is of the state as it was, even when the weights moved after their last hash
    from gradnode.node.config import SwarmConfig
    from gradnode.node.swarm import adversary

    before = e.state_hash()
    adversary.drift(SwarmConfig(fault="drift", fault_round=3), 3, e)
    copy = Engine(cfg, peer_index=6)
    copy.load_shared_state(e.shared_state())
    e.apply_aggregate([])
    assert e.previous.hash == copy.state_hash() != before


def _sat_out(undrawn: str) -> tuple[Engine, dict[str, torch.Tensor], int]:
    """A peer that trains a round, sits it out as ``undrawn`` says, and takes the others' aggregate (none)."""
    e = Engine(tiny_config(outer={"algorithm": "sparseloco", "undrawn": undrawn}))
    tokens = e.inner_round().tokens
    delta = e.pseudo_gradient()
    e.sit_out()
    e.apply_aggregate([])
    return e, delta, tokens


def test_an_undrawn_peer_carries_its_work_into_its_next_update():
    e, delta, tokens = _sat_out("carry")
    for n, d in delta.items():  # the progress stays local, on top of the agreed weights
        assert torch.allclose(e.start[n] - e.params[n], d, atol=1e-6), n
    e.inner_round()
    assert decode_update(e.make_update(sender="p")).tokens == 2 * tokens  # both rounds' work, sent whole


def test_an_undrawn_peer_folds_its_work_into_error_feedback():
    e, delta, tokens = _sat_out("feedback")
    beta = e.cfg.outer.ef_beta
    for n, d in delta.items():
        assert torch.equal(e.params[n].detach(), e.global_params[n]), n  # restarted from the agreed weights
        assert torch.allclose(e.ef[n], d, atol=1e-7), n  # e <- beta * 0 + delta
    assert e.pending_tokens == tokens  # counted when the buffers are next sent
    e.inner_round()
    before = {n: t.clone() for n, t in e.ef.items()}
    second = e.pseudo_gradient()
    sent = decode_update(e.make_update(sender="p")).tensors
    assert sent.keys() == before.keys()
    for n in before:  # the update sends from beta * e + delta, and what it leaves stays: nothing is lost
        assert torch.allclose(sent[n] + e.ef[n], beta * before[n] + second[n], atol=1e-6), n


def test_an_undrawn_peer_drops_its_work():
    e, _, _ = _sat_out("drop")
    assert e.pending_tokens == 0 and not e.ef
    for n, p in e.params.items():
        assert torch.equal(p.detach(), e.global_params[n]), n


def test_feedback_for_an_undrawn_peer_needs_error_feedback():
    """Refused with the config (tests/test_configs.py), before any engine is made."""
    from gradnode.node.config import ConfigError

    with pytest.raises(ConfigError, match="error feedback"):
        Engine(tiny_config(outer={"algorithm": "diloco", "undrawn": "feedback"}))
