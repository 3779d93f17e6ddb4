import json
import os

import pytest
import torch

from _tiny import tiny_config
from gradnode.node.train import checkpoint
from gradnode.node.train.checkpoint import CheckpointError
from gradnode.node.train.engine import Engine
from gradnode.protocol import decode_update


def run(engine, rounds):
    for _ in range(rounds):
        engine.inner_round()
        engine.apply_aggregate([decode_update(engine.make_update(sender="solo"))])


@pytest.mark.parametrize("algorithm", ["sparseloco", "diloco"])
def test_resume_is_bit_identical(tmp_path, algorithm):
    outer = {"algorithm": algorithm} | ({"momentum": 0.9, "nesterov": True} if algorithm == "diloco" else {})
    cfg = tiny_config(tmp_path, outer=outer, model={"dropout": 0.1})  # dropout: the RNG state must resume too
    straight = Engine(cfg)
    run(straight, 4)

    first = Engine(cfg)
    run(first, 2)
    first.inner_round(max_steps=1)  # mid-round progress (overlapped peers checkpoint like this)
    first.save_checkpoint(tmp_path / "ck")
    del first
    resumed = Engine.resume(cfg, tmp_path / "ck")
    assert resumed.round == 2 and resumed.step == 2 * 4 + 1
    resumed.inner_round(max_steps=3)
    resumed.apply_aggregate([decode_update(resumed.make_update(sender="solo"))])
    run(resumed, 1)
    assert resumed.param_hash() == straight.param_hash()
    assert resumed.tokens_seen == straight.tokens_seen


def test_no_checkpoint_gives_a_fresh_engine(tmp_path):
    assert Engine.resume(tiny_config(), tmp_path / "none").round == 0


def test_atomic_layout_and_pruning(tmp_path):
    cfg = tiny_config(checkpoint={"keep": 2})
    e = Engine(cfg)
    for _ in range(3):
        run(e, 1)
        e.save_checkpoint(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["round-00000002", "round-00000003"]  # no temporary folders left behind
    meta = json.loads((tmp_path / "round-00000003" / "meta.json").read_text())
    assert meta["round"] == 3 and meta["run_id"] == "test-tiny" and len(meta["sha256"]) == 64


def _corrupt(path):
    state = path / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    return state.read_bytes()


def test_corrupt_checkpoint_is_a_clear_error_and_left_untouched(tmp_path):
    e = Engine(tiny_config())
    run(e, 1)
    path = e.save_checkpoint(tmp_path)
    damaged = _corrupt(path)
    with pytest.raises(CheckpointError, match="corrupt"):
        checkpoint.load(path)
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        Engine.resume(tiny_config(), tmp_path)
    assert (path / "state.pt").read_bytes() == damaged


def test_newest_corrupt_falls_back_to_older_valid(tmp_path):
    e = Engine(tiny_config())
    run(e, 1)
    e.save_checkpoint(tmp_path)
    older_hash = e.param_hash()
    run(e, 1)
    newest = e.save_checkpoint(tmp_path)
    damaged = _corrupt(newest)
    resumed = Engine.resume(tiny_config(), tmp_path)
    assert resumed.round == 1 and resumed.param_hash() == older_hash
    assert (newest / "state.pt").read_bytes() == damaged
    # the resumed state is as old as the checkpoint it came from, not the newest one (a peer's run_over ``since``)
    os.utime(newest / "meta.json", (2e9, 2e9))
    os.utime(tmp_path / "round-00000001" / "meta.json", (1e9, 1e9))
    assert checkpoint.made_at(tmp_path, resumed.round) == 1e9 and checkpoint.made_at(tmp_path, 7) is None


def test_truncated_or_foreign_checkpoints(tmp_path):
    e = Engine(tiny_config())
    path = e.save_checkpoint(tmp_path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="meta.json"):
        checkpoint.load(path)
    path2 = Engine(tiny_config()).save_checkpoint(tmp_path / "b")
    with pytest.raises(CheckpointError, match="run.run_id"):
        Engine.resume(tiny_config(run={"run_id": "another-run"}), tmp_path / "b")
    with pytest.raises(CheckpointError, match="outer.algorithm"):
        Engine.resume(tiny_config(outer={"algorithm": "diloco"}), path2.parent)


def test_a_checkpoint_stores_its_resolved_config_and_older_ones_still_load(tmp_path):
    from gradnode.node.config import config_from_dict

    cfg = tiny_config(tmp_path)
    e = Engine(cfg)
    run(e, 1)
    path = e.save_checkpoint(tmp_path / "ck")
    _, meta = checkpoint.load(path)
    assert config_from_dict(meta["config"]) == cfg  # what `gradnode export` / `eval` rebuild the model from
    del meta["config"]  # as written before checkpoints stored it
    (path / "meta.json").write_text(json.dumps(meta))
    assert Engine.resume(cfg, tmp_path / "ck").param_hash() == e.param_hash()


def _tensor_bytes(obj) -> int:
    """Bytes of the tensors a loaded state holds (what torch.save wrote for them)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _same_engine(a: Engine, b: Engine) -> None:
    """Bit-identical shared state, own weights, start and error feedback, and the next round's update bytes
    (``b`` just resumed from ``a``'s checkpoint: the RNG, one for the process, is the checkpoint's for both)."""
    assert (b.round, b.step, b.state_hash()) == (a.round, a.step, a.state_hash())
    for n in a.names:
        for x, y in ((a.params[n], b.params[n]), (a.start[n], b.start[n]), (a.ef[n], b.ef[n])):
            assert torch.equal(x.detach().view(torch.int32), y.detach().view(torch.int32)), n
    rng = torch.get_rng_state()
    updates = []
    for e in (a, b):
        torch.set_rng_state(rng)
        e.inner_round()
        updates.append(e.make_update(sender="solo"))
    assert updates[0] == updates[1]


@pytest.mark.parametrize("moment", ["round boundary", "mid-round", "update sent"])
def test_a_checkpoint_stores_each_tensor_once_and_resumes_bit_identical(tmp_path, moment):
    """The agreed weights once; the own weights only where they differ from them (mid-round); the start only where
    it differs from both (after an outer step it equals the agreed weights, after an update the own weights). The
    error feedback and AdamW's moments always. Format 1 wrote 24 bytes per parameter in every case."""
    cfg = tiny_config(tmp_path, model={"dropout": 0.1})
    e = Engine(cfg)
    run(e, 2)
    if moment == "mid-round":
        e.inner_round(max_steps=1)
    elif moment == "update sent":  # the swarm's overlapped order checkpoints here: start <- own weights
        e.inner_round()
        e.make_update(sender="solo")
    path = e.save_checkpoint(tmp_path / "ck")
    state = torch.load(path / "state.pt", weights_only=True)
    n = sum(t.numel() for t in e.global_params.values())
    own = {"round boundary": "agreed", "mid-round": "tensor", "update sent": "tensor"}[moment]
    start = {"round boundary": "agreed", "mid-round": "agreed", "update sent": "local"}[moment]
    for name in e.names:
        stored = state["model"][name]
        assert (isinstance(stored, torch.Tensor) if own == "tensor" else stored == own), (name, stored)
        assert state["start"][name] == start, name
    per_param = 16 if moment == "round boundary" else 20  # agreed + EF + AdamW's two moments (+ own weights)
    assert per_param * n <= _tensor_bytes(state) <= per_param * n + 8192  # + the RNG state and AdamW's step counts
    _same_engine(e, Engine.resume(cfg, tmp_path / "ck"))


def test_format_1_checkpoints_still_load_and_newer_ones_are_refused(tmp_path):
    """Format 1 held every set of weights in full; it loads as it was. A format this gradnode does not know is
    one line naming what to do."""
    cfg = tiny_config(tmp_path)
    e = Engine(cfg)
    run(e, 1)
    e.inner_round(max_steps=1)
    state = e.state_dict()
    state["model"] = {n: p.detach().clone() for n, p in e.params.items()}  # format 1's layout
    state["start"] = {n: t.clone() for n, t in e.start.items()}
    meta = e.snapshot().meta
    path = checkpoint.save(tmp_path / "ck", e.round, state, meta, keep=1)
    written = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**written, "format": 1}))
    _same_engine(e, Engine.resume(cfg, tmp_path / "ck"))
    (path / "meta.json").write_text(json.dumps({**written, "format": 3}))
    with pytest.raises(CheckpointError, match="format 3, this gradnode reads formats 1, 2: .*checkpoint.resume=false"):
        checkpoint.load(path)


def test_a_tensor_viewing_a_larger_buffer_is_written_alone(tmp_path):
    """torch.save writes a tensor's whole storage: a view is copied out first; tensors that share one storage
    whole (tied weights) stay shared and are written once."""
    big = torch.arange(1 << 20, dtype=torch.float32)
    tied = torch.ones(1 << 16)
    path = checkpoint.save(tmp_path, 1, {"w": big[5:9], "a": tied, "b": tied}, {"run_id": "r"}, keep=1)
    assert (path / "state.pt").stat().st_size < (1 << 16) * 4 + 4096
    state, _ = checkpoint.load(path)
    assert torch.equal(state["w"], big[5:9]) and state["a"].untyped_storage().data_ptr() == \
        state["b"].untyped_storage().data_ptr()


def test_a_marker_that_names_nothing_is_a_checkpoint_error(tmp_path):
    cfg = tiny_config(tmp_path)
    e = Engine(cfg)
    run(e, 1)
    state = e.state_dict()
    state["model"] = {n: "local" for n in e.names}  # the own weights cannot stand for themselves
    checkpoint.save(tmp_path / "ck", e.round, state, e.snapshot().meta, keep=1)
    with pytest.raises(CheckpointError, match="does not fit this config: .*model"):
        Engine.resume(cfg, tmp_path / "ck")
