"""The outer step: plain SGD for SparseLoCo, Nesterov momentum for DiLoCo, and a momentum buffer that
survives a checkpoint."""

from __future__ import annotations

import pytest
import torch

from gradnode.node.config import OuterConfig
from gradnode.node.train.outer import OuterOptimizer


def run(cfg: OuterConfig, grads: list[float]) -> list[float]:
    """The weight after each outer step, from 0 with these scalar pseudo-gradients."""
    opt, theta, seen = OuterOptimizer(cfg), torch.zeros(1), []
    for g in grads:
        opt.step({"w": theta}, {"w": torch.tensor([g])})
        seen.append(theta.item())
    return seen


def test_nesterov_looks_ahead_by_one_momentum_step() -> None:
    """m <- mu m + g; theta <- theta - lr (g + mu m). By hand with mu 0.9, lr 0.5 and g = 1, 1: the first step
    moves 0.95 (plain momentum: 0.5) and the second 1.355 (plain: 0.95)."""
    nesterov = run(OuterConfig(algorithm="diloco", lr=0.5, momentum=0.9, nesterov=True), [1.0, 1.0])
    plain = run(OuterConfig(algorithm="diloco", lr=0.5, momentum=0.9, nesterov=False), [1.0, 1.0])
    assert nesterov == pytest.approx([-0.95, -2.305])
    assert plain == pytest.approx([-0.5, -1.45])


def test_it_matches_torch_sgd_with_nesterov() -> None:
    """The same steps as torch.optim.SGD(nesterov=True), the reference DiLoCo names, on random gradients."""
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(64, generator=gen) for _ in range(6)]
    ours, ref = torch.zeros(64), torch.zeros(64, requires_grad=True)
    opt = OuterOptimizer(OuterConfig(algorithm="diloco", lr=0.7, momentum=0.9, nesterov=True))
    sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    for g in grads:
        opt.step({"w": ours}, {"w": g})
        ref.grad = g.clone()
        sgd.step()
        torch.testing.assert_close(ours, ref.detach(), rtol=1e-6, atol=1e-6)


def test_sparseloco_takes_the_plain_step_and_a_missing_name_moves_only_by_momentum() -> None:
    """Without momentum a step is theta - lr g exactly. With momentum, a name missing from a round's
    aggregate still moves by its buffer: it gets a zero pseudo-gradient, not no step."""
    assert run(OuterConfig(lr=0.5), [1.0, 2.0]) == [-0.5, -1.5]
    opt, theta = OuterOptimizer(OuterConfig(algorithm="diloco", lr=1.0, momentum=0.5, nesterov=True)), torch.zeros(1)
    opt.step({"w": theta}, {"w": torch.ones(1)})  # m = 1, step 1 + 0.5
    opt.step({"w": theta}, {})  # m = 0.5, step 0 + 0.25
    assert theta.item() == pytest.approx(-1.75)


def test_the_momentum_buffer_survives_a_checkpoint() -> None:
    """A peer restarted from its checkpoint takes the same next step as one that never stopped."""
    cfg = OuterConfig(algorithm="diloco", lr=0.5, momentum=0.9, nesterov=True)
    a, theta_a = OuterOptimizer(cfg), torch.zeros(3)
    a.step({"w": theta_a}, {"w": torch.ones(3)})
    b, theta_b = OuterOptimizer(cfg), theta_a.clone()
    b.load_state_dict(a.state_dict())
    a.step({"w": theta_a}, {"w": torch.full((3,), 2.0)})
    b.step({"w": theta_b}, {"w": torch.full((3,), 2.0)})
    assert torch.equal(theta_a, theta_b)
