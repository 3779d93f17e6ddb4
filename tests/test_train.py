import json
import threading

from typer.testing import CliRunner

from _tiny import tiny_config
from gradnode.node.cli import app
from gradnode.node.train.solo import train


def test_train_end_to_end_and_resume(tmp_path):
    cfg = tiny_config(tmp_path, rounds=4)
    summary = train(cfg, eval_every=2)
    assert summary.rounds == 4 and summary.val_loss < summary.val_loss_start
    assert summary.tokens == 4 * 4 * 4 * 32 and summary.bytes_per_round > 0
    assert (tmp_path / "checkpoints" / "round-00000004").is_dir()
    again = train(tiny_config(tmp_path, rounds=5))  # resumes at round 4
    assert again.rounds == 1


def test_cli_train_runs_and_prints_a_summary(tmp_path):
    args = ["train", "--rounds", "2", "--output-dir", str(tmp_path), "--set", "model.d_model=32",
            "--set", "model.n_layer=1", "--set", "model.seq_len=32", "--set", "inner.steps=2",
            "--set", "inner.batch_size=2", "--set", "inner.device=cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "val loss" in result.output and "nats/byte" in result.output and "32,768 held-out bytes" in result.output
    assert "tokens" in result.output


def test_cli_train_bad_config_names_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("inner:\n  lr: -1\n")
    result = CliRunner().invoke(app, ["train", "--config", str(bad)])
    assert result.exit_code == 2 and "inner.lr" in result.output


def test_cli_train_missing_data_path(tmp_path):
    result = CliRunner().invoke(app, ["train", "--output-dir", str(tmp_path), "--set", "data.source=text",
                                      "--set", f"data.paths=[{tmp_path / 'nope'}]"])
    assert result.exit_code == 2 and "data.paths" in result.output


class _StopAfter(threading.Event):
    """A Ctrl+C that arrives after the loop asked ``n`` times whether to stop (mid-round, deterministically)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        if self.n < 0:
            self.set()
        return super().is_set()


def test_a_stop_mid_round_resumes_to_the_same_weights(tmp_path):
    from gradnode.node.train.engine import Engine

    whole = train(tiny_config(tmp_path / "whole", rounds=3))
    assert whole.stopped_at_step is None
    cfg = tiny_config(tmp_path / "cut", rounds=3)
    cut = train(cfg, stop=_StopAfter(8))  # 2 checks per round + 1 per step: inside round 2
    assert cut.stopped_at_step is not None and 0 < cut.stopped_at_step < cfg.inner.steps and cut.last_round == 1
    assert cut.checkpoint is not None
    rest = train(cfg)
    assert rest.first_round == 1 and rest.last_round == 3
    done = [Engine.resume(tiny_config(tmp_path / name, rounds=3), tmp_path / name / "checkpoints")
            for name in ("whole", "cut")]
    assert done[0].param_hash() == done[1].param_hash()


def test_train_and_eval_give_one_val_loss_for_one_checkpoint(tmp_path):
    """`gradnode train`'s val loss at the end and `gradnode eval` of the checkpoint it wrote: the same measure
    (nats per byte on the same held-out bytes) of the same agreed weights, hence the same figure."""
    from gradnode.node.train.evaluate import VAL_BYTES

    summary = train(tiny_config(tmp_path, rounds=2))
    result = CliRunner().invoke(app, ["eval", str(tmp_path), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["checkpoint"] == summary.checkpoint and report["round"] == 2
    assert report["tokens"] == summary.val_bytes == VAL_BYTES and report["unit"] == "nats/byte"
    assert abs(report["loss"] - summary.val_loss) <= 1e-6 * summary.val_loss, (report["loss"], summary.val_loss)
    assert summary.val_loss < summary.val_loss_start


def test_the_progress_bar_counts_inner_steps_within_a_round(tmp_path):
    """A round can take minutes: the bar shows the step about to run and the round, not an empty bar."""
    from rich.console import Console

    console = Console(record=True, width=120, force_terminal=True)
    train(tiny_config(tmp_path, rounds=1), eval_every=1, console=console)
    text = console.export_text()
    steps = tiny_config(tmp_path, rounds=1).inner.steps
    assert "round 1/1" in text and f"step {steps}/{steps}" in text and "validation loss before training" in text, text
