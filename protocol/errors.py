"""The one exception type for malformed or hostile input reaching the protocol layer."""

from __future__ import annotations


class ProtocolError(ValueError):
    """Bad input: a malformed payload from a peer, or codec parameters/tensors that cannot be encoded."""
