"""A run's genesis: what fixes a run once, so that nothing of one run passes for another.

`gradnode run init` writes it: the run's name, its shared rules (the config values every peer must
hold alike: model, codec, outer and inner optimisation, seed), the hash of the initial weights, a
random nonce, and optionally a run-authority public key. Its digest names the run: the run id every
record, update and state offer carries (and is signed with) is ``<name>-<first 16 hex digits>``.
Two runs that share a name, a config and a seed still differ by their nonce, so an update or record
of one never verifies in the other (records and updates are checked against the run id before use).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gradnode.protocol.errors import ProtocolError

Name = Annotated[str, StringConstraints(min_length=1, max_length=47, pattern=r"^[A-Za-z0-9_.-]+$")]
Hex = Annotated[str, StringConstraints(min_length=32, max_length=1200, pattern=r"^[0-9a-f]+$")]
MAX_GENESIS_BYTES = 64 * 1024


class GenesisError(ProtocolError):
    """A genesis file is malformed, oversized, or does not match what it claims."""


class Genesis(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Name
    rules: dict[str, Any] = Field(description="The shared config values, by section (JSON types only).")
    weights_hash: Annotated[str, StringConstraints(min_length=64, max_length=64, pattern=r"^[0-9a-f]+$")]
    nonce: Annotated[str, StringConstraints(min_length=32, max_length=32, pattern=r"^[0-9a-f]+$")]
    authority: Hex | None = Field(None, description="DER public key of the run authority, hex (admission).")
    created: float = Field(ge=0.0, le=1e11)

    def canonical(self) -> bytes:
        return json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()

    @property
    def run_id(self) -> str:
        return f"{self.name}-{self.digest()[:16]}"

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> "Genesis":
        if len(text) > MAX_GENESIS_BYTES:
            raise GenesisError(f"larger than {MAX_GENESIS_BYTES} bytes")
        try:
            return cls.model_validate(json.loads(text))
        except (ValueError, TypeError, ValidationError) as err:  # JSONDecodeError is a ValueError
            raise GenesisError(str(err).splitlines()[0] if str(err) else type(err).__name__) from None


def differences(run: dict[str, Any], mine: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, run's value, our value) wherever two nested rule dicts differ, sorted by key."""
    out = []
    for key in sorted(set(run) | set(mine)):
        a, b = run.get(key), mine.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((f"{prefix}{key}", a, b))
    return out
