"""The inner loop: AdamW steps with gradient accumulation, clipping, warmup + cosine, bf16 on CUDA."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradnode.node.config import InnerConfig

log = logging.getLogger(__name__)


def pick_device(requested: str | None) -> torch.device:
    """'auto' (or None) picks CUDA when available; asking for CUDA without one is a user error."""
    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("inner.device is 'cuda' but no CUDA device is available")
    return torch.device(requested)


def lr_at(step: int, cfg: InnerConfig, total_steps: int) -> float:
    """Linear warmup to inner.lr, then cosine down to inner.lr * inner.min_lr_ratio at total_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


def lm_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    logits = model(x)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


class InnerTrainer:
    """Owns a model's AdamW optimizer and runs one optimizer step over a list of micro-batches."""

    def __init__(self, model: nn.Module, cfg: InnerConfig, total_steps: int, device: torch.device) -> None:
        self.model, self.cfg, self.total_steps, self.device = model, cfg, total_steps, device
        decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=cfg.betas, foreach=device.type == "cuda")

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.device.type == "cuda" and self.cfg.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, step: int, micro_batches: Sequence[tuple[Tensor, Tensor]]) -> float:
        """One optimizer step at global inner step ``step``: mean loss over the micro-batches."""
        assert micro_batches, "an inner step needs at least one micro-batch"
        lr = lr_at(step, self.cfg, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        total = 0.0
        for x, y in micro_batches:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.autocast():
                loss = lm_loss(self.model, x, y) / len(micro_batches)
            loss.backward()
            total += loss.item()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total
