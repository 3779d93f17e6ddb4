"""Held-out evaluation of a checkpoint's agreed weights: loss, perplexity and bits per byte.

The text is cut into non-overlapping windows of ``model.seq_len`` tokens (the last one shorter); every token
after the first is predicted once, from the tokens before it in its window. The loss is the mean
cross-entropy in nats over those predictions, perplexity is exp(loss), and since the corpus is byte-level
(a token is a byte) bits per byte is loss / ln 2. Windows go in order, in fixed batches, in fp32, so the
same checkpoint and text give the same numbers on every call.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradnode.node.config import Config
from gradnode.node.train.data import load_corpus, text_stream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalResult:
    tokens: int  # predictions scored
    truncated: bool  # the text holds more than max_tokens predictions: only the first were scored
    loss: float  # mean cross-entropy, nats per token

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else math.inf

    @property
    def bits_per_byte(self) -> float:
        return self.loss / math.log(2)  # tokens are bytes


def held_out(cfg: Config) -> tuple[Tensor, str]:
    """The run's validation split (data.*, split by data.val_fraction) and a description of it."""
    corpus = load_corpus(cfg.data)
    return corpus.val, f"held-out split (data.source={cfg.data.source}, val_fraction={cfg.data.val_fraction:g})"


def text_files(paths: list[Path], max_tokens: int) -> tuple[Tensor, str]:
    """The given text files and folders, read whole (up to a byte past what ``max_tokens`` scores, enough to
    tell that there is more), and a description."""
    stream = text_stream(paths, "--data", max_bytes=max_tokens + 2)
    return stream, "text: " + ", ".join(str(p) for p in paths)


@torch.no_grad()
def evaluate(model: nn.Module, data: Tensor, seq_len: int, max_tokens: int, batch_size: int = 16,
             device: torch.device | str = "cpu") -> EvalResult:
    """Mean next-byte cross-entropy of ``model`` over ``data`` (uint8), at most ``max_tokens`` predictions."""
    if max_tokens < 1 or batch_size < 1:
        raise ValueError("max_tokens and batch_size must be >= 1")
    available = data.numel() - 1
    if available < 1:
        raise ValueError(f"the text to evaluate holds {data.numel()} byte(s): at least 2 are needed")
    n = min(available, max_tokens)
    tokens = data[: n + 1].long()
    was_training = model.training
    model.eval()
    total = 0.0
    full = n // seq_len
    for first in range(0, full, batch_size):  # full windows in batches, in order
        rows = torch.arange(first, min(first + batch_size, full))[:, None] * seq_len + torch.arange(seq_len + 1)
        total += _loss_sum(model, tokens[rows], device)
    if n % seq_len:  # the shorter last window
        total += _loss_sum(model, tokens[full * seq_len:][None, :], device)
    model.train(was_training)
    result = EvalResult(tokens=n, truncated=available > n, loss=total / n)
    log.info("evaluated tokens=%d loss=%.6f", n, result.loss)
    return result


def _loss_sum(model: nn.Module, rows: Tensor, device: torch.device | str) -> float:
    rows = rows.to(device)
    logits = model(rows[:, :-1]).float()
    return float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1), reduction="sum"))
