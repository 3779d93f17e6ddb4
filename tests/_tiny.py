"""A tiny shared config for the training tests (seconds on 2 CPU cores)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gradnode.node.config import Config, config_from_dict

# Tiny models gain nothing from intra-op threads, and spinning OpenMP workers slow the tests down
# badly when other processes share the cores.
torch.set_num_threads(1)

TINY: dict[str, Any] = {
    "run": {"run_id": "test-tiny", "seed": 0},
    "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32},
    "inner": {"steps": 4, "batch_size": 4, "warmup_steps": 2, "lr": 3e-3, "device": "cpu"},
    "codec": {"chunk": 256, "topk": 16},
    "rounds": 6,
}


def tiny_config(tmp: Path | None = None, **sections: dict[str, Any]) -> Config:
    tree: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in TINY.items()}
    for key, value in sections.items():
        if isinstance(value, dict):
            tree.setdefault(key, {}).update(value)
        else:
            tree[key] = value
    if tmp is not None:
        tree["run"]["output_dir"] = str(tmp)
    return config_from_dict(tree, "tiny test config")


def trained_checkpoint(tmp: Path, **sections: dict[str, Any]) -> tuple[Any, Path]:
    """A real checkpoint of a tiny run made by the real engine: one round trained and applied, then two inner
    steps of the next (so the peer's own weights differ from the agreed ones), saved in tmp/run/checkpoints.
    Returns the engine (still at that moment) and the checkpoint folder."""
    from gradnode.node.train.engine import Engine
    from gradnode.protocol import decode_update

    engine = Engine(tiny_config(tmp / "run", **sections))
    engine.inner_round()
    engine.apply_aggregate([decode_update(engine.make_update(sender="solo"))])
    engine.inner_round(max_steps=2)
    return engine, engine.save_checkpoint()


def agreed_logits(engine: Any, x: torch.Tensor) -> torch.Tensor:
    """The engine's logits on its agreed weights (theta_g), as Engine.evaluate computes them."""
    from torch.func import functional_call

    engine.model.eval()
    with torch.no_grad():
        return functional_call(engine.model, engine.global_params, (x,))


def one_error_line(code: int, err: str) -> str:
    """The one `error: ...` line a command ends with on a user's mistake (exit 2, no traceback)."""
    lines = [x for x in err.splitlines() if x.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]
