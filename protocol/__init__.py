"""gradnode.protocol: pure codec, wire format, records and aggregation. No I/O, no clocks."""

from gradnode.protocol.aggregate import aggregate
from gradnode.protocol.errors import ProtocolError
from gradnode.protocol.feedback import ErrorFeedback, compress_with_feedback
from gradnode.protocol.params import CodecParams
from gradnode.protocol.wire import (
    VERSION,
    DecodedUpdate,
    attach_signature,
    decode_update,
    encode_update,
    encode_with_reconstruction,
    signing_digest,
)

__all__ = [
    "VERSION",
    "CodecParams",
    "DecodedUpdate",
    "ErrorFeedback",
    "ProtocolError",
    "aggregate",
    "attach_signature",
    "compress_with_feedback",
    "decode_update",
    "encode_update",
    "encode_with_reconstruction",
    "signing_digest",
]
