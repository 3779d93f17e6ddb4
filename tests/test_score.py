"""The witness's loss check (node/train/score.py) and the engine's 'robust' aggregation with its reputation."""

from __future__ import annotations

import torch

from _tiny import tiny_config
from gradnode.node.train.engine import Engine
from gradnode.node.train.score import Scorer, ScoreParams, score_update, sender_steps
from gradnode.protocol import decode_update, encode_update


def _engines(n: int, **sections):
    cfg = tiny_config(**sections)
    return [Engine(cfg, peer_index=i) for i in range(n)]


def _round(engines, r: int, replace: dict[int, callable] | None = None):
    for e in engines:
        e.inner_round()
    updates = [decode_update(e.make_update(sender=f"peer{i}")) for i, e in enumerate(engines)]
    for i, craft in (replace or {}).items():
        updates[i] = craft(updates[i])
    return updates


def _flipped(u, factor: float = 1.0):
    tensors = {n: -factor * t for n, t in u.tensors.items()}
    return decode_update(encode_update(tensors, params=u.params, run_id=u.run_id, round=u.round, sender=u.sender,
                                       tokens=u.tokens))


def test_honest_updates_pass_and_a_sign_flip_fails() -> None:
    engines = _engines(3)
    for r in range(2):  # past the first steps, so that updates carry a real direction
        updates = _round(engines, r)
        for e in engines:
            e.apply_aggregate(updates)
    updates = _round(engines, 2)
    before = engines[0].param_hash()
    scorer = Scorer(engines[0], 2, secret=12345, params=ScoreParams(rows=8))
    honest = [scorer.score(u) for u in updates]
    assert all(v.accept and v.gain > 0 for v in honest), honest
    bad = scorer.score(_flipped(updates[0]))
    assert not bad.accept and bad.gain < 0
    # a huge multiple is judged as the aggregate's clip will apply it: like the flip itself
    huge = scorer.score(_flipped(updates[0], 1e4), clip_norm=updates[0].norm)
    assert not huge.accept and abs(huge.gain - bad.gain) < 1e-4
    assert engines[0].param_hash() == before  # the check never touches the engine's weights
    single = score_update(engines[0], updates[1], 2, secret=12345, params=ScoreParams(rows=8))
    assert single.gain == honest[1].gain


def test_own_rows_come_from_the_senders_assigned_batches() -> None:
    engines = _engines(2)
    updates = _round(engines, 0)
    scorer = Scorer(engines[0], 0, secret=1, params=ScoreParams(rows=4, own_rows=3))
    v = scorer.score(updates[1], shard=1)
    assert v.own_gain is not None and v.own_advantage == v.own_gain - v.gain
    assert list(sender_steps(3, 4)) == [12, 13, 14, 15]
    x, _ = scorer._own_rows(1, sender_steps(0, 4))
    assert torch.equal(x[0], engines[1].batches.train(1, 0, 0)[0][0])


def test_witness_rows_depend_on_the_secret_and_the_round() -> None:
    e = _engines(1)[0]
    a = e.batches.sample(4, "witness", 1, 0)[0]
    assert torch.equal(a, e.batches.sample(4, "witness", 1, 0)[0])
    assert not torch.equal(a, e.batches.sample(4, "witness", 2, 0)[0])
    assert not torch.equal(a, e.batches.sample(4, "witness", 1, 1)[0])


def test_engine_robust_rule_bans_a_repeat_attacker_and_carries_the_table_in_its_state() -> None:
    engines = _engines(4, outer={"aggregation": "robust"})
    for r in range(4):  # peer3 contributes honestly in round 0 (a contributor: strikes count), then flips
        updates = _round(engines, r, {3: _flipped} if r else {})
        for e in engines:
            e.apply_aggregate(list(reversed(updates)) if e.peer_index % 2 else updates)
        reasons = {s.sender: s.reason for s in engines[0].last_screens}
        assert reasons["peer3"] in (("direction", "reputation") if r else ("",)) and reasons["peer0"] == ""
    assert len({e.param_hash() for e in engines}) == 1
    assert engines[0].reputation.banned() == ["peer3"]
    assert len({repr(e.reputation) for e in engines}) == 1
    state = engines[0].shared_state()
    joiner = _engines(1, outer={"aggregation": "robust"})[0]
    joiner.load_shared_state(state)
    assert joiner.reputation == engines[0].reputation and joiner.state_hash() == engines[0].state_hash()
    # the state hash covers the table: a donor offering the weights with peer3's strikes wiped is refused
    wiped = _engines(1, outer={"aggregation": "robust"})[0]
    wiped.load_shared_state({**state, "reputation": {"scores": {}, "recent": state["reputation"]["recent"]}})
    assert wiped.param_hash() == joiner.param_hash() and wiped.state_hash() != joiner.state_hash()
    plain = _engines(1)[0]  # another rule keeps an empty table
    assert plain.shared_state()["reputation"] == {"scores": {}, "recent": []}


def test_the_reputation_survives_a_checkpoint(tmp_path) -> None:
    cfg = tiny_config(tmp_path, outer={"aggregation": "robust"})
    engines = [Engine(cfg, peer_index=i) for i in range(4)]
    for r in range(3):  # honest in round 0, flipped in rounds 1 and 2: two strikes of a contributor
        updates = _round(engines, r, {3: _flipped} if r else {})
        for e in engines:
            e.apply_aggregate(updates)
    assert engines[0].reputation.banned() == ["peer3"]
    engines[0].save_checkpoint()
    resumed = Engine.resume(cfg)
    assert resumed.round == 3 and resumed.reputation == engines[0].reputation
