"""Testing aids: how a deliberately misbehaving peer deviates (``swarm.fault``), in one place.

Honest code paths call these hooks; with ``swarm.fault = none`` (the default) each returns its input
unchanged. The integration tests and `gradnode simulate --faults` run real peer processes with a fault
set, and check that the honest peers reject or repair what they do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.identity import load_or_create
from gradnode.protocol import attach_signature, signing_digest


def sent_update(sw: SwarmConfig, round_: int, blob: bytes, output_dir: Path) -> bytes:
    """'corrupt' flips bytes of the signed update; 'forge' signs it with a key that is not the sender's."""
    if sw.fault not in ("corrupt", "forge") or round_ < sw.fault_round:
        return blob
    if sw.fault == "corrupt":
        mid = len(blob) // 2
        return blob[:mid] + bytes(b ^ 0x5A for b in blob[mid:mid + 64]) + blob[mid + 64:]
    other = load_or_create(output_dir / "forger.key")
    return attach_signature(blob, other.sign(signing_digest(blob)))


def offered_state(sw: SwarmConfig, round_: int, state: dict[str, Any]) -> dict[str, Any]:
    """'tamper_state': the shared state offered to joiners with one weight nudged (honest hash kept)."""
    if sw.fault != "tamper_state" or round_ < sw.fault_round:
        return state
    params = dict(state["global_params"])
    name = sorted(params)[0]
    params[name] = params[name] + 1e-3
    return {**state, "global_params": params}


def drift(sw: SwarmConfig, round_: int, engine: Any) -> None:
    """'drift': nudge this peer's own shared weights once, after applying ``fault_round``; its hash check
    must notice and re-sync it from the majority."""
    if sw.fault == "drift" and round_ == sw.fault_round:
        engine.global_params[engine.names[0]].add_(1e-3)
