"""PowerSGD in one message per round: every peer projects on the same basis, so factors can be summed.

A tensor of 2+ dims is the matrix M = [shape[0], rest] (m x n). In a round whose shared basis is Q
(n x r, orthonormal) a peer sends P = M Q and receivers decode P Q^T; with a basis P on the other
side it sends M^T P and receivers decode P (M^T P)^T. Both are linear in what is sent, so the sum of
the factors decodes to the sum of the updates.

Warm start: after a round, every peer turns the applied aggregate A into the next basis, alternating
sides (orth(A Q) after a Q round, orth(A^T P) after a P round). That is one step of power iteration
per round on the swarm's own update, from shared data only, so it needs no extra message. Without
warm start, or when a peer has not seen the last aggregate, the basis is a fresh Gaussian Q from the
round's shared seed. The basis is shared state: peers must hold the same one (the round's aggregate
on every peer is the same, and the ops here run in a fixed order on the CPU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from gradnode.protocol.compress.base import Code, Compressor, Family, MetaSpec, Options, Shape, from_bytes, \
    shared_seed, tensor_bytes
from gradnode.protocol.errors import ProtocolError

RIGHT, LEFT = "right", "left"  # the basis multiplies M from the right (Q, n x r) or from the left (P, m x r)


@dataclass(frozen=True)
class PowerSGD(Options):
    """Rank-r factors of every matrix; bits 32 sends fp32 factors, 16 bf16. Vectors go as fp32."""

    rank: int = 2
    warm_start: bool = True
    bits: int = 32

    family: ClassVar[Family] = Family.POWERSGD

    def __post_init__(self) -> None:
        super().__post_init__()
        if type(self.rank) is not int or not 1 <= self.rank <= 256:
            raise ProtocolError(f"powersgd rank must be an int in [1, 256], got {self.rank}")
        if self.bits not in (16, 32):
            raise ProtocolError(f"powersgd bits must be 16 or 32, got {self.bits}")

    def describe(self) -> str:
        return f" r{self.rank}{'' if self.warm_start else ' cold'}{' bf16' if self.bits == 16 else ''}"


def matrix_shape(shape: Shape) -> tuple[int, int]:
    return shape[0], math.prod(shape[1:])


def orthonormal(x: Tensor) -> Tensor | None:
    """Columns of x made orthonormal (float64 QR, signs fixed so R's diagonal is positive); None if rank-deficient."""
    q, r = torch.linalg.qr(x.double().cpu())
    diag = r.diagonal()
    if diag.numel() == 0 or float(diag.abs().min()) <= 1e-9 * max(float(diag.abs().max()), 1e-300):
        return None
    return (q * diag.sign()).float()


class PowerSGDCompressor(Compressor):
    settings: PowerSGD
    summable = True

    def __init__(self, settings: PowerSGD) -> None:
        super().__init__(settings)
        self.bases: dict[str, tuple[int, str, Tensor]] = {}  # name -> (round it serves, side, basis)

    def is_dense(self, shape: Shape, round: int) -> bool:
        return super().is_dense(shape, round) or len(shape) < 2 or self.settings.rank >= min(matrix_shape(shape))

    def basis(self, name: str, shape: Shape, round: int) -> tuple[str, Tensor]:
        """The round's shared basis of a tensor: the warm-started one, else a fresh seeded Q."""
        held = self.bases.get(name)
        if self.settings.warm_start and held is not None and held[0] == round:
            return held[1], held[2]
        m, n = matrix_shape(shape)
        g = torch.Generator().manual_seed(shared_seed("powersgd", round, name))
        q = orthonormal(torch.randn(n, self.settings.rank, generator=g, dtype=torch.float64))
        assert q is not None  # a Gaussian matrix has full rank with probability 1
        return RIGHT, q

    def observe(self, round: int, aggregate: Mapping[str, Tensor]) -> None:
        """Warm start: the next round's basis is one power-iteration step on this round's aggregate."""
        if not self.settings.warm_start:
            return
        bases = {}
        for name, a in aggregate.items():
            shape = tuple(a.shape)
            if len(shape) < 2 or self.settings.rank >= min(matrix_shape(shape)):
                continue
            side, basis = self.basis(name, shape, round)
            mat = a.detach().float().cpu().reshape(matrix_shape(shape))
            nxt = orthonormal(mat @ basis if side == RIGHT else mat.T @ basis)
            if nxt is not None:
                bases[name] = (round + 1, LEFT if side == RIGHT else RIGHT, nxt)
        self.bases = bases

    def state_dict(self) -> dict[str, tuple[int, str, Tensor]]:
        return {k: (r, s, b.clone()) for k, (r, s, b) in self.bases.items()}

    def load_state_dict(self, state: Mapping[str, Any], shapes: Mapping[str, Shape]) -> None:
        """Hold another peer's bases (a state it offered: checked). Each is a finite fp32 matrix of ``rank``
        columns, with the rows of the side of its tensor (of ``shapes``) it multiplies, serving one round."""
        bases = {}
        for k, value in state.items():
            ok = isinstance(k, str) and k in shapes and isinstance(value, (tuple, list)) and len(value) == 3
            r, side, b = value if ok else (None, None, None)
            if not ok or type(r) is not int or r < 0 or side not in (RIGHT, LEFT) or not isinstance(b, Tensor) \
                    or b.dtype != torch.float32 or b.dim() != 2 or len(shapes[k]) < 2 \
                    or tuple(b.shape) != (matrix_shape(shapes[k])[1 if side == RIGHT else 0], self.settings.rank) \
                    or not bool(torch.isfinite(b).all()):
                raise ValueError(f"powersgd basis {k!r}: malformed")
            bases[k] = (r, side, b.detach().float().cpu().clone())
        self.bases = bases

    def _dtype(self) -> torch.dtype:
        return torch.float32 if self.settings.bits == 32 else torch.bfloat16

    def _spec(self, name: str, shape: Shape, round: int) -> MetaSpec:
        return {}

    def _lengths(self, name: str, shape: Shape, round: int, meta: Mapping[str, int | bytes]) -> tuple[int, ...]:
        side, basis = self.basis(name, shape, round)
        m, n = matrix_shape(shape)
        return ((n if side == LEFT else m) * self.settings.rank * self.settings.bits // 8,)

    def _encode(self, name: str, t: Tensor, round: int) -> tuple[Code, Tensor]:
        side, basis = self.basis(name, tuple(t.shape), round)
        mat = t.cpu().reshape(matrix_shape(tuple(t.shape)))
        factor = (mat @ basis if side == RIGHT else mat.T @ basis).to(self._dtype())
        code = Code({}, (tensor_bytes(factor, factor.dtype),))
        return code, self._expand(name, tuple(t.shape), round, factor.float().reshape(-1)).to(t.device)

    def _compact(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        return from_bytes(code.sections[0], self._dtype(), f"{name}: factor")

    def _expand(self, name: str, shape: Shape, round: int, compact: Tensor) -> Tensor:
        side, basis = self.basis(name, shape, round)
        factor = compact.float().cpu().reshape(-1, self.settings.rank)
        return factor @ basis.T if side == RIGHT else basis @ factor.T

    def _decode(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        return self._expand(name, shape, round, self._compact(name, shape, round, code))
