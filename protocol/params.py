"""Codec parameters: what a sender chose and a receiver needs to decode, carried in every envelope."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gradnode.protocol.errors import ProtocolError

INDEX_CODINGS = ("packed12", "rice")
MAX_CHUNK = 1 << 16


@dataclass(frozen=True)
class CodecParams:
    """Chunked top-k with bit-packed quantised values (SparseLoCo), or a dense fp32 passthrough.

    chunk: values per chunk (s x s tiles of 2-D weights when chunk is a perfect square, else contiguous).
    topk: values kept per chunk, by magnitude (all of them in chunks smaller than topk).
    bits: bits per kept value: one sign bit plus bits-1 bits selecting a per-tensor magnitude level.
    index_coding: 'packed12' fixed-width in-chunk positions (ceil(log2(chunk)) bits, 12 at 4096);
        'rice' Rice-coded gaps between sorted positions (low bits and unary high parts in two streams).
    dense: send every value as fp32 (the DiLoCo baseline); chunk/topk/bits are then ignored.
    """

    chunk: int = 4096
    topk: int = 64
    bits: int = 2
    index_coding: str = "rice"
    dense: bool = False

    def __post_init__(self) -> None:
        for name in ("chunk", "topk", "bits"):
            value = getattr(self, name)
            if type(value) is not int:
                raise ProtocolError(f"codec {name} must be an int, got {type(value).__name__}")
        if type(self.dense) is not bool:
            raise ProtocolError("codec dense must be a bool")
        if not 16 <= self.chunk <= MAX_CHUNK:
            raise ProtocolError(f"codec chunk must be in [16, {MAX_CHUNK}], got {self.chunk}")
        if not 1 <= self.topk <= self.chunk:
            raise ProtocolError(f"codec topk must be in [1, chunk={self.chunk}], got {self.topk}")
        if not 1 <= self.bits <= 8:
            raise ProtocolError(f"codec bits must be in [1, 8], got {self.bits}")
        if self.index_coding not in INDEX_CODINGS:
            raise ProtocolError(f"codec index_coding must be one of {INDEX_CODINGS}, got {self.index_coding!r}")

    @property
    def index_width(self) -> int:
        """Bits per position in the fixed-width coding: ceil(log2(chunk))."""
        return max(1, (self.chunk - 1).bit_length())

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, obj: Any) -> "CodecParams":
        if not isinstance(obj, dict) or set(obj) != {"chunk", "topk", "bits", "index_coding", "dense"}:
            raise ProtocolError("codec params must be a map with exactly chunk, topk, bits, index_coding, dense")
        if type(obj["index_coding"]) is not str:
            raise ProtocolError("codec index_coding must be a string")
        return cls(**obj)
