"""`gradnode bench scale`: a committee beside all-to-all in the virtual simulator, per peer and round."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gradnode.node.cli import app


def test_bench_scale_gives_each_figure_per_rule_and_a_committee_fetches_fewer_updates() -> None:
    got = CliRunner().invoke(app, ["bench", "scale", "--sizes", "8,24", "--rounds", "8", "--round-s", "20",
                                   "--committee", "4,8,1", "--all-to-all-max", "24", "--json"])
    assert got.exit_code == 0, got.output
    out = json.loads(got.output.strip().splitlines()[-1])
    rows = {(r["peers"], r["rule"]): r for r in out["rows"]}
    assert set(rows) == {(8, "committee"), (8, "all-to-all"), (24, "committee"), (24, "all-to-all")}
    for r in rows.values():
        assert r["violations"] == 0 and r["final_hashes"] == 1 and not r["stalled"], r
        for f in ("update_bytes_down", "update_bytes_up", "records_read", "record_bytes_read", "peak_updates_held"):
            assert 0 <= r[f]["min"] <= r[f]["median"] <= r[f]["max"], (f, r)
    per_update = rows[24, "committee"]["update_bytes"]
    committee = rows[24, "committee"]["update_bytes_down"]["median"] / per_update
    everyone = rows[24, "all-to-all"]["update_bytes_down"]["median"] / per_update
    assert committee < 0.6 * everyone, (committee, everyone)  # 4 + 1 a round (and two rounds of all) against 23


def test_bench_scale_refuses_bad_sizes_and_budgets() -> None:
    for bad in (["--sizes", "1"], ["--sizes", "8,x"], ["--committee", "0,0,1"], ["--sizes", "20000"],
                ["--loopback", "1"], ["--loopback", "64"], ["--loopback", "4", "--loopback-committee", "2,0,1"]):
        got = CliRunner().invoke(app, ["bench", "scale", *bad])
        assert got.exit_code == 2, (bad, got.output)
