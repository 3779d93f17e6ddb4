"""The envelope: header fields, signatures, limits, and rejection of every kind of malformed input."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import msgpack
import pytest
import torch
import zstandard

from gradnode.protocol import (
    VERSION,
    CodecParams,
    ProtocolError,
    attach_signature,
    decode_update,
    encode_update,
    signing_digest,
)
from gradnode.protocol.bitpack import pack_bits


def _load_fuzzer():
    path = Path(__file__).resolve().parents[1] / "scripts" / "fuzz_decode.py"
    spec = importlib.util.spec_from_file_location("fuzz_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzzer()


def _update() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(96, 80, generator=g), "b": torch.randn(33, generator=g)}


def _payload(**kw: object) -> bytes:
    meta = {"run_id": "run", "round": 3, "sender": "peer", "tokens": 10, **kw}
    return encode_update(_update(), **meta)


def _rebuild(data: bytes, header_fn=None, body_fn=None) -> bytes:
    prefix, header, frame = fuzz._split(data)
    if header_fn:
        header = header_fn(header) or header
    if body_fn:
        body = bytearray(zstandard.ZstdDecompressor().decompress(frame))
        frame = zstandard.ZstdCompressor().compress(bytes(body_fn(body) or body))
    return fuzz._join(prefix, header, frame)


def test_header_fields() -> None:
    data = _payload(params=CodecParams(index_coding="packed12", bits=3))
    assert data[:4] == b"GNUP" and data[4] == VERSION
    dec = decode_update(data)
    assert (dec.version, dec.run_id, dec.round, dec.sender, dec.tokens) == (VERSION, "run", 3, "peer", 10)
    assert dec.params == CodecParams(index_coding="packed12", bits=3)
    assert set(dec.tensors) == {"w", "b"} and dec.signature == b"" and len(dec.digest) == 32
    assert dec.nbytes == len(data)


def test_encoding_is_deterministic() -> None:
    assert _payload() == _payload()


def test_signature_round_trip() -> None:
    data = _payload()
    digest = signing_digest(data)
    signed = attach_signature(data, b"s" * 64)
    assert signing_digest(signed) == digest
    dec = decode_update(signed)
    assert dec.signature == b"s" * 64 and dec.digest == digest
    resigned = attach_signature(signed, b"t" * 10)
    assert decode_update(resigned).signature == b"t" * 10 and signing_digest(resigned) == digest
    other = _payload(tokens=11)
    assert signing_digest(other) != digest  # the digest covers the header...
    tampered = _rebuild(signed, body_fn=lambda b: b.__setitem__(0, b[0] ^ 1))
    assert signing_digest(tampered) != digest  # ...and the body
    with pytest.raises(ProtocolError):
        attach_signature(data, b"x" * 2000)


def test_expected_shapes_pin_the_tensor_set() -> None:
    data = _payload()
    decode_update(data, expected={"w": (96, 80), "b": (33,)})
    for expected in ({"w": (96, 80)}, {"w": (96, 80), "b": (34,)}, {"w": (96, 80), "b": (33,), "c": (1,)}):
        with pytest.raises(ProtocolError):
            decode_update(data, expected=expected)


def test_limits_apply_before_work() -> None:
    data = _payload()
    with pytest.raises(ProtocolError, match="max_bytes"):
        decode_update(data, max_bytes=len(data) - 1)
    with pytest.raises(ProtocolError, match="max_numel"):
        decode_update(data, max_numel=96 * 80)
    with pytest.raises(ProtocolError):
        decode_update(data, max_tensors=1)


@pytest.mark.parametrize("case", [
    "wrong_version", "bad_magic", "truncated", "duplicate_name", "negative_dim", "huge_dim", "nan_levels",
    "inf_levels", "negative_levels", "bad_dtype", "bool_round", "extra_key", "bomb", "body_size_lie",
    "trailing_frame_bytes", "padding_bits", "unknown_coding", "rice_param", "ubits_lie",
])
def test_rejects_malformed(case: str) -> None:
    data = _payload()
    nan2 = struct.pack("<ff", float("nan"), 1.0)
    mutate = {
        "wrong_version": lambda: data[:4] + bytes([VERSION + 1]) + data[5:],
        "bad_magic": lambda: b"XXXX" + data[4:],
        "truncated": lambda: data[:-3],
        "duplicate_name": lambda: _rebuild(data, lambda h: h["tensors"].append(dict(h["tensors"][0]))),
        "negative_dim": lambda: _rebuild(data, lambda h: h["tensors"][0].__setitem__("shape", [-1, 5])),
        "huge_dim": lambda: _rebuild(data, lambda h: h["tensors"][0].__setitem__("shape", [2**40, 2**40])),
        "nan_levels": lambda: _rebuild(data, lambda h: h["tensors"][0].__setitem__("levels", nan2)),
        "inf_levels": lambda: _rebuild(data, lambda h: h["tensors"][0].__setitem__(
            "levels", struct.pack("<ff", 1.0, float("inf")))),
        "negative_levels": lambda: _rebuild(data, lambda h: h["tensors"][0].__setitem__(
            "levels", struct.pack("<ff", -1.0, 1.0))),
        "bad_dtype": lambda: _rebuild(data, lambda h: h["tensors"][0].__setitem__("dtype", "int8")),
        "bool_round": lambda: _rebuild(data, lambda h: h.__setitem__("round", True)),
        "extra_key": lambda: _rebuild(data, lambda h: h.__setitem__("x", 1)),
        "bomb": lambda: _rebuild(data, lambda h: h.__setitem__("body", 2**27)),
        "body_size_lie": lambda: _rebuild(data, lambda h: h.__setitem__("body", h["body"] + 1)),
        "trailing_frame_bytes": lambda: data + b"\x00",
        "padding_bits": lambda: _rebuild(data, body_fn=lambda b: b.__setitem__(-1, b[-1] | 0x80)),
        "unknown_coding": lambda: _rebuild(data, lambda h: h["codec"].__setitem__("index_coding", "zip")),
        "rice_param": lambda: _rebuild(data, lambda h: h["tensors"][0].__setitem__("r", 40)),
        "ubits_lie": lambda: _rebuild(data, lambda h: h["tensors"][0].__setitem__("ubits", 10**9)),
    }[case]
    with pytest.raises(ProtocolError):
        decode_update(mutate())


def _sections(params: CodecParams) -> tuple[bytes, int]:
    """A one-tensor payload (one 64x64 tile) and the offset of its index section in the body."""
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    data = encode_update({"w": x}, params=params)
    return data, (params.topk * params.bits + 7) // 8


def test_rejects_out_of_range_and_duplicate_indices() -> None:
    params = CodecParams(index_coding="packed12", topk=4, chunk=4096)
    data, off = _sections(params)

    def set_positions(values: list[int]):
        def fn(body: bytearray) -> bytearray:
            packed = bytes(pack_bits(torch.tensor(values), 12).tolist())
            body[off:off + len(packed)] = packed
            return body
        return fn

    decode_update(_rebuild(data, body_fn=set_positions([1, 2, 3, 4095])))
    for bad in ([1, 2, 2, 3], [3, 2, 1, 0], [0, 1, 2, 0]):
        with pytest.raises(ProtocolError):
            decode_update(_rebuild(data, body_fn=set_positions(bad)))
    # a ragged edge tile has fewer positions than 2**12: 4000 is out of range for a 64x10 tile
    x = torch.randn(64, 10)
    data = encode_update({"w": x}, params=params)
    with pytest.raises(ProtocolError):
        decode_update(_rebuild(data, body_fn=set_positions([1, 2, 3, 4000])))


def test_rejects_nan_dense_values() -> None:
    data = encode_update({"w": torch.ones(4)}, params=CodecParams(dense=True))
    bad = _rebuild(data, body_fn=lambda b: b.__setitem__(slice(0, 4), struct.pack("<f", float("nan"))))
    with pytest.raises(ProtocolError):
        decode_update(bad)


def test_rejects_non_bytes() -> None:
    for obj in (None, 12, "GNUP", [1, 2]):
        with pytest.raises(ProtocolError):
            decode_update(obj)  # type: ignore[arg-type]


def test_msgpack_header_is_plain() -> None:
    """The header is readable with any msgpack library (documented in WIRE.md)."""
    _, header, _ = fuzz._split(_payload())
    assert set(header) == {"run", "round", "sender", "tokens", "codec", "tensors", "body"}
    assert msgpack.unpackb(msgpack.packb(header)) == header


def _held_bytes(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of every tensor storage reachable from ``obj`` (dataclass fields, dicts, lists), each storage once."""
    import dataclasses

    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if dataclasses.is_dataclass(obj):
        return sum(_held_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    if isinstance(obj, dict):
        return sum(_held_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_held_bytes(v, seen) for v in obj)
    return 0


def test_a_decoded_update_holds_what_was_sent_not_a_dense_copy() -> None:
    """Every receiver holds all the round's updates until it applies them: a decoded update holds 8 bytes per
    value sent (top-64 of 4096: 0.125 bytes per parameter), not fp32 and a mask (5 bytes per parameter)."""
    params = 1 << 20
    dec = decode_update(encode_update({"w": torch.randn(1024, 1024)}))
    sent = int(dec.masks["w"].sum())
    assert sent == params // 64
    assert _held_bytes(dec) <= 8 * sent + 4096, f"{_held_bytes(dec) / params:.3f} bytes per parameter"
    dense = decode_update(encode_update({"w": torch.randn(256, 256)}, params=CodecParams(dense=True)))
    assert _held_bytes(dense) <= 4 * 256 * 256 + 64  # the dense codec: its fp32 values, no mask
