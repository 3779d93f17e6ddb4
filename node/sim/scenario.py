"""A run's config as the virtual simulator's scenario: the node's settings that the simulator reads."""

from __future__ import annotations

from typing import Any

from gradnode.node.config import Config
from gradnode.node.sim import sizes
from gradnode.node.sim.virtual import Scenario
from gradnode.node.swarm.clock import params


def of_config(cfg: Config, *, model_params: int | None = None, **fields: Any) -> Scenario:
    """The virtual simulator's scenario for a run of ``cfg``: its swarm's deadline settings, record ttl, inner
    steps, copy budget and committee, and its model's update size (or that of ``model_params`` parameters); ``fields``
    set the rest (peers, rounds, seed, faults, compute_s, ...)."""
    sw, c = cfg.swarm, cfg.committee
    if c.contributors:  # the config's committee, unless the fields name one
        fields.setdefault("committee", (c.contributors, c.witnesses, c.newcomers))
    return Scenario(params=params(sw), record_ttl_s=sw.record_ttl_s, inner_steps=cfg.inner.steps,
                    min_steps=min(sw.min_steps, cfg.inner.steps), own_copies=sw.own_update_copies,
                    min_peers=sw.min_peers,
                    update_bytes=sizes.update_bytes(cfg, model_params), model_params=model_params or 0, **fields)
