"""`gradnode bench robust`: how much can attackers with valid keys hurt training, per aggregation rule?

Like `bench quality`: R replicas train in lock-step in one process, without a network (SparseLoCo, the
real codec, ``Engine.make_update -> decode_update -> Engine.apply_aggregate``). Some replicas are
attackers (node/bench/attacks.py): their sent update is replaced by the attack, computed from the
round's real updates, with honest token counts. Every honest replica must end bit-identical.

For each rule, each group (R replicas of which A attack: 1 of 4 and 2 of 8 by default) and each attack,
the final validation loss is compared with the clean run (no attacker) of the same rule and R:
``ratio = val_loss / clean_val_loss``. With ``score`` on, the 'robust' rule's round first goes through
the witnesses' loss check (node/train/score.py): updates a witness rejects never enter the decided
set. All honest replicas hold the same weights, so their verdicts agree; it is computed once per
update, and its cost is reported against one replica's inner compute of the round, both in CPU time
(a witness checks the N-1 other updates: reported for N, a slight over-estimate).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from gradnode.node.bench.attacks import ATTACKS, TRAINS, Attacker
from gradnode.node.bench import pyplot
from gradnode.node.train.data import FixedBatches
from gradnode.node.config import Config, config_from_dict, with_overrides
from gradnode.node.train.engine import Engine, codec_params
from gradnode.node.train.model import count_params
from gradnode.node.train.score import Scorer, ScoreParams
from gradnode.protocol import DecodedUpdate, decode_update

log = logging.getLogger(__name__)

RULES = ("coord_mean", "robust")
# "small" (the default) fits the whole default run in 10 minutes on 2 CPU cores; "tiny" is for tests;
# "medium" is bench quality's 1.66M-parameter default model; "node" is the embedded default config's model
# and batch (configs/tiny-cpu.yaml, 3.2M parameters; pair it with --inner-steps 20), where the scoring
# cost is measured against the compute of a round a peer really runs.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"model": {"n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 32}, "inner": {"batch_size": 4}},
    "small": {"model": {"n_layer": 2, "d_model": 64, "n_head": 2, "seq_len": 64}, "inner": {"batch_size": 8}},
    "medium": {"model": {"n_layer": 2, "d_model": 256, "n_head": 4, "seq_len": 64}, "inner": {"batch_size": 8}},
    "node": {"model": {"n_layer": 4, "d_model": 256, "n_head": 4, "seq_len": 128}, "inner": {"batch_size": 16}},
}
GOALS = {4: 1.02, 8: 1.03}  # ratio bound per replica count of the groups (1 of 4, 2 of 8)
CLEAN_GOAL = 1.005  # robust rule's clean run vs coord_mean's clean run
COST_GOAL = 0.10  # scoring time / one replica's inner compute per round


@dataclass
class RobustSettings:
    rounds: int = 15
    inner_steps: int = 10
    size: str = "small"
    seed: int = 0
    eval_batches: int = 16
    inner_lr: float = 1.5e-3  # bench quality's measured best
    sparseloco_lr: float = 1.0
    ef_beta: float = 0.9
    rules: tuple[str, ...] = RULES
    attacks: tuple[str, ...] = ATTACKS
    groups: tuple[tuple[int, int], ...] = ((4, 1), (8, 2))  # (replicas, attackers)
    score: bool = True  # the witnesses' loss check in front of the 'robust' rule
    score_rows: int = ScoreParams().rows
    own_rows: int = 0  # also score each update on this many rows of its sender's assigned batches
    jobs: int = 2  # runs at a time, in worker processes of one torch thread each
    device: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"--size must be one of {', '.join(SIZES)}, got {self.size!r}")
        if self.rounds < 1 or self.inner_steps < 1 or self.jobs < 1:
            raise ValueError("--rounds, --inner-steps and --jobs must be >= 1")
        for name in self.rules:
            if name not in RULES:
                raise ValueError(f"--rule must be one of {', '.join(RULES)}, got {name!r}")
        for name in self.attacks:
            if name not in ATTACKS:
                raise ValueError(f"--attack must be one of {', '.join(ATTACKS)}, got {name!r}")
        for replicas, attackers in self.groups:
            if replicas < 2 or not 1 <= attackers < replicas / 2:
                raise ValueError(f"--groups: {attackers} of {replicas}: need 2+ replicas and 1 <= attackers < half")


@dataclass
class RunResult:
    rule: str
    attack: str  # "none" for the clean run
    attackers: int
    replicas: int
    val_loss: float
    seconds: float
    clean_val_loss: float = math.nan
    honest_left_out: int = 0  # honest updates the rule screened out or the witnesses rejected, all rounds
    attacker_left_out: int = 0  # attackers' updates left out (screened, rejected or weight 0)
    attacker_updates: int = 0
    honest_updates: int = 0
    rejected: int = 0  # by the witnesses' loss check (all senders)
    score_cost: float = 0.0  # scoring seconds per round / one replica's inner seconds per round
    apply_cost: float = 0.0  # apply_aggregate (the rule and the outer step) per round / the same
    min_honest_gain: float = math.nan  # the smallest mean loss gain of an honest update (witness rows)
    min_honest_cos_ratio: float = math.nan  # robust rule: smallest honest cos / the round's median cos
    max_attacker_cos_ratio: float = math.nan  # ... largest of an attacker's update (the screen: >= 0.35)
    honest_capped: int = 0  # robust rule: honest updates whose magnitudes were capped
    attacker_reasons: dict[str, int] = field(default_factory=dict)  # why attackers' updates were left out
    own_advantage_honest: list[float] = field(default_factory=list)  # own_gain - gain per honest update
    own_advantage_attacker: list[float] = field(default_factory=list)  # ... per attacker's update (own_rows)

    @property
    def ratio(self) -> float:
        return self.val_loss / self.clean_val_loss


def bench_config(s: RobustSettings, rule: str) -> Config:
    base = SIZES[s.size]
    tree: dict[str, Any] = {
        "run": {"run_id": "bench-robust", "seed": s.seed}, "rounds": s.rounds, "model": dict(base["model"]),
        "inner": {**base["inner"], "steps": s.inner_steps, "lr": s.inner_lr,
                  "warmup_steps": min(50, s.rounds * s.inner_steps // 10)},
        "outer": {"algorithm": "sparseloco", "lr": s.sparseloco_lr, "momentum": 0.0, "ef_beta": s.ef_beta,
                  "aggregation": rule, "clip_to_median": True},
        "checkpoint": {"every_rounds": 0}}
    return config_from_dict(with_overrides(tree, s.overrides), f"bench robust ({rule})")


def run_one(s: RobustSettings, rule: str, attack: str | None, replicas: int, attackers: int) -> RunResult:
    """One training run; attackers are the last ``attackers`` replicas."""
    run = _Run(s, rule, attack, replicas, attackers)
    for r in range(s.rounds):
        updates = run.updates(r)
        keep = run.witnesses(r, updates) if s.score and rule == "robust" else list(range(replicas))
        run.apply([updates[i] for i in keep])
        run.tally(keep)
    return run.finish()


class _Run:
    """The replicas of one run, its attackers' crafting state and its tallies."""

    def __init__(self, s: RobustSettings, rule: str, attack: str | None, replicas: int, attackers: int) -> None:
        cfg = bench_config(s, rule)
        self.s, self.rule, self.attack, self.replicas = s, rule, attack, replicas
        self.engines = [Engine(cfg, peer_index=i, device=s.device) for i in range(replicas)]
        self.bad = list(range(replicas - attackers, replicas)) if attack else []
        self.honest = [i for i in range(replicas) if i not in self.bad]
        self.crafters = {i: Attacker(attack, i, victim=k % len(self.honest), codec=codec_params(cfg),
                                     run_id=cfg.run.run_id, seed=s.seed)
                         for k, i in enumerate(self.bad)} if attack else {}
        for i in self.bad:
            if attack == "lazy":
                b = self.engines[i].batches
                self.engines[i].batches = FixedBatches.of(b)
        self.out = RunResult(rule, attack or "none", len(self.bad), replicas, math.nan, 0.0)
        self.inner_s = self.score_s = self.apply_s = 0.0  # CPU seconds: the cost ratio holds on a machine busy with other work
        self.gains: list[float] = []
        self.cos_ratios: list[float] = []
        self.bad_ratios: list[float] = []
        self.t0 = time.perf_counter()

    def updates(self, r: int) -> list[DecodedUpdate]:
        """Round r's updates as sent: the honest replicas' own, the attackers' crafted from them."""
        trains = [i for i in range(self.replicas) if i in self.honest or self.attack in TRAINS]
        for i in trains:
            t = time.process_time()
            self.engines[i].inner_round()
            self.inner_s += (time.process_time() - t) if i in self.honest else 0.0
        payloads = {i: self.engines[i].make_update(sender=f"replica-{i}") for i in trains}
        decoded = {i: decode_update(p) for i, p in payloads.items()}
        median = statistics.median(decoded[i].norm for i in self.honest)
        for i in self.bad:
            own = decoded.get(i, decoded[self.honest[0]])  # attackers that do not train: shapes and tokens
            pl = [payloads.get(j, b"") for j in range(self.replicas)]
            dec = [decoded.get(j, own) for j in range(self.replicas)]
            decoded[i] = decode_update(self.crafters[i].craft(r, pl, dec, self.honest, median))
        return [decoded[i] for i in range(self.replicas)]

    def witnesses(self, r: int, updates: list[DecodedUpdate]) -> list[int]:
        """The indices of the updates the witnesses accept (one verdict stands for all: same weights)."""
        t = time.process_time()
        scorer = Scorer(self.engines[self.honest[0]], r, secret=self.s.seed,
                        params=ScoreParams(rows=self.s.score_rows, own_rows=self.s.own_rows))
        clip = statistics.median(u.norm for u in updates)  # as the aggregate will clip them
        verdicts = [scorer.score(u, shard=i, clip_norm=clip) for i, u in enumerate(updates)]
        self.score_s += time.process_time() - t
        for i, v in enumerate(verdicts):
            if v.own_advantage is not None:
                own = self.out.own_advantage_honest if i in self.honest else self.out.own_advantage_attacker
                own.append(v.own_advantage)
        self.gains += [v.gain for i, v in enumerate(verdicts) if i in self.honest]
        keep = [i for i, v in enumerate(verdicts) if v.accept]
        self.out.rejected += self.replicas - len(keep)
        return keep

    def apply(self, decided: list[DecodedUpdate]) -> None:
        """Every replica applies the decided updates; one honest replica's apply is timed (CPU)."""
        weights = [float(u.tokens) for u in decided]
        for i, e in enumerate(self.engines):
            t = time.process_time()
            e.apply_aggregate(decided, weights)
            self.apply_s += (time.process_time() - t) if i == self.honest[0] else 0.0

    def tally(self, keep: list[int]) -> None:
        """Who was left out this round and why; the direction screen's margins."""
        screens = self.engines[self.honest[0]].last_screens if self.rule == "robust" else []
        by = {sc.sender: sc for sc in screens}
        names = {f"replica-{i}" for i in self.honest}
        judged = [sc.cos for sc in screens if sc.reason in ("", "small", "direction") and sc.norm > 0]
        mid = statistics.median(judged) if judged else 0.0
        if mid > 0:  # honest cosines against the median the rule compares with (it leaves out < 0.35 x)
            self.cos_ratios += [sc.cos / mid for sc in screens if sc.sender in names]
            self.bad_ratios += [sc.cos / mid for sc in screens if sc.sender not in names and sc.norm > 0
                                and sc.reason not in ("replay", "duplicate")]
        self.out.honest_capped += sum(sc.capped for sc in screens if sc.sender in names)
        for i in range(self.replicas):
            sc = by.get(f"replica-{i}")
            left_out = i not in keep or (sc is not None and sc.weight <= 0.0)
            if i in self.honest:
                self.out.honest_updates += 1
                self.out.honest_left_out += left_out
                continue
            self.out.attacker_updates += 1
            self.out.attacker_left_out += left_out
            if left_out:
                reason = "rejected" if i not in keep else (sc.reason if sc is not None and sc.reason else "weight")
                self.out.attacker_reasons[reason] = self.out.attacker_reasons.get(reason, 0) + 1

    def finish(self) -> RunResult:
        out, s = self.out, self.s
        hashes = {self.engines[i].param_hash() for i in self.honest}
        assert len(hashes) == 1, f"{self.rule}/{self.attack}: honest replicas diverged ({len(hashes)} weight hashes)"
        out.val_loss = self.engines[self.honest[0]].evaluate(s.eval_batches)
        out.seconds = time.perf_counter() - self.t0
        per_round_inner = self.inner_s / (len(self.honest) * s.rounds)
        out.score_cost = (self.score_s / s.rounds) / per_round_inner if self.score_s and per_round_inner else 0.0
        out.apply_cost = (self.apply_s / s.rounds) / per_round_inner if per_round_inner else 0.0
        out.min_honest_gain = min(self.gains) if self.gains else math.nan
        out.min_honest_cos_ratio = min(self.cos_ratios) if self.cos_ratios else math.nan
        out.max_attacker_cos_ratio = max(self.bad_ratios) if self.bad_ratios else math.nan
        log.info("bench robust rule=%s attack=%s attackers=%d/%d val_loss=%.4f seconds=%.1f", self.rule,
                 out.attack, out.attackers, self.replicas, out.val_loss, out.seconds)
        return out


def plan(s: RobustSettings) -> list[tuple[str, str | None, int, int]]:
    """(rule, attack or None, replicas, attackers) of every run, clean runs first."""
    runs: list[tuple[str, str | None, int, int]] = []
    for replicas, attackers in s.groups:
        for rule in s.rules:
            runs.append((rule, None, replicas, 0))
            runs += [(rule, a, replicas, attackers) for a in s.attacks]
    return runs


def _run_in_worker(s: RobustSettings, run: tuple[str, str | None, int, int]) -> RunResult:
    torch.set_num_threads(1)
    return run_one(s, *run)


def run_bench(s: RobustSettings, on_run: Callable[[str, int, int], None] | None = None) -> list[RunResult]:
    """Every run of plan(s), ``s.jobs`` at a time (worker processes, one torch thread each: the same
    figures whatever the number of jobs)."""
    s.validate()
    runs = plan(s)
    done: dict[int, RunResult] = {}
    label = lambda run: f"{run[0]} {run[1] or 'clean'} {run[3]}/{run[2]}"  # noqa: E731
    if s.jobs == 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for k, run in enumerate(runs):
                if on_run:
                    on_run(label(run), k, len(runs))
                done[k] = run_one(s, *run)
        finally:
            torch.set_num_threads(threads)
    else:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that holds torch threads
        with ProcessPoolExecutor(max_workers=s.jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_run_in_worker, s, run): k for k, run in enumerate(runs)}
            for future in as_completed(futures):
                k = futures[future]
                done[k] = future.result()
                if on_run:
                    on_run(label(runs[k]), len(done), len(runs))
    if on_run:
        on_run("done", len(runs), len(runs))
    results = [done[k] for k in range(len(runs))]
    clean = {(r.rule, r.replicas): r.val_loss for r in results if not r.attackers}
    for r in results:
        r.clean_val_loss = clean[(r.rule, r.replicas)]
    return results


def params_of(s: RobustSettings) -> int:
    from gradnode.node.train.model import build_model

    cfg = bench_config(s, "coord_mean")
    return count_params(build_model(cfg.model, cfg.run.seed))


def results_json(s: RobustSettings, results: list[RunResult]) -> dict[str, Any]:
    rows = []
    for r in results:
        row = {k: v for k, v in asdict(r).items()}
        row["ratio"] = r.ratio
        rows.append(row)
    return {"settings": {**asdict(s), "params": params_of(s)},
            "results": rows,
            "goals": [{"goal": g, "measured": m, "bound": b, "met": ok} for g, m, b, ok in goals(results, s.size)]}


def goals(results: list[RunResult], size: str = "small") -> list[tuple[str, float, float, bool | None]]:
    """(goal, measured, bound, met): the robust rule's worst ratio per group, its clean run against
    coord_mean's, and the scoring cost; that goal is for the node's default settings (``size`` 'node',
    H=20), so at other sizes it is a figure (met None): their inner rounds are far smaller than a peer's."""
    out = []
    robust = [r for r in results if r.rule == "robust"]
    for replicas in sorted({r.replicas for r in robust}):
        attacked = [r for r in robust if r.replicas == replicas and r.attackers]
        if attacked:
            worst = max(attacked, key=lambda r: r.ratio)
            bound = GOALS.get(replicas, 1.03)
            out.append((f"robust, {worst.attackers} of {replicas}, worst attack ({worst.attack}) / clean",
                        worst.ratio, bound, worst.ratio <= bound))
        clean = {r.rule: r.val_loss for r in results if r.replicas == replicas and not r.attackers}
        if "robust" in clean and "coord_mean" in clean:
            ratio = clean["robust"] / clean["coord_mean"]
            out.append((f"robust clean / coord_mean clean, {replicas} replicas", ratio, CLEAN_GOAL,
                        ratio <= CLEAN_GOAL))
    for replicas in sorted({r.replicas for r in robust}):
        costs = [r.score_cost for r in robust if r.score_cost > 0 and r.replicas == replicas]
        if costs:
            label = f"scoring cost / inner compute per round, {replicas} updates checked (worst run, {size} size)"
            out.append((label, max(costs), COST_GOAL, max(costs) <= COST_GOAL if size == "node" else None))
    return out


def plot(results: list[RunResult], path: str, title: str) -> None:
    plt = pyplot()
    groups = sorted({(r.replicas, r.attackers) for r in results if r.attackers})
    rules = list(dict.fromkeys(r.rule for r in results))
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 3.6 * len(groups)), squeeze=False)
    ratios = [r.ratio for r in results if r.attackers and math.isfinite(r.ratio)]
    top = min(max([1.04, *ratios]) + 0.02, 1.30)  # bars beyond are cut, their value printed
    bottom = min([0.97, *(x - 0.01 for x in ratios)])
    for ax, (replicas, attackers) in zip(axes[:, 0], groups):
        attacks = list(dict.fromkeys(r.attack for r in results if (r.replicas, r.attackers) == (replicas, attackers)))
        width = 0.8 / len(rules)
        for k, rule in enumerate(rules):
            by = {r.attack: r.ratio for r in results if r.rule == rule and r.replicas == replicas and r.attackers}
            xs = [i + (k - (len(rules) - 1) / 2) * width for i in range(len(attacks))]
            ys = [by.get(a, math.nan) for a in attacks]
            ax.bar(xs, [min(y, top) - bottom for y in ys], width, bottom=bottom, label=rule)
            for x, y in zip(xs, ys):
                if math.isfinite(y):
                    ax.text(x, min(y, top) + 0.003, f"{y:.3f}", ha="center", va="bottom", fontsize=7, rotation=90)
        bound = GOALS.get(replicas, 1.03)
        ax.axhline(bound, color="red", linestyle="--", linewidth=1, label=f"goal <= {bound:g}")
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(attacks)))
        ax.set_xticklabels(attacks)
        ax.set_ylim(bottom, top + 0.035)
        ax.set_ylabel("val loss / clean run")
        ax.set_title(f"{attackers} of {replicas} replicas attack", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
