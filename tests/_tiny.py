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
