"""`gradnode train`: one peer alone, end to end (its own update is the whole round's aggregate).

The loop reads like nanoGPT's train.py: inner steps, outer step, evaluate, checkpoint, log. The val loss is
node/train/evaluate.py's measure (nats/byte on VAL_BYTES held-out bytes), as `gradnode eval` gives it.

Stopping (``stop`` set, e.g. by Ctrl+C) ends the inner steps at the next step boundary and writes a
checkpoint of exactly that moment, mid-round included; the same command then resumes where it stopped
and runs only the rest of that round's steps, so an interrupted and resumed run equals an
uninterrupted one.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gradnode.node.config import Config
from gradnode.node.train.engine import Engine
from gradnode.node.train.evaluate import UNIT
from gradnode.node.train.model import count_params
from gradnode.protocol import decode_update

log = logging.getLogger(__name__)


@dataclass
class TrainSummary:
    rounds: int  # rounds completed by this run
    tokens: int
    seconds: float
    train_loss: float
    val_loss_start: float
    val_loss: float  # at the end (evaluate.py's measure, as val_loss_start)
    val_bytes: int  # the held-out bytes both were measured on
    bytes_per_round: float
    params: int
    checkpoint: str | None
    first_round: int = 0  # the round this run started at (> 0: resumed)
    last_round: int = 0  # rounds completed in all, after this run
    stopped_at_step: int | None = None  # set when stopped mid-round: inner steps done in that round

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def open_engine(cfg: Config, device: str | None = None) -> tuple[Engine, Path | None]:
    """A fresh engine, or the newest valid checkpoint of run.output_dir (with checkpoint.resume);
    returns the checkpoint folder it resumed from, if any."""
    from gradnode.node.train import checkpoint

    ckpt_dir = cfg.run.output_dir / "checkpoints"
    found = checkpoint.list_checkpoints(ckpt_dir) if cfg.checkpoint.resume else []
    engine = Engine.resume(cfg, ckpt_dir, device=device) if found else Engine(cfg, device=device)
    return engine, (found[0] if found else None)


def train(cfg: Config, eval_every: int = 5, console: Console | None = None, device: str | None = None,
          stop: threading.Event | None = None) -> TrainSummary:
    """Train ``cfg.rounds`` rounds (resuming from run.output_dir when checkpoint.resume); the val loss at the
    start, every ``eval_every`` rounds and at the end."""
    console = console or Console(stderr=True)
    stop = stop or threading.Event()
    ckpt_dir = cfg.run.output_dir / "checkpoints"
    engine, _ = open_engine(cfg, device)
    first_round, h = engine.round, cfg.inner.steps
    # the bar counts inner steps, so that a long round shows its progress and an ETA from its first steps
    columns = (TextColumn("[bold]round {task.fields[round]}/{task.fields[rounds]}"),
               TextColumn("step {task.fields[step]}/{task.fields[steps]}"), BarColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("train", total=cfg.rounds * h, completed=min(engine.step, cfg.rounds * h),
                                 info="validation loss before training", round=engine.round + 1,
                                 rounds=cfg.rounds, step=0, steps=h)
        first = engine.val_loss()
        val_start, val_bytes = first.loss, first.tokens
        val_loss, train_loss, sent, tokens = val_start, float("nan"), 0, 0
        saved = None
        t0 = time.perf_counter()
        progress.update(task, info="")

        def next_step() -> bool:  # asked before every inner step: the bar shows the step about to run
            if stop.is_set():
                return True
            progress.update(task, completed=engine.step, round=engine.round + 1, step=engine.step - engine.round * h + 1)
            return False
        while engine.round < cfg.rounds and not stop.is_set():
            done_in_round = engine.step - engine.round * h  # > 0 when resumed from a mid-round stop
            stats = engine.inner_round(max_steps=h - done_in_round, should_stop=next_step)
            tokens += stats.tokens
            if stop.is_set():
                break  # mid-round: the checkpoint below keeps exactly this moment
            payload = engine.make_update(sender="local")
            engine.apply_aggregate([decode_update(payload)])
            sent += len(payload)
            train_loss = stats.loss if stats.steps else train_loss
            if engine.round % eval_every == 0 or engine.round == cfg.rounds:
                val_loss = engine.evaluate()
            if cfg.checkpoint.every_rounds and (engine.round % cfg.checkpoint.every_rounds == 0
                                                or engine.round == cfg.rounds):
                saved = engine.save_checkpoint(ckpt_dir)
            log.info("round=%d loss=%.4f val_loss=%.4f tok_s=%.0f bytes=%d", engine.round, train_loss, val_loss,
                     stats.tokens_per_s, len(payload))
            progress.update(task, completed=engine.step, step=h,
                            info=f"loss {train_loss:.3f} val {val_loss:.3f} {stats.tokens_per_s:,.0f} tok/s")
    stopped_at = None
    if stop.is_set():
        stopped_at = engine.step - engine.round * h
        saved = engine.save_checkpoint(ckpt_dir)
    done = engine.round - first_round
    return TrainSummary(rounds=done, tokens=tokens, seconds=time.perf_counter() - t0, train_loss=train_loss,
                        val_loss_start=val_start, val_loss=val_loss, val_bytes=val_bytes,
                        bytes_per_round=sent / done if done else 0.0,
                        params=count_params(engine.model), checkpoint=str(saved) if saved else None,
                        first_round=first_round, last_round=engine.round, stopped_at_step=stopped_at)


def summary_table(cfg: Config, s: TrainSummary) -> Table:
    table = Table(title=f"gradnode train: {cfg.run.run_id} ({cfg.outer.algorithm})", show_header=False)
    rounds = f"{s.rounds} (rounds {s.first_round + 1}-{s.last_round} of {cfg.rounds})" if s.rounds else "0"
    rows = [("parameters", f"{s.params:,}"), ("rounds run", rounds), ("tokens", f"{s.tokens:,}"),
            ("time", f"{s.seconds:.1f} s"), ("throughput", f"{s.tokens_per_s:,.0f} tokens/s"),
            ("train loss (last round)", f"{s.train_loss:.4f}"),
            ("val loss", f"{s.val_loss_start:.4f} -> {s.val_loss:.4f} {UNIT}"),
            ("val loss measured on", f"{s.val_bytes:,} held-out bytes"),
            ("update size", f"{s.bytes_per_round:,.0f} bytes/round"), ("checkpoint", s.checkpoint or "-")]
    for k, v in rows:
        table.add_row(k, v)
    return table
