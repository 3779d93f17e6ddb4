"""`gradnode export` on real checkpoints of the real engine: the agreed weights (not a peer's unfinished
progress) reload with identical logits, as safetensors through gradnode's loader and as a folder that
transformers loads; a config that does not fit, a full output folder or a missing transformers are one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from _tiny import agreed_logits, one_error_line, trained_checkpoint
from gradnode.node import __version__
from gradnode.node.cli import app
from gradnode.node.train.export import HF_ATOL, HF_RTOL, load_safetensors

runner = CliRunner()


def export(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["export", *args])
    return result.exit_code, result.stdout, result.stderr


def assert_loads_in_transformers(transformers, folder: Path, engine, cls_name: str) -> None:
    """``AutoModelForCausalLM.from_pretrained(folder)`` is a ``cls_name`` whose logits are the agreed weights'."""
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    assert type(loaded).__name__ == cls_name
    x = sample(engine)
    with torch.no_grad():
        theirs = loaded(input_ids=x).logits
    ours = agreed_logits(engine, x)
    # fp32 on both sides, other matmul kernels (GPT-2's Conv1D): equal up to rounding, stated tolerance
    assert torch.allclose(theirs, ours, rtol=HF_RTOL, atol=HF_ATOL), float((theirs - ours).abs().max())


def sample(engine) -> torch.Tensor:
    return torch.randint(0, 256, (3, engine.cfg.model.seq_len), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory):
    """One tiny GPT checkpoint (tied head) for the module; its engine stays at the moment it was saved."""
    return trained_checkpoint(tmp_path_factory.mktemp("gpt"))


@pytest.mark.parametrize("tied", [True, False])
def test_safetensors_export_reloads_with_the_engines_exact_logits(tmp_path: Path, tied: bool) -> None:
    engine, ckpt = trained_checkpoint(tmp_path, model={"tie_embeddings": tied})
    code, out, err = export(str(tmp_path / "run"), "--format", "safetensors", "--out", str(tmp_path / "exp"),
                            "--json")
    assert code == 0, err
    assert f"checkpoint: {ckpt.resolve()} (round 1 of run test-tiny; model config from the checkpoint)" in err
    report = json.loads(out)
    assert report["weights_hash"] == engine.param_hash() and report["round"] == 1
    assert sorted(report["files"]) == ["config.json", "model.safetensors"]

    model, info = load_safetensors(tmp_path / "exp")
    x = sample(engine)
    with torch.no_grad():
        assert torch.equal(model(x), agreed_logits(engine, x))
        # the peer's own weights were two inner steps further: those are not what was exported
        assert not torch.equal(model(x), engine.model(x))
    assert info["run_id"] == "test-tiny" and info["round"] == 1 and info["gradnode_version"] == __version__
    assert info["weights_hash"] == engine.param_hash() and info["model"]["tie_embeddings"] is tied

    from safetensors import safe_open

    with safe_open(str(tmp_path / "exp" / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert ("head.weight" in stored) is not tied  # a tied head is stored once, as tok.weight, and re-tied on load
    assert info["tied"] == ({"head.weight": "tok.weight"} if tied else {})
    assert (model.head.weight is model.tok.weight) is tied


def test_a_damaged_safetensors_export_is_refused(tmp_path: Path, gpt) -> None:
    _, ckpt = gpt
    assert export(str(ckpt), "--out", str(tmp_path / "exp"))[0] == 0
    weights = tmp_path / "exp" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x40  # a bit of the last tensor's values
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="weights_hash"):
        load_safetensors(tmp_path / "exp")


@pytest.mark.parametrize("tied", [True, False])
def test_hf_export_of_the_builtin_gpt_loads_in_transformers(tmp_path: Path, tied: bool) -> None:
    transformers = pytest.importorskip("transformers")
    engine, _ = trained_checkpoint(tmp_path, model={"tie_embeddings": tied})
    code, out, err = export(str(tmp_path / "run"), "--format", "hf", "--out", str(tmp_path / "hf"))
    assert code == 0, err
    assert "exported as hf" in out and "GPT2LMHeadModel's logits equal the GPT's" in out
    assert_loads_in_transformers(transformers, tmp_path / "hf", engine, "GPT2LMHeadModel")
    side = json.loads((tmp_path / "hf" / "gradnode.json").read_text())
    assert side["weights_hash"] == engine.param_hash() and side["round"] == 1 and side["run_id"] == "test-tiny"


def test_hf_export_of_a_transformers_model(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg_dir = tmp_path / "llama"
    transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=2, vocab_size=300, max_position_embeddings=32,
                             tie_word_embeddings=False).save_pretrained(cfg_dir)
    engine, _ = trained_checkpoint(tmp_path, model={"kind": "hf", "hf_config": str(cfg_dir)})
    code, out, err = export(str(tmp_path / "run" / "checkpoints"), "--out", str(tmp_path / "hf"))  # auto: hf
    assert code == 0, err
    assert_loads_in_transformers(transformers, tmp_path / "hf", engine, "LlamaForCausalLM")
    code, _, err = export(str(tmp_path / "run"), "--format", "safetensors", "--out", str(tmp_path / "st"))
    assert "format safetensors is the built-in GPT's" in one_error_line(code, err)


def test_the_config_comes_from_the_checkpoint_or_from_config_and_must_fit(tmp_path: Path, gpt) -> None:
    engine, ckpt = gpt
    code, _, err = export(str(ckpt), "--set", "model.d_model=64", "--out", str(tmp_path / "a"))
    line = one_error_line(code, err)
    assert "does not fit checkpoint" in line and "in the checkpoint" in line and "--config" in line, line
    assert not (tmp_path / "a").exists()

    old = tmp_path / "old" / "round-00000001"  # as written before checkpoints stored their config
    old.mkdir(parents=True)
    (old / "state.pt").write_bytes((ckpt / "state.pt").read_bytes())
    meta = json.loads((ckpt / "meta.json").read_text())
    (old / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "config"}))
    code, _, err = export(str(old), "--out", str(tmp_path / "b"))
    line = one_error_line(code, err)
    assert "the default config (the checkpoint stores none: pass --config)" in line and "does not fit" in line
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(meta["config"]))  # JSON is YAML
    code, out, err = export(str(old), "--config", str(config), "--out", str(tmp_path / "b"), "--json")
    assert code == 0, err
    assert f"model config from --config {config}" in err and json.loads(out)["weights_hash"] == engine.param_hash()


def test_export_mistakes_are_one_line(tmp_path: Path, gpt, monkeypatch: pytest.MonkeyPatch) -> None:
    _, ckpt = gpt
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = {"is not an empty folder": [str(ckpt), "--out", str(tmp_path / "full")],
             "--format 'onnx': use one of auto, safetensors, hf": [str(ckpt), "-f", "onnx", "--out",
                                                                     str(tmp_path / "o")],
             "no such checkpoint or folder": [str(tmp_path / "missing"), "--out", str(tmp_path / "o")],
             "no checkpoint in it": [str(tmp_path / "full"), "--out", str(tmp_path / "o")]}
    for expected, args in cases.items():
        code, _, err = export(*args)
        assert expected in one_error_line(code, err), (expected, err)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as where it is not installed
    code, _, err = export(str(ckpt), "--format", "hf", "--out", str(tmp_path / "o"))
    assert "format hf needs transformers: pip install 'gradnode[hf]'" in one_error_line(code, err)
    assert not (tmp_path / "o").exists() and [p.name for p in tmp_path.iterdir()] == ["full"]
