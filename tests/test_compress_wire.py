"""Every compressor family through the node's path: the signed envelope, the run's rules, the engine's error
feedback and aggregate, the shared state and the genesis. The families' own round trips are in
test_compressors.py; the fuzzing of their envelopes is in test_wire_fuzz.py (scripts/fuzz_decode.py)."""

from __future__ import annotations

import math

import pytest
import torch

from _tiny import tiny_config
from gradnode.node.config import ConfigError, shared_rules
from gradnode.node.swarm.identity import load_or_create
from gradnode.node.swarm.rules import UpdateRules
from gradnode.node.train.engine import Engine, codec_params
from gradnode.protocol import ProtocolError, attach_signature, decode_update, signing_digest
from gradnode.protocol.compress import (KINDS, DctTopK, Dense, Family, PowerSGD, Quant, RandomK, Sign, compressor,
                                        to_wire)
from gradnode.protocol.wire import encode_codes

# one setting per family the node can run (SparseLoCo is the default codec, tested everywhere else)
FAMILIES = {"random-k": {"density": 0.1}, "powersgd": {"rank": 2}, "sign": {"chunk": 256},
            "dct-topk": {"chunk": 256, "topk": 16}, "quant": {"bits": 4}, "dense": {"bits": 16}}


def _cfg(family: str, **options):
    return tiny_config(codec={"family": family, "options": {**FAMILIES[family], **options}})


def _rounds(engines: list[Engine], rounds: int) -> None:
    """Rounds of the node's order: compute, make the update, decode it as each receiver does, apply."""
    for _ in range(rounds):
        for e in engines:
            e.inner_round()
        blobs = [e.make_update(sender=f"peer-{i}") for i, e in enumerate(engines)]
        for e in engines:
            updates = [decode_update(b, compressor=e.compressor) for b in blobs]
            e.apply_aggregate(updates, [float(u.tokens) for u in updates])


def test_the_config_families_are_the_protocol_families() -> None:
    from gradnode.node.config import FAMILIES as NAMES
    assert set(NAMES) == {f.value for f in Family} and set(FAMILIES) | {"sparseloco"} == set(NAMES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_trains_the_same_weights_on_every_peer(family: str) -> None:
    cfg = _cfg(family)
    engines = [Engine(cfg, peer_index=i) for i in range(2)]
    before = engines[0].evaluate()
    _rounds(engines, 3)
    assert engines[0].state_hash() == engines[1].state_hash()
    assert engines[0].evaluate() < before
    assert engines[0].ef, "error feedback holds what was not sent"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_envelope_holds_what_the_family_decodes(family: str) -> None:
    settings = codec_params(_cfg(family))
    comp = compressor(settings)
    g = torch.Generator().manual_seed(1)
    delta = {"w": torch.randn(48, 40, generator=g), "b": torch.randn(40, generator=g)}
    shapes = {n: tuple(t.shape) for n, t in delta.items()}
    codes = comp.compress({}, delta, 1.0, round=2)
    upd = decode_update(encode_codes(codes, shapes, settings, run_id="r", round=2, sender="s", tokens=9),
                        expected=shapes, compressor=comp)
    assert (upd.run_id, upd.round, upd.sender, upd.tokens, upd.params) == ("r", 2, "s", 9, settings)
    for n in delta:
        assert torch.equal(upd.tensors[n], comp.decode(n, shapes[n], 2, codes[n]))
    assert upd.sq_norm == pytest.approx(sum(float(t.double().square().sum()) for t in upd.tensors.values()))
    held = sum(sp.nbytes for sp in upd.sparse.values())
    if family == "random-k":  # a few shared positions: held as sent, not as the tensor's size
        assert held < 0.25 * 8 * sum(math.prod(s) for s in shapes.values())


def test_a_sparseloco_family_map_is_refused_on_the_wire() -> None:
    from gradnode.protocol.compress import SparseLoCo
    blob = encode_codes({}, {}, SparseLoCo())
    with pytest.raises(ProtocolError, match="codec params"):
        decode_update(blob)


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory):
    return load_or_create(tmp_path_factory.mktemp("keys") / "peer.key")


def _signed(identity, blob: bytes) -> bytes:
    return attach_signature(blob, identity.sign(signing_digest(blob)))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_rules_take_the_runs_family_and_refuse_any_other(family: str, identity) -> None:
    cfg = _cfg(family)
    engine = Engine(cfg)
    shapes = {n: tuple(t.shape) for n, t in engine.global_params.items()}
    rules = UpdateRules.of(cfg, shapes, engine.compressor)
    key_of = {identity.peer_id: identity.public_der}.get
    engine.inner_round()
    blob = _signed(identity, engine.make_update(sender=identity.peer_id))
    upd, reason = rules.check(blob, sender=identity.peer_id, round_=0, key_of=key_of)
    assert reason is None and upd.params == engine.codec
    # the same update sent with another family's settings, or SparseLoCo's codec: validly signed, refused
    other = sorted(set(FAMILIES) - {family})[0]
    for cfg_other in (_cfg(other), tiny_config()):
        e = Engine(cfg_other)
        e.inner_round()
        foreign = _signed(identity, e.make_update(sender=identity.peer_id))
        assert rules.check(foreign, sender=identity.peer_id, round_=0, key_of=key_of) == (None, "wrong_codec")
    # the same family with other settings is another codec too
    other_settings = {"random-k": {"density": 0.2}, "powersgd": {"rank": 1}, "sign": {"chunk": 64},
                      "dct-topk": {"chunk": 64}, "quant": {"bits": 8}, "dense": {"bits": 32}}[family]
    changed = type(engine.codec)(**{**{k: v for k, v in to_wire(engine.codec).items() if k != "family"},
                                    **other_settings})
    codes = compressor(changed).compress({}, engine.pseudo_gradient(), 1.0, 0)
    blob = _signed(identity, encode_codes(codes, shapes, changed, run_id=cfg.run.run_id, sender=identity.peer_id))
    assert rules.check(blob, sender=identity.peer_id, round_=0, key_of=key_of) == (None, "wrong_codec")


def test_powersgd_warm_starts_from_the_applied_aggregate_and_its_basis_is_shared_state() -> None:
    cfg = _cfg("powersgd")
    a, b = Engine(cfg, peer_index=0), Engine(cfg, peer_index=1)
    _rounds([a, b], 2)
    assert a.compressor.state_dict(), "a basis learned from the last aggregate"
    assert a.state_hash() == b.state_hash()
    # a joiner adopts the state: the same hash, and it decodes the next round's updates as the others do
    joiner = Engine(cfg, peer_index=2)
    joiner.load_shared_state(a.shared_state())
    assert joiner.state_hash() == a.state_hash()
    _rounds([a, b, joiner], 1)
    assert joiner.state_hash() == a.state_hash() == b.state_hash()
    # the basis is under the state hash: a state with another basis is another state
    state = a.shared_state()
    name, (r, side, basis) = next(iter(state["codec"].items()))
    tampered = Engine(cfg, peer_index=3)
    tampered.load_shared_state({**state, "codec": {**state["codec"], name: (r, side, basis.flip(0))}})
    assert tampered.state_hash() != a.state_hash()
    assert tampered.param_hash() == a.param_hash()


def test_without_the_basis_a_joiner_would_decode_apart() -> None:
    """Why the basis travels with the state: a peer holding only the weights decodes the next round's factors on
    a fresh basis, and its weights leave the others'."""
    cfg = _cfg("powersgd")
    a, b = Engine(cfg, peer_index=0), Engine(cfg, peer_index=1)
    _rounds([a, b], 2)
    joiner = Engine(cfg, peer_index=2)
    joiner.load_shared_state({**a.shared_state(), "codec": {}})
    _rounds([a, b, joiner], 1)
    assert a.state_hash() == b.state_hash() and joiner.param_hash() != a.param_hash()


@pytest.mark.parametrize("state", [{"nope": (1, "right", torch.zeros(4, 2))}, {"blocks.0.attn.qkv.weight": (1, "up", None)},
                                   {"blocks.0.attn.qkv.weight": (1, "right", torch.full((3, 2), math.nan))}])
def test_a_malformed_basis_from_the_network_is_refused(state) -> None:
    e = Engine(_cfg("powersgd"))
    with pytest.raises(ValueError, match="basis"):
        e.load_shared_state({**e.shared_state(), "codec": state})


def test_a_codec_state_in_a_run_without_one_is_refused() -> None:
    e = Engine(tiny_config())
    with pytest.raises(ValueError, match="keeps none"):
        e.load_shared_state({**e.shared_state(), "codec": {"w": (1, "right", torch.zeros(2, 2))}})


def test_warm_up_rounds_send_fp32_then_compress() -> None:
    cfg = _cfg("sign", warmup_rounds=1)
    a = Engine(cfg)
    sizes = []
    for _ in range(2):
        a.inner_round()
        blob = a.make_update(sender="a")
        sizes.append(len(blob))
        a.apply_aggregate([decode_update(blob, compressor=a.compressor)])
    n = sum(t.numel() for t in a.global_params.values())
    assert sizes[0] > 3 * n and sizes[1] < n  # fp32, then a bit and a scale per value


def test_the_genesis_fixes_the_family_and_a_sparseloco_run_keeps_its_rules() -> None:
    assert "family" not in shared_rules(tiny_config())["codec"]  # a genesis written before the families
    rules = shared_rules(_cfg("random-k"))["codec"]
    assert rules["family"] == "random-k" and rules["options"] == {"density": 0.1}
    assert shared_rules(_cfg("random-k", small_numel=256)) != shared_rules(_cfg("random-k"))


@pytest.mark.parametrize("codec, match", [
    ({"family": "random-k", "options": {"rank": 2}}, "rank not a setting of random-k"),
    ({"family": "random-k", "options": {"density": 2.0}}, "density"),
    ({"family": "powersgd", "options": {"rank": 1.5}}, "must be a int"),
    ({"family": "sparseloco", "options": {"density": 0.1}}, "sparseloco takes"),
    ({"family": "zip"}, "family"),
])
def test_a_bad_codec_is_refused_at_load(codec, match) -> None:
    with pytest.raises(ConfigError, match=match):
        tiny_config(codec=codec)


def test_a_family_needs_error_feedback() -> None:
    with pytest.raises(ConfigError, match="outer.algorithm='sparseloco'"):
        tiny_config(codec={"family": "sign"}, outer={"algorithm": "diloco"})


def test_every_family_is_wired() -> None:
    assert {f.value for f in KINDS} - {"sparseloco"} == set(FAMILIES)
    assert all(type(codec_params(_cfg(f))) in (RandomK, PowerSGD, Sign, DctTopK, Quant, Dense) for f in FAMILIES)


def test_sizes_of_the_virtual_simulator_follow_the_family() -> None:
    from gradnode.node.sim import sizes
    dense = sizes.update_bytes(_cfg("dense"))
    assert sizes.update_bytes(_cfg("sign")) < dense / 8 and sizes.update_bytes(tiny_config()) < dense / 8


def test_a_checkpoint_keeps_the_basis(tmp_path) -> None:
    cfg = tiny_config(tmp_path, codec={"family": "powersgd", "options": {"rank": 2}})
    a, b = Engine(cfg, peer_index=0), Engine(cfg, peer_index=1)
    _rounds([a, b], 2)
    a.save_checkpoint(tmp_path / "ckpt")
    resumed = Engine.resume(cfg, tmp_path / "ckpt")
    assert resumed.compressor.state_dict().keys() == a.compressor.state_dict().keys()
    assert resumed.state_hash() == a.state_hash()
