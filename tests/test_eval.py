"""`gradnode eval` on real checkpoints of the real engine: loss, perplexity and bits per byte of the agreed
weights over non-overlapping windows spread over the text, the same on every call, on the run's held-out split
or on given text; bad input is one line and exit 2, a bad checkpoint path before torch loads."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from _tiny import agreed_logits, one_error_line, trained_checkpoint
from gradnode.node.cli import app

pytestmark = pytest.mark.process  # starts processes or daemons (selectable for flake-hunt: -m process)

runner = CliRunner()


def gradnode_eval(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["eval", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """A tiny run folder with one checkpoint; the engine stays at the moment it was saved."""
    return trained_checkpoint(tmp_path_factory.mktemp("eval"))


def expected_loss(engine, data: bytes, seq_len: int, starts: list[int] | None = None, last: int | None = None) -> float:
    """The same figure computed another way: every window on its own, the agreed weights through the engine.
    ``starts``: only the windows starting there, the last one scoring ``last`` predictions."""
    tokens = torch.tensor(list(data))
    starts = list(range(0, len(data) - 1, seq_len)) if starts is None else starts
    total, n = 0.0, 0
    for start in starts:
        window = tokens[start:start + seq_len + 1]
        if start == starts[-1] and last is not None:
            window = window[:last + 1]
        logits = agreed_logits(engine, window[None, :-1])
        total += float(F.cross_entropy(logits[0], window[1:], reduction="sum"))
        n += window.numel() - 1
    return total / n


def test_eval_on_text_files_matches_a_direct_computation(tmp_path: Path, run) -> None:
    engine, ckpt = run
    a = tmp_path / "a.txt"
    a.write_bytes(b"".join(b"def add_%d(a, b):\n    return a + %d * b\n" % (i, i * i) for i in range(7)) + b"x = 1\n")
    folder = tmp_path / "more"
    folder.mkdir()
    (folder / "b.py").write_bytes(b"import os\nprint(os.getcwd())\n" * 3)
    (folder / "skip.bin").write_bytes(b"\x00\x01 not text by suffix")
    code, out, err = gradnode_eval(str(ckpt.parent.parent), "--data", str(a), "--data", str(folder), "--json")
    assert code == 0, err
    report = json.loads(out)
    text = a.read_bytes() + b"\n\n" + (folder / "b.py").read_bytes()  # documents joined as the corpus joins them
    assert report["tokens"] == len(text) - 1 and report["truncated"] is False
    assert report["data"] == f"text: {a}, {folder}" and report["round"] == 1 and report["checkpoint"] == str(ckpt)
    assert math.isclose(report["loss"], expected_loss(engine, text, engine.cfg.model.seq_len), rel_tol=1e-6)
    assert math.isclose(report["perplexity"], math.exp(report["loss"]), rel_tol=1e-12)
    assert math.isclose(report["bits_per_byte"], report["loss"] / math.log(2), rel_tol=1e-12)
    assert set(report) >= {"checkpoint", "round", "tokens", "loss", "perplexity", "bits_per_byte", "data"}

    code, out, err = gradnode_eval(str(ckpt), "--data", str(a), "--max-tokens", "50", "--json")
    cut = json.loads(out)
    assert cut["tokens"] == 50 and cut["truncated"] is True and cut["unit"] == "nats/byte"
    # 50 predictions of a text of 8 whole windows of 32 and a shorter one: 2 windows spread over the 8
    assert (len(a.read_bytes()) - 1) // 32 == 8 and engine.cfg.model.seq_len == 32
    spread = expected_loss(engine, a.read_bytes(), 32, starts=[0, 128], last=18)
    assert math.isclose(cut["loss"], spread, rel_tol=1e-6)
    assert not math.isclose(spread, expected_loss(engine, a.read_bytes()[:51], 32), rel_tol=1e-4)  # not the start


def test_eval_of_the_held_out_split_is_the_same_on_every_call(run) -> None:
    _, ckpt = run
    args = [sys.executable, "-m", "gradnode.node.cli", "eval", str(ckpt.parent.parent), "--max-tokens", "20000",
            "--device", "cpu", "--json"]
    first, second = (subprocess.run(args, capture_output=True, text=True, timeout=300) for _ in range(2))
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout  # every figure, to the last digit
    report = json.loads(first.stdout)
    assert report["tokens"] == 20000 and report["truncated"] is True and report["data"].startswith("held-out split")
    assert 0 < report["loss"] < math.log(256) + 0.5  # one round of training: about as good as uniform bytes

    code, out, err = gradnode_eval(str(ckpt), "--max-tokens", "20000")  # the table
    assert code == 0, err
    for row in ("val loss", "perplexity", "bits per byte", "20,000 (spread over more: --max-tokens)",
                f"{report['loss']:.4f} nats/byte on 20,000 held-out bytes"):
        assert row in out, out


def test_a_run_folder_takes_its_newest_valid_checkpoint_and_says_which(tmp_path: Path) -> None:
    engine, older = trained_checkpoint(tmp_path)
    engine.apply_aggregate([])
    newest = engine.save_checkpoint()
    (newest / "state.pt").write_bytes(b"damaged")
    text = tmp_path / "t.txt"
    text.write_text("hello world\n" * 20)
    code, out, err = gradnode_eval(str(tmp_path / "run"), "--data", str(text), "--json")
    assert code == 0, err
    assert "skipped: checkpoint" in err and newest.name in err and "corrupt" in err
    assert f"checkpoint: {older.resolve()} (round 1" in err and json.loads(out)["round"] == 1


def test_eval_mistakes_are_one_line(tmp_path: Path, run) -> None:
    _, ckpt = run
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "x.bin").write_bytes(b"1234")
    corrupt = tmp_path / "ckpts" / "round-00000003"
    corrupt.mkdir(parents=True)
    (corrupt / "state.pt").write_bytes((ckpt / "state.pt").read_bytes()[:-100])
    (corrupt / "meta.json").write_text((ckpt / "meta.json").read_text())
    cases = {"no such checkpoint or folder": [str(tmp_path / "missing")],
             "no checkpoint in it": [str(tmp_path / "bare")],
             "state.pt is corrupt (sha256 mismatch)": [str(corrupt)],
             "no valid checkpoint in": [str(corrupt.parent)],
             f"--data: {empty} is empty": [str(ckpt), "--data", str(empty)],
             f"--data: {tmp_path / 'nope.txt'} does not exist": [str(ckpt), "--data", str(tmp_path / "nope.txt")],
             f"--data: no text files in {tmp_path / 'bare'}": [str(ckpt), "--data", str(tmp_path / "bare")],
             "does not fit checkpoint": [str(ckpt), "--set", "model.n_layer=3"]}
    for expected, args in cases.items():
        code, _, err = gradnode_eval(*args)
        assert expected in one_error_line(code, err), (expected, err)


def test_the_windows_scored_are_spread_over_the_text_and_make_the_count() -> None:
    """The grid of non-overlapping windows; all of it when the count covers the text, else windows spread evenly
    over its whole windows (the last one cut to make the count): the same few files at the split's start would
    stand for it all."""
    from gradnode.node.train.evaluate import windows

    assert windows(100, 100, 32) == [(0, 32), (32, 32), (64, 32), (96, 4)]
    assert windows(100, 98, 32) == [(0, 32), (32, 32), (64, 32), (96, 2)]
    assert windows(1000, 64, 32) == [(0, 32), (480, 32)]
    assert windows(100, 5, 32) == [(0, 5)]
    for available in range(1, 200):
        for n in range(1, available + 1):
            picked = windows(available, n, 32)
            assert sum(length for _, length in picked) == n
            ends = [(s, s + length) for s, length in picked]
            assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:])) and ends[-1][1] <= available
            assert all(s % 32 == 0 for s, _ in picked)
            if len(picked) > 1:  # spread: the first window at the start, the last one (k-1)/k of the way along
                k, whole = len(picked), available // 32
                assert picked[0][0] == 0 and picked[-1][0] // 32 >= (k - 1) * whole // k


CHECK_BEFORE_TORCH = """
import json, sys
from typer.testing import CliRunner
from gradnode.node.cli import app
results = []
for path in sys.argv[1:]:
    r = CliRunner().invoke(app, ["eval", path])
    results.append([r.exit_code, r.stderr])
print(json.dumps({"results": results, "torch": "torch" in sys.modules}))
"""


def test_a_wrong_checkpoint_path_fails_before_torch_loads(tmp_path: Path, run) -> None:
    """A file inside a checkpoint (state.pt, meta.json), a missing path or a folder without checkpoints: one line
    naming what to pass, exit 2, and torch never imported (it takes seconds)."""
    _, ckpt = run
    (tmp_path / "bare").mkdir()
    paths = [ckpt / "state.pt", ckpt / "meta.json", tmp_path / "missing", tmp_path / "bare"]
    done = subprocess.run([sys.executable, "-c", CHECK_BEFORE_TORCH, *map(str, paths)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    expected = [f"is a file: name a checkpoint folder (round-NNNNNNNN) (here: {ckpt})",
                f"is a file: name a checkpoint folder (round-NNNNNNNN) (here: {ckpt})",
                "no such checkpoint or folder", "no checkpoint in it"]
    for (code, err), want in zip(report["results"], expected):
        assert want in one_error_line(code, err), (want, err)
    assert report["torch"] is False
