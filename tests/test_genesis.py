"""A run's genesis (protocol/genesis.py, `gradnode run init`): it names the run once, binds every update
and record to it, and refuses peers whose rules or initial weights differ.

crossrun: a run reuses an old run's name, config and seed. Without a genesis both have the same run id, so
an update signed in the old run verifies in the new one; with one, the nonce makes the run ids differ and
the rules refuse the replayed update as 'replayed'."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from _tiny import TINY, tiny_config
from gradnode.node.config import ConfigError, bind_genesis, load_config, shared_rules
from gradnode.node.swarm.identity import load_or_create
from gradnode.node.swarm.rules import UpdateRules
from gradnode.node.train.engine import Engine, initial_weights_hash
from gradnode.protocol import attach_signature, encode_update, signing_digest
from gradnode.protocol.genesis import Genesis, GenesisError

pytestmark = pytest.mark.process  # starts processes or daemons (selectable for flake-hunt: -m process)
# a well-formed peer address that nobody answers: the checks before any network come first
SILENT = "/ip4/127.0.0.1/tcp/9/p2p/QmPk5SDMjSGEC5nnj1J7rJpxJeoVK6nFM4JQUEbj8Ux5qR"

SETS = [f"--set=model.{k}={v}" for k, v in TINY["model"].items()] + ["--set=run.run_id=demo"]


def gradnode(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradnode.node.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def init(out: Path, *extra: str) -> str:
    done = gradnode("run", "init", "--out", str(out), *SETS, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().removeprefix("run id: ")


def test_run_init_names_each_run_once(tmp_path: Path) -> None:
    a, b = init(tmp_path / "a.json"), init(tmp_path / "b.json")
    assert a.startswith("demo-") and b.startswith("demo-") and a != b  # same name, config and seed: the nonce
    genesis = Genesis.from_json((tmp_path / "a.json").read_text())
    assert genesis.run_id == a and genesis.rules["model"]["n_layer"] == TINY["model"]["n_layer"]
    again = gradnode("run", "init", "--out", str(tmp_path / "a.json"), *SETS)
    assert again.returncode == 2 and "created once" in again.stderr
    # the id is the digest of everything in the file: an edited rule is another run
    data = json.loads((tmp_path / "a.json").read_text())
    data["rules"]["outer"]["lr"] = 0.5
    assert Genesis.model_validate(data).run_id != a
    for bad in (b"{", b"[]", json.dumps({**data, "extra": 1}).encode(), b" " * 70_000):
        with pytest.raises(GenesisError):
            Genesis.from_json(bad)


def test_a_peer_takes_the_run_id_and_must_hold_the_runs_rules(tmp_path: Path) -> None:
    run_id = init(tmp_path / "g.json")
    overrides = {f"model.{k}": v for k, v in TINY["model"].items()} | {"run.genesis": str(tmp_path / "g.json")}
    assert load_config(None, overrides).run.run_id == run_id
    # each peer's own settings may differ; the shared rules may not
    assert load_config(None, overrides | {"inner.device": "cpu", "swarm.min_peers": 3}).run.run_id == run_id
    with pytest.raises(ConfigError, match=r"1 rule\(s\): inner.lr: run has 0.003, this config 0.1"):
        load_config(None, overrides | {"inner.lr": 0.1})
    # a peer drawing another committee would count other witnesses: the genesis fixes the budget too
    with pytest.raises(ConfigError, match=r"committee.contributors: run has 0, this config 4"):
        load_config(None, overrides | {"committee.contributors": 4, "committee.witnesses": 8})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(None, overrides | {"run.genesis": str(tmp_path / "missing.json")})


def test_the_genesis_fixes_the_compressor_and_its_settings(tmp_path: Path) -> None:
    run_id = init(tmp_path / "g.json", "--set=codec.family=random-k", "--set=codec.options.density=0.1")
    overrides = {f"model.{k}": v for k, v in TINY["model"].items()} | {"run.genesis": str(tmp_path / "g.json")}
    same = load_config(None, overrides | {"codec.family": "random-k", "codec.options": {"density": 0.1}})
    assert same.run.run_id == run_id
    with pytest.raises(ConfigError, match=r"codec.options.density: run has 0.1, this config 0.2"):
        load_config(None, overrides | {"codec.family": "random-k", "codec.options": {"density": 0.2}})
    with pytest.raises(ConfigError, match=r"codec.family: run has 'random-k', this config 'sign'"):
        load_config(None, overrides | {"codec.family": "sign"})
    with pytest.raises(ConfigError, match=r"codec.family: run has 'random-k', this config None"):
        load_config(None, overrides)  # today's SparseLoCo, whose rules name no family


def test_the_genesis_weights_hash_is_what_a_fresh_engine_holds() -> None:
    cfg = tiny_config()
    assert initial_weights_hash(cfg) == Engine(cfg).param_hash()
    assert initial_weights_hash(tiny_config(run={"seed": 1})) != Engine(cfg).param_hash()


def test_a_fresh_peer_with_other_initial_weights_is_refused(tmp_path: Path) -> None:
    init(tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    data["weights_hash"] = "0" * 64  # what another model code or torch version would build
    (tmp_path / "g.json").write_text(json.dumps(data))
    done = gradnode("join", *SETS, "--set=inner.device=cpu", "--genesis", str(tmp_path / "g.json"),
                    "--initial-peer", SILENT,
                    "--output-dir", str(tmp_path / "peer"), "--set=swarm.host_maddrs=[/ip4/127.0.0.1/tcp/0]",
                    "--no-eval", timeout=180)
    assert done.returncode == 2 and "differs from the run's genesis" in done.stderr, done.stderr[-2000:]


def test_crossrun_an_update_of_an_earlier_run_with_the_same_name_is_refused(tmp_path: Path) -> None:
    peer = load_or_create(tmp_path / "peer.key")
    key_of = {peer.peer_id: peer.public_der}.get
    delta = {"w": torch.randn(64, 64)}
    old_run, new_run = tiny_config(), tiny_config()  # no genesis: the name is the run id
    rules_of = {"old": UpdateRules.of(old_run, {"w": (64, 64)}), "new": UpdateRules.of(new_run, {"w": (64, 64)})}
    blob = encode_update(delta, params=rules_of["old"].codec, run_id=old_run.run.run_id, sender=peer.peer_id)
    signed = attach_signature(blob, peer.sign(signing_digest(blob)))
    # the attack without a genesis: the old run's update passes the new run's rules
    assert rules_of["new"].check(signed, sender=peer.peer_id, round_=0, key_of=key_of)[1] is None
    # with one per run (same name, config and seed), the run ids differ and the replay is refused
    runs = []
    for name in ("old", "new"):  # what `gradnode run init` writes, for the tiny config
        genesis = Genesis(name=old_run.run.run_id, rules=shared_rules(old_run), nonce=secrets.token_hex(16),
                          weights_hash=initial_weights_hash(old_run), created=time.time())
        (tmp_path / f"{name}.json").write_text(genesis.to_json())
        cfg = tiny_config(run={"genesis": str(tmp_path / f"{name}.json")})
        runs.append(bind_genesis(cfg))
    old_cfg, new_cfg = runs
    assert old_cfg.run.run_id != new_cfg.run.run_id
    blob = encode_update(delta, params=rules_of["old"].codec, run_id=old_cfg.run.run_id, sender=peer.peer_id)
    signed = attach_signature(blob, peer.sign(signing_digest(blob)))
    assert UpdateRules.of(old_cfg, {"w": (64, 64)}).check(signed, sender=peer.peer_id, round_=0, key_of=key_of)[1] \
        is None
    assert UpdateRules.of(new_cfg, {"w": (64, 64)}).check(signed, sender=peer.peer_id, round_=0, key_of=key_of) == \
        (None, "replayed")
