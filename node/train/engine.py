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
from enum import Enum
from pathlib import Path
from typing import Any

import msgpack
import torch
from torch import Tensor
from torch.func import functional_call

from gradnode.node.train import checkpoint
from gradnode.node.train import evaluate as held_out
from gradnode.node.train import native
from gradnode.node.config import Config
from gradnode.node.train.data import Batches, load_corpus
from gradnode.node.train.inner import InnerTrainer, pick_device
from gradnode.node.train.model import build_model
from gradnode.node.train.outer import OuterOptimizer
from gradnode.protocol import CodecParams, DecodedUpdate, aggregate, committee, compress_with_feedback, encode_update
from gradnode.protocol.compress import Compressor, Options, compressor
from gradnode.protocol.feedback import fold
from gradnode.protocol.wire import encode_codes
from gradnode.protocol.reputation import Reputation
from gradnode.protocol.robust import Screen, robust_aggregate, screen
from gradnode.protocol.votes import CONTRIBUTOR_ROUNDS  # the ledger remembers whose updates these last rounds applied

log = logging.getLogger(__name__)

STATE_VERSION = 3  # 2: the contributors ledger is shared state; 3: so is the state one round back (``Previous``)
MAX_CONTRIBUTORS = 65536  # entries a ledger from the network may hold


@dataclass(frozen=True)
class Previous:
    """The state one round back, as the state after it names it: its hash and its contributors (keys only).
    The committee of the round an engine computes next is drawn from it (protocol/committee.py, LAG = 2).
    It is shared state, under the state hash, so a peer that adopts a state draws what the others draw."""

    hash: str = committee.GENESIS
    pool: frozenset[str] = frozenset()


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


class Same(str, Enum):
    """In a checkpoint, in place of a tensor (format 2): it equals, bit for bit, the tensor of the same name in
    the agreed weights, or in the peer's own weights. Stored as its value."""

    AGREED = "agreed"
    LOCAL = "local"


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal bit for bit (NaNs and signed zeros included), dtype and shape too."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))


def _stored(t: Tensor, **refs: Tensor) -> Tensor | str:
    """``t``, or the name of the first of ``refs`` (a Same value) holding the same bits."""
    for name, ref in refs.items():
        if _same_bits(t, ref):
            return Same(name).value
    return t


def _restored(value: Any, name: str, **refs: Tensor) -> Tensor:
    """The tensor a checkpoint entry stands for: itself, or the reference its Same value names."""
    if isinstance(value, Tensor):
        return value
    try:
        return refs[Same(value).value]
    except (ValueError, KeyError):
        raise ValueError(f"{name}: {value!r} is neither a tensor nor one of {sorted(refs)}") from None


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


def shared_state_hash(run_id: str, round_: int, params: Mapping[str, Tensor], outer: Mapping[str, Tensor],
                      contributors: Mapping[str, int], reputation: Mapping[str, Any], previous: Previous,
                      codec: Mapping[str, tuple[int, str, Tensor]] | None = None) -> str:
    """What peers publish, compare and sync to (``Engine.state_hash``): the weights, the outer optimizer's
    buffers, the contributors ledger, the reputation table and the state one round back (msgpack of their
    sorted items: one byte string per table), the round and the run id. ``codec``: the compressor's shared
    state (PowerSGD's bases: name -> the round served, the side, the basis), where it keeps one: a donor cannot
    hand out a basis that decodes the next round's updates otherwise."""
    h = hashlib.sha256(f"gradnode-state/{STATE_VERSION}/{run_id}/{round_}\n".encode())
    h.update(bytes.fromhex(weights_hash(params)))
    h.update(bytes.fromhex(weights_hash(outer)))
    h.update(msgpack.packb(sorted(contributors.items())))
    h.update(msgpack.packb([sorted(reputation["scores"].items()), sorted(reputation["recent"])]))
    h.update(msgpack.packb([previous.hash, sorted(previous.pool)]))
    if codec:  # absent for every family without shared state: their hashes are as before
        h.update(msgpack.packb([[k, r, side] for k, (r, side, _) in sorted(codec.items())]))
        h.update(bytes.fromhex(weights_hash({k: b for k, (_, _, b) in codec.items()})))
    return h.hexdigest()


def _previous(value: Any) -> Previous:
    """The state one round back, read from a state from the network (checked): a hash and a key list."""
    ok = isinstance(value, dict) and isinstance(value.get("hash"), str) and len(value["hash"]) <= 64 and \
        isinstance(value.get("pool"), list) and len(value["pool"]) <= MAX_CONTRIBUTORS and \
        all(isinstance(p, str) and 0 < len(p) <= 128 for p in value["pool"])
    if not ok:
        raise ValueError("shared state: malformed previous state")
    return Previous(value["hash"], frozenset(value["pool"]))


def _ledger(value: Any, round_: int) -> dict[str, int]:
    """A contributors ledger read from a state of round ``round_`` (from the network: checked): sender names,
    each with a round among the CONTRIBUTOR_ROUNDS before ``round_``."""
    if not isinstance(value, dict) or len(value) > MAX_CONTRIBUTORS or not all(
            isinstance(p, str) and 0 < len(p) <= 128 and type(r) is int and max(0, round_ - CONTRIBUTOR_ROUNDS) <= r < round_
            for p, r in value.items()):
        raise ValueError("shared state: malformed contributors ledger")
    return dict(value)


def initial_weights_hash(cfg: Config) -> str:
    """The hash of the weights a run starts from (its model config and seed): what a genesis records."""
    model = build_model(cfg.model, cfg.run.seed)
    return weights_hash(dict(model.named_parameters()))


def codec_params(cfg: Config) -> CodecParams | Options:
    """The run's codec, as its envelopes name it: DiLoCo sends dense fp32, SparseLoCo today's codec
    (CodecParams), another ``codec.family`` its settings (protocol/compress)."""
    if cfg.outer.algorithm == "diloco":
        return CodecParams(dense=True)
    c = cfg.codec
    if c.family != "sparseloco":
        return c.settings()
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
        # a family's encoder and decoder, with the shared state it learns (PowerSGD's bases); None: CodecParams
        self.compressor: Compressor | None = compressor(self.codec) if isinstance(self.codec, Options) else None
        self.global_params: dict[str, Tensor] = {n: self.params[n].detach().float().cpu().clone() for n in self.names}
        self.start: dict[str, Tensor] = {n: self.params[n].detach().clone() for n in self.names}
        self.ef: dict[str, Tensor] = {}  # error-feedback buffers (sparseloco), created on first use
        self.round = 0  # next round to train
        self.step = 0  # global inner step counter: LR schedule position and data cursor
        self.pending_tokens = 0  # tokens in local progress not yet sent in an update
        self.tokens_seen = 0
        self.skipped_steps = 0  # aggregates never applied (inf/NaN or absurdly large; see _unsafe)
        self.last_step_ratio = 0.0  # norm of the last aggregate / norm of the shared weights
        # the ledger: peer -> newest round whose applied set held its update (the last CONTRIBUTOR_ROUNDS).
        # Shared state like the weights (a joiner receives it, the state hash covers it): every peer on a
        # chain knows exactly who contributed lately, which is who witnesses rounds and votes on hashes.
        # Replaced whole, never mutated: other threads read it.
        self.contributors: dict[str, int] = {}
        # outer.aggregation 'robust': the decided history's reputation table (shared state too, covered by
        # the state hash) and what the rule decided about the last round's updates
        self.reputation = Reputation()
        self.last_screens: list[Screen] = []
        self.previous = Previous()  # the state before the last round applied (GENESIS before any)
        self._version = 0  # bumped by every change to the shared state (``changed``)
        self._hashed: tuple[int, str] | None = None  # (version, state hash): the last hash computed, of that version

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
        if self.compressor is not None:
            codes = self.compressor.compress(self.ef, delta, self.cfg.outer.ef_beta, self.round)
            payload = encode_codes(codes, {n: tuple(d.shape) for n, d in delta.items()}, self.compressor.settings,
                                   **meta)
        elif self.cfg.outer.algorithm == "sparseloco":
            payload = compress_with_feedback(self.ef, delta, self.cfg.outer.ef_beta, self.codec, **meta)
        else:
            payload = encode_update(delta, params=self.codec, **meta)
        for n in self.names:
            self.start[n].copy_(self.params[n])
        self.pending_tokens = 0
        return payload

    @torch.no_grad()
    def sit_out(self) -> None:
        """This peer sends nothing for round ``self.round`` (a committee left it out); its work waits, as
        ``outer.undrawn`` says. 'carry': nothing changes, so the progress stays local and the next update
        holds it whole. 'feedback': the pseudo-gradient joins the error-feedback buffers as an unsent residue
        does (e <- beta * e + delta), and the local weights restart from start, so inner steps never drift
        far from the agreed weights. 'drop': the progress is discarded. ``apply_aggregate`` follows as after
        an update."""
        how = self.cfg.outer.undrawn
        if how == "carry":
            return
        if how == "feedback":  # with error feedback only: the config refuses it for diloco and ddp
            for n, d in self.pseudo_gradient().items():
                fold(self.ef, n, d, self.cfg.outer.ef_beta)
        else:
            self.pending_tokens = 0
        for n in self.names:
            self.params[n].copy_(self.start[n])

    @torch.no_grad()
    def kept(self, updates: Sequence[DecodedUpdate], weights: Sequence[float] | None = None) -> set[str]:
        """The senders of ``updates`` whose update this round's robust rule would count (weight > 0) among
        them all, judged as ``apply_aggregate`` judges (this state's reputation table and previous round's
        fingerprints); every sender under another aggregation rule. Nothing is applied."""
        if self.cfg.outer.aggregation != "robust" or not updates:
            return {u.sender for u in updates}
        for u in updates:
            self._check_update(u)
        screens = screen(list(updates), weights, reputation=self.reputation.weights(),
                         previous=self.reputation.recent, clip_to_median=self.cfg.outer.clip_to_median)[0]
        return {s.sender for s in screens if s.weight > 0}

    @torch.no_grad()
    def apply_aggregate(self, updates: Sequence[DecodedUpdate], weights: Sequence[float] | None = None) -> None:
        """theta_g <- outer step(aggregate(updates)); local <- theta_g + (local - start); start <- theta_g."""
        if weights is not None and len(weights) != len(updates):
            raise ValueError(f"{len(weights)} weights for {len(updates)} updates")
        self.last_screens = []
        previous = Previous(self._state_hash_now(), frozenset(self.contributors))
        applied: dict[str, Tensor] = {}  # what the compressor learns from: the aggregate stepped on, if any
        if updates:
            for u in updates:
                self._check_update(u)
            # aggregate() sorts by (sender, digest): the result does not depend on arrival order.
            if self.cfg.outer.aggregation == "robust":
                agg, self.last_screens = robust_aggregate(
                    list(updates), weights, reputation=self.reputation.weights(), previous=self.reputation.recent,
                    clip_to_median=self.cfg.outer.clip_to_median)
                self.reputation = self.reputation.after(self.last_screens, established=self.contributors)
                left_out = [f"{s.sender}:{s.reason}(cos={s.cos:.2f},norm={s.norm:.3g})" for s in self.last_screens
                            if s.reason]
                if left_out:
                    log.info("round=%d screened=%s banned=%s", self.round, ",".join(left_out),
                             ",".join(self.reputation.banned()) or "-")
            else:
                agg = aggregate(list(updates), weights=weights, rule=self.cfg.outer.aggregation,
                                clip_to_median=self.cfg.outer.clip_to_median)
            unsafe = self._unsafe(agg)
            if unsafe:
                self.skipped_steps += 1
                log.error("round=%d: aggregate of %d updates not applied: %s", self.round, len(updates), unsafe)
            else:
                self.outer.step(self.global_params, agg)
                applied = agg
        if self.compressor is not None:  # every peer learns alike: from the same aggregate, or from none
            self.compressor.observe(self.round, applied)
        for n in self.names:
            theta = self.global_params[n].to(self.device, non_blocking=True)
            progress = self.params[n] - self.start[n]
            self.params[n].copy_(theta + progress)
            self.start[n].copy_(theta)
        # contributors: the senders whose updates counted (the robust rule gives a screened-out one weight 0)
        screened = {sc.sender for sc in self.last_screens if sc.weight == 0.0}
        ledger = {**self.contributors, **{u.sender: self.round for u in updates if u.sender not in screened}}
        self.contributors = {p: r for p, r in ledger.items() if r > self.round - CONTRIBUTOR_ROUNDS}
        self.previous = previous
        self.round += 1
        self.changed()
        if log.isEnabledFor(logging.DEBUG):  # a hash of all the weights: not for a line nobody reads
            log.debug("outer round=%d updates=%d hash=%s", self.round - 1, len(updates), self.state_hash()[:12])

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
        for name, shape in update.shapes.items():
            ref = self.global_params.get(name)
            if ref is None or shape != tuple(ref.shape):
                raise ValueError(f"update from {update.sender!r}: unexpected tensor {name!r} {shape}")

    # --- shared state -----------------------------------------------------------------------------

    def param_hash(self) -> str:
        """The weights alone (what a genesis records for round 0, what an export checks)."""
        return weights_hash(self.global_params)

    def state_hash(self) -> str:
        """The hash peers publish, compare and sync to: all they share. The weights, the outer optimizer's
        state (DiLoCo's momentum: a donor with honest weights cannot hand out poisoned momentum under the
        honest hash), the contributors ledger, the state one round back, the round, and the run id (with a
        genesis, its digest)."""
        version = self._version  # read first: a change made meanwhile leaves the hash unremembered
        h = shared_state_hash(self.cfg.run.run_id, self.round, self.global_params, self.outer.buffers,
                              self.contributors, self.reputation.to_dict(), self.previous, self._codec_state())
        self._hashed = (version, h)
        return h

    def _codec_state(self) -> dict[str, Any]:
        return self.compressor.state_dict() if self.compressor is not None else {}

    def changed(self) -> None:
        """Say that the shared state changed (every method here that changes it does): a state hash
        computed before is no longer of this state."""
        self._version += 1

    def _state_hash_now(self) -> str:
        """The state hash, without hashing the weights again when nothing changed since the last one (the
        node hashes every state it applies: a 1B model's weights are 4 GB to hash)."""
        if self._hashed is not None and self._hashed[0] == self._version:
            return self._hashed[1]
        return self.state_hash()

    def committee(self, budget: committee.Budget) -> committee.Committee | None:
        """The committee of the round this engine computes next (``self.round``), drawn from the state one
        round back (None: no budget, everyone contributes)."""
        return committee.drawn_from(budget, self.round, self.previous.hash, self.previous.pool)

    def evaluate(self, batches: int | None = None) -> float:
        """The val loss of theta_g (node/train/evaluate.py: nats/byte on VAL_BYTES held-out bytes spread over the
        split), the figure every summary, metrics row and `gradnode eval` reports. ``batches``: instead, the mean
        over that many sampled validation batches, the figure `gradnode bench` compares with its DDP reference."""
        if batches is not None:
            return self._sampled_val_loss(batches)
        return self.val_loss().loss

    def val_loss(self) -> held_out.EvalResult:
        """The val loss of theta_g with the bytes it was measured on (see ``evaluate``)."""
        weights = {n: self.global_params[n].to(self.device) for n in self.names}
        return held_out.evaluate(self.model, self.batches.corpus.val, self.cfg.model.seq_len,
                                 device=self.device, weights=weights)

    @torch.no_grad()
    def _sampled_val_loss(self, batches: int) -> float:
        """Mean loss of theta_g over the run's first ``batches`` sampled validation batches (inner autocast)."""
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
        """What a joining peer needs: theta_g, the outer optimizer state, the contributors ledger, the reputation
        table (JSON types; it changes only under the 'robust' aggregation), the round, and the compressor's
        shared state (empty but for PowerSGD)."""
        return {"version": STATE_VERSION, "run_id": self.cfg.run.run_id, "round": self.round,
                "global_params": {n: self.global_params[n].clone() for n in self.names},
                "outer": self.outer.state_dict(), "contributors": dict(self.contributors),
                "reputation": self.reputation.to_dict(),
                "previous": {"hash": self.previous.hash, "pool": sorted(self.previous.pool)},
                "codec": self._codec_state()}

    @torch.no_grad()
    def load_shared_state(self, state: Mapping[str, Any], keep_progress: bool = False) -> None:
        """Adopt a swarm's state: start becomes theta_g. ``keep_progress``: this peer's progress not yet
        aggregated (local - start, and the error-feedback buffer) carries over onto the new weights, so
        nothing it computed is thrown away; otherwise local becomes theta_g and EF restarts from zero."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"shared state format v{state.get('version')}, this gradnode reads v{STATE_VERSION} (a "
                             f"checkpoint from another version: start afresh with --set checkpoint.resume=false, or "
                             f"move the old checkpoints folder away)")
        if state.get("run_id") != self.cfg.run.run_id:
            raise ValueError(f"shared state is for run {state.get('run_id')!r}, expected run.run_id="
                             f"{self.cfg.run.run_id!r}")
        params = state["global_params"]
        if sorted(params) != self.names or any(params[n].shape != self.global_params[n].shape for n in self.names):
            raise ValueError("shared state does not match this model (check the model section of the config)")
        contributors = _ledger(state.get("contributors"), int(state["round"]))
        reputation = Reputation.from_dict(state.get("reputation"))
        previous = _previous(state.get("previous"))
        codec_state = state.get("codec") or {}
        if self.compressor is not None:
            self.compressor.load_state_dict(codec_state, {n: tuple(self.global_params[n].shape) for n in self.names})
        elif codec_state:
            raise ValueError("shared state: a compressor's state in a run whose codec keeps none")
        progress = {n: self.params[n] - self.start[n] for n in self.names} if keep_progress else None
        self.global_params = {n: params[n].detach().float().cpu().clone() for n in self.names}
        self.outer.load_state_dict(state["outer"])
        self.contributors = contributors
        self.reputation = reputation
        self.previous = previous
        self.round = int(state["round"])
        self.step = self.round * self.cfg.inner.steps
        if not keep_progress:
            self.ef = {}
            self.pending_tokens = 0
        for n in self.names:
            theta = self.global_params[n].to(self.device)
            self.params[n].copy_(theta if progress is None else theta + progress[n])
            self.start[n].copy_(theta)
        self.changed()

    # --- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue, each tensor once (checkpoint format 2): the peer's own weights by name
        where they equal the agreed ones (a round boundary), the start where it equals either (it equals the
        agreed weights after an outer step, the own weights after an update). Tensors are on the CPU."""
        rng = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        shared = self.shared_state()
        agreed = shared["global_params"]
        local = {n: p.detach().cpu() for n, p in self.params.items()}
        return {"shared": shared,
                "model": {n: _stored(t, agreed=agreed[n]) for n, t in local.items()},
                "start": {n: _stored(t.cpu(), agreed=agreed[n], local=local[n]) for n, t in self.start.items()},
                "ef": {n: t.cpu() for n, t in self.ef.items()},
                "inner_optimizer": self.trainer.optimizer.state_dict(),
                "cursor": {"step": self.step, "pending_tokens": self.pending_tokens, "tokens_seen": self.tokens_seen,
                           "peer_index": self.peer_index},
                "rng": rng}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (format 2, or format 1's full tensors) exactly where it was taken."""
        self.load_shared_state(state["shared"])
        for n in self.names:
            local = _restored(state["model"][n], f"model.{n}", agreed=self.global_params[n])
            start = _restored(state["start"][n], f"start.{n}", agreed=self.global_params[n], local=local)
            self.params[n].copy_(local)
            self.start[n].copy_(start)
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
        write it while the inner steps go on (briefly, memory for what the checkpoint stores: 16 to 20 bytes per
        parameter with SparseLoCo)."""
        state = self.state_dict()
        if copy:  # the shared state is a copy already
            state = {k: v if k == "shared" else _deep_clone(v) for k, v in state.items()}
        # the resolved config: `gradnode export` and `gradnode eval` rebuild the model from it
        meta = {"run_id": self.cfg.run.run_id, "algorithm": self.cfg.outer.algorithm, "peer_index": self.peer_index,
                "step": self.step, "config": self.cfg.model_dump(mode="json")}
        return Snapshot(self.round, state, meta)

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
