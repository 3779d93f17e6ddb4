"""A witness's cheap loss check of a received update: does applying it make the model worse?

Templar's gauntlet scores an update by the loss before and after applying it, on random data and on the
sender's assigned data. Here a witness applies the decoded update u to the shared weights it was computed
from (theta - outer.lr * u) and measures the loss change on ``rows`` training windows of its own drawing
(seeded by its own secret and the round, so a sender cannot tune an update to them):

    gain_k = loss_k(theta) - loss_k(theta - lr * u)        for each row k (nats per byte)

and rejects the update when the gains say, with z standard errors to spare, that it makes the loss
worse: ``mean(gain) + z * stderr(gain) < 0``. An honest update lowers the loss on data it never saw; late
in training its gain is small and a few rows can show a small rise by chance, which the z standard
errors absorb. Measured (`gradnode bench robust --score-rows N`, docs/notes/robust.md): no honest update
rejected from 4 rows up (2 rows rejected one in each of four 8-replica runs); with 8 rows 26 of 30 sign-flipped and 30 of 30
one-coordinate updates rejected at 2 attackers in 8, random noise of the same norm 3 of 30, a lazy peer's
real (if overfitted) update never: those are left to the deterministic screens.

The sender's assigned data (its shard's batches of the round, reproducible from run, shard and step) is
scored too when ``own_rows`` > 0: ``own_gain - gain`` is Templar's proof that the sender trained on its
own slice. Measured at the benchmark's scale it does not separate honest updates from copies or lazy
ones (the advantage is a few thousandths of a nat, the row-to-row noise larger), so it is reported,
not used for the verdict; copies, replays and dilution are left to the deterministic screens of the
'robust' aggregation (protocol/robust.py).

Verdicts are per witness and may differ slightly between peers and hardware (floats, own rows): the
swarm lets a strict majority of binary verdicts decide. Nothing here touches the engine's weights.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from gradnode.node.train.engine import Engine
from gradnode.protocol import DecodedUpdate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoreParams:
    """How much a witness checks. Cost per round: one forward pass over ``rows`` windows for the baseline
    and one per update checked. Measured at the node's default settings (`gradnode bench robust --size
    node --inner-steps 20`: configs/tiny-cpu.yaml's model, batch 16 x 128), 8 rows: 3.7-4.2% of a round's
    inner compute checking 4 updates, 7.4-8.0% checking 8 (docs/notes/robust.md); it grows with the number of
    updates, so large swarms want fewer rows (not under 4: 2 rows rejected honest updates)."""

    rows: int = 8  # random windows of model.seq_len bytes per round (shared by every update scored)
    own_rows: int = 0  # windows of the sender's assigned batches (diagnostic; 0 = skip)
    z: float = 3.0  # reject when mean gain + z * stderr < 0

    def __post_init__(self) -> None:
        if self.rows < 2 or self.own_rows < 0 or not self.z >= 0:
            raise ValueError("score rows must be >= 2, own_rows >= 0 and z >= 0")


@dataclass(frozen=True)
class UpdateScore:
    """One witness's verdict on one update."""

    sender: str
    gain: float  # mean loss decrease on the witness's random rows (nats/byte); > 0 = the update helps
    stderr: float  # its standard error over the rows
    own_gain: float | None  # the same on the sender's assigned rows (None when own_rows = 0)
    accept: bool
    seconds: float  # wall time of this check (the round's baseline excluded; see Scorer.baseline_seconds)

    @property
    def own_advantage(self) -> float | None:
        return None if self.own_gain is None else self.own_gain - self.gain


def shadow(engine: Engine) -> tuple[torch.nn.Module, dict[str, Tensor]]:
    """The engine's model architecture without memory of its own (on the meta device, in eval mode) and the
    engine's buffers: a witness runs the model with weights it passes in (``functional_call``) on the
    exchange thread while the training thread runs the engine's own model. ``functional_call`` on that
    model swaps its parameters for the call, and its train/eval switch is shared: neither may happen
    under the inner steps."""
    from gradnode.node.train.model import build_model

    with torch.device("meta"):
        model = build_model(engine.cfg.model, engine.cfg.run.seed)
    model.eval()
    buffers = {n: b.detach().clone() for n, b in engine.model.named_buffers()}
    return model, buffers


def sender_steps(round_: int, inner_steps: int) -> range:
    """The global inner steps a peer runs in round ``round_`` when it runs all of them (Engine.step)."""
    return range(round_ * inner_steps, (round_ + 1) * inner_steps)


class Scorer:
    """The checks of one witness for one round: the baseline losses of its rows are computed once.

    ``weights``: the shared weights the round's updates were computed from (default: the engine's
    theta_g); ``secret``: any integer the senders cannot guess (the witness's own draw), which picks
    the random rows together with the round.
    """

    def __init__(self, engine: Engine, round_: int, secret: int, params: ScoreParams = ScoreParams(),
                 weights: Mapping[str, Tensor] | None = None,
                 model: tuple[torch.nn.Module, dict[str, Tensor]] | None = None) -> None:
        self.engine, self.round, self.params = engine, round_, params
        self.model, self.buffers = model if model is not None else shadow(engine)  # a shadow() kept across rounds
        self.lr = engine.cfg.outer.lr
        src = engine.global_params if weights is None else weights
        self.theta = {n: src[n].detach().to(engine.device, torch.float32) for n in engine.names}
        t0 = time.perf_counter()
        x, y = engine.batches.sample(params.rows, "witness", secret, round_)
        self.rows = (x.to(engine.device), y.to(engine.device))
        self.base = self._losses(self.theta, self.rows)
        self.baseline_seconds = time.perf_counter() - t0

    @torch.no_grad()
    def _losses(self, weights: Mapping[str, Tensor], rows: tuple[Tensor, Tensor]) -> Tensor:
        """Per-row mean cross-entropy (fp32) of the model with ``weights``."""
        x, y = rows
        with self.engine.trainer.autocast():
            logits = functional_call(self.model, {**self.buffers, **weights}, (x,))
        ce = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
        return ce.view(x.shape).mean(dim=1).double()

    def _own_rows(self, shard: int, steps: Sequence[int]) -> tuple[Tensor, Tensor]:
        """own_rows windows of the sender's assigned batches, spread over its steps of the round."""
        n, per = self.params.own_rows, self.engine.cfg.inner.batch_size
        picks = [steps[(i * len(steps)) // n] for i in range(n)] if len(steps) >= n else list(steps)
        xs, ys = [], []
        for i, step in enumerate(picks):
            x, y = self.engine.batches.train(shard, step, 0)
            xs.append(x[i % per: i % per + 1])
            ys.append(y[i % per: i % per + 1])
        return torch.cat(xs).to(self.engine.device), torch.cat(ys).to(self.engine.device)

    @torch.no_grad()
    def score(self, update: DecodedUpdate, shard: int | None = None, steps: Sequence[int] | None = None,
              clip_norm: float | None = None) -> UpdateScore:
        """The verdict on ``update`` (decoded, any sender). ``clip_norm``: judge the update scaled down to
        this norm, as the aggregate's median-norm clip will (e.g. the median norm of the updates verified so
        far); ``shard``: the sender's data-shard index (its peer index), with ``steps`` its inner steps of
        the round (default: all of ``sender_steps``), only used when params.own_rows > 0."""
        t0 = time.perf_counter()
        if sorted(update.tensors) != sorted(self.theta):
            raise ValueError(f"update of {update.sender!r} does not match this model's tensors")
        scale = self.lr
        if clip_norm is not None and update.norm > clip_norm:
            scale *= clip_norm / update.norm
        after = {n: self.theta[n] - scale * update.tensors[n].to(self.theta[n].device, torch.float32)
                 for n in self.theta}
        gains = self.base - self._losses(after, self.rows)
        if not bool(torch.isfinite(gains).all()):
            gain, stderr = -math.inf, 0.0
        else:
            gain = float(gains.mean())
            stderr = float(gains.std(unbiased=True)) / math.sqrt(gains.numel())
        own_gain = None
        if self.params.own_rows > 0 and shard is not None:
            steps = sender_steps(self.round, self.engine.cfg.inner.steps) if steps is None else steps
            rows = self._own_rows(shard, steps)
            own_gain = float((self._losses(self.theta, rows) - self._losses(after, rows)).mean())
        accept = math.isfinite(gain) and gain + self.params.z * stderr >= 0.0
        result = UpdateScore(update.sender, gain, stderr, own_gain, accept, time.perf_counter() - t0)
        log.debug("score sender=%s round=%d gain=%.5f stderr=%.5f own=%s accept=%s", update.sender, self.round,
                  gain, stderr, own_gain, accept)
        return result


def score_update(engine: Engine, update: DecodedUpdate, round_: int, secret: int, shard: int | None = None,
                 clip_norm: float | None = None, params: ScoreParams = ScoreParams(),
                 weights: Mapping[str, Tensor] | None = None) -> UpdateScore:
    """One update's verdict (a Scorer for a single update; use Scorer to check a round's updates at the
    cost of one baseline)."""
    return Scorer(engine, round_, secret, params, weights).score(update, shard, clip_norm=clip_norm)
