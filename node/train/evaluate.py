"""The validation loss: one measure behind every figure gradnode reports as "val loss".

`gradnode train`'s summary, a peer's summary and metrics rows (`gradnode join`, `gradnode simulate`), the
Prometheus gauge ``val_loss`` and `gradnode eval` all give this number for the agreed weights (theta_g).

The measure: ``VAL_BYTES`` predictions of the run's held-out split (``data.val_fraction``; all of it when
shorter). The text is cut into a grid of non-overlapping windows of ``model.seq_len`` bytes; the windows
scored are spread evenly over it (all of them when the budget covers the text; the last one scored may be
cut short). Every byte of a window after its first is predicted once, from the bytes before it in the
window. The loss is the mean cross-entropy in nats per byte. Windows go in order, in batches of ``BATCH``,
in fp32 (no autocast), so the same weights and text give the same number on every call, in the engine and
in `gradnode eval` alike.

Every corpus gradnode reads is byte-level (node/train/data.py), for ``model.kind: hf`` too: a token is a
byte, so nats per token are nats per byte and bits per byte is loss / ln 2.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from gradnode.node.config import Config
from gradnode.node.train.data import load_corpus, text_stream

log = logging.getLogger(__name__)

# Spread windows estimate the whole split far better than the same bytes from its start. Measured on a 5-round
# checkpoint of the default model (3,248,640 parameters, seq_len 128; the split holds 450,091 bytes): the whole
# split 2.8305 nats/byte; 256 windows (32,768 bytes) spread 2.8251, from the start 2.8970; 1,024 windows spread
# 2.8350, from the start 2.8867. Cost on this 2-core machine (shared, 1 torch thread, best of 5): 5.6 s, against
# 20.1 s for a default round of 20 inner steps (the 8 sampled batches of 16 windows the peers used: 3.9 s;
# 131,072 bytes: 31 s). `gradnode train` evaluates every 5 rounds: 5.6% of its time; a peer, at start and end.
VAL_BYTES = 32_768
BATCH = 16  # windows per forward pass
UNIT = "nats/byte"


@dataclass(frozen=True)
class EvalResult:
    tokens: int  # predictions scored (bytes)
    truncated: bool  # the text holds more than max_tokens predictions: that many were scored, spread over it
    loss: float  # mean cross-entropy, nats per byte

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else math.inf

    @property
    def bits_per_byte(self) -> float:
        return self.loss / math.log(2)  # tokens are bytes

    def describe(self, what: str = "held-out") -> str:
        """The figure with its measure, e.g. '2.8251 nats/byte on 32,768 held-out bytes'."""
        return describe(self.loss, self.tokens, what)


def describe(loss: float, scored: int, what: str = "held-out") -> str:
    """A val loss with its unit and the bytes it was measured on."""
    return f"{loss:.4f} {UNIT} on {scored:,} {what} bytes"


# what a val loss means where only the number travels (a peer's summary JSON, simulate's summary)
MEASURE = f"{UNIT} on {VAL_BYTES:,} held-out bytes in windows spread over the split (all of it when shorter)"


def held_out(cfg: Config) -> tuple[Tensor, str]:
    """The run's validation split (data.*, split by data.val_fraction) and a description of it."""
    corpus = load_corpus(cfg.data)
    return corpus.val, f"held-out split (data.source={cfg.data.source}, val_fraction={cfg.data.val_fraction:g})"


def text_files(paths: list[Path], max_bytes: int) -> tuple[Tensor, str]:
    """The given text files and folders, read whole (up to ``max_bytes``, as the corpus is), and a description."""
    stream = text_stream(paths, "--data", max_bytes=max_bytes)
    return stream, "text: " + ", ".join(str(p) for p in paths)


def evaluate(model: nn.Module, data: Tensor, seq_len: int, max_tokens: int = VAL_BYTES, batch_size: int = BATCH,
             device: torch.device | str = "cpu", weights: Mapping[str, Tensor] | None = None) -> EvalResult:
    """Mean next-byte cross-entropy of ``model`` (with ``weights`` in place of its own parameters, when given)
    over ``data`` (uint8): ``max_tokens`` predictions in windows spread over it (see the module docstring)."""
    if max_tokens < 1 or batch_size < 1:
        raise ValueError("max_tokens and batch_size must be >= 1")
    available = data.numel() - 1
    if available < 1:
        raise ValueError(f"the text to evaluate holds {data.numel()} byte(s): at least 2 are needed")
    picked = windows(available, min(available, max_tokens), seq_len)
    forward = _forward(model, weights)
    was_training = model.training
    model.eval()
    total = 0.0
    offsets = torch.arange(seq_len + 1)
    with torch.no_grad():
        full = [start for start, length in picked if length == seq_len]
        for first in range(0, len(full), batch_size):  # whole windows in batches, in order
            rows = torch.tensor(full[first:first + batch_size])[:, None] + offsets
            total += _loss_sum(forward, data[rows], device)
        for start, length in picked:  # the window cut short, if any
            if length < seq_len:
                total += _loss_sum(forward, data[start:start + length + 1][None, :], device)
    model.train(was_training)
    n = sum(length for _, length in picked)
    result = EvalResult(tokens=n, truncated=available > n, loss=total / n)
    log.info("evaluated tokens=%d windows=%d loss=%.6f", n, len(picked), result.loss)
    return result


def windows(available: int, n: int, seq_len: int) -> list[tuple[int, int]]:
    """``(start, predictions)`` of the windows that score ``n`` of a text's ``available`` predictions: the grid of
    windows of ``seq_len`` over the text, all of it when ``n`` covers it, else ceil(n / seq_len) windows spread
    evenly over the grid's whole windows, the last one cut to make ``n``."""
    assert 1 <= n <= available, (n, available)
    grid = [(start, min(seq_len, available - start)) for start in range(0, available, seq_len)]
    if n == available:
        return grid
    whole = available // seq_len
    k = -(-n // seq_len)
    if k > whole:  # more than the whole windows: all of them, and the start of the shorter last one
        return grid[:whole] + [(whole * seq_len, n - whole * seq_len)]
    picked = [(i * whole // k * seq_len, seq_len) for i in range(k)]
    picked[-1] = (picked[-1][0], n - (k - 1) * seq_len)
    return picked


def _forward(model: nn.Module, weights: Mapping[str, Tensor] | None) -> Callable[[Tensor], Tensor]:
    if weights is None:
        return model
    params = dict(weights)
    return lambda x: functional_call(model, params, (x,))


def _loss_sum(forward: Callable[[Tensor], Tensor], rows: Tensor, device: torch.device | str) -> float:
    rows = rows.to(device).long()
    logits = forward(rows[:, :-1]).float()
    return float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1), reduction="sum"))
