"""The training engine of one peer: inner rounds, pseudo-gradient updates, the outer step, checkpoints.

Three sets of weights:

- ``global_params`` (theta_g, fp32 on CPU): the shared weights, changed only by :meth:`apply_aggregate`,
  so peers that apply the same updates hold bit-identical weights;
- the model's parameters (local): what the inner AdamW steps move;
- ``start``: the local weights when the current pseudo-gradient began.

Synchronous order (DiLoCo / SparseLoCo): ``inner_round(); make_update(); apply_aggregate()``: local
equals theta_g after every round. Overlapped order (the swarm): ``inner_round()`` of round r+1 runs
while round r is exchanged, then ``apply_aggregate(r)``, then ``make_update()`` for r+1: a
one-round-delayed outer step in which each peer keeps its own not-yet-aggregated progress.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from gradnode.node.train import checkpoint
from gradnode.node.train import native
from gradnode.node.config import Config
from gradnode.node.train.data import Batches, load_corpus
from gradnode.node.train.inner import InnerTrainer, lm_loss, pick_device
from gradnode.node.train.model import build_model
from gradnode.node.train.outer import OuterOptimizer
from gradnode.protocol import CodecParams, DecodedUpdate, aggregate, compress_with_feedback, encode_update

log = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass(frozen=True)
class RoundStats:
    steps: int
    tokens: int
    loss: float
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Snapshot:
    """A checkpoint's content taken at one moment (Engine.snapshot), written by Engine.write_snapshot."""

    round: int
    state: dict[str, Any]
    meta: dict[str, Any]


def _deep_clone(obj: Any) -> Any:
    """Tensors cloned, containers rebuilt, everything else shared (ints, strings are immutable)."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _deep_clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_deep_clone(v) for v in obj)
    return obj


def weights_hash(params: Mapping[str, Tensor]) -> str:
    """sha256 over shared weights: names in sorted order, shapes, raw fp32 CPU bytes."""
    h = hashlib.sha256()
    for n in sorted(params):
        t = params[n].detach().float().cpu().contiguous()
        h.update(f"{n}:{tuple(t.shape)}:{t.dtype}\n".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def initial_weights_hash(cfg: Config) -> str:
    """The hash of the weights a run starts from (its model config and seed): what a genesis records."""
    model = build_model(cfg.model, cfg.run.seed)
    return weights_hash(dict(model.named_parameters()))


def codec_params(cfg: Config) -> CodecParams:
    """The codec of ``cfg.outer.algorithm``: SparseLoCo compresses, DiLoCo sends dense fp32."""
    if cfg.outer.algorithm == "diloco":
        return CodecParams(dense=True)
    c = cfg.codec
    return CodecParams(chunk=c.chunk, topk=c.topk, bits=c.bits, index_coding=c.index_coding)


def schedule_steps(cfg: Config) -> int:
    """Length of the inner LR schedule in inner steps."""
    return cfg.inner.schedule_steps or cfg.rounds * cfg.inner.steps


class Engine:
    """One peer's model, optimizers, data stream and outer state (see the module docstring)."""

    def __init__(self, cfg: Config, peer_index: int = 0, device: str | None = None) -> None:
        native.install()  # the codec's native CPU encoder (idempotent; falls back to torch ops)
        if cfg.outer.algorithm == "ddp":
            raise ValueError("outer.algorithm: 'ddp' is the synchronous reference of `gradnode bench quality`; "
                             "a peer trains with 'sparseloco' or 'diloco'")
        if peer_index < 0:
            raise ValueError(f"peer_index must be >= 0, got {peer_index}")
        self.cfg, self.peer_index = cfg, peer_index
        self.device = pick_device(device or cfg.inner.device)
        self.batches = Batches(load_corpus(cfg.data), cfg.model.seq_len, cfg.inner.batch_size,
                               cfg.run.run_id, cfg.run.seed)
        self.model = build_model(cfg.model, cfg.run.seed).to(self.device)
        self.params: dict[str, Tensor] = dict(self.model.named_parameters())  # tied weights appear once
        self.names = sorted(self.params)
        self.trainer = InnerTrainer(self.model, cfg.inner, schedule_steps(cfg), self.device)
        self.outer = OuterOptimizer(cfg.outer)
        self.codec = codec_params(cfg)
        self.global_params: dict[str, Tensor] = {n: self.params[n].detach().float().cpu().clone() for n in self.names}
        self.start: dict[str, Tensor] = {n: self.params[n].detach().clone() for n in self.names}
        self.ef: dict[str, Tensor] = {}  # error-feedback buffers (sparseloco), created on first use
        self.round = 0  # next round to train
        self.step = 0  # global inner step counter: LR schedule position and data cursor
        self.pending_tokens = 0  # tokens in local progress not yet sent in an update
        self.tokens_seen = 0
        self.skipped_steps = 0  # aggregates never applied (inf/NaN or absurdly large; see _unsafe)
        self.last_step_ratio = 0.0  # norm of the last aggregate / norm of the shared weights

    # --- inner loop -------------------------------------------------------------------------------

    def inner_round(self, max_steps: int | None = None,
                    should_stop: Callable[[], bool] | None = None) -> RoundStats:
        """Up to inner.steps AdamW steps from the local weights; stops early when ``should_stop()``."""
        steps = self.cfg.inner.steps if max_steps is None else min(max_steps, self.cfg.inner.steps)
        tokens_per_step = self.cfg.inner.batch_size * self.cfg.model.seq_len * self.cfg.inner.grad_accum
        t0 = time.perf_counter()
        losses: list[float] = []
        for _ in range(steps):
            if should_stop is not None and should_stop():
                break
            micro = [self.batches.train(self.peer_index, self.step, m) for m in range(self.cfg.inner.grad_accum)]
            losses.append(self.trainer.step(self.step, micro))
            self.step += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats = RoundStats(len(losses), len(losses) * tokens_per_step,
                           sum(losses) / len(losses) if losses else float("nan"), time.perf_counter() - t0)
        self.pending_tokens += stats.tokens
        self.tokens_seen += stats.tokens
        log.debug("inner round=%d steps=%d loss=%.4f tok_s=%.0f", self.round, stats.steps, stats.loss,
                  stats.tokens_per_s)
        return stats

    # --- outer step -------------------------------------------------------------------------------

    @torch.no_grad()
    def pseudo_gradient(self) -> dict[str, Tensor]:
        """start - local, fp32, on the engine's device."""
        return {n: (self.start[n] - self.params[n]).float() for n in self.names}

    @torch.no_grad()
    def make_update(self, sender: str = "") -> bytes:
        """Encode this peer's pseudo-gradient for round ``self.round``; then start <- local."""
        delta = self.pseudo_gradient()
        meta = dict(run_id=self.cfg.run.run_id, round=self.round, sender=sender, tokens=self.pending_tokens)
        if self.cfg.outer.algorithm == "sparseloco":
            payload = compress_with_feedback(self.ef, delta, self.cfg.outer.ef_beta, self.codec, **meta)
        else:
            payload = encode_update(delta, params=self.codec, **meta)
        for n in self.names:
            self.start[n].copy_(self.params[n])
        self.pending_tokens = 0
        return payload

    @torch.no_grad()
    def apply_aggregate(self, updates: Sequence[DecodedUpdate], weights: Sequence[float] | None = None) -> None:
        """theta_g <- outer step(aggregate(updates)); local <- theta_g + (local - start); start <- theta_g."""
        if weights is not None and len(weights) != len(updates):
            raise ValueError(f"{len(weights)} weights for {len(updates)} updates")
        if updates:
            for u in updates:
                self._check_update(u)
            # aggregate() sorts by (sender, digest): the result does not depend on arrival order.
            agg = aggregate(list(updates), weights=weights, rule=self.cfg.outer.aggregation,
                            clip_to_median=self.cfg.outer.clip_to_median)
            unsafe = self._unsafe(agg)
            if unsafe:
                self.skipped_steps += 1
                log.error("round=%d: aggregate of %d updates not applied: %s", self.round, len(updates), unsafe)
            else:
                self.outer.step(self.global_params, agg)
        for n in self.names:
            theta = self.global_params[n].to(self.device, non_blocking=True)
            progress = self.params[n] - self.start[n]
            self.params[n].copy_(theta + progress)
            self.start[n].copy_(theta)
        log.debug("outer round=%d updates=%d hash=%s", self.round, len(updates), self.param_hash()[:12])
        self.round += 1

    def _unsafe(self, agg: dict[str, torch.Tensor]) -> str | None:
        """Why this aggregate must not be applied (inf/NaN, or a step out of all proportion to the weights),
        or None. The same inputs give the same answer on every peer, so all skip alike."""
        sq = math.fsum(float(t.double().square().sum()) for _, t in sorted(agg.items()))
        if not math.isfinite(sq):
            return "it holds inf or NaN"
        weights = math.sqrt(math.fsum(float(t.double().square().sum()) for _, t in sorted(self.global_params.items())))
        ratio = math.sqrt(sq) / max(weights, 1e-12)
        self.last_step_ratio = ratio
        if ratio > self.cfg.outer.max_step_ratio:
            return f"its norm is {ratio:.3g}x the weights' (outer.max_step_ratio={self.cfg.outer.max_step_ratio:g})"
        return None

    def _check_update(self, update: DecodedUpdate) -> None:
        if update.round != self.round:
            raise ValueError(f"update from {update.sender!r} is for round {update.round}, engine is at {self.round}")
        for name, t in update.tensors.items():
            ref = self.global_params.get(name)
            if ref is None or t.shape != ref.shape:
                raise ValueError(f"update from {update.sender!r}: unexpected tensor {name!r} {tuple(t.shape)}")

    # --- shared state -----------------------------------------------------------------------------

    def param_hash(self) -> str:
        return weights_hash(self.global_params)

    @torch.no_grad()
    def evaluate(self, batches: int = 8) -> float:
        """Mean validation loss of theta_g over the run's first ``batches`` validation batches."""
        weights = {n: self.global_params[n].to(self.device) for n in self.names}
        was_training = self.model.training
        self.model.eval()
        total = 0.0
        for i in range(batches):
            x, y = (z.to(self.device) for z in self.batches.val(i))
            with self.trainer.autocast():
                logits = functional_call(self.model, weights, (x,))
            total += torch.nn.functional.cross_entropy(
                logits.float().view(-1, logits.size(-1)), y.reshape(-1)).item()
        self.model.train(was_training)
        return total / batches

    def shared_state(self) -> dict[str, Any]:
        """What a joining peer needs: theta_g, the outer optimizer state and the round."""
        return {"version": STATE_VERSION, "run_id": self.cfg.run.run_id, "round": self.round,
                "global_params": {n: self.global_params[n].clone() for n in self.names},
                "outer": self.outer.state_dict()}

    @torch.no_grad()
    def load_shared_state(self, state: Mapping[str, Any], keep_progress: bool = False) -> None:
        """Adopt a swarm's state: start becomes theta_g. ``keep_progress``: this peer's progress not yet
        aggregated (local - start, and the error-feedback buffer) carries over onto the new weights, so
        nothing it computed is thrown away; otherwise local becomes theta_g and EF restarts from zero."""
        if state.get("version") != STATE_VERSION or state.get("run_id") != self.cfg.run.run_id:
            raise ValueError(f"shared state is for run {state.get('run_id')!r} v{state.get('version')}, "
                             f"expected run.run_id={self.cfg.run.run_id!r} v{STATE_VERSION}")
        params = state["global_params"]
        if sorted(params) != self.names or any(params[n].shape != self.global_params[n].shape for n in self.names):
            raise ValueError("shared state does not match this model (check the model section of the config)")
        progress = {n: self.params[n] - self.start[n] for n in self.names} if keep_progress else None
        self.global_params = {n: params[n].detach().float().cpu().clone() for n in self.names}
        self.outer.load_state_dict(state["outer"])
        self.round = int(state["round"])
        self.step = self.round * self.cfg.inner.steps
        if not keep_progress:
            self.ef = {}
            self.pending_tokens = 0
        for n in self.names:
            theta = self.global_params[n].to(self.device)
            self.params[n].copy_(theta if progress is None else theta + progress[n])
            self.start[n].copy_(theta)

    # --- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        rng = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {"shared": self.shared_state(),
                "model": {n: p.detach().cpu() for n, p in self.params.items()},
                "start": {n: t.cpu() for n, t in self.start.items()},
                "ef": {n: t.cpu() for n, t in self.ef.items()},
                "inner_optimizer": self.trainer.optimizer.state_dict(),
                "cursor": {"step": self.step, "pending_tokens": self.pending_tokens, "tokens_seen": self.tokens_seen,
                           "peer_index": self.peer_index},
                "rng": rng}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.load_shared_state(state["shared"])
        for n in self.names:
            self.params[n].copy_(state["model"][n])
            self.start[n].copy_(state["start"][n])
        self.ef = {n: t.to(self.device) for n, t in state["ef"].items()}
        self.trainer.optimizer.load_state_dict(state["inner_optimizer"])
        cursor = state["cursor"]
        self.step, self.pending_tokens, self.tokens_seen = cursor["step"], cursor["pending_tokens"], cursor["tokens_seen"]
        torch.set_rng_state(state["rng"]["cpu"])
        if "cuda" in state["rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)

    def save_checkpoint(self, directory: Path | str | None = None) -> Path:
        """Atomically save everything needed to continue; returns the checkpoint folder."""
        return self.write_snapshot(self.snapshot(copy=False), directory)

    def snapshot(self, copy: bool = True) -> "Snapshot":
        """What a checkpoint holds, as of now. ``copy``: deep-copied tensors, so that another thread can
        write it while the inner steps go on (~4 bytes x 4 per parameter of memory, briefly)."""
        state = self.state_dict()
        meta = {"run_id": self.cfg.run.run_id, "algorithm": self.cfg.outer.algorithm, "peer_index": self.peer_index,
                "step": self.step}
        return Snapshot(self.round, _deep_clone(state) if copy else state, meta)

    def write_snapshot(self, snap: "Snapshot", directory: Path | str | None = None) -> Path:
        directory = Path(directory) if directory is not None else self.cfg.run.output_dir / "checkpoints"
        return checkpoint.save(directory, snap.round, snap.state, snap.meta, self.cfg.checkpoint.keep)

    @classmethod
    def resume(cls, cfg: Config, directory: Path | str | None = None, peer_index: int = 0,
               device: str | None = None) -> "Engine":
        """A fresh engine, or the newest valid checkpoint of ``directory`` loaded into one."""
        engine = cls(cfg, peer_index, device)
        directory = Path(directory) if directory is not None else cfg.run.output_dir / "checkpoints"
        found = checkpoint.load_latest(directory, cfg.run.run_id)
        if found is not None:
            state, meta = found
            engine.load_checkpoint_state(state, meta)
        return engine

    def load_checkpoint_state(self, state: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        if meta.get("algorithm") != self.cfg.outer.algorithm:
            raise checkpoint.CheckpointError(f"checkpoint was written with outer.algorithm={meta.get('algorithm')!r}, "
                                             f"config says {self.cfg.outer.algorithm!r}")
        try:
            self.load_state_dict(state)
        except (KeyError, ValueError, RuntimeError) as err:
            raise checkpoint.CheckpointError(f"checkpoint does not fit this config: {err}") from None
        log.info("checkpoint resumed round=%d step=%d", self.round, self.step)
