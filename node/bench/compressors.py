"""`gradnode bench compressors`: every compressor family side by side on the quality bench's setup.

Each row trains R replicas in one process with the quality bench's model, data, seed, inner steps
and tokens (node/bench/quality.py). Per round a replica folds its pseudo-gradient into its error
buffer, encodes it with the row's compressor, and every replica applies the same aggregate of the
decoded updates (clipped to the median norm, coord_mean) with outer SGD at the row's learning rate.
DDP and dense DiLoCo come from the quality bench itself, as references.

Sizes are the compressors' exact byte counts (sections and byte-valued header fields), checked
against `Compressor.nbytes` every round; the wire envelope's header adds the same few bytes per
tensor for every family. Speeds are fp32 bytes of update per second: error feedback plus encoding,
and decoding of one update.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from gradnode.node.bench import pyplot
from gradnode.node.bench.quality import BenchSettings, Evaluator, bench_config, run_bench
from gradnode.node.train import native
from gradnode.node.train.data import Batches, load_corpus
from gradnode.node.train.engine import schedule_steps
from gradnode.node.train.inner import InnerTrainer, pick_device
from gradnode.node.train.model import build_model, count_params
from gradnode.protocol.aggregate import aggregate
from gradnode.protocol.compress import (DctTopK, Dense, Options, PowerSGD, Quant, RandomK, Sign, SparseLoCo,
                                        compressor)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    """One compressor setting and the outer learning rate it trains with."""

    settings: Options
    lr: float

    @property
    def label(self) -> str:
        return self.settings.label

    @property
    def key(self) -> str:
        """The label and the learning rate: unique among a sweep's rows."""
        return f"{self.label} lr={self.lr:g}"


REFERENCE = Row(SparseLoCo(), 1.0)  # today's SparseLoCo: the row every other is compared with

# Two or three settings per family, each at outer lr 1.0: SparseLoCo's measured best in the quality bench. `--lr`
# sweeps them (docs/compressors.md, "Outer learning rates"). Top-30 is the sparsest SparseLoCo under 0.01 bytes a
# parameter: 400x smaller than fp32.
ROWS: tuple[Row, ...] = (
    REFERENCE,
    Row(SparseLoCo(topk=32), 1.0),
    Row(SparseLoCo(topk=30), 1.0),
    Row(SparseLoCo(topk=16), 1.0),
    Row(DctTopK(topk=64), 1.0),
    Row(DctTopK(topk=16), 1.0),
    Row(RandomK(density=0.05), 1.0),
    Row(RandomK(density=0.01), 1.0),
    Row(PowerSGD(rank=4), 1.0),
    Row(PowerSGD(rank=1, bits=16), 1.0),
    Row(Sign(chunk=256), 1.0),
    Row(Sign(chunk=4096), 1.0),
    Row(Quant(bits=8), 1.0),
    Row(Quant(bits=4), 1.0),
    Row(Dense(bits=16), 1.0),
    Row(Dense(bits=32), 1.0),
)


def swept(rows: tuple[Row, ...], lrs: tuple[float, ...] | list[float]) -> tuple[Row, ...]:
    """Each row at each of ``lrs`` (its own lr when none). Today's SparseLoCo runs at its own lr and at each of
    ``lrs`` too: every row is compared with its best (``Report.reference``)."""
    if not lrs:
        return rows
    out = []
    for r in rows:
        rates = [lr for lr in lrs if lr != r.lr] if r == REFERENCE else list(lrs)
        out += ([r] if r == REFERENCE else []) + [Row(r.settings, lr) for lr in rates]
    return tuple(out)


@dataclass
class RowResult:
    label: str
    family: str
    lr: float
    val_loss: float
    bytes_per_param: float  # per peer per round
    summable: bool
    encode_gbps: float
    decode_gbps: float
    seconds: float
    params: int
    tokens: int
    curve: list[tuple[int, float]] = field(default_factory=list)

    @property
    def fp32_ratio(self) -> float:
        return 4.0 / self.bytes_per_param if self.bytes_per_param else math.inf


@dataclass
class Report:
    settings: BenchSettings
    rows: list[RowResult]
    ddp: float | None = None
    diloco: float | None = None
    seconds: float = 0.0

    @property
    def reference(self) -> RowResult | None:
        """Today's SparseLoCo at the best of the learning rates it ran at: a tuned row is compared with a tuned
        reference, never with an untuned one."""
        runs = [r for r in self.rows if r.label == REFERENCE.label]
        return min(runs, key=lambda r: r.val_loss) if runs else None

    def best_within(self, tolerance: float = 0.01) -> RowResult | None:
        """The row of fewest bytes whose loss is within tolerance of today's SparseLoCo."""
        ref = self.reference
        if ref is None:
            return None
        fits = [r for r in self.rows if r.val_loss <= ref.val_loss * (1 + tolerance)]
        return min(fits, key=lambda r: r.bytes_per_param) if fits else None


def run_row(s: BenchSettings, row: Row, on_round: Callable[[int], None] = lambda r: None) -> RowResult:
    """R replicas in lock-step with one compressor; the loop of Engine, with the codec swapped."""
    native.install()  # the SparseLoCo rows use the node's native encoder, as a peer does
    cfg = bench_config(s, "sparseloco-rice")
    device = pick_device(s.device or cfg.inner.device)
    batches = Batches(load_corpus(cfg.data), cfg.model.seq_len, cfg.inner.batch_size, cfg.run.run_id, cfg.run.seed)
    models = [build_model(cfg.model, cfg.run.seed).to(device) for _ in range(s.replicas)]
    trainers = [InnerTrainer(m, cfg.inner, schedule_steps(cfg), device) for m in models]
    params = [dict(m.named_parameters()) for m in models]
    names = sorted(params[0])
    shapes = {n: tuple(params[0][n].shape) for n in names}
    theta = {n: params[0][n].detach().float().clone() for n in names}
    comps = [compressor(row.settings) for _ in range(s.replicas)]
    buffers: list[dict[str, torch.Tensor]] = [{} for _ in range(s.replicas)]
    evaluator = Evaluator(models[0], batches, trainers[0], s.eval_batches)
    n_params = count_params(models[0])
    tokens_per_step = cfg.inner.batch_size * cfg.model.seq_len * cfg.inner.grad_accum
    curve = [(0, evaluator())]
    sent = tokens = step = 0
    enc_s = dec_s = 0.0
    t0 = time.perf_counter()
    for r in range(s.rounds):
        for i, trainer in enumerate(trainers):
            for k in range(cfg.inner.steps):
                trainer.step(step + k, [batches.train(i, step + k, m) for m in range(cfg.inner.grad_accum)])
        step += cfg.inner.steps
        tokens += s.replicas * cfg.inner.steps * tokens_per_step
        decoded = []
        for i, comp in enumerate(comps):
            with torch.no_grad():
                delta = {n: theta[n].to(device) - params[i][n].float() for n in names}
            t1 = time.perf_counter()
            codes = comp.compress(buffers[i], delta, s.ef_beta, r)
            t2 = time.perf_counter()
            decoded.append({n: comps[0].decode(n, shapes[n], r, c).to(device) for n, c in codes.items()})
            dec_s += time.perf_counter() - t2
            enc_s += t2 - t1
            nbytes = sum(c.nbytes for c in codes.values())
            assert nbytes == comp.nbytes(shapes, r, {n: c.meta for n, c in codes.items()}), row.label
            sent += nbytes
        agg = aggregate(decoded, rule=s.aggregation, clip_to_median=s.clip_to_median)
        with torch.no_grad():
            for n in names:
                theta[n].sub_(agg[n].cpu() * row.lr)
            for comp in comps:
                comp.observe(r, agg)
            for p in params:
                for n in names:
                    p[n].copy_(theta[n].to(device))
        if (r + 1) % s.eval_every == 0 or r + 1 == s.rounds:
            curve.append((tokens, evaluator()))
        on_round(r + 1)
    updates = s.rounds * s.replicas
    gbytes = 4.0 * n_params * updates / 1e9
    return RowResult(row.label, row.settings.family.value, row.lr, curve[-1][1], sent / updates / n_params,
                     comps[0].summable, gbytes / max(enc_s, 1e-9), gbytes / max(dec_s, 1e-9),
                     time.perf_counter() - t0, n_params, tokens, curve)


def run(s: BenchSettings, rows: tuple[Row, ...] = ROWS, baselines: bool = True,
        on_row: Callable[[str, int], None] | None = None) -> Report:
    """Every row, then DDP and DiLoCo (when baselines) on the same settings."""
    s.validate()
    t0 = time.perf_counter()
    report = Report(s, [])
    for row in rows:
        callback = (lambda r, n=row.key: on_row(n, r)) if on_row else (lambda r: None)
        result = run_row(s, row, callback)
        log.info("bench compressor=%r val_loss=%.4f bytes_per_param=%.5f seconds=%.1f", result.label,
                 result.val_loss, result.bytes_per_param, result.seconds)
        report.rows.append(result)
    if baselines:
        ddp, diloco = run_bench(s, ("ddp", "diloco"))
        report.ddp, report.diloco = ddp.val_loss, diloco.val_loss
    report.seconds = time.perf_counter() - t0
    return report


def table(report: Report) -> list[dict[str, Any]]:
    """One dict per row: the figures of the docs' table."""
    ref = report.reference
    out = []
    for r in report.rows:
        out.append({"compressor": r.label, "family": r.family, "outer_lr": r.lr, "val_loss": r.val_loss,
                    "bytes_per_param": r.bytes_per_param, "fp32_ratio": r.fp32_ratio,
                    "vs_sparseloco": r.val_loss / ref.val_loss if ref else None,
                    "vs_diloco": r.val_loss / report.diloco if report.diloco else None,
                    "vs_ddp": r.val_loss / report.ddp if report.ddp else None,
                    "encode_gbps": r.encode_gbps, "decode_gbps": r.decode_gbps, "summable": r.summable,
                    "seconds": r.seconds})
    return out


def report_json(report: Report) -> dict[str, Any]:
    best = report.best_within()
    return {"settings": asdict(report.settings), "ddp": report.ddp, "diloco": report.diloco,
            "seconds": report.seconds, "params": report.rows[0].params if report.rows else 0,
            "tokens": report.rows[0].tokens if report.rows else 0, "rows": table(report),
            "fewest_bytes_within_1pct": best.label if best else None,
            "curves": {r.label: r.curve for r in report.rows}}


def plot(report: Report, path: str) -> None:
    """Validation loss against bytes per parameter (log axis), one curve per family over its settings."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    families: dict[str, list[RowResult]] = {}
    for r in report.rows:
        families.setdefault(r.family, []).append(r)
    for family, rows in families.items():
        rows = sorted(rows, key=lambda r: r.bytes_per_param)
        ax.plot([r.bytes_per_param for r in rows], [r.val_loss for r in rows], marker="o", label=family)
    for value, name, style in ((report.diloco, "dense DiLoCo", "--"), (report.ddp, "DDP", ":")):
        if value is not None:
            ax.axhline(value, linestyle=style, color="grey", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("bytes per parameter per round (log)")
    ax.set_ylabel("validation loss at equal tokens")
    ax.set_title(f"compressors: {report.settings.replicas} replicas, H={report.settings.inner_steps}, "
                 f"{report.settings.rounds} rounds ({report.settings.size})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
