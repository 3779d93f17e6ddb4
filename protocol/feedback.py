"""Error feedback: what a peer does not send this round stays in its buffer for the next.

    e <- beta * e + delta;  payload = encode(e);  e <- e - decode(payload)

decode(payload) is taken from the encoder's own reconstruction, which is bit-identical to what
receivers decode (values are table lookups of the fp32 levels carried in the payload), so the
quantisation error stays in e as well as the unsent coordinates.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

import torch
from torch import Tensor

from gradnode.protocol.compress.base import fold
from gradnode.protocol.errors import ProtocolError
from gradnode.protocol.params import CodecParams
from gradnode.protocol.wire import encode_with_reconstruction


def compress_with_feedback(buffers: MutableMapping[str, Tensor], delta: Mapping[str, Tensor], beta: float,
                           params: CodecParams = CodecParams(), **meta: object) -> bytes:
    """Fold delta into the fp32 error buffers (created on first use), encode them, subtract what was sent.

    meta goes to encode_update (run_id, round, sender, tokens). Mutates buffers in place.
    """
    if not 0.0 <= beta <= 1.0:
        raise ProtocolError(f"error-feedback beta must be in [0, 1], got {beta}")
    if set(buffers) - set(delta):
        raise ProtocolError("error buffers hold tensors missing from delta")
    for name, d in delta.items():
        fold(buffers, name, d, beta)
    data, encoded = encode_with_reconstruction(buffers, params=params, **meta)  # type: ignore[arg-type]
    for name, enc in encoded.items():
        flat = buffers[name].view(-1)
        flat.index_put_((enc.flat_index,), flat[enc.flat_index] - enc.values)
    return data


class ErrorFeedback:
    """Holds one peer's error buffers; step(delta) returns the round's payload."""

    def __init__(self, beta: float = 0.95, params: CodecParams = CodecParams()) -> None:
        self.beta = beta
        self.params = params
        self.buffers: dict[str, Tensor] = {}

    def step(self, delta: Mapping[str, Tensor], **meta: object) -> bytes:
        return compress_with_feedback(self.buffers, delta, self.beta, self.params, **meta)

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.buffers)

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.buffers = {k: v.detach().to(torch.float32).clone() for k, v in state.items()}
