"""The compressor families side by side: pick one with a frozen settings dataclass, build it with `compressor`.

    c = compressor(SparseLoCo())          # today's codec, byte for byte
    codes = c.compress(buffers, delta, beta=0.9, round=r)
    update = {n: c.decode(n, shape, r, code) for n, code in codes.items()}

Every family's decode is strict (ProtocolError for malformed input, lengths checked before reading),
and `nbytes` is the exact cost of a model's update.
"""

from __future__ import annotations

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


def compressor(settings: Options) -> Compressor:
    """A fresh compressor for these settings (its shared state, where the family has one, starts empty)."""
    for family, (kind, make) in KINDS.items():
        if type(settings) is kind:
            return make(settings)
    raise ProtocolError(f"unknown compressor settings {settings!r}")


__all__ = ["Code", "Compressor", "DctTopK", "Dense", "Family", "KINDS", "Options", "PowerSGD", "ProtocolError",
           "Quant", "RandomK", "Sign", "SparseLoCo", "compressor", "shared_seed"]
