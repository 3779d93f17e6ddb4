"""`gradnode bench quality`: does compressed training learn as well as dense training?

R replicas train on the embedded corpus in one process, without any network, with the same model,
seed, data stream per replica and total tokens for every algorithm:

- ``ddp``: synchronous data-parallel AdamW, gradients of all R replicas averaged every step (the
  reference; it is computed as one optimizer over R micro-batches, which is the same arithmetic);
- ``diloco``: H inner AdamW steps per replica, dense fp32 pseudo-gradients, outer Nesterov SGD;
- ``sparseloco-packed12`` / ``sparseloco-rice``: error feedback + top-k + 2-bit codec, outer SGD,
  with 12-bit or entropy-coded in-chunk indices.

With ``committee`` K (``--committee K``), each SparseLoCo algorithm also runs under the drawn committee of
protocol/committee.py: per round, K contributors drawn from the ledger plus its newcomer slots, and every other
replica sits the round out as each ``undrawn`` rule says (``Engine.sit_out``). Beside it runs all-to-all with K
replicas: the same updates per round, a quarter of the compute at K = R / 4. ``reached`` is the share of the
tokens computed that an applied update carried.

Sizes are real encoded payload lengths (``len(make_update())``), except for ddp, which all-reduces
fp32 gradients every inner step (H x 4 bytes per parameter per round, nominal).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, get_args

import torch

from gradnode.node.bench import pyplot
from gradnode.node.config import Config, OuterConfig, config_from_dict, with_overrides
from gradnode.node.train.data import Batches, load_corpus
from gradnode.node.train.engine import Engine, schedule_steps
from gradnode.node.train.inner import InnerTrainer, pick_device
from gradnode.node.train.model import build_model, count_params
from gradnode.protocol import committee, decode_update

log = logging.getLogger(__name__)

ALGORITHMS = ("ddp", "diloco", "sparseloco-packed12", "sparseloco-rice")
UNDRAWN: tuple[str, ...] = get_args(OuterConfig.model_fields["undrawn"].annotation)  # outer.undrawn's rules

# Model sizes offered by --size; "small" is the default that fits 10 minutes on 2 CPU cores, "tiny" is for tests.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"model": {"n_layer": 1, "d_model": 32, "n_head": 2, "seq_len": 32}, "inner": {"batch_size": 4}},
    "small": {"model": {"n_layer": 2, "d_model": 256, "n_head": 4, "seq_len": 64}, "inner": {"batch_size": 8}},
    "medium": {"model": {"n_layer": 4, "d_model": 256, "n_head": 4, "seq_len": 128}, "inner": {"batch_size": 16}},
    "large": {"model": {"n_layer": 8, "d_model": 512, "n_head": 8, "seq_len": 256}, "inner": {"batch_size": 16}},
}


@dataclass
class BenchSettings:
    replicas: int = 4
    rounds: int = 20
    inner_steps: int = 15
    size: str = "small"
    seed: int = 0
    eval_every: int = 3
    eval_batches: int = 16
    inner_lr: float = 1.5e-3  # measured best for all three algorithms of 1e-3, 1.5e-3, 2e-3, 3e-3, 6e-3 (docs/notes/quality.md)
    diloco_lr: float = 0.5  # measured best of 0.2, 0.3, 0.5, 0.7 at inner lr 1.5e-3 (see docs/notes/quality.md)
    diloco_momentum: float = 0.9
    sparseloco_lr: float = 1.0
    ef_beta: float = 0.9  # SparseLoCo's error-feedback decay: measured 0.8 ~ 0.9 < 0.95
    aggregation: str = "coord_mean"  # measured: beats "mean" (see docs/notes/quality.md)
    clip_to_median: bool = True
    device: str | None = None
    committee: int = 0  # contributors drawn per round (0: all-to-all only)
    newcomers: int = 1  # the committee's newcomer slots
    undrawn: tuple[str, ...] = UNDRAWN  # what undrawn replicas do, one run each
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted config keys applied to every algorithm

    def validate(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"--size must be one of {', '.join(SIZES)}, got {self.size!r}")
        if self.replicas < 1 or self.rounds < 1 or self.inner_steps < 1 or self.eval_every < 1:
            raise ValueError("--replicas, --rounds, --inner-steps and --eval-every must be >= 1")
        if self.committee and not 0 < self.committee < self.replicas:
            raise ValueError(f"--committee must lie between 1 and --replicas - 1, got {self.committee}")
        if set(self.undrawn) - set(UNDRAWN) or not self.undrawn:
            raise ValueError(f"--undrawn takes {', '.join(UNDRAWN)}, got {','.join(self.undrawn)}")


@dataclass
class BenchResult:
    algorithm: str
    val_loss: float
    bits_per_param_per_round: float
    bytes_per_peer_per_round: float
    tokens: int
    seconds: float
    params: int
    curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens, val_loss)
    reached: float = 1.0  # share of the tokens computed that an applied update carried

    @property
    def fp32_ratio(self) -> float:
        return 32.0 / self.bits_per_param_per_round if self.bits_per_param_per_round else float("inf")


def bench_config(s: BenchSettings, algorithm: str) -> Config:
    """The config of one algorithm; everything but the outer section is shared."""
    base = SIZES[s.size]
    outer: dict[str, Any] = {"aggregation": s.aggregation, "clip_to_median": s.clip_to_median}
    codec: dict[str, Any] = {}
    if algorithm == "ddp":
        outer |= {"algorithm": "ddp"}
    elif algorithm == "diloco":
        outer |= {"algorithm": "diloco", "lr": s.diloco_lr, "momentum": s.diloco_momentum, "nesterov": True}
    else:
        outer |= {"algorithm": "sparseloco", "lr": s.sparseloco_lr, "momentum": 0.0, "ef_beta": s.ef_beta}
        codec["index_coding"] = algorithm.removeprefix("sparseloco-")
    tree = {"run": {"run_id": "bench-quality", "seed": s.seed}, "rounds": s.rounds,
            "model": dict(base["model"]),
            "inner": {**base["inner"], "steps": s.inner_steps, "lr": s.inner_lr,
                      "warmup_steps": min(50, s.rounds * s.inner_steps // 10)},
            "outer": outer, "codec": codec, "checkpoint": {"every_rounds": 0}}
    return config_from_dict(with_overrides(tree, s.overrides), f"bench quality ({algorithm})")


def run_local_sgd(cfg: Config, s: BenchSettings, name: str, on_round: Callable[[int], None],
                  replicas: int | None = None, budget: committee.Budget | None = None) -> BenchResult:
    """DiLoCo or SparseLoCo with R engines in lock-step; all must end bit-identical. With a committee
    ``budget``, only the drawn contributors and admitted newcomers send; the others sit the round out."""
    engines = [Engine(cfg, peer_index=i, device=s.device) for i in range(replicas or s.replicas)]
    keys = [f"replica-{i}" for i in range(len(engines))]
    hashes: dict[int, str] = {}  # after round r, as every replica holds them
    pools: dict[int, frozenset[str]] = {}
    curve = [(0, engines[0].evaluate(s.eval_batches))]
    tokens, applied, sent, t0 = 0, 0, 0, time.perf_counter()
    for r in range(s.rounds):
        for e in engines:
            tokens += e.inner_round().tokens
        senders = set(keys)
        if budget is not None:
            drawn = committee.of_round(budget, r, hashes, pools)
            assert drawn is not None
            base = committee.base(r, hashes)
            announced = [k for k in keys if committee.announces(drawn, base, k, len(keys))]
            senders = committee.admitted(drawn, base, announced)
        payloads = []
        for key, e in zip(keys, engines):
            if key in senders:
                payloads.append(e.make_update(sender=key))
            else:
                e.sit_out()
        sent += sum(len(p) for p in payloads)
        updates = [decode_update(p) for p in payloads]
        applied += sum(u.tokens for u in updates)
        for e in engines:
            e.apply_aggregate(updates)
        hashes[r], pools[r] = engines[0].state_hash(), frozenset(engines[0].contributors)
        if (r + 1) % s.eval_every == 0 or r + 1 == s.rounds:
            curve.append((tokens, engines[0].evaluate(s.eval_batches)))
        on_round(r + 1)
    assert len({e.state_hash() for e in engines}) == 1, f"{name}: replicas diverged"
    params = count_params(engines[0].model)
    per_peer = sent / (s.rounds * len(engines))
    return BenchResult(name, curve[-1][1], 8 * per_peer / params, per_peer, tokens,
                       time.perf_counter() - t0, params, curve, applied / tokens)


def run_ddp(cfg: Config, s: BenchSettings, on_round: Callable[[int], None]) -> BenchResult:
    """Data-parallel AdamW: each step averages the gradients of the R replicas' micro-batches."""
    device = pick_device(s.device or cfg.inner.device)
    model = build_model(cfg.model, cfg.run.seed).to(device)
    trainer = InnerTrainer(model, cfg.inner, schedule_steps(cfg), device)
    batches = Batches(load_corpus(cfg.data), cfg.model.seq_len, cfg.inner.batch_size, cfg.run.run_id, cfg.run.seed)
    evaluator = Evaluator(model, batches, trainer, s.eval_batches)
    accum = cfg.inner.grad_accum
    tokens_per_step = s.replicas * accum * cfg.inner.batch_size * cfg.model.seq_len
    curve = [(0, evaluator())]
    tokens, step, t0 = 0, 0, time.perf_counter()
    for r in range(s.rounds):
        for _ in range(cfg.inner.steps):
            micro = [batches.train(peer, step, m) for peer in range(s.replicas) for m in range(accum)]
            trainer.step(step, micro)
            step += 1
            tokens += tokens_per_step
        if (r + 1) % s.eval_every == 0 or r + 1 == s.rounds:
            curve.append((tokens, evaluator()))
        on_round(r + 1)
    params = count_params(model)
    per_peer = 4.0 * params * cfg.inner.steps  # fp32 gradients all-reduced every inner step
    return BenchResult("ddp", curve[-1][1], 8 * per_peer / params, per_peer, tokens,
                       time.perf_counter() - t0, params, curve)


class Evaluator:
    """Validation loss of a bare model on the same batches Engine.evaluate uses."""

    def __init__(self, model: torch.nn.Module, batches: Batches, trainer: InnerTrainer, n: int) -> None:
        self.model, self.batches, self.trainer, self.n = model, batches, trainer, n

    @torch.no_grad()
    def __call__(self) -> float:
        self.model.eval()
        total = 0.0
        for i in range(self.n):
            x, y = (z.to(self.trainer.device) for z in self.batches.val(i))
            with self.trainer.autocast():
                logits = self.model(x)
            total += torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1)).item()
        self.model.train()
        return total / self.n


def run_bench(s: BenchSettings, algorithms: tuple[str, ...] = ALGORITHMS,
              on_round: Callable[[str, int], None] | None = None) -> list[BenchResult]:
    s.validate()
    unknown = set(algorithms) - set(ALGORITHMS)
    if unknown:
        raise ValueError(f"unknown algorithm(s) {sorted(unknown)}; choose from {', '.join(ALGORITHMS)}")
    results = []
    for name in algorithms:
        cfg = bench_config(s, name)
        callback = (lambda r, n=name: on_round(n, r)) if on_round else (lambda r: None)
        result = run_ddp(cfg, s, callback) if name == "ddp" else run_local_sgd(cfg, s, name, callback)
        results.append(result)
        if s.committee and name.startswith("sparseloco"):
            results += run_committee(s, name, on_round)
    for result in results:
        log.info("bench algorithm=%s val_loss=%.4f bytes=%.0f reached=%.2f seconds=%.1f", result.algorithm,
                 result.val_loss, result.bytes_per_peer_per_round, result.reached, result.seconds)
    return results


def run_committee(s: BenchSettings, name: str, on_round: Callable[[str, int], None] | None) -> list[BenchResult]:
    """``name`` under a committee of ``s.committee`` contributors, once per undrawn rule, and all-to-all with
    that many replicas (the same per-round budget)."""
    budget = committee.Budget(s.committee, s.replicas, s.newcomers)
    runs = [(f"{name} committee {s.committee}/{s.replicas} {how}", how, budget, None) for how in s.undrawn]
    runs.append((f"{name} all-to-all {s.committee}", "carry", None, s.committee))
    out = []
    for label, how, drawn, replicas in runs:
        cfg = bench_config(replace(s, overrides={**s.overrides, "outer.undrawn": how}), name)
        callback = (lambda r, n=label: on_round(n, r)) if on_round else (lambda r: None)
        out.append(run_local_sgd(cfg, s, label, callback, replicas=replicas, budget=drawn))
    return out


def results_json(s: BenchSettings, results: list[BenchResult]) -> dict[str, Any]:
    keys = ("algorithm", "val_loss", "bits_per_param_per_round", "bytes_per_peer_per_round", "tokens", "reached")
    return {"settings": asdict(s),
            "results": [{**{k: getattr(r, k) for k in keys}, "fp32_ratio": r.fp32_ratio, "seconds": r.seconds,
                         "params": r.params, "curve": r.curve} for r in results]}


def goals(results: list[BenchResult]) -> list[tuple[str, float, float, bool]]:
    """(goal, measured, bound, met) for the issue's targets, where the baselines were run."""
    by = {r.algorithm: r for r in results}
    out = []
    for name in ("sparseloco-packed12", "sparseloco-rice"):
        if name not in by:
            continue
        r = by[name]
        if "diloco" in by:
            ratio = r.val_loss / by["diloco"].val_loss
            out.append((f"{name} val_loss / diloco", ratio, 1.02, ratio <= 1.02))
        if "ddp" in by:
            ratio = r.val_loss / by["ddp"].val_loss
            out.append((f"{name} val_loss / ddp", ratio, 1.05, ratio <= 1.05))
        out.append((f"{name} traffic vs fp32 (x smaller)", r.fp32_ratio, 200.0, r.fp32_ratio >= 200.0))
    return out


def plot(results: list[BenchResult], path: str, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in results:
        xs, ys = zip(*r.curve)
        label = f"{r.algorithm} ({r.val_loss:.3f}; {r.bits_per_param_per_round:.3g} bit/param/round)"
        ax.plot([x / 1e6 for x in xs], ys, marker="o", markersize=3, label=label)
    ax.set_xlabel("training tokens, all replicas (millions)")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title(title)
    low = min(min(y for _, y in r.curve) for r in results)
    ax.set_ylim(low - 0.1, min(max(r.curve[1][1] for r in results if len(r.curve) > 1) + 0.2, 6.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
