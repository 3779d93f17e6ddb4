"""The compressor families side by side: pick one with a frozen settings dataclass, build it with `compressor`.

    c = compressor(SparseLoCo())          # today's codec, byte for byte
    codes = c.compress(buffers, delta, beta=0.9, round=r)
    update = {n: c.decode(n, shape, r, code) for n, code in codes.items()}

Every family's decode is strict (ProtocolError for malformed input, lengths checked before reading),
and `nbytes` is the exact cost of a model's update.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from gradnode.protocol.compress.base import Code, Compressor, Family, Options, shared_seed
from gradnode.protocol.compress.dense import Dense, DenseCompressor, Quant, QuantCompressor, Sign, SignCompressor
from gradnode.protocol.compress.lowrank import PowerSGD, PowerSGDCompressor
from gradnode.protocol.compress.sparse import (DctTopK, DctTopKCompressor, RandomK, RandomKCompressor, SparseLoCo,
                                               SparseLoCoCompressor)
from gradnode.protocol.errors import ProtocolError

KINDS: dict[Family, tuple[type[Options], type[Compressor]]] = {
    Family.SPARSELOCO: (SparseLoCo, SparseLoCoCompressor),
    Family.RANDOM_K: (RandomK, RandomKCompressor),
    Family.POWERSGD: (PowerSGD, PowerSGDCompressor),
    Family.SIGN: (Sign, SignCompressor),
    Family.DCT_TOPK: (DctTopK, DctTopKCompressor),
    Family.QUANT: (Quant, QuantCompressor),
    Family.DENSE: (Dense, DenseCompressor),
}


def to_wire(settings: Options) -> dict[str, Any]:
    """The settings as an envelope's codec map: the family and every field."""
    return {"family": settings.family.value, **asdict(settings)}


def from_wire(obj: Any) -> Options:
    """An envelope's codec map -> the family's settings; ProtocolError unless it names a family and holds
    exactly that family's fields, each of its declared type (an int where an int belongs: True is no int)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("family"), str):
        raise ProtocolError("a codec map names its family")
    try:
        kind = KINDS[Family(obj["family"])][0]
    except ValueError:
        raise ProtocolError(f"unknown compressor family {obj['family']!r}") from None
    names = {f.name: f for f in fields(kind)}
    if set(obj) != set(names) | {"family"}:
        raise ProtocolError(f"codec map of {kind.family.value}: exactly family and {sorted(names)}")
    for name, f in names.items():
        if type(obj[name]) is not type(f.default):
            raise ProtocolError(f"codec {kind.family.value}: {name} must be a {type(f.default).__name__}")
    return kind(**{n: obj[n] for n in names})


def compressor(settings: Options) -> Compressor:
    """A fresh compressor for these settings (its shared state, where the family has one, starts empty)."""
    for family, (kind, make) in KINDS.items():
        if type(settings) is kind:
            return make(settings)
    raise ProtocolError(f"unknown compressor settings {settings!r}")


__all__ = ["Code", "Compressor", "DctTopK", "Dense", "Family", "KINDS", "Options", "PowerSGD", "ProtocolError",
           "Quant", "RandomK", "Sign", "SparseLoCo", "compressor", "from_wire", "shared_seed", "to_wire"]
