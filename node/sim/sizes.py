"""The encoded size of each record the virtual simulator counts: real records (protocol/records.py) of
typical content, encoded by protocol/records.py, so that a record's bytes grow with what it lists exactly as
a real one's do. Sizes are what a DHT read returns (the record's bytes); the DHT's own framing is not counted."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import msgpack

from gradnode.protocol import records

if TYPE_CHECKING:
    from gradnode.node.config import Config

PEER_ID = "Qm" + "W" * 44  # a peer id: the base58 multihash of its public key, 46 characters
RUN_ID = "run-0123456789ab"
PUBLIC_KEY = bytes(294)  # an RSA-2048 public key, DER (SPKI)
SIGNATURE = bytes(256)  # an RSA-2048 signature
HASH = "0" * 64  # a weight hash or digest (hex of 32 bytes)
MADDRS = ["/ip4/203.0.113.10/tcp/31337/p2p/" + PEER_ID]  # one reachable address


def _size(rec: records.Record) -> int:
    """Its bytes as Record.to_bytes encodes them, past the cap too (a model of an all-to-all round at a size
    the node could not run counts what it would move)."""
    return len(msgpack.packb([rec.kind, rec.model_dump(by_alias=True)], use_bin_type=True))


@functools.lru_cache(maxsize=None)
def member(chain: int = 4) -> int:
    """A member record naming ``chain`` states of its chain."""
    return _size(records.MemberRecord(
        run_id=RUN_ID, signature=SIGNATURE, peer_id=PEER_ID, public_key=PUBLIC_KEY, maddrs=MADDRS, round=12345,
        training=True, step_seconds=0.123456, inner_steps=30, tokens_per_s=12345.6, bytes_up=123456789,
        bytes_down=123456789, rejected=0, loss=3.21, software_version="0.1.0",
        protocol_version=records.PROTOCOL_VERSION, time=1.7e9, chain=[(12345 - i, HASH) for i in range(chain)],
    ))


@functools.lru_cache(maxsize=None)
def announcement() -> int:
    """An update's announcement."""
    return _size(records.UpdateAnnouncement(run_id=RUN_ID, signature=SIGNATURE, round=12345, sender=PEER_ID,
                                          digest=HASH, size=18_350_000, tokens=123456, time=1.7e9))


def _fps(n: int) -> bytes:
    return bytes(records.FINGERPRINT_BYTES * n)


@functools.lru_cache(maxsize=4096)
def report(updates: int) -> int:
    """A witness's report listing ``updates`` updates."""
    return _size(records.Report.model_construct(run_id=RUN_ID, signature=SIGNATURE, round=12345, witness=PEER_ID,
                                              base=HASH, included=_fps(updates), abstain=False))


@functools.lru_cache(maxsize=4096)
def weights(updates: int) -> int:
    """A weight report of a round that applied ``updates`` updates."""
    return _size(records.WeightHash.model_construct(run_id=RUN_ID, signature=SIGNATURE, round=12345, peer=PEER_ID,
                                                  param_hash=HASH, included=_fps(updates),
                                                  update_bytes=18_350_000 * updates))


@functools.lru_cache(maxsize=4096)
def holdings(updates: int) -> int:
    """A list of the ``updates`` updates a peer holds of a round."""
    return _size(records.Holdings.model_construct(run_id=RUN_ID, signature=SIGNATURE, round=12345, peer=PEER_ID,
                                                held=_fps(updates)))


SAMPLE_PARAMS = 1 << 22  # a flat model size is measured on one tensor this large (the codec's bytes scale with it)
SIGNED_BYTES = 256  # the update's RSA-2048 signature (wire.attach_signature)


def update_bytes(cfg: "Config", model_params: int | None = None) -> int:
    """The wire size of one peer's update, as protocol/wire.py writes it: the config's model (every tensor at
    its own shape; small ones are sent whole), or a model of ``model_params`` parameters in full chunks
    (measured on SAMPLE_PARAMS of them and scaled: a large model is almost all big matrices). Values are
    Gaussian (a pseudo-gradient's top-k positions are spread like theirs); the encoder is the node's own."""
    import torch

    from gradnode.node.train.engine import codec_params
    from gradnode.node.train.model import build_model
    from gradnode.protocol.compress import Options, compressor
    from gradnode.protocol.wire import encode_codes, encode_update

    params = codec_params(cfg)

    def encode(tensors: dict[str, torch.Tensor]) -> bytes:
        if isinstance(params, Options):  # a family's first round after its warm-up, as every peer sends it
            codes = compressor(params).compress({}, tensors, 1.0, params.warmup_rounds)
            return encode_codes(codes, {n: tuple(t.shape) for n, t in tensors.items()}, params, run_id=RUN_ID,
                                sender=PEER_ID)
        return encode_update(tensors, params=params, run_id=RUN_ID, sender=PEER_ID)

    g = torch.Generator().manual_seed(0)
    if model_params is None:
        model = build_model(cfg.model, cfg.run.seed)
        tensors = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
        return len(encode(tensors)) + SIGNED_BYTES
    side = int(SAMPLE_PARAMS ** 0.5)
    sample = len(encode({"w": torch.randn(side, side, generator=g)}))
    empty = len(encode({}))
    return empty + round((sample - empty) * model_params / (side * side)) + SIGNED_BYTES

