"""decode_update against >= 10,000 random and mutated envelopes: ProtocolError from an explicit check,
or a clean decode; nothing else. scripts/fuzz_decode.py runs the same generator for longer."""

from __future__ import annotations

from test_wire import fuzz


def test_fuzz_decode_10k() -> None:
    stats = fuzz.run(seed=20260, iterations=10_000)
    assert sum(stats.values()) == 10_000
    kinds = {kind for kind, _ in stats}
    assert kinds >= {"random", "truncate", "bitflip", "splice", "header", "body", "bomb", "version", "frame"}
    assert stats[("bomb", "ok")] == 0 and stats[("version", "ok")] == 0 and stats[("truncate", "ok")] == 0
    # body mutations that survive zstd must be caught by the structural checks often, not only by luck
    assert stats[("body", "rejected")] > 100
