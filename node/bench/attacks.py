"""The attacks of `gradnode bench robust`: what a peer with a valid key and honest token counts can send.

Each attack turns one round's facts (the attacker's own honest update, the others' updates, the round's
median norm) into payload bytes that pass ``decode_update``; payloads are crafted with the real encoder
or by rewriting a real envelope's header (the header is plain msgpack; a receiver checks the signature,
which an attacker makes with its own key, so the bench leaves envelopes unsigned as bench quality does).

- ``signflip``: its own honest update negated, rescaled to the round's median norm;
- ``scaled``: its own honest update negated and multiplied by 100 (the median-norm clip's case);
- ``noise``: Gaussian noise through the codec (top-k of noise), rescaled to the median norm;
- ``zeros``: zeros marked as sent: the positions the honest updates send most, every magnitude level 0
  (dilutes ``coord_mean``'s per-coordinate average at no norm cost);
- ``targeted``: one coordinate (the honest aggregate's largest, chosen in round 0) pushed against the
  honest direction with the whole median-norm budget, every round;
- ``copy``: another replica's update re-sent under its own name (same tensors: a free-rider);
- ``replay``: the previous round's update of another replica re-sent as its own (a free-rider that never
  trains; round 0: a copy);
- ``lazy``: a real replica that trains every round on one fixed batch (its assigned data ignored).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch
from torch import Tensor

from gradnode.protocol import CodecParams, DecodedUpdate, decode_update, encode_update

ATTACKS = ("signflip", "scaled", "noise", "zeros", "targeted", "copy", "replay", "lazy")
TRAINS = {"signflip", "scaled", "lazy"}  # attacks that need the attacker's own inner steps
SCALE = 100.0

_PREFIX = struct.Struct("<4sBBH")
_HDR_LEN = struct.Struct("<I")


def _edit_header(payload: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """The same envelope with its msgpack header changed by ``edit``; the body is untouched."""
    sig_len = _PREFIX.unpack_from(payload)[3]
    at = _PREFIX.size + sig_len
    (hdr_len,) = _HDR_LEN.unpack_from(payload, at)
    header = msgpack.unpackb(payload[at + 4: at + 4 + hdr_len], raw=False)
    edit(header)
    new = msgpack.packb(header, use_bin_type=True)
    return payload[:at] + _HDR_LEN.pack(len(new)) + new + payload[at + 4 + hdr_len:]


def rewrite_header(payload: bytes, **fields: Any) -> bytes:
    """The same envelope with header fields replaced (e.g. sender=, round=)."""
    return _edit_header(payload, lambda header: header.update(fields))


def zero_levels(payload: bytes) -> bytes:
    """Every kept value decodes as 0; the positions stay marked as sent."""
    def edit(header: dict[str, Any]) -> None:
        for spec in header["tensors"]:
            spec["levels"] = bytes(len(spec["levels"]))
    return _edit_header(payload, edit)


@dataclass
class Attacker:
    """One attacking replica's crafting state across rounds."""

    kind: str
    index: int
    victim: int  # the replica a copy/replay takes from
    codec: CodecParams
    run_id: str
    seed: int
    target: tuple[str, int, float] | None = None  # (tensor, flat index, sign) of the targeted attack
    last: dict[int, bytes] = field(default_factory=dict)  # previous round's payload per replica

    @property
    def name(self) -> str:
        return f"replica-{self.index}"

    def _encode(self, tensors: Mapping[str, Tensor], round_: int, tokens: int) -> bytes:
        return encode_update(dict(tensors), params=self.codec, run_id=self.run_id, round=round_, sender=self.name,
                             tokens=tokens)

    def _at_norm(self, tensors: Mapping[str, Tensor], norm: float, round_: int, tokens: int) -> bytes:
        """Encode, then rescale so that the decoded update's norm is ``norm`` (top-k is scale-invariant)."""
        first = decode_update(self._encode(tensors, round_, tokens))
        factor = norm / first.norm if first.norm > 0 else 1.0
        return self._encode({n: t * factor for n, t in tensors.items()}, round_, tokens)

    def craft(self, round_: int, payloads: Sequence[bytes], decoded: Sequence[DecodedUpdate],
              honest: Sequence[int], median_norm: float) -> bytes:
        """This round's payload. ``payloads``/``decoded``: every replica's real update (the attacker's own
        honest one at its index when it trained); ``honest``: the honest replicas' indices."""
        own = decoded[self.index]
        tokens = own.tokens
        if self.kind == "lazy":
            out = payloads[self.index]
        elif self.kind == "signflip":
            out = self._at_norm({n: -t for n, t in own.tensors.items()}, median_norm, round_, tokens)
        elif self.kind == "scaled":
            out = self._encode({n: -SCALE * t for n, t in own.tensors.items()}, round_, tokens)
        elif self.kind == "noise":
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + round_ * 101 + self.index)
            noise = {n: torch.randn(t.shape, generator=g) for n, t in sorted(own.tensors.items())}
            out = self._at_norm(noise, median_norm, round_, tokens)
        elif self.kind == "zeros":
            mass = {n: sum(decoded[i].tensors[n].abs() for i in honest) for n in own.tensors}
            out = zero_levels(self._encode(mass, round_, tokens))
        elif self.kind == "targeted":
            if self.target is None:
                self.target = _largest(decoded, honest)
            name, flat, sign = self.target
            spike = {n: torch.zeros_like(t) for n, t in own.tensors.items()}
            spike[name].view(-1)[flat] = -sign * median_norm
            out = self._encode(spike, round_, tokens)
        elif self.kind == "copy":
            out = rewrite_header(payloads[self.victim], sender=self.name)
        elif self.kind == "replay":
            source = self.last.get(self.victim, payloads[self.victim])
            out = rewrite_header(source, sender=self.name, round=round_)
        else:
            raise ValueError(f"unknown attack {self.kind!r}; choose from {', '.join(ATTACKS)}")
        self.last = dict(enumerate(payloads))
        return out


def _largest(decoded: Sequence[DecodedUpdate], honest: Sequence[int]) -> tuple[str, int, float]:
    """(tensor, flat index, sign) of the largest coordinate of the honest updates' sum."""
    best: tuple[float, str, int, float] = (-1.0, "", 0, 1.0)
    for name in sorted(decoded[honest[0]].tensors):
        total = sum(decoded[i].tensors[name] for i in honest).view(-1)
        i = int(total.abs().argmax())
        value = float(total[i])
        if abs(value) > best[0]:
            best = (abs(value), name, i, 1.0 if value >= 0 else -1.0)
    return best[1], best[2], best[3]
