"""The run's rules for updates (node/swarm/rules.py) against crafted attacks, and the aggregate guard.

Each attack here is a real envelope an attacker can build with the project's own encoder and a key of
its own; the rules must refuse it, and refuse the cheap ones before any decompression."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _tiny import tiny_config
from gradnode.node.swarm import adversary, rules
from gradnode.node.swarm.identity import load_or_create
from gradnode.node.swarm.rules import UpdateRules, max_tokens_per_round
from gradnode.node.train.engine import Engine, codec_params
from gradnode.protocol import CodecParams, attach_signature, decode_update, encode_update, signing_digest

BOMB_VALUES = 2_100_000  # zeros: a dense envelope of them compresses to under a kilobyte


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("keys")
    honest, attacker = load_or_create(folder / "honest.key"), load_or_create(folder / "attacker.key")
    return honest, attacker


def _signed(identity, blob: bytes) -> bytes:
    return attach_signature(blob, identity.sign(signing_digest(blob)))


def _rules(shapes: dict[str, tuple[int, ...]], codec: CodecParams, max_tokens: int = 4096) -> UpdateRules:
    return UpdateRules(run_id="run", shapes=shapes, codec=codec, max_bytes=64 << 20, max_tokens=max_tokens)


class _CountingDecode:
    """Wraps the real decode_update to count how often the rules call it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return decode_update(*args, **kwargs)


def test_a_forged_or_unsigned_bomb_is_refused_before_it_is_decompressed(keys, monkeypatch) -> None:
    honest, attacker = keys
    blob = encode_update({"w": torch.zeros(BOMB_VALUES)}, params=CodecParams(dense=True), run_id="run",
                         sender=honest.peer_id)
    assert len(blob) < 1024  # 8.4 MB of fp32 once decoded
    r = _rules({"w": (BOMB_VALUES,)}, CodecParams(dense=True))
    spy = _CountingDecode()
    monkeypatch.setattr(rules, "decode_update", spy)
    key_of = {honest.peer_id: honest.public_der}.get
    assert r.check(blob, sender=honest.peer_id, round_=0, key_of=key_of) == (None, "unsigned")
    forged = _signed(attacker, blob)  # the attacker signs as the honest peer
    assert r.check(forged, sender=honest.peer_id, round_=0, key_of=key_of) == (None, "forged")
    unknown = _signed(attacker, blob)  # a sender nobody knows a key of
    assert r.check(unknown, sender=attacker.peer_id, round_=0, key_of=key_of) == (None, "forged")
    assert spy.calls == 0, "a body was decompressed before its signature was checked"
    upd, reason = r.check(_signed(honest, blob), sender=honest.peer_id, round_=0, key_of=key_of)
    assert reason is None and upd.tensors["w"].numel() == BOMB_VALUES and spy.calls == 1


def test_a_dense_update_in_a_sparse_run_is_refused(keys) -> None:
    honest, _ = keys
    cfg = tiny_config()
    delta = {"w": torch.randn(64, 64)}
    r = _rules({"w": (64, 64)}, codec_params(cfg))
    key_of = {honest.peer_id: honest.public_der}.get
    sparse = _signed(honest, encode_update(delta, params=codec_params(cfg), run_id="run", sender=honest.peer_id))
    dense = _signed(honest, encode_update(delta, params=CodecParams(dense=True), run_id="run", sender=honest.peer_id))
    assert r.check(sparse, sender=honest.peer_id, round_=0, key_of=key_of)[1] is None
    assert r.check(dense, sender=honest.peer_id, round_=0, key_of=key_of) == (None, "wrong_codec")
    assert len(dense) > 10 * len(sparse)


def test_declared_tokens_are_capped_by_the_runs_config(keys) -> None:
    honest, _ = keys
    cfg = tiny_config()
    cap = max_tokens_per_round(cfg)
    assert cap == cfg.inner.steps * cfg.inner.batch_size * cfg.model.seq_len
    r = UpdateRules.of(cfg, {"w": (64, 64)})
    key_of = {honest.peer_id: honest.public_der}.get
    delta = {"w": torch.randn(64, 64)}

    def make(tokens: int) -> bytes:
        return _signed(honest, encode_update(delta, params=r.codec, run_id=cfg.run.run_id, sender=honest.peer_id,
                                             tokens=tokens))

    upd, reason = r.check(make(cap), sender=honest.peer_id, round_=0, key_of=key_of)
    assert reason is None and UpdateRules.weight(upd) == cap
    assert r.check(make(cap + 1), sender=honest.peer_id, round_=0, key_of=key_of) == (None, "inflated_tokens")
    assert r.check(make(2**62), sender=honest.peer_id, round_=0, key_of=key_of) == (None, "inflated_tokens")


def test_the_simulators_adversaries_build_what_the_rules_refuse(keys, tmp_path: Path) -> None:
    """The 'tokens' and 'dense' faults of `simulate --faults` send validly signed updates that only the
    run's rules stop (the integration tests run them as real peers)."""
    honest, _ = keys
    cfg = tiny_config()
    r = UpdateRules.of(cfg, {"w": (64, 64)})
    key_of = {honest.peer_id: honest.public_der}.get
    blob = _signed(honest, encode_update({"w": torch.randn(64, 64)}, params=r.codec, run_id=cfg.run.run_id,
                                         sender=honest.peer_id, tokens=128))
    for fault, reason in (("tokens", "inflated_tokens"), ("dense", "wrong_codec")):
        sw = cfg.swarm.model_copy(update={"fault": fault, "fault_round": 0})
        sent = adversary.sent_update(sw, 0, blob, tmp_path, honest.sign)
        assert r.check(sent, sender=honest.peer_id, round_=0, key_of=key_of) == (None, reason)
    assert decode_update(adversary.sent_update(cfg.swarm.model_copy(update={"fault": "tokens", "fault_round": 0}),
                                               0, blob, tmp_path, honest.sign)).tokens == adversary.INFLATED_TOKENS


def test_an_absurd_aggregate_is_never_applied() -> None:
    """Updates of finite but enormous values (levels of 1e30, each one a valid envelope) would blow the
    weights up; the engine skips that outer step, the same way on every peer."""
    cfg = tiny_config()
    engine = Engine(cfg)
    before = engine.param_hash()
    huge = {n: torch.randn_like(t) * 1e30 for n, t in engine.global_params.items()}
    upd = decode_update(encode_update(huge, params=engine.codec, run_id=cfg.run.run_id, sender="attacker"))
    engine.apply_aggregate([upd])
    assert engine.param_hash() == before and engine.skipped_steps == 1 and engine.round == 1
    assert all(torch.isfinite(t).all() for t in engine.global_params.values())
    # an honest round goes through, and its step is far below the bound
    engine.inner_round()
    engine.apply_aggregate([decode_update(engine.make_update(sender="honest"))])
    assert engine.param_hash() != before and engine.skipped_steps == 1
    assert 0 < engine.last_step_ratio < 0.1 * cfg.outer.max_step_ratio
