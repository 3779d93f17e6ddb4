"""`gradnode train`: one peer alone, end to end (its own update is the whole round's aggregate).

The loop reads like nanoGPT's train.py: inner steps, outer step, evaluate, checkpoint, log.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gradnode.node.config import Config
from gradnode.node.train.engine import Engine
from gradnode.node.train.model import count_params
from gradnode.protocol import decode_update

log = logging.getLogger(__name__)


@dataclass
class TrainSummary:
    rounds: int
    tokens: int
    seconds: float
    train_loss: float
    val_loss_start: float
    val_loss: float
    bytes_per_round: float
    params: int
    checkpoint: str | None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def train(cfg: Config, eval_every: int = 5, eval_batches: int = 8, console: Console | None = None,
          device: str | None = None) -> TrainSummary:
    """Train ``cfg.rounds`` rounds (resuming from run.output_dir when checkpoint.resume)."""
    console = console or Console(stderr=True)
    ckpt_dir = cfg.run.output_dir / "checkpoints"
    engine = Engine.resume(cfg, ckpt_dir, device=device) if cfg.checkpoint.resume else Engine(cfg, device=device)
    first_round = engine.round
    val_start = engine.evaluate(eval_batches)
    val_loss, train_loss, sent, tokens = val_start, float("nan"), 0, 0
    saved = None
    t0 = time.perf_counter()
    columns = (TextColumn("[bold]round"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("train", total=cfg.rounds, completed=first_round, info="")
        while engine.round < cfg.rounds:
            stats = engine.inner_round()
            payload = engine.make_update(sender="local")
            engine.apply_aggregate([decode_update(payload)])
            sent += len(payload)
            tokens += stats.tokens
            train_loss = stats.loss
            if engine.round % eval_every == 0 or engine.round == cfg.rounds:
                val_loss = engine.evaluate(eval_batches)
            if cfg.checkpoint.every_rounds and (engine.round % cfg.checkpoint.every_rounds == 0
                                                or engine.round == cfg.rounds):
                saved = engine.save_checkpoint(ckpt_dir)
            log.info("round=%d loss=%.4f val_loss=%.4f tok_s=%.0f bytes=%d", engine.round, train_loss, val_loss,
                     stats.tokens_per_s, len(payload))
            progress.update(task, completed=engine.round,
                            info=f"loss {train_loss:.3f} val {val_loss:.3f} {stats.tokens_per_s:,.0f} tok/s")
    done = engine.round - first_round
    return TrainSummary(rounds=done, tokens=tokens, seconds=time.perf_counter() - t0, train_loss=train_loss,
                        val_loss_start=val_start, val_loss=val_loss, bytes_per_round=sent / done if done else 0.0,
                        params=count_params(engine.model), checkpoint=str(saved) if saved else None)


def summary_table(cfg: Config, s: TrainSummary) -> Table:
    table = Table(title=f"gradnode train: {cfg.run.run_id} ({cfg.outer.algorithm})", show_header=False)
    rows = [("parameters", f"{s.params:,}"), ("rounds run", str(s.rounds)), ("tokens", f"{s.tokens:,}"),
            ("time", f"{s.seconds:.1f} s"), ("throughput", f"{s.tokens_per_s:,.0f} tokens/s"),
            ("train loss (last round)", f"{s.train_loss:.4f}"),
            ("val loss", f"{s.val_loss_start:.4f} -> {s.val_loss:.4f}"),
            ("update size", f"{s.bytes_per_round:,.0f} bytes/round"), ("checkpoint", s.checkpoint or "-")]
    for k, v in rows:
        table.add_row(k, v)
    return table
