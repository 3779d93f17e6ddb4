#!/usr/bin/env python
"""Fuzz gradnode.protocol.decode_update with random and mutated envelopes.

Every input must either decode to finite tensors or raise ProtocolError from an explicit check (never
another exception, never the catch-all "unchecked" net). Usage:

    python scripts/fuzz_decode.py --iterations 200000 --seed 1
"""

from __future__ import annotations

import argparse
import collections
import math
import random
import struct
import sys
from collections.abc import Callable, Iterator

import msgpack
import torch
import zstandard

from gradnode.protocol import CodecParams, ProtocolError, attach_signature, decode_update, encode_update
from gradnode.protocol.compress import DctTopK, Dense, PowerSGD, Quant, RandomK, Sign, compressor
from gradnode.protocol.wire import encode_codes

PREFIX = 8  # magic, version, flags, sig_len


def seed_payloads(seed: int) -> list[bytes]:
    """Valid envelopes covering every codec mode, odd shapes and a signature."""
    g = torch.Generator().manual_seed(seed)
    update = {"w": torch.randn(96, 80, generator=g), "b": torch.randn(33, generator=g),
              "t": torch.randn(5000, generator=g).to(torch.bfloat16), "s": torch.randn((), generator=g)}
    small = {"x": torch.randn(20, 20, generator=g)}
    out = []
    for params in (CodecParams(), CodecParams(index_coding="packed12"), CodecParams(bits=3, chunk=256, topk=8),
                   CodecParams(bits=1, chunk=100, topk=100), CodecParams(dense=True)):
        out.append(encode_update(update, params=params, run_id="fuzz", round=7, sender="peer", tokens=123))
        out.append(encode_update(small, params=params))
    out.append(attach_signature(out[0], b"\x01" * 64))
    shapes = {n: tuple(t.shape) for n, t in update.items()}
    for settings in FAMILIES:  # every compressor family's envelope (SparseLoCo's is CodecParams, above)
        codes = compressor(settings).compress({}, update, 1.0, round=7)
        out.append(encode_codes(codes, shapes, settings, run_id="fuzz", round=7, sender="peer", tokens=123))
    return out


FAMILIES = (RandomK(), RandomK(density=0.5, bits=32, small_numel=64), PowerSGD(), PowerSGD(rank=1, bits=16),
            Sign(), Sign(chunk=64, warmup_rounds=8), DctTopK(chunk=256, topk=8), DctTopK(sign=False),
            Quant(), Quant(bits=4, chunk=32), Dense(), Dense(bits=16))


def _split(data: bytes) -> tuple[bytes, dict, bytes]:
    sig_len = struct.unpack_from("<H", data, 6)[0]
    start = PREFIX + sig_len
    (hdr_len,) = struct.unpack_from("<I", data, start)
    header = msgpack.unpackb(data[start + 4:start + 4 + hdr_len], raw=False)
    return data[:start], header, data[start + 4 + hdr_len:]


def _join(prefix: bytes, header: object, frame: bytes) -> bytes:
    h = msgpack.packb(header, use_bin_type=True)
    return prefix + struct.pack("<I", len(h)) + h + frame


WEIRD = [0, -1, 1, 2**31, 2**63 - 1, -2**63, 2**64 - 1, 1.5, float("nan"), float("inf"), "", "x" * 300, b"",
         b"\xff" * 16, None, True, [], {}, [1, 2], {"a": 1}, struct.pack("<f", float("nan")) * 2,
         struct.pack("<f", float("inf")) * 2, struct.pack("<f", -1.0) * 2]


def _mutate_header(rng: random.Random, header: dict) -> dict:
    header = msgpack.unpackb(msgpack.packb(header, use_bin_type=True), raw=False)  # deep copy
    kind = rng.randrange(6)
    specs = header.get("tensors") or []
    if kind == 0:
        header[rng.choice(list(header))] = rng.choice(WEIRD)
    elif kind == 1 and specs:
        spec = rng.choice(specs)
        meta = spec.get("meta")
        if isinstance(meta, dict) and meta and rng.random() < 0.5:  # a family code's header fields
            meta[rng.choice(list(meta))] = rng.choice(WEIRD + [3, 2**40, b"\0" * 4])
        else:
            spec[rng.choice(list(spec))] = rng.choice(WEIRD)
    elif kind == 2 and specs:
        spec = rng.choice(specs)
        shape = spec.get("shape")
        if isinstance(shape, list) and shape:
            shape[rng.randrange(len(shape))] = rng.choice([0, 1, 3, 4096, 10**6, 2**40, -5])
        else:
            spec["shape"] = [rng.choice([0, 7, 2**20]) for _ in range(rng.randrange(10))]
    elif kind == 3 and specs:
        specs.append(dict(rng.choice(specs)))  # duplicate name
    elif kind == 4:
        codec = header.get("codec")
        if isinstance(codec, dict):
            codec[rng.choice(list(codec))] = rng.choice(WEIRD + [16, 4095, 65537, 9, "rice", "packed12", "x",
                                                                 "random-k", "powersgd", "dense", 0.5, 32])
    else:
        header["body"] = rng.choice([0, 1, 2**20, 2**34, header.get("body", 0) + rng.choice([-1, 1])])
    return header


def _mutate_body(rng: random.Random, frame: bytes) -> bytes:
    body = bytearray(zstandard.ZstdDecompressor().decompress(frame))
    if body:
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(body))
            body[i] ^= 1 << rng.randrange(8)
    return zstandard.ZstdCompressor().compress(bytes(body))


_BOMBS: dict[int, bytes] = {}


def _bomb(rng: random.Random, prefix: bytes, header: dict) -> bytes:
    """A tiny frame that inflates to 16 or 128 MiB, under a header that declares it (or not)."""
    size = rng.choice([2**24, 2**27])
    if size not in _BOMBS:
        _BOMBS[size] = zstandard.ZstdCompressor().compress(bytes(size))
    header = dict(header, body=size) if rng.random() < 0.5 else header
    return _join(prefix, header, _BOMBS[size])


def mutants(seed: int, iterations: int) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(seed)
    seeds = seed_payloads(seed)
    for _ in range(iterations):
        base = rng.choice(seeds)
        kind = rng.randrange(9)
        if kind == 0:
            n = rng.choice([0, 1, 7, 8, 16, 100, 1000])
            head = base[:6] if rng.random() < 0.5 else b""
            yield "random", head + rng.randbytes(n)
        elif kind == 1:
            yield "truncate", base[:rng.randrange(len(base))]
        elif kind == 2:
            data = bytearray(base)
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
            yield "bitflip", bytes(data)
        elif kind == 3:
            i = rng.randrange(len(base))
            yield "splice", base[:i] + rng.randbytes(rng.randint(1, 16)) + base[i + rng.randint(0, 16):]
        elif kind == 4:
            prefix, header, frame = _split(base)
            yield "header", _join(prefix, _mutate_header(rng, header), frame)
        elif kind == 5:
            prefix, header, frame = _split(base)
            yield "body", _join(prefix, header, _mutate_body(rng, frame))
        elif kind == 6:
            prefix, header, frame = _split(base)
            yield "bomb", _bomb(rng, prefix, header)
        elif kind == 7:
            yield "version", base[:4] + bytes([rng.choice([0, 2, 255])]) + base[5:]
        else:
            prefix, header, frame = _split(base)
            yield "frame", _join(prefix, header, frame + rng.randbytes(rng.randint(1, 8)))


def check(data: bytes) -> str:
    """'ok' or 'rejected'; raises AssertionError on any outcome a hostile peer must not cause."""
    try:
        upd = decode_update(data, max_numel=1 << 22)
    except ProtocolError as err:
        assert not str(err).startswith("unchecked"), f"input slipped past the explicit checks: {err}"
        return "rejected"
    for name, t in upd.tensors.items():
        assert t.dtype == torch.float32 and bool(torch.isfinite(t).all()), name
        assert upd.masks[name].shape == t.shape
    assert math.isfinite(upd.sq_norm)
    return "ok"


def run(seed: int, iterations: int, log: Callable[[str], None] | None = None) -> collections.Counter:
    stats: collections.Counter = collections.Counter()
    for i, (kind, data) in enumerate(mutants(seed, iterations)):
        try:
            stats[(kind, check(data))] += 1
        except AssertionError as err:
            raise AssertionError(f"iteration {i} ({kind}, seed {seed}): {err}; input={data[:64].hex()}...") from None
        if log and (i + 1) % 10000 == 0:
            log(f"{i + 1} inputs, {sum(v for (k, r), v in stats.items() if r == 'ok')} accepted")
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    stats = run(args.seed, args.iterations, log=lambda m: print(m, file=sys.stderr))
    for (kind, result), n in sorted(stats.items()):
        print(f"{kind:10s} {result:9s} {n}")
    print(f"ok: {args.iterations} inputs, only ProtocolError from explicit checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
