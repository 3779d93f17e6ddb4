"""The compressor interface: one family of update codecs as a small, symmetric and strict piece.

A compressor turns one fp32 tensor of a round into a Code (a few header fields plus byte sections)
and back. Every section length follows from the tensor's shape, the round and the settings (plus the
header fields of codes whose size depends on the data), so a receiver checks every length before it
reads a byte, and a sender knows a model's exact cost before it trains.

Error feedback is the same for every family: e <- beta * e + delta; send encode(e); e <- e - what
receivers decode. A family whose decode is linear in a compact form that every peer shares the
coordinates of (shared indices, a shared projection) can be summed without decoding: see `compact`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

import torch
from torch import Tensor

from gradnode.protocol.errors import ProtocolError

MAX_NUMEL = 1 << 28  # the wire's default bound on one tensor's values
MAX_SECTIONS = 8
MAX_META_INT = (1 << 62) - 1

Shape = tuple[int, ...]


class Family(str, Enum):
    """The compressor families; each has one settings dataclass (see gradnode.protocol.compress)."""

    SPARSELOCO = "sparseloco"
    RANDOM_K = "random-k"
    POWERSGD = "powersgd"
    SIGN = "sign"
    DCT_TOPK = "dct-topk"
    QUANT = "quant"
    DENSE = "dense"


@dataclass(frozen=True)
class Options:
    """Choices every family offers.

    warmup_rounds: rounds before this one send every tensor as fp32 (dense warm-up).
    small_numel: when > 0, tensors that are 1-D or hold fewer values go as fp32 (biases, norms).
    """

    warmup_rounds: int = 0
    small_numel: int = 0

    family: ClassVar[Family]

    def __post_init__(self) -> None:
        for name in ("warmup_rounds", "small_numel"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ProtocolError(f"{name} must be an int >= 0, got {value!r}")

    @property
    def label(self) -> str:
        """A short name for tables: the family and its settings."""
        extra = "".join(f" {k}={v}" for k, v in (("warmup", self.warmup_rounds), ("small", self.small_numel)) if v)
        return f"{self.family.value}{self.describe()}{extra}"

    def describe(self) -> str:
        return ""


@dataclass(frozen=True)
class Code:
    """One tensor's encoded form: header fields (ints that fix the layout, small byte tables) and sections."""

    meta: Mapping[str, int | bytes] = field(default_factory=dict)
    sections: tuple[bytes, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes it costs: every section plus the byte-valued header fields (ints fix the layout only)."""
        return sum(len(s) for s in self.sections) + sum(len(v) for v in self.meta.values() if isinstance(v, bytes))


# A header field's rule: an int is the exact length of a bytes value; a pair is an int's inclusive range.
MetaSpec = Mapping[str, int | tuple[int, int]]


def tensor_bytes(t: Tensor, dtype: torch.dtype = torch.float32) -> bytes:
    """Little-endian bytes of t in dtype (fp32 or bf16 for floats, uint8 for packed fields)."""
    return t.detach().to(dtype).reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()


def from_bytes(data: bytes, dtype: torch.dtype, what: str) -> Tensor:
    """The inverse of tensor_bytes for fp32/bf16 (finite values only) and uint8 (raw)."""
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    if dtype == torch.uint8:
        return t
    values = t.view(dtype).float()
    if not bool(torch.isfinite(values).all()):
        raise ProtocolError(f"{what} hold NaN or Inf")
    return values


def check_padding(section: bytes, nbits: int, what: str) -> None:
    """Canonical form: the unused high bits of a packed section's last byte are zero."""
    used = nbits % 8
    if used and section[-1] >> used:
        raise ProtocolError(f"non-zero padding after the {what}")


def check_shape(shape: Any) -> Shape:
    if not isinstance(shape, tuple) or len(shape) > 8 or any(type(d) is not int or d < 0 for d in shape):
        raise ProtocolError(f"a shape is a tuple of at most 8 ints >= 0, got {shape!r}")
    if math.prod(shape) > MAX_NUMEL:
        raise ProtocolError(f"tensor of {math.prod(shape)} values exceeds {MAX_NUMEL}")
    return shape


def fold(buffers: MutableMapping[str, Tensor], name: str, d: Tensor, beta: float) -> Tensor:
    """e <- beta * e + d for the fp32 buffer ``name`` (made of zeros on first use); the buffer. One of another
    shape or dtype is a caller's bug, never carried on: ProtocolError."""
    e = buffers.get(name)
    if e is None:
        e = buffers[name] = torch.zeros(d.shape, dtype=torch.float32, device=d.device)
    elif e.shape != d.shape or e.dtype != torch.float32:
        raise ProtocolError(f"{name}: error buffer must be fp32 of shape {tuple(d.shape)}")
    return e.mul_(beta).add_(d.to(e.dtype))


class Compressor(ABC):
    """One family's encoder and decoder, with shared state only where the family needs it (PowerSGD).

    Subclasses implement the compressed path (`_spec`, `_lengths`, `_encode`, `_decode`); this class
    adds the dense paths (warm-up, small tensors), strict checks, exact sizes and error feedback.
    """

    summable: ClassVar[bool] = False  # two peers' codes can be summed in compact form, without decoding
    sizes_known: ClassVar[bool] = True  # lengths follow from shape and round alone, before encoding

    def __init__(self, settings: Options) -> None:
        self.settings = settings

    @property
    def family(self) -> Family:
        return self.settings.family

    # --- what subclasses implement ------------------------------------------------------------------

    @abstractmethod
    def _spec(self, name: str, shape: Shape, round: int) -> MetaSpec:
        """The header fields of a compressed code and their rules."""

    @abstractmethod
    def _lengths(self, name: str, shape: Shape, round: int, meta: Mapping[str, int | bytes]) -> tuple[int, ...]:
        """Section lengths of a compressed code whose header passed _spec."""

    @abstractmethod
    def _encode(self, name: str, t: Tensor, round: int) -> tuple[Code, Tensor]:
        """fp32 tensor -> (code, exactly what receivers decode from it)."""

    @abstractmethod
    def _decode(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        """A code whose header and lengths passed the checks -> fp32 tensor; ProtocolError if malformed."""

    # --- the interface --------------------------------------------------------------------------------

    def is_dense(self, shape: Shape, round: int) -> bool:
        """Warm-up rounds and small tensors go as fp32; so does an empty tensor."""
        s = self.settings
        small = s.small_numel > 0 and (len(shape) <= 1 or math.prod(shape) < s.small_numel)
        return round < s.warmup_rounds or small or math.prod(shape) == 0

    def encode(self, name: str, t: Tensor, round: int) -> Code:
        return self.encode_exact(name, t, round)[0]

    def encode_exact(self, name: str, t: Tensor, round: int) -> tuple[Code, Tensor]:
        """(code, its decoding): what error feedback subtracts, bit-identical to what receivers get."""
        check_shape(tuple(t.shape))
        x = t.detach().float()
        if not bool(torch.isfinite(x).all()):
            raise ProtocolError(f"{name}: update holds NaN or Inf values")
        if self.is_dense(tuple(t.shape), round):
            return Code({}, (tensor_bytes(x),)), x.clone()
        code, recon = self._encode(name, x, round)
        return code, recon.reshape(t.shape)

    def check(self, name: str, shape: Shape, round: int, code: Any) -> Shape:
        """The shape, once code's header and every section length are checked (ProtocolError if not): nothing
        is read before, so hostile bytes cost at most the tensor's own size."""
        shape = check_shape(tuple(shape))
        lengths = self.lengths(name, shape, round, code)
        if not isinstance(code.sections, tuple) or len(code.sections) != len(lengths):
            raise ProtocolError(f"{name}: expected {len(lengths)} sections")
        for i, (s, n) in enumerate(zip(code.sections, lengths)):
            if not isinstance(s, bytes) or len(s) != n:
                raise ProtocolError(f"{name}: section {i} must be {n} bytes")
        return shape

    def decode(self, name: str, shape: Shape, round: int, code: Any) -> Tensor:
        """A code from the network -> fp32 tensor of shape; ProtocolError for anything malformed (``check``
        first)."""
        shape = self.check(name, shape, round, code)
        if self.is_dense(shape, round):
            return from_bytes(code.sections[0], torch.float32, f"{name}: dense values").reshape(shape)
        out = self._decode(name, shape, round, code)
        if not bool(torch.isfinite(out).all()):  # finite parts can overflow: a scale near fp32's max times 127
            raise ProtocolError(f"{name}: decodes to NaN or Inf values")
        return out.reshape(shape)

    def sent(self, name: str, shape: Shape, round: int, code: Any) -> tuple[Tensor | None, Tensor]:
        """What a receiver holds of a code: the flat positions it sent (sorted; None: every position) and their
        fp32 values, decoded as strictly as ``decode``. A family that sends a few known positions says which, so
        that a held update costs what was sent, not the tensor's size."""
        return None, self.decode(name, shape, round, code).reshape(-1)

    def lengths(self, name: str, shape: Shape, round: int, code: Any) -> tuple[int, ...]:
        """Section lengths of code, after checking its header; ProtocolError if the header is wrong."""
        if not isinstance(code, Code) or not isinstance(code.meta, Mapping):
            raise ProtocolError(f"{name}: expected a Code")
        if self.is_dense(shape, round):
            if code.meta:
                raise ProtocolError(f"{name}: a dense code has no header fields")
            return (4 * math.prod(shape),)
        spec = self._spec(name, shape, round)
        if set(code.meta) != set(spec):
            raise ProtocolError(f"{name}: header fields must be exactly {sorted(spec)}")
        for key, rule in spec.items():
            value = code.meta[key]
            if isinstance(rule, int):
                if not isinstance(value, bytes) or len(value) != rule:
                    raise ProtocolError(f"{name}: header field {key} must be {rule} bytes")
            elif type(value) is not int or not rule[0] <= value <= rule[1]:
                raise ProtocolError(f"{name}: header field {key} must be an int in [{rule[0]}, {rule[1]}]")
        return self._lengths(name, shape, round, code.meta)

    def nbytes(self, shapes: Mapping[str, Shape], round: int = 0,
               metas: Mapping[str, Mapping[str, int | bytes]] | None = None) -> int:
        """Exact bytes of a model's update in this round (codes' sections and byte-valued header fields).

        Families whose sizes depend on the data (`sizes_known` False) need the codes' header fields.
        """
        total = 0
        for name, shape in shapes.items():
            shape = check_shape(tuple(shape))
            if self.is_dense(shape, round):
                total += 4 * math.prod(shape)
                continue
            spec = self._spec(name, shape, round)
            if not self.sizes_known:
                if metas is None or name not in metas:
                    raise ProtocolError(f"{self.family.value}: sizes depend on the data; pass the codes' header fields")
                meta = metas[name]
            else:
                meta = {k: (b"\0" * r if isinstance(r, int) else r[0]) for k, r in spec.items()}
            total += sum(self.lengths(name, shape, round, Code(meta, ()))) + \
                sum(r for r in spec.values() if isinstance(r, int))
        return total

    def compress(self, buffers: MutableMapping[str, Tensor], delta: Mapping[str, Tensor], beta: float,
                 round: int) -> dict[str, Code]:
        """Error feedback over a whole update: fold delta into the fp32 buffers, encode, subtract what was sent.

        Buffers are created on first use and mutated in place; codes come in sorted name order.
        """
        if not 0.0 <= beta <= 1.0:
            raise ProtocolError(f"error-feedback beta must be in [0, 1], got {beta}")
        codes = {}
        for name in sorted(delta):
            e = fold(buffers, name, delta[name], beta)
            codes[name], sent = self.encode_exact(name, e, round)
            e.sub_(sent.to(e.device))
        return codes

    def observe(self, round: int, aggregate: Mapping[str, Tensor]) -> None:
        """Learn from the round's applied aggregate (every peer sees the same one). Most families keep nothing."""

    def state_dict(self) -> dict[str, Any]:
        """The shared state the family learned (``observe``): what a peer that adopts a state must hold to decode
        alike. Empty for most families."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any], shapes: Mapping[str, Shape]) -> None:
        """Hold ``state`` (from ``state_dict``, maybe of another peer: checked against the model's ``shapes``).
        ValueError if malformed."""
        if state:
            raise ValueError(f"{self.family.value} keeps no shared state")

    # --- summing without decoding -------------------------------------------------------------------------

    def compact(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        """The code's values in the round's shared coordinates; decode(code) == expand(compact(code)).

        expand is linear, so the sum of compact forms expands to the sum of the decoded updates.
        """
        if self.is_dense(shape, round):
            return self.decode(name, shape, round, code).reshape(-1)
        if not self.summable:
            raise ProtocolError(f"{self.family.value} codes cannot be summed without decoding")
        self.lengths(name, shape, round, code)
        return self._compact(name, shape, round, code)

    def expand(self, name: str, shape: Shape, round: int, compact: Tensor) -> Tensor:
        if self.is_dense(shape, round):
            return compact.reshape(shape).clone()
        if not self.summable:
            raise ProtocolError(f"{self.family.value} codes cannot be summed without decoding")
        return self._expand(name, shape, round, compact).reshape(shape)

    def _compact(self, name: str, shape: Shape, round: int, code: Code) -> Tensor:
        raise NotImplementedError

    def _expand(self, name: str, shape: Shape, round: int, compact: Tensor) -> Tensor:
        raise NotImplementedError


def shared_seed(tag: str, round: int, name: str) -> int:
    """A seed every peer derives alike from the round and the tensor's name (BLAKE2b, 63 bits).

    Nobody picks it, so no peer can steer which coordinates or projection a round uses.
    """
    import hashlib

    digest = hashlib.blake2b(f"{tag}|{round}|{name}".encode(), digest_size=8, person=b"gradnode-seed").digest()
    return int.from_bytes(digest, "little") >> 1
