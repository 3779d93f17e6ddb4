"""`gradnode bench compressors` at tiny size: every family has a row, and the figures hang together."""

from __future__ import annotations

import json
import math
import sys

from typer.testing import CliRunner

from gradnode.node.bench.compressors import REFERENCE, ROWS
from gradnode.node.cli import app
from gradnode.protocol.compress import Family


def test_tiny_bench_has_every_family_with_sane_figures(tmp_path, monkeypatch):
    """Without matplotlib the run goes on, says the plot was skipped, and prints its figures."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = ["bench", "compressors", "--size", "tiny", "--replicas", "2", "--rounds", "2", "--inner-steps", "2",
            "--json", "--plot", str(tmp_path / "p.png")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "plot skipped" in result.output and not (tmp_path / "p.png").exists()
    out = json.loads(result.stdout.strip().splitlines()[-1])
    rows = {r["compressor"]: r for r in out["rows"]}
    assert list(rows) == [r.label for r in ROWS]
    assert {r["family"] for r in rows.values()} == {f.value for f in Family}
    assert out["ddp"] > 0 and out["diloco"] > 0 and out["tokens"] > 0
    for r in rows.values():
        assert math.isfinite(r["val_loss"]) and 0 < r["val_loss"] < math.log(256) + 1
        assert 0 < r["bytes_per_param"] <= 4.0 and math.isclose(r["fp32_ratio"] * r["bytes_per_param"], 4.0)
        assert r["encode_gbps"] > 0 and r["decode_gbps"] > 0
        assert math.isclose(r["vs_diloco"], r["val_loss"] / out["diloco"])
    assert rows["dense fp32"]["bytes_per_param"] == 4.0 and rows["dense bf16"]["bytes_per_param"] == 2.0
    assert rows[REFERENCE.label]["vs_sparseloco"] == 1.0
    # cost order within families follows the settings: fewer kept values, fewer bytes
    assert rows["sparseloco top16/4096 2b rice"]["bytes_per_param"] < rows[REFERENCE.label]["bytes_per_param"]
    assert rows["quant int4/64"]["bytes_per_param"] < rows["quant int8/64"]["bytes_per_param"]
    assert {r["compressor"] for r in rows.values() if r["summable"]} == \
        {label for label in rows if label.split()[0] in ("random-k", "powersgd", "dense")}
    # fp32 and bf16 updates of a 2-round run differ by rounding only
    assert abs(rows["dense bf16"]["val_loss"] - rows["dense fp32"]["val_loss"]) < 0.01
    assert out["fewest_bytes_within_1pct"] in rows


def test_a_sweep_runs_each_row_at_each_rate_and_compares_with_the_best_reference() -> None:
    from gradnode.node.bench import compressors as bc
    rows = bc.swept(bc.ROWS[:3], [1.0, 2.0])
    assert [(r.label, r.lr) for r in rows] == [(bc.REFERENCE.label, 1.0), (bc.REFERENCE.label, 2.0)] + [
        (r.label, lr) for r in bc.ROWS[1:3] for lr in (1.0, 2.0)]
    assert len({r.key for r in rows}) == len(rows) and bc.swept(bc.ROWS, []) == bc.ROWS
    def result(label: str, lr: float, loss: float, nbytes: float = 0.0189) -> bc.RowResult:
        return bc.RowResult(label, "sparseloco", lr, loss, nbytes, False, 1.0, 1.0, 1.0, 1, 1)
    report = bc.Report(None, [result(bc.REFERENCE.label, 1.0, 2.1), result(bc.REFERENCE.label, 2.0, 2.0),
                              result("sparser", 2.0, 2.015, 0.01)])
    assert report.reference.lr == 2.0  # a tuned row against the tuned reference: 1.0075x, not 0.96x
    assert report.best_within(0.01).label == "sparser" and report.best_within(0.005).label == bc.REFERENCE.label
