"""gradnode.protocol: pure codec, wire format, records and aggregation. No I/O, no clocks.

The names below load on first use (PEP 562), so that a module needing only records or chains
(`gradnode health`, a container healthcheck with a 5 s limit) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "aggregate": "aggregate",
    "robust_aggregate": "robust",
    "Reputation": "reputation",
    "ProtocolError": "errors",
    "ErrorFeedback": "feedback",
    "compress_with_feedback": "feedback",
    "CodecParams": "params",
    "VERSION": "wire",
    "DecodedUpdate": "wire",
    "attach_signature": "wire",
    "decode_update": "wire",
    "encode_update": "wire",
    "encode_with_reconstruction": "wire",
    "signing_digest": "wire",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
