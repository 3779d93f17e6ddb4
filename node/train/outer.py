"""The outer step: SGD on the shared weights with an aggregated pseudo-gradient (optionally Nesterov).

Every honest peer runs this on the same inputs and must end with bit-identical weights, on any
machine. So the update is built from separate element-wise ops that IEEE rounds exactly the same
way everywhere (``mul`` then ``sub``), never a fused multiply-add whose use depends on the CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch import Tensor

from gradnode.node.config import OuterConfig

log = logging.getLogger(__name__)


class OuterOptimizer:
    """theta <- theta - lr * g (SparseLoCo), or with (Nesterov) momentum m <- mu * m + g (DiLoCo)."""

    def __init__(self, cfg: OuterConfig) -> None:
        self.lr, self.momentum, self.nesterov = cfg.lr, cfg.momentum, cfg.nesterov
        self.buffers: dict[str, Tensor] = {}

    @torch.no_grad()
    def step(self, params: Mapping[str, Tensor], grads: Mapping[str, Tensor]) -> None:
        """Update ``params`` in place; names missing from ``grads`` get a zero pseudo-gradient."""
        for name, theta in params.items():
            g = grads.get(name)
            if g is None:
                g = torch.zeros_like(theta)
            assert g.shape == theta.shape and g.dtype == theta.dtype, f"pseudo-gradient mismatch for {name}"
            if self.momentum > 0:
                m = self.buffers.get(name)
                if m is None:
                    m = self.buffers[name] = torch.zeros_like(theta)
                m.mul_(self.momentum).add_(g)
                g = g + m * self.momentum if self.nesterov else m.clone()
            theta.sub_(g * self.lr)

    def state_dict(self) -> dict[str, object]:
        return {"buffers": {k: v.clone() for k, v in self.buffers.items()}}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        buffers = state["buffers"]
        assert isinstance(buffers, Mapping)
        self.buffers = {k: v.clone().float() for k, v in buffers.items()}
