"""`gradnode bench robust` at a very small size: the JSON the issue asks for, and the robust rule beating
coord_mean under a strong attack in the same run."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gradnode.node.bench.attacks import ATTACKS
from gradnode.node.bench.robust import RobustSettings, goals, plan, run_bench
from gradnode.node.cli import app

KEYS = {"rule", "attack", "attackers", "replicas", "val_loss", "clean_val_loss", "ratio"}


def test_cli_json_structure_and_the_robust_rule_beats_coord_mean() -> None:
    args = ["bench", "robust", "--size", "tiny", "--rounds", "3", "--inner-steps", "2", "--groups", "4:1",
            "-a", "signflip", "-a", "scaled", "--jobs", "1", "--score-rows", "4", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    rows = out["results"]
    assert len(rows) == 2 * 3  # 2 rules x (clean + 2 attacks)
    for row in rows:
        assert KEYS <= set(row)
        assert row["replicas"] == 4 and row["attackers"] == (0 if row["attack"] == "none" else 1)
        assert abs(row["ratio"] - row["val_loss"] / row["clean_val_loss"]) < 1e-12
    by = {(r["rule"], r["attack"]): r for r in rows}
    for attack in ("signflip", "scaled"):
        assert by[("robust", attack)]["ratio"] < by[("coord_mean", attack)]["ratio"], attack
        assert by[("robust", attack)]["attacker_left_out"] == 3  # every round
        assert by[("robust", attack)]["honest_left_out"] == 0
    # no attacker: the robust rule's run is coord_mean's, bit for bit
    assert by[("robust", "none")]["val_loss"] == by[("coord_mean", "none")]["val_loss"]
    assert {g["goal"].split(",")[0] for g in out["goals"]} >= {"robust"}


def test_every_attack_runs_and_honest_replicas_stay_identical() -> None:
    """run_one asserts that the honest replicas end bit-identical; every attack, both rules, 2 of 5."""
    s = RobustSettings(size="tiny", rounds=2, inner_steps=1, groups=((5, 2),), eval_batches=1, jobs=1,
                       score_rows=2)
    results = run_bench(s)
    assert [(r.rule, r.attack) for r in results] == [(rule, a or "none") for rule, a, _, _ in plan(s)]
    assert {r.attack for r in results} == {"none", *ATTACKS}
    assert all(r.attackers == 2 for r in results if r.attack != "none")
    assert goals(results)


def test_cli_rejects_bad_groups_and_attacks() -> None:
    for args in (["--groups", "4-1"], ["--groups", "4:2"], ["-a", "meteor"], ["--rule", "median"]):
        result = CliRunner().invoke(app, ["bench", "robust", "--size", "tiny", *args])
        assert result.exit_code == 2, (args, result.output)
        assert result.output.count("\n") <= 2, result.output
