"""A checkpoint's agreed weights as a ready model: what `gradnode export` and `gradnode eval` start from.

The weights taken are the shared ones (``state["shared"]["global_params"]``, theta_g: what every honest peer
of the round holds bit for bit and what the swarm hashes), never the peer's local weights, which carry its
own progress of an unfinished round. The model is rebuilt from the config the checkpoint stores in its
meta.json; ``--config`` replaces it (and is needed for checkpoints written before configs were stored),
``--set`` overrides either. A config whose model does not fit the weights is refused, naming the mismatch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from gradnode.node.config import Config, ConfigError, config_from_dict, load_config, with_overrides
from gradnode.node.train import checkpoint
from gradnode.node.train.engine import weights_hash
from gradnode.node.train.model import build_model

log = logging.getLogger(__name__)


@dataclass
class Restored:
    """The checkpoint taken, the config its model was rebuilt from, and that model holding theta_g (eval mode)."""

    path: Path
    round: int
    run_id: str
    cfg: Config
    config_source: str  # "the checkpoint", "--config FILE" or "the default config"
    params: dict[str, Tensor]  # theta_g by the model's parameter names (tied weights once), fp32 on CPU
    model: nn.Module
    skipped: list[str] = field(default_factory=list)  # newer checkpoints that did not verify, and why

    @property
    def weights_hash(self) -> str:
        """The hash of these weights alone (Engine.param_hash; peers publish Engine.state_hash, which also
        covers the outer optimizer's state, the round and the run)."""
        return weights_hash(self.params)


def config_for(meta: dict[str, Any], config: Path | None, overrides: dict[str, Any] | None) -> tuple[Config, str]:
    """The config to rebuild the model with, and where it came from: ``config`` when given, else the one the
    checkpoint stores, else the embedded default; ``overrides`` (dotted keys) apply to whichever it is."""
    if config is not None:
        return load_config(config, overrides), f"--config {config}"
    stored = meta.get("config")
    if isinstance(stored, dict):
        # no genesis binding: the stored run id is already the bound one, and the genesis file may be elsewhere
        try:
            return config_from_dict(with_overrides(stored, overrides), "stored in the checkpoint"), "the checkpoint"
        except ConfigError as err:
            raise ConfigError(f"{err} (fix it with --set, or pass the run's config with --config)") from None
    return load_config(None, overrides), "the default config (the checkpoint stores none: pass --config)"


def _mismatch(model: nn.Module, params: dict[str, Tensor]) -> str | None:
    """How the model's parameters differ from the checkpoint's weights, or None when they fit."""
    want = {n: tuple(p.shape) for n, p in model.named_parameters()}
    have = {n: tuple(t.shape) for n, t in params.items()}
    problems = [f"{n} is {have[n]} in the checkpoint, {want[n]} in the model" for n in sorted(want.keys() & have.keys())
                if want[n] != have[n]]
    problems += [f"{n} missing from the checkpoint" for n in sorted(want.keys() - have.keys())]
    problems += [f"{n} not in the model" for n in sorted(have.keys() - want.keys())]
    if not problems:
        return None
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def shared_params(state: dict[str, Any], path: Path) -> dict[str, Tensor]:
    """theta_g of a loaded checkpoint state, fp32 on CPU."""
    try:
        params = state["shared"]["global_params"]
    except (KeyError, TypeError):
        raise checkpoint.CheckpointError(f"checkpoint {path}: holds no shared weights (state['shared'])") from None
    if not isinstance(params, dict) or not all(isinstance(t, Tensor) for t in params.values()):
        raise checkpoint.CheckpointError(f"checkpoint {path}: its shared weights are not a dict of tensors")
    return {n: t.detach().float().cpu() for n, t in params.items()}


@torch.no_grad()
def restore(path: Path | str, config: Path | None = None, overrides: dict[str, Any] | None = None) -> Restored:
    """Find the checkpoint (see checkpoint.find), pick its config, rebuild the model and load theta_g into it."""
    folder, state, meta, skipped = checkpoint.find(path)
    params = shared_params(state, folder)
    cfg, source = config_for(meta, config, overrides)
    model = build_model(cfg.model, cfg.run.seed)
    wrong = _mismatch(model, params)
    if wrong:
        raise ConfigError(f"the model of {source} does not fit checkpoint {folder}: {wrong}; pass the run's config "
                          f"with --config (or fix model.* with --set)")
    for name, p in model.named_parameters():  # tied weights appear once here and stay tied
        p.copy_(params[name])
    model.eval()
    log.info("checkpoint restored path=%s round=%s config=%s", folder, meta.get("round"), source)
    return Restored(path=folder.resolve(), round=int(meta["round"]), run_id=str(meta.get("run_id", "")), cfg=cfg,
                    config_source=source, params=params, model=model, skipped=skipped)
