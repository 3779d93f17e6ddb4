import json
import os

import pytest

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
