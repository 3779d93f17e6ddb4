"""The versioned update envelope: a small uncompressed msgpack header, then one zstd frame of body.

    magic "GNUP" | version u8 | flags u8 (0) | sig_len u16 | signature | hdr_len u32 | header | body

Integers are little-endian. The header declares every tensor (name, shape, dtype, quantisation
levels, rice parameters) and the body's decompressed size; all section lengths follow from it, so a
receiver checks sizes against its limits before it decompresses or allocates anything. The digest
that peers sign covers every byte except sig_len and the signature itself.

The header's codec map is either today's SparseLoCo codec (``CodecParams``: its bytes are those of every
release) or a compressor family's settings (``compress.to_wire``: a map naming its family). A family's tensor
spec carries its code's header fields under ``meta``; its sections follow from them, the shape and the round.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch
import zstandard
from torch import Tensor

from gradnode.protocol import compress
from gradnode.protocol.codec import DTYPE_NAMES, DTYPES, Encoded, decode_tensor, encode_tensors, section_sizes
from gradnode.protocol.compress import Code, Compressor, Options
from gradnode.protocol.errors import ProtocolError
from gradnode.protocol.params import CodecParams

MAGIC = b"GNUP"
VERSION = 1
ZSTD_LEVEL = 3
MAX_SIGNATURE = 1024
MAX_HEADER = 16 << 20
MAX_NAME = 256
MAX_META_STR = 256
MAX_NDIM = 8
_U63 = (1 << 63) - 1
_PREFIX = struct.Struct("<4sBBH")
_HDR_LEN = struct.Struct("<I")

DEFAULT_MAX_BYTES = 512 << 20
DEFAULT_MAX_TENSORS = 4096
DEFAULT_MAX_NUMEL = 1 << 28


@dataclass(frozen=True)
class SparseTensor:
    """One decoded tensor as it was sent: the flat positions sent, sorted, and their fp32 values.

    A receiver holds every update of the round until it applies them, so a decoded update holds what was sent,
    not a dense copy: 8 bytes per value sent (int32 positions) instead of 5 bytes per parameter (fp32 and a
    mask). ``index`` None: every position was sent (the dense codec), and ``values`` is the flat tensor.
    Positions are unique, so adding a tensor into a dense sum (``add_to``) touches each coordinate once, in the
    same IEEE operations as adding its dense form: skipped coordinates would add zero, which changes no sum.
    """

    shape: tuple[int, ...]
    index: Tensor | None  # int32 (int64 past 2**31 positions), strictly increasing; None: all positions
    values: Tensor  # fp32, one per position sent

    @classmethod
    def from_dense(cls, t: Tensor) -> "SparseTensor":
        """The nonzero coordinates of ``t`` as the positions sent (how a plain mapping counts in aggregates)."""
        flat = t.detach().reshape(-1).float()
        index = flat.nonzero().squeeze(1)
        return cls(tuple(t.shape), _narrow(index, flat.numel()), flat[index])

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def sent(self) -> int:
        """How many positions were sent."""
        return self.values.numel()

    @property
    def nbytes(self) -> int:
        """Bytes held (positions and values)."""
        index = 0 if self.index is None else self.index.numel() * self.index.element_size()
        return index + self.values.numel() * self.values.element_size()

    def with_values(self, values: Tensor) -> "SparseTensor":
        return SparseTensor(self.shape, self.index, values)

    def dense(self) -> Tensor:
        """The fp32 tensor of the original shape, zero where nothing was sent."""
        if self.index is None:
            return self.values.reshape(self.shape)
        out = self.values.new_zeros(self.numel)
        out[self.index] = self.values
        return out.reshape(self.shape)

    def mask(self) -> Tensor:
        """True where a value was sent."""
        if self.index is None:
            return torch.ones(self.shape, dtype=torch.bool, device=self.values.device)
        out = torch.zeros(self.numel, dtype=torch.bool, device=self.values.device)
        out[self.index] = True
        return out.reshape(self.shape)

    def add_to(self, flat: Tensor, values: Tensor) -> None:
        """flat[positions sent] += values (one value per position sent); ``flat`` is a 1-D dense tensor."""
        if self.index is None:
            flat.add_(values)
        else:
            flat.index_add_(0, self.index, values)


def _narrow(index: Tensor, numel: int) -> Tensor:
    """Positions as int32 where they fit (4 bytes each instead of 8)."""
    return index.to(torch.int32) if numel <= 2**31 else index.to(torch.int64)


class _Dense(Mapping[str, Tensor]):
    """Name -> dense tensor (or mask), built on each access from the sparse form and never kept."""

    def __init__(self, sparse: Mapping[str, SparseTensor], masks: bool = False) -> None:
        self._sparse, self._masks = sparse, masks

    def __getitem__(self, name: str) -> Tensor:
        sp = self._sparse[name]
        return sp.mask() if self._masks else sp.dense()

    def __iter__(self) -> Iterator[str]:
        return iter(self._sparse)

    def __len__(self) -> int:
        return len(self._sparse)


@dataclass(frozen=True)
class DecodedUpdate:
    """A peer's update as every receiver reconstructs it: per tensor the positions sent and their fp32 values.

    ``tensors`` and ``masks`` give the dense form, one tensor at a time, for readers that want it; the
    aggregates read ``sparse``, so holding an update costs O(values sent), not O(parameters).
    """

    version: int
    run_id: str
    round: int
    sender: str
    tokens: int
    params: CodecParams | Options  # the codec it was sent with: SparseLoCo's (or fp32), or a family's settings
    sparse: dict[str, SparseTensor]
    dtypes: dict[str, str]  # the sender's tensor dtypes
    sq_norm: float  # squared L2 norm, computed identically on every machine (see _sq_norm)
    signature: bytes
    digest: bytes
    nbytes: int = 0
    levels: dict[str, Tensor] = field(default_factory=dict)

    @property
    def norm(self) -> float:
        return math.sqrt(self.sq_norm)

    @property
    def tensors(self) -> Mapping[str, Tensor]:
        """Name -> dense fp32 tensor in its original shape (built when read)."""
        return _Dense(self.sparse)

    @property
    def masks(self) -> Mapping[str, Tensor]:
        """Name -> bool tensor, True where the sender sent a value (all True for dense; built when read)."""
        return _Dense(self.sparse, masks=True)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: sp.shape for name, sp in self.sparse.items()}

    @property
    def held_bytes(self) -> int:
        """Bytes its decoded tensors hold."""
        return sum(sp.nbytes for sp in self.sparse.values())


# ---------------------------------------------------------------- encoding


def _header(update_specs: list[dict[str, Any]], params: CodecParams, run_id: str, round: int, sender: str,
            tokens: int, body_size: int) -> bytes:
    return msgpack.packb({"run": run_id, "round": round, "sender": sender, "tokens": tokens,
                          "codec": params.to_wire(), "tensors": update_specs, "body": body_size},
                         use_bin_type=True)


def _check_meta(run_id: str, round: int, sender: str, tokens: int) -> None:
    if not isinstance(run_id, str) or len(run_id) > MAX_META_STR:
        raise ProtocolError(f"run_id must be a str of at most {MAX_META_STR} chars")
    if not isinstance(sender, str) or len(sender) > MAX_META_STR:
        raise ProtocolError(f"sender must be a str of at most {MAX_META_STR} chars")
    for name, value in (("round", round), ("tokens", tokens)):
        if type(value) is not int or not 0 <= value <= _U63:
            raise ProtocolError(f"{name} must be an int in [0, 2**63)")


def encode_with_reconstruction(update: Mapping[str, Tensor], *, params: CodecParams = CodecParams(),
                               run_id: str = "default", round: int = 0, sender: str = "",
                               tokens: int = 0) -> tuple[bytes, dict[str, Encoded]]:
    """encode_update, plus per tensor the kept flat indices and exactly the values receivers decode."""
    _check_meta(run_id, round, sender, tokens)
    if not isinstance(params, CodecParams):
        raise ProtocolError("params must be a CodecParams")
    names = sorted(update)
    for name in names:
        t = update[name]
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise ProtocolError(f"tensor names must be non-empty str of at most {MAX_NAME} chars: {name!r}")
        if not isinstance(t, Tensor) or t.dtype not in DTYPE_NAMES:
            raise ProtocolError(f"{name}: expected a float tensor ({', '.join(DTYPES)})")
        if t.dim() > MAX_NDIM:
            raise ProtocolError(f"{name}: at most {MAX_NDIM} dimensions")
    encoded = dict(zip(names, encode_tensors([update[name] for name in names], params)))
    specs, sections = [], []
    for name, enc in encoded.items():
        t = update[name]
        specs.append({"name": name, "shape": list(t.shape), "dtype": DTYPE_NAMES[t.dtype], **enc.meta})
        sections += enc.sections
    if sections:
        body_t = torch.cat([s.reshape(-1) for s in sections]).cpu()
        body = body_t.numpy().tobytes()
    else:
        body = b""
    header = _header(specs, params, run_id, round, sender, tokens, len(body))
    frame = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(body)
    data = _PREFIX.pack(MAGIC, VERSION, 0, 0) + _HDR_LEN.pack(len(header)) + header + frame
    return data, encoded


def encode_update(update: Mapping[str, Tensor], *, params: CodecParams = CodecParams(), run_id: str = "default",
                  round: int = 0, sender: str = "", tokens: int = 0) -> bytes:
    """Compress a pseudo-gradient (name -> tensor of any float dtype, shape and device) into an envelope."""
    return encode_with_reconstruction(update, params=params, run_id=run_id, round=round, sender=sender,
                                      tokens=tokens)[0]


def encode_codes(codes: Mapping[str, Code], shapes: Mapping[str, tuple[int, ...]], settings: Options, *,
                 run_id: str = "default", round: int = 0, sender: str = "", tokens: int = 0) -> bytes:
    """An envelope of a compressor family's codes (``Compressor.compress``: name -> Code of a float32 tensor
    of ``shapes[name]``), for the family ``settings`` names."""
    _check_meta(run_id, round, sender, tokens)
    if not isinstance(settings, Options):
        raise ProtocolError("settings must be a compressor family's Options")
    specs, sections = [], []
    for name in sorted(codes):
        code = codes[name]
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise ProtocolError(f"tensor names must be non-empty str of at most {MAX_NAME} chars: {name!r}")
        specs.append({"name": name, "shape": list(shapes[name]), "dtype": "float32", "meta": dict(code.meta)})
        sections += code.sections
    body = b"".join(sections)
    header = msgpack.packb({"run": run_id, "round": round, "sender": sender, "tokens": tokens,
                            "codec": compress.to_wire(settings), "tensors": specs, "body": len(body)},
                           use_bin_type=True)
    frame = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(body)
    return _PREFIX.pack(MAGIC, VERSION, 0, 0) + _HDR_LEN.pack(len(header)) + header + frame


# ---------------------------------------------------------------- signatures


def _split_signature(data: bytes) -> tuple[bytes, bytes, bytes]:
    """(signed prefix, signature, signed rest); raises ProtocolError if the prefix is malformed."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError("payload must be bytes")
    data = bytes(data)
    if len(data) < _PREFIX.size:
        raise ProtocolError("payload shorter than the envelope prefix")
    magic, version, flags, sig_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError("not a gradnode update (bad magic)")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this node speaks {VERSION})")
    if flags != 0:
        raise ProtocolError("unknown envelope flags")
    if sig_len > MAX_SIGNATURE or len(data) < _PREFIX.size + sig_len:
        raise ProtocolError("bad signature length")
    end = _PREFIX.size + sig_len
    return data[:6], data[_PREFIX.size:end], data[end:]


def signing_digest(data: bytes) -> bytes:
    """BLAKE2b-256 over the envelope without its signature field: what a sender signs."""
    return signed_part(data)[0]


def signed_part(data: bytes) -> tuple[bytes, bytes]:
    """(signing digest, signature) of an envelope, from its raw bytes alone: a receiver checks the
    signature before it parses the header or decompresses a byte of the body."""
    head, signature, rest = _split_signature(data)
    return hashlib.blake2b(head + rest, digest_size=32, person=b"gradnode-upd").digest(), signature


def attach_signature(data: bytes, signature: bytes) -> bytes:
    """The same envelope with its signature field set (replacing any previous one)."""
    if not isinstance(signature, (bytes, bytearray)) or len(signature) > MAX_SIGNATURE:
        raise ProtocolError(f"signature must be bytes of at most {MAX_SIGNATURE} bytes")
    head, _, rest = _split_signature(data)
    return head + struct.pack("<H", len(signature)) + bytes(signature) + rest


# ---------------------------------------------------------------- decoding


def _int(obj: Any, what: str, lo: int = 0, hi: int = _U63) -> int:
    if type(obj) is not int or not lo <= obj <= hi:
        raise ProtocolError(f"{what} must be an int in [{lo}, {hi}]")
    return obj


def _str(obj: Any, what: str, max_len: int) -> str:
    if type(obj) is not str or len(obj) > max_len:
        raise ProtocolError(f"{what} must be a str of at most {max_len} chars")
    return obj


def _keys(obj: Any, keys: set[str], what: str) -> dict[str, Any]:
    if type(obj) is not dict or set(obj) != keys:
        raise ProtocolError(f"{what} must be a map with exactly the keys {sorted(keys)}")
    return obj


def _spec_keys(params: CodecParams) -> set[str]:
    keys = {"name", "shape", "dtype"}
    if not params.dense:
        keys.add("levels")
        if params.index_coding == "rice":
            keys |= {"r", "ubits"}
    return keys


def _named_shape(spec: dict[str, Any], seen: set[str], max_numel: int) -> tuple[str, tuple[int, ...]]:
    """A tensor spec's name (non-empty, not in ``seen``: then added) and shape, checked."""
    name = _str(spec["name"], "tensor name", MAX_NAME)
    if not name or name in seen:
        raise ProtocolError(f"empty or duplicate tensor name {name!r}")
    seen.add(name)
    if type(spec["shape"]) is not list or len(spec["shape"]) > MAX_NDIM:
        raise ProtocolError(f"{name}: shape must be a list of at most {MAX_NDIM} dims")
    return name, tuple(_int(d, f"{name}: dim", 0, max_numel) for d in spec["shape"])


def _parse_specs(raw: Any, params: CodecParams, max_tensors: int, max_numel: int,
                 expected: Mapping[str, tuple[int, ...]] | None) -> list[tuple[str, tuple[int, ...], dict[str, Any]]]:
    if type(raw) is not list or len(raw) > max_tensors:
        raise ProtocolError(f"tensors must be a list of at most {max_tensors} specs")
    keys, specs, seen, total = _spec_keys(params), [], set(), 0
    for i, spec in enumerate(raw):
        spec = _keys(spec, keys, f"tensor spec {i}")
        name, shape = _named_shape(spec, seen, max_numel)
        numel = math.prod(shape)
        total += numel
        if total > max_numel:
            raise ProtocolError(f"update declares more than max_numel={max_numel} values")
        if type(spec["dtype"]) is not str or spec["dtype"] not in DTYPES:
            raise ProtocolError(f"{name}: unsupported dtype {spec['dtype']!r}")
        if expected is not None and tuple(expected.get(name, (-1,))) != shape:
            raise ProtocolError(f"{name}: unexpected tensor or shape {shape}")
        if not params.dense:
            levels = spec["levels"]
            if type(levels) is not bytes or len(levels) != 4 << (params.bits - 1):
                raise ProtocolError(f"{name}: levels must be {1 << (params.bits - 1)} fp32 values")
            if params.index_coding == "rice":
                _int(spec["r"], f"{name}: rice parameter", 0, 64)
                _int(spec["ubits"], f"{name}: unary length", 0, 8 * DEFAULT_MAX_BYTES * 64)
        specs.append((name, shape, spec))
    if expected is not None and len(seen) != len(expected):
        raise ProtocolError(f"update holds {len(seen)} tensors, expected {len(expected)}")
    return specs


def _decompress(frame: bytes, size: int) -> bytes:
    try:
        declared = zstandard.get_frame_parameters(frame).content_size
    except zstandard.ZstdError as err:
        raise ProtocolError(f"bad zstd frame header: {err}") from None
    if declared != size:
        raise ProtocolError(f"zstd frame declares {declared} bytes, header says {size}")
    try:
        obj = zstandard.ZstdDecompressor().decompressobj()
        body = obj.decompress(frame)
    except zstandard.ZstdError as err:
        raise ProtocolError(f"corrupt zstd body: {err}") from None
    if not obj.eof or obj.unused_data or len(body) != size:
        raise ProtocolError("zstd body truncated, oversized or followed by extra bytes")
    return body


def _sq_norm(params: CodecParams, per_tensor: list[tuple[list[int], Tensor, Tensor]]) -> float:
    """Sparse: sum of count * level**2 in Python floats, in name order: identical on every machine.
    Dense: a float64 reduction (identical for identical hardware and thread count)."""
    total = 0.0
    for counts, levels, values in per_tensor:
        if params.dense:
            total += float(values.double().square().sum().item())
        else:
            for c, lv in zip(counts, levels.tolist()):
                total += c * lv * lv
    return total


MAX_META_FIELDS = 8  # header fields of one family code (the most any family writes is 3)


def _decode_family(data: bytes, signature: bytes, rest: bytes, header: dict[str, Any], frame: bytes,
                   comp: Compressor, run_id: str, sender: str, round_: int, tokens: int, max_tensors: int,
                   max_numel: int, expected: Mapping[str, tuple[int, ...]] | None,
                   device: torch.device) -> DecodedUpdate:
    """The rest of ``_decode`` for a compressor family's envelope: every spec and length checked, then the body
    decompressed and each code decoded strictly by ``comp`` (``Compressor.sent``)."""
    raw = header["tensors"]
    if type(raw) is not list or len(raw) > max_tensors:
        raise ProtocolError(f"tensors must be a list of at most {max_tensors} specs")
    codes, seen, total, body_size = [], set(), 0, 0
    for i, spec in enumerate(raw):
        spec = _keys(spec, {"name", "shape", "dtype", "meta"}, f"tensor spec {i}")
        name, shape = _named_shape(spec, seen, max_numel)
        total += math.prod(shape)
        if total > max_numel:
            raise ProtocolError(f"update declares more than max_numel={max_numel} values")
        if spec["dtype"] != "float32":
            raise ProtocolError(f"{name}: a family's code is of a float32 tensor")
        if expected is not None and tuple(expected.get(name, (-1,))) != shape:
            raise ProtocolError(f"{name}: unexpected tensor or shape {shape}")
        meta = spec["meta"]
        if type(meta) is not dict or len(meta) > MAX_META_FIELDS or not all(
                type(k) is str and (type(v) is int or type(v) is bytes) for k, v in meta.items()):
            raise ProtocolError(f"{name}: meta must be a map of at most {MAX_META_FIELDS} int or bytes fields")
        lengths = comp.lengths(name, shape, round_, Code(meta, ()))
        body_size += sum(lengths)
        codes.append((name, shape, meta, lengths))
    if expected is not None and len(seen) != len(expected):
        raise ProtocolError(f"update holds {len(seen)} tensors, expected {len(expected)}")
    if _int(header["body"], "body size") != body_size:
        raise ProtocolError("declared body size does not match the tensor specs")
    body = _decompress(frame, body_size)
    sparse, dtypes, sq_norm, offset = {}, {}, 0.0, 0
    for name, shape, meta, lengths in sorted(codes, key=lambda c: c[0]):  # the norm sums in name order
        sections = []
        for n in lengths:
            sections.append(body[offset:offset + n])
            offset += n
        index, values = comp.sent(name, shape, round_, Code(meta, tuple(sections)))
        sparse[name] = SparseTensor(shape, index if index is None else index.to(device), values.to(device))
        dtypes[name] = "float32"
        sq_norm += float(values.double().square().sum().item())
    digest = hashlib.blake2b(data[:6] + rest, digest_size=32, person=b"gradnode-upd").digest()
    return DecodedUpdate(VERSION, run_id, round_, sender, tokens, comp.settings, sparse, dtypes, sq_norm,
                         signature, digest, len(data))


def _decode(data: bytes, max_bytes: int, max_tensors: int, max_numel: int,
            expected: Mapping[str, tuple[int, ...]] | None, device: torch.device,
            compressor: Compressor | None = None) -> DecodedUpdate:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError("payload must be bytes")
    if len(data) > max_bytes:
        raise ProtocolError(f"payload of {len(data)} bytes exceeds max_bytes={max_bytes}")
    data = bytes(data)
    _, signature, rest = _split_signature(data)
    if len(rest) < _HDR_LEN.size:
        raise ProtocolError("payload truncated before the header")
    (hdr_len,) = _HDR_LEN.unpack_from(rest)
    if hdr_len > min(MAX_HEADER, len(rest) - _HDR_LEN.size):
        raise ProtocolError("header length out of range")
    header_bytes = rest[_HDR_LEN.size:_HDR_LEN.size + hdr_len]
    frame = rest[_HDR_LEN.size + hdr_len:]
    try:
        header = msgpack.unpackb(header_bytes, raw=False, strict_map_key=True, use_list=True)
    except Exception as err:  # msgpack raises a zoo of types (ExtraData, StackError, ValueError, ...)
        raise ProtocolError(f"malformed msgpack header: {type(err).__name__}") from None
    header = _keys(header, {"run", "round", "sender", "tokens", "codec", "tensors", "body"}, "header")
    run_id = _str(header["run"], "run id", MAX_META_STR)
    sender = _str(header["sender"], "sender", MAX_META_STR)
    round_ = _int(header["round"], "round")
    tokens = _int(header["tokens"], "tokens")
    if isinstance(header["codec"], dict) and "family" in header["codec"]:
        settings = compress.from_wire(header["codec"])
        if settings.family is compress.Family.SPARSELOCO:
            raise ProtocolError("sparseloco is sent under its codec params, never as a family's map")
        if compressor is None or compressor.settings != settings:
            compressor = compress.compressor(settings)  # a stateless one: a codec not the run's is refused later
        return _decode_family(data, signature, rest, header, frame, compressor, run_id, sender, round_, tokens,
                              max_tensors, max_numel, expected, device)
    try:
        params = CodecParams.from_wire(header["codec"])
    except ProtocolError:
        raise
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"bad codec params: {err}") from None
    specs = _parse_specs(header["tensors"], params, max_tensors, max_numel, expected)
    sizes = [section_sizes(shape, params, spec) for _, shape, spec in specs]
    body_size = _int(header["body"], "body size", 0, _U63)
    if body_size != sum(s.total for s in sizes):
        raise ProtocolError("declared body size does not match the tensor specs")
    body = _decompress(frame, body_size)
    body_t = torch.frombuffer(bytearray(body), dtype=torch.uint8) if body else torch.zeros(0, dtype=torch.uint8)
    sparse, dtypes, levels_out, norm_parts = {}, {}, {}, []
    offset = 0
    for (name, shape, spec), size in zip(specs, sizes):
        sections = []
        for length in size.lengths:
            sections.append(body_t[offset:offset + length])
            offset += length
        index, values, counts, levels = decode_tensor(shape, params, spec, size, sections, device)
        sparse[name] = SparseTensor(shape, None if index is None else _narrow(index, math.prod(shape)), values)
        dtypes[name] = spec["dtype"]
        if not params.dense:
            levels_out[name] = levels
        norm_parts.append((name, (counts, levels, values)))
    sq_norm = _sq_norm(params, [p for _, p in sorted(norm_parts, key=lambda item: item[0])])
    digest = hashlib.blake2b(data[:6] + rest, digest_size=32, person=b"gradnode-upd").digest()
    return DecodedUpdate(VERSION, run_id, round_, sender, tokens, params, sparse, dtypes, sq_norm,
                         signature, digest, len(data), levels_out)


def decode_update(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, max_tensors: int = DEFAULT_MAX_TENSORS,
                  max_numel: int = DEFAULT_MAX_NUMEL, expected: Mapping[str, tuple[int, ...]] | None = None,
                  device: str | torch.device = "cpu", compressor: Compressor | None = None) -> DecodedUpdate:
    """Parse and fully validate an envelope from an untrusted peer.

    Raises ProtocolError, and nothing else, for any malformed input. `expected` (name -> shape) pins
    the exact tensor set; the limits bound the envelope before anything is decompressed or allocated.
    `compressor`: the run's, which decodes a family's codes with the shared state it holds (PowerSGD's basis);
    an envelope of other settings is decoded by a fresh one.
    """
    try:
        return _decode(data, max_bytes, max_tensors, max_numel, expected, torch.device(device), compressor)
    except ProtocolError:
        raise
    except Exception as err:  # a gap in the checks above; still never let peer bytes crash the node
        raise ProtocolError(f"unchecked malformed input ({type(err).__name__}: {err})") from err
