"""The `gradnode` command line. Imports nothing heavy at module level: `gradnode --help` stays fast.

Each command parses its options, loads the config and hands over to the module that does the work.
User and environment mistakes (a bad config key, a peer address nobody answers, a port in use, an
unwritable folder) end a command with one line that names what to check, and exit status 2; the
traceback appears only with --verbose. Commands that write say where, at the start and at the end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from gradnode.node import __version__, write_json
from gradnode.node.config import Config, ConfigError, load_config, parse_override, peer_id_ok

ERR = Console(stderr=True)  # logs, progress bars and live views share it, so they never break each other
REVOKE_TTL_S = 30 * 86400.0  # how long the DHT keeps a revocation list `revoke` stores (a bootstrap keeps it longer)


class _TidyHelp:
    """Help without type placeholders: flags show none, other options their metavar, arguments their name."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            if getattr(p, "param_type_name", "") == "argument":
                p.display_type_rich = lambda ctx: None  # its metavar already names it
            elif p.metavar is None and getattr(p, "is_flag", False):
                p.metavar = ""
            elif p.metavar is None:
                p.metavar = p.display_type(ctx).strip("<>").split(" ")[0].upper()
        return params


class _Command(_TidyHelp, TyperCommand):
    pass


# The top-level commands in the order people meet them, each with its panel and its line in `gradnode --help`.
COMMANDS = {
    "simulate": ("Train", "A whole swarm on this machine: a bootstrap and N peers (--virtual: thousands, no "
                          "processes)."),
    "train": ("Train", "Train one peer alone, without a network, with a progress bar."),
    "bootstrap": ("Train", "Start the peer others join first; with --train it trains too."),
    "join": ("Train", "Join a run: get the current weights, then train and exchange every round."),
    "status": ("Watch", "The swarm's peers as a table, or a live web page (--serve)."),
    "health": ("Watch", "Exit 0 while this peer trains in one swarm with the others."),
    "eval": ("After training", "Validation loss of a checkpoint's agreed weights."),
    "export": ("After training", "A checkpoint's agreed weights as safetensors or a transformers folder."),
    "run": ("Permissioned runs", "Create a run's genesis: its rules, weights and id."),
    "admit": ("Permissioned runs", "Admit a peer to a permissioned run."),
    "revoke": ("Permissioned runs", "Withdraw admissions while the run goes on."),
    "bench": ("Tools", "Benchmarks that print measured figures."),
    "check-config": ("Tools", "Validate a config and print the resolved tree."),
}


class _Group(_TidyHelp, TyperGroup):
    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: list(COMMANDS).index(n) if n in COMMANDS else len(COMMANDS))


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True,
                  help="gradnode: decentralised SparseLoCo training over hivemind.")
bench_app = typer.Typer(cls=_Group, no_args_is_help=True, help="Benchmarks that print measured figures.")
app.add_typer(bench_app, name="bench", rich_help_panel=COMMANDS["bench"][0], short_help=COMMANDS["bench"][1])
run_app = typer.Typer(cls=_Group, no_args_is_help=True, help="Create a run: its genesis, which names it once.")
app.add_typer(run_app, name="run", rich_help_panel=COMMANDS["run"][0], short_help=COMMANDS["run"][1])


def command(name: str, group: typer.Typer = app) -> Any:
    panel, short = COMMANDS[name] if group is app else (None, None)
    return group.command(name, cls=_Command, rich_help_panel=panel, short_help=short)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gradnode {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print gradnode's version and exit.")) -> None:
    """gradnode: decentralised SparseLoCo training over hivemind."""


ConfigOpt = typer.Option(None, "--config", "-c", metavar="FILE",
                         help="YAML or TOML config; default: the embedded tiny-cpu preset.")
SetOpt = typer.Option(None, "--set", metavar="KEY=VALUE",
                      help="Override a config key, e.g. --set inner.lr=1e-3 (repeatable).")
PeerOpt = typer.Option(None, "--initial-peer", "-p", metavar="MADDR",
                       help="Multiaddr of a swarm peer, as `gradnode bootstrap` prints it (repeatable); adds to "
                            "swarm.initial_peers.")
DeviceOpt = typer.Option(None, "--device", metavar="DEVICE",
                         help="cpu, cuda or cuda:N (default: inner.device; auto picks CUDA when there is one).")
VerboseOpt = typer.Option(False, "--verbose", "-v", help="Debug logging, and the traceback of any error.")
AdmissionOpt = typer.Option(None, "--admission", metavar="FILE", help="This peer's admission certificate "
                            "(`gradnode admit`), in a permissioned run; sets run.admission.")
GenesisOpt = typer.Option(None, "--genesis", metavar="FILE", help="The run's genesis (`gradnode run init`); sets "
                          "run.genesis.")
OutputOpt = typer.Option(None, "--output-dir", metavar="DIR", help="Override run.output_dir (checkpoints, key, logs).")


def _say(text: str) -> None:
    ERR.print(text, markup=False, highlight=False, soft_wrap=True)


def _load(config: Optional[Path], overrides: Optional[list[str]], extra: dict[str, Any] | None = None) -> Config:
    """Load the config, exit with the key-naming message on error (no traceback for user mistakes)."""
    try:
        pairs = dict(parse_override(o) for o in overrides or [])
        origins = {key: f"--set {o}" for key, o in zip(pairs, overrides or [])}
        origins.update({key: f"the option that sets {key}" for key in extra or {}})
        pairs.update(extra or {})
        return load_config(config, pairs, origins)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record, never to a stream that has since been
    replaced and closed (a test runner's capture, a redirected console)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _setup_logging(verbose: bool) -> None:
    """Logs go through the shared console on a terminal (above any progress bar or live view), plainly
    with timestamps elsewhere (log files); hivemind's own INFO lines only with --verbose."""
    os.environ.setdefault("HIVEMIND_LOGLEVEL", "DEBUG" if verbose else "WARNING")
    handler: logging.Handler
    if ERR.is_terminal:
        from rich.logging import RichHandler

        handler = RichHandler(console=ERR, show_path=False, markup=False, log_time_format="%H:%M:%S")
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)



def _quiet_logging(verbose: bool) -> None:
    """Plain timestamped warnings on stderr (benchmarks that draw their own progress), everything with
    --verbose."""
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, handlers=[handler], force=True)

@contextlib.contextmanager
def _user_errors(verbose: bool) -> Iterator[None]:
    """A user's or the environment's mistake (ValueError and its kinds: config, transport, identity,
    checkpoint; OSError: folders, disks) ends the command with one line and exit 2."""
    try:
        yield
    except (ValueError, OSError) as err:
        if verbose:
            traceback.print_exc()
        text = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) and err.filename else str(err)
        typer.echo(f"error: {' '.join(text.split())}", err=True)
        raise typer.Exit(2) from None


def _writable(folder: Path, key: str) -> Path:
    """``folder`` made and checked for writing, as an absolute path; ConfigError naming ``key`` if not."""
    folder = folder.resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".gradnode-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"cannot write to {folder} ({err.strerror}): choose another folder with {key}") from None
    return folder


def _size(folder: Path) -> str:
    """'596.3 MB, of which checkpoints 590.1 MB' for a run folder."""
    total = ckpt = 0
    for path in folder.rglob("*"):
        try:
            n = path.stat().st_size if path.is_file() else 0
        except OSError:  # removed meanwhile
            continue
        total += n
        ckpt += n if "checkpoints" in path.parts else 0
    return f"{total / 1e6:.1f} MB" + (f", of which checkpoints {ckpt / 1e6:.1f} MB" if ckpt else "")


def _check_plot(path: Optional[Path]) -> None:
    """--plot needs matplotlib: find out before any work starts, not after it."""
    if path is None:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        typer.echo("error: --plot needs matplotlib: pip install 'gradnode[plot]' (or leave --plot out)", err=True)
        raise typer.Exit(2) from None


def _plot(draw: Any, path: Path) -> None:
    """Draw after the summary was printed; a failed plot never loses a finished run's figures."""
    try:
        draw()
        _say(f"plot written to {path}")
    except Exception as err:  # matplotlib or the disk: report, keep the run's result
        _say(f"plot not written ({type(err).__name__}: {err})")


@command("check-config")
def check_config(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt) -> None:
    """Validate a config file and print the full resolved tree as JSON."""
    cfg = _load(config, set_)
    typer.echo(json.dumps(cfg.model_dump(mode="json"), indent=2))


@command("init", run_app)
def run_init_cmd(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
                 out: Path = typer.Option(..., "--out", "-o", metavar="FILE", help="Where to write the genesis (JSON)."),
                 name: Optional[str] = typer.Option(None, "--name", metavar="NAME",
                                                    help="The run's name (default: run.run_id of the config)."),
                 authority_key: Optional[Path] = typer.Option(None, "--authority-key", metavar="FILE",
                                                              help="The run authority's key file, made here when "
                                                                   "absent (any gradnode key file will do).")) -> None:
    """Create a run once: write its genesis (name, shared rules, initial weights hash, a random nonce, an
    optional authority key) and print its run id. Every peer then joins with --genesis FILE."""
    import secrets

    from gradnode.node.config import shared_rules
    from gradnode.protocol.genesis import Genesis

    cfg = _load(config, set_)
    with _user_errors(False):
        if out.exists():
            raise ValueError(f"{out} exists: a run is created once (choose another --out)")
        authority = None
        if authority_key is not None:
            from gradnode.node.swarm.identity import load_or_create

            made = not authority_key.exists()
            authority = load_or_create(authority_key).public_der.hex()
            if made:
                _say(f"authority key created: {authority_key} (keep it secret: it admits and revokes peers)")
        from gradnode.node.train.engine import initial_weights_hash

        genesis = Genesis(name=name or cfg.run.run_id[:47], rules=shared_rules(cfg),
                          weights_hash=initial_weights_hash(cfg), nonce=secrets.token_hex(16), authority=authority,
                          created=time.time())
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(genesis.to_json())
    typer.echo(f"run id: {genesis.run_id}")
    _say(f"genesis written to {out}; peers join with: gradnode join --config ... --genesis {out}")


def _authority(genesis_file: Path, key: Path) -> tuple[Any, Any]:
    """(genesis, authority identity) after checking that ``key`` is the authority the genesis names."""
    from gradnode.node.swarm.identity import load_or_create
    from gradnode.protocol.genesis import Genesis

    genesis = Genesis.from_json(genesis_file.read_bytes())
    if not genesis.authority:
        raise ValueError(f"{genesis_file} names no run authority: the run is open (anyone may join)")
    if not key.is_file():
        raise ValueError(f"--authority-key {key}: no such key file")
    ident = load_or_create(key)
    if ident.public_der.hex() != genesis.authority:
        raise ValueError(f"--authority-key {key} is not the authority key of {genesis_file}")
    return genesis, ident


AuthorityOpt = typer.Option(..., "--authority-key", metavar="FILE", help="The run authority's key file.")
GenesisReq = typer.Option(..., "--genesis", metavar="FILE", help="The run's genesis (`gradnode run init`).")


@command("admit")
def admit_cmd(peer_id: str = typer.Argument(..., metavar="PEER_ID", help="The peer id it prints at start."),
              genesis_file: Path = GenesisReq, authority_key: Path = AuthorityOpt,
              days: float = typer.Option(30.0, "--days", min=0.001, metavar="N", help="Valid for N days."),
              out: Path = typer.Option(..., "--out", "-o", metavar="FILE", help="Where to write the certificate.")) \
        -> None:
    """Admit a peer to a permissioned run: write an admission certificate, signed by the run authority, that
    the peer starts with (--admission FILE); peers ignore everything from ids without a valid one."""
    from gradnode.node.swarm import admission

    with _user_errors(False):
        genesis, authority = _authority(genesis_file, authority_key)
        try:
            cert = admission.admit(authority, genesis.run_id, peer_id, time.time() + days * 86400)
        except Exception as err:  # pydantic: a malformed peer id
            raise ValueError(f"PEER_ID {peer_id!r} is not a peer id") from err
        out.write_bytes(cert)
    typer.echo(f"admitted {peer_id} to {genesis.run_id} for {days:g} days: {out}")


@command("revoke")
def revoke_cmd(peer_ids: list[str] = typer.Argument(..., metavar="PEER_ID...", help="Peers to revoke."),
               genesis_file: Path = GenesisReq, authority_key: Path = AuthorityOpt,
               initial_peer: Optional[list[str]] = PeerOpt, verbose: bool = VerboseOpt) -> None:
    """Revoke admissions in a running permissioned run: publish a signed revocation list (the peers listed
    before stay listed: those the run's DHT holds and those this authority key revoked here before, kept in
    KEY.revoked.json, with KEY.revoked.json.lock beside it); every peer drops the revoked ones at its next read
    of the member list, and a bootstrap keeps the lists in its run folder (stored in the DHT again after it restarts).
    A revocation is never undone: a peer revoked by mistake joins again with a new key and a new certificate
    (`gradnode admit`)."""
    import fcntl
    import tempfile

    from gradnode.node.config import SwarmConfig
    from gradnode.node.swarm import admission
    from gradnode.node.swarm.transport import Transport
    from gradnode.protocol.records import REVOKED_MAX, dht_key

    _setup_logging(verbose)
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.WARNING)
    with _user_errors(verbose), tempfile.TemporaryDirectory():
        genesis, authority = _authority(genesis_file, authority_key)
        if not initial_peer:
            raise ValueError("revoke needs --initial-peer (a peer of the run)")
        bad = [p for p in peer_ids if not peer_id_ok(p)]
        if bad:
            raise ValueError(f"not a peer id: {', '.join(map(repr, bad))}")
        sw = SwarmConfig(client_mode=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=list(initial_peer))
        here = authority_key.with_name(authority_key.name + ".revoked.json")
        # one revoke at a time with this key: two at once would each publish the list without the other's peer
        with open(here.with_name(here.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = _revoked_here(here)  # a broken file fails here, before anything is asked or published
            transport = Transport(sw, authority)
            try:
                transport.start()
                gate = admission.Gate(genesis.run_id, authority.public_der, transport.now)
                # the list published replaces the one stored: a failed read must not drop the peers revoked before,
                # nor a read that found none (expired, a restarted bootstrap's empty DHT, a junk value in its place):
                # the peers this key revoked before are kept beside it too
                listed = transport.read_expiring(dht_key(genesis.run_id, "revocations"), timeout=30.0)
                if listed is None:
                    raise ValueError("the run's revocation list could not be read from the DHT, and a new one would "
                                     "replace it without the peers revoked before; nothing was published: try again")
                gate.take_revocations([raw for _, raw, _ in listed])
                # hivemind keeps the later of two expirations under one subkey: over a list this key stored from a
                # clock ahead of this one (another machine's), a store of now + 30 days failed every time; it
                # outlives the one stored
                ttl = max([REVOKE_TTL_S, *(t + 1.0 - transport.now() for owner, _, t in listed
                                           if owner == authority.peer_id)])
                revoked = sorted(gate.revoked | set(kept.get(genesis.run_id, [])) | set(peer_ids))
                if len(revoked) > REVOKED_MAX:
                    raise ValueError(f"a revocation list holds at most {REVOKED_MAX} peers ({len(revoked)} with "
                                     "these): a run that must shut out more needs a new genesis")
                rec = admission.revocation(authority, genesis.run_id, revoked, transport.now())  # ids checked here
                # kept before it is published: revocations add up, so one kept whose publishing failed goes out
                # with the next revoke, and a folder that cannot be written fails before anything is published
                write_json(here, {**kept, genesis.run_id: revoked}, indent=1)
                if not transport.store(dht_key(genesis.run_id, "revocations"), rec, ttl=ttl):
                    raise ValueError("the revocation list could not be stored in the DHT; try again")
            finally:
                transport.close()
    typer.echo(f"revoked in {genesis.run_id}: {len(revoked)} peer(s)")


def _revoked_here(path: Path) -> dict[str, list[str]]:
    """{run id: the peers an authority key revoked}, as ``revoke`` keeps them beside the key ({} if none)."""
    if not path.exists():
        return {}
    try:
        kept = json.loads(path.read_text())
        if isinstance(kept, dict) and all(isinstance(v, list) and all(isinstance(p, str) and peer_id_ok(p) for p in v)
                                          for v in kept.values()):
            return kept
    except (ValueError, UnicodeDecodeError):
        pass
    raise ValueError(f"{path} is not a list of revoked peer ids by run (revoke writes it): fix or remove it")


# --- training alone ---


@command("train")
def train_cmd(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
              rounds: Optional[int] = typer.Option(None, "--rounds", metavar="N", help="Override the top-level "
                                                   "`rounds` (default 50)."),
              output_dir: Optional[Path] = OutputOpt, device: Optional[str] = DeviceOpt,
              eval_every: int = typer.Option(5, "--eval-every", min=1, metavar="N", help="Validate every N rounds."),
              fresh: bool = typer.Option(False, "--fresh", help="Start over: remove this run's checkpoints first "
                                                                "(default: resume from the newest)."),
              verbose: bool = VerboseOpt) -> None:
    """Train one peer alone, end to end (no network), with a progress bar and a final summary.

    Ctrl+C or SIGTERM stops at the next inner step with a checkpoint; the same command resumes from it."""
    import shutil

    extra: dict[str, Any] = {}
    if rounds is not None:
        extra["rounds"] = rounds
    if output_dir is not None:
        extra["run.output_dir"] = str(output_dir)
    cfg = _load(config, set_, extra)
    _setup_logging(verbose)
    from gradnode.node.train import checkpoint
    from gradnode.node.train.solo import summary_table, train

    with _user_errors(verbose):
        out = _writable(cfg.run.output_dir, "--output-dir or run.output_dir")
        ckpts = out / "checkpoints"
        if fresh and ckpts.exists():
            _say(f"--fresh: removing {len(checkpoint.list_checkpoints(ckpts))} checkpoint(s) in {ckpts}")
            shutil.rmtree(ckpts)
        _say(f"run folder: {out}")
        found = checkpoint.list_checkpoints(ckpts) if cfg.checkpoint.resume else []
        if found:
            _say(f"resuming from {found[0]} ({_where(found[0], cfg)}); --fresh starts over")
        stop = threading.Event()
        with _stop_at_next_step(stop) as shutdown:
            summary = train(cfg, eval_every=eval_every, console=ERR, device=device, stop=stop)
    Console().print(summary_table(cfg, summary))
    if summary.stopped_at_step is not None:
        _say(f"stopped in round {summary.last_round + 1} of {cfg.rounds}, after {summary.stopped_at_step} of "
             f"{cfg.inner.steps} inner steps; checkpoint {summary.checkpoint}. Resume with the same command.")
        _say(f"run folder: {out} ({_size(out)})")
        raise typer.Exit(128 + (shutdown.signum or signal.SIGINT))
    if summary.rounds == 0:
        _say(f"nothing to do: this run already trained {summary.last_round} rounds (raise --rounds, or --fresh)")
    _say(f"run folder: {out} ({_size(out)})")


def _where(folder: Path, cfg: Config) -> str:
    """'round 12 of 50 done' or 'round 12 of 50 done, 5 of 20 steps into round 13' for a checkpoint."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        done, step = int(meta["round"]), int(meta.get("step", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return "unreadable meta.json"
    into = step - done * cfg.inner.steps
    return f"round {done} of {cfg.rounds} done" + (f", {into} of {cfg.inner.steps} steps into round {done + 1}"
                                                   if 0 < into < cfg.inner.steps else "")


def _stop_at_next_step(stop: threading.Event) -> Any:
    """SIGINT or SIGTERM (to the process or its group): stop at the next inner step, with a checkpoint. A
    second one ends the process at once (node/shutdown.py)."""
    from gradnode.node.shutdown import Shutdown

    def request(signum: int) -> None:
        stop.set()
        _say(f"signal {signum}: stopping after this inner step, with a checkpoint (a second signal stops at once)")
    return Shutdown(on_request=request)


# --- export and evaluation ---

CheckpointArg = typer.Argument(..., metavar="CHECKPOINT", help="A checkpoint folder (round-NNNNNNNN), or a "
                               "checkpoints/ folder or run folder: then its newest checkpoint that verifies.")
RestoreConfigOpt = typer.Option(None, "--config", "-c", metavar="FILE", help="Rebuild the model from this config "
                                "instead of the one the checkpoint stores (needed for checkpoints that store none); "
                                "its model must fit the weights.")
FORMATS = ("auto", "safetensors", "hf")


def _restore(checkpoint: Path, config: Optional[Path], set_: Optional[list[str]]) -> Any:
    """The checkpoint's agreed weights in a model; says which checkpoint was taken and whose config built it."""
    from gradnode.node.train.restore import restore

    restored = restore(checkpoint, config, dict(parse_override(o) for o in set_ or []))
    for why in restored.skipped:
        _say(f"skipped: {why}")
    _say(f"checkpoint: {restored.path} (round {restored.round} of run {restored.run_id}; model config from "
         f"{restored.config_source})")
    return restored


@command("export")
def export_cmd(checkpoint: Path = CheckpointArg,
               fmt: str = typer.Option("auto", "--format", "-f", metavar="FORMAT", help="safetensors: the built-in "
                                       "GPT's weights (model.safetensors, tied weights once) and config.json; hf: a "
                                       "folder that transformers' AutoModelForCausalLM.from_pretrained loads (needs "
                                       "transformers; the built-in GPT becomes a GPT2LMHeadModel); auto: safetensors "
                                       "for model.kind gpt, hf for kind hf."),
               out: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="A new or empty folder to write."),
               config: Optional[Path] = RestoreConfigOpt, set_: Optional[list[str]] = SetOpt,
               as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
               verbose: bool = VerboseOpt) -> None:
    """Export a checkpoint's agreed weights (the weights every peer held after its round, not a peer's own
    unfinished progress) for use outside gradnode, with the run id, round and weights hash."""
    _setup_logging(verbose)
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.WARNING)
    with _user_errors(verbose):
        if fmt not in FORMATS:
            raise ValueError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
        from gradnode.node.train.export import export, require_transformers

        if fmt == "hf":
            require_transformers()  # before any work
        restored = _restore(checkpoint, config, set_)
        result = export(restored, out, fmt)
    if as_json:
        typer.echo(json.dumps({"checkpoint": str(restored.path), "round": restored.round, "run_id": restored.run_id,
                               "format": result.format, "out": str(result.out), "files": result.files,
                               "bytes": result.bytes, "seconds": result.seconds, "weights_hash": result.weights_hash,
                               "max_logit_diff": result.max_logit_diff}))
        return
    typer.echo(f"exported as {result.format} to {result.out}: {', '.join(result.files)} "
               f"({result.bytes / 1e6:.1f} MB) in {result.seconds:.2f} s; weights hash {result.weights_hash[:16]}")
    if result.max_logit_diff is not None:
        typer.echo(f"checked: GPT2LMHeadModel's logits equal the GPT's (max difference {result.max_logit_diff:.2g})")


@command("eval")
def eval_cmd(checkpoint: Path = CheckpointArg,
             data: Optional[list[Path]] = typer.Option(None, "--data", "-d", metavar="PATH", help="Evaluate on these "
                                                       "text files or folders (repeatable; a folder: its files with a "
                                                       "text suffix), read whole, instead of the run's held-out "
                                                       "split."),
             max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, metavar="N", help="Score N bytes "
                                                      "of the text, in windows spread evenly over it (all of it when "
                                                      "shorter; default 32,768, as every val loss gradnode reports; "
                                                      "the default corpus's held-out split holds about 450,000)."),
             batch_size: int = typer.Option(16, "--batch-size", min=1, metavar="N", help="Windows per forward pass "
                                            "(memory and speed; the numbers change by float rounding at most)."),
             device: Optional[str] = typer.Option(None, "--device", metavar="DEVICE", help="cpu, cuda or cuda:N "
                                                  "(default: CUDA when there is one)."),
             config: Optional[Path] = RestoreConfigOpt, set_: Optional[list[str]] = SetOpt,
             as_json: bool = typer.Option(False, "--json", help="Print one JSON object: checkpoint, round, tokens, "
                                          "loss, unit, perplexity, bits_per_byte, data, truncated, run_id."),
             verbose: bool = VerboseOpt) -> None:
    """Validation loss, perplexity and bits per byte of a checkpoint's agreed weights on held-out text, the val
    loss `gradnode train` and the peers report (node/train/evaluate.py): the text is cut into non-overlapping
    windows of model.seq_len bytes, and those scored are spread evenly over it; loss is the mean cross-entropy
    in nats per byte (every corpus is byte-level), perplexity exp(loss), bits per byte loss / ln 2. The same
    checkpoint and text give the same numbers on every call."""
    _setup_logging(verbose)
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.WARNING)
    with _user_errors(verbose):
        from gradnode.node.train import checkpoint as ckpt

        ckpt.candidates(checkpoint)  # a path mistake fails here, before torch and the model load
        from gradnode.node.train import evaluate as ev
        from gradnode.node.train.inner import pick_device

        dev = pick_device(device or "auto")
        restored = _restore(checkpoint, config, set_)
        limit = max_tokens or ev.VAL_BYTES
        text, described = ev.text_files(list(data), restored.cfg.data.max_bytes) if data else \
            ev.held_out(restored.cfg)
        result = ev.evaluate(restored.model.to(dev), text, restored.cfg.model.seq_len, limit, batch_size, dev)
    figures = {"checkpoint": str(restored.path), "round": restored.round, "tokens": result.tokens,
               "loss": result.loss, "unit": ev.UNIT, "perplexity": result.perplexity,
               "bits_per_byte": result.bits_per_byte, "data": described, "truncated": result.truncated,
               "run_id": restored.run_id}
    if as_json:
        typer.echo(json.dumps(figures))
        return
    from rich.table import Table

    table = Table(title=f"eval: round {restored.round} of run {restored.run_id}", show_header=False)
    table.add_column("figure")
    table.add_column("value", overflow="fold")
    table.add_row("checkpoint", str(restored.path))
    table.add_row("data", described)
    table.add_row("tokens (bytes)", f"{result.tokens:,}" + (" (spread over more: --max-tokens)" if result.truncated
                                                            else ""))
    table.add_row("val loss" if not data else "loss", result.describe("text" if data else "held-out"))
    table.add_row("perplexity", f"{result.perplexity:.3f}")
    table.add_row("bits per byte", f"{result.bits_per_byte:.4f}")
    Console().print(table)


# --- the swarm: bootstrap, join, status ---


def _swarm_cfg(config: Optional[Path], set_: Optional[list[str]], initial_peer: Optional[list[str]],
               extra: dict[str, Any] | None = None) -> Config:
    cfg = _load(config, set_, extra)
    if initial_peer:
        from pydantic import ValidationError

        try:
            cfg.swarm.initial_peers = [*cfg.swarm.initial_peers, *initial_peer]
        except ValidationError as err:
            typer.echo(f"error: --initial-peer {err.errors()[0]['msg'].removeprefix('Value error, ')}", err=True)
            raise typer.Exit(2) from None
    return cfg


def _serve_status(membership: Any, cfg: Config, port: int, folder: Optional[Path] = None) -> Any:
    """The status page on ``port`` (metrics.host), fed by a watch over ``membership`` with what the run folder
    ``folder`` adds, or by ``folder`` alone (no ``membership``: a finished run); returns a closer."""
    from gradnode.node.status.runfolder import RunFolder
    from gradnode.node.status.server import StatusServer
    from gradnode.node.status.watch import SwarmWatch

    reader = RunFolder(folder, target_rounds=cfg.swarm.rounds) if folder is not None else None
    watch = SwarmWatch(membership, cfg.run.run_id, target_rounds=cfg.swarm.rounds, folder=reader) \
        if membership is not None else None
    server = StatusServer(watch.snapshot if watch else reader.snapshot, cfg.metrics.host, port)
    if watch is not None:
        watch.start()
    server.start()
    typer.echo(f"status page: {server.url}")

    def close() -> None:
        server.close()
        if watch is not None:
            watch.close()
    return close


def _run_peer(cfg: Config, *, train: bool, peer_index: Optional[int], device: Optional[str], metrics: Optional[Path],
              summary: Optional[Path], evaluate: bool, verbose: bool, maddrs_file: Optional[Path] = None,
              status_port: Optional[int] = None) -> None:
    from gradnode.node.status.runfolder import around
    from gradnode.node.swarm import events
    from gradnode.node.swarm.peer import Peer
    from gradnode.node.swarm.report import summary_json

    import faulthandler

    with contextlib.suppress(ValueError, AttributeError):  # stderr without a file descriptor (embedded, tests)
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack, in the log
    with _user_errors(verbose):
        out = _writable(cfg.run.output_dir, "--output-dir or run.output_dir")
        _say(f"run folder: {out}")
        peer = Peer(cfg, peer_index=peer_index, device=device, metrics_path=metrics, evaluate=evaluate)
        peer.install_signal_handlers()
        close_status = None
        recording = events.install(out)  # the run's events for the status page, in the run folder
        try:
            peer.start()
            if status_port is not None:
                close_status = _serve_status(peer.membership, cfg, status_port, around(out))
            maddrs = peer.transport.maddrs()
            typer.echo("peer id: " + peer.identity.peer_id)
            for line in address_lines(maddrs):
                typer.echo(line)
            if maddrs_file is not None:
                tmp = maddrs_file.with_suffix(".tmp")
                tmp.write_text("\n".join(maddrs) + "\n")
                tmp.replace(maddrs_file)
            if not train:
                typer.echo("this bootstrap only serves (no training): a run needs swarm.min_peers="
                           f"{cfg.swarm.min_peers} trainers, so one joiner waits for another; --train makes this one "
                           "a trainer too")
                peer.serve()
            else:
                result = peer.train()
                if summary is not None:
                    summary.write_text(summary_json(result))
                val = f"{result.val_loss_last:.4f}" if result.val_loss_last is not None else "-"
                typer.echo(f"rounds={result.rounds} train_loss={result.final_loss} val_loss={val} "
                           f"hash={result.param_hash[:16]} "
                           f"utilization={result.utilization:.3f} up={result.bytes_up} down={result.bytes_down} "
                           f"rejected={result.rejected_updates}")
        finally:
            if close_status is not None:
                close_status()
            peer.close()
            events.uninstall(recording)
    _say(f"run folder: {out} ({_size(out)})")


def address_lines(maddrs: list[str]) -> list[str]:
    """A peer's addresses as it prints them: the one to share first, with who can dial it and what to open,
    each address on a line of its own (scripts read them), then the others, and what a NAT needs."""
    from gradnode.node.config import Reach, reach_of

    if not maddrs:
        return ["no address to share: this peer accepts no inbound connections (swarm.client_mode)"]
    rank = {Reach.PUBLIC: 0, Reach.NETWORK: 1, Reach.MACHINE: 2}
    ordered = sorted(maddrs, key=lambda m: rank[reach_of(m)])
    best, reach = ordered[0], reach_of(ordered[0])
    parts = best.split("/")
    port = parts[4] if len(parts) > 4 and parts[3] == "tcp" else "?"
    if reach is Reach.MACHINE:
        lines = ["this peer listens on loopback only: other machines cannot reach it (listen on "
                 f"/ip4/0.0.0.0/tcp/{port} to let them); peers on this machine join with:"]
    else:
        lines = [f"share this address with the machines that join (reachable from {reach.value}; open tcp port "
                 f"{port} to them):"]
    lines.append(best)
    for where in (Reach.PUBLIC, Reach.NETWORK, Reach.MACHINE):
        rest = [m for m in ordered[1:] if reach_of(m) is where]
        if rest:
            lines += [f"other addresses ({where.value}):", *rest]
    if reach is not Reach.PUBLIC:
        lines.append(f"machines outside this network (behind NAT, another site) need a public address: add "
                     f"--announce /ip4/PUBLIC_IP/tcp/{port} and share that one")
    return lines


ListenOpt = typer.Option(None, "--listen", "--host", metavar="MADDR", help="Where to listen, as a multiaddr: "
                         "/ip4/0.0.0.0/tcp/N is port N on every interface (repeatable; swarm.host_maddrs).")
AnnounceOpt = typer.Option(None, "--announce", metavar="MADDR", help="The multiaddr other machines dial, behind "
                           "NAT: /ip4/IP/tcp/N with its public IP (repeatable; sets announce_maddrs).")


def _addresses(extra: dict[str, Any], listen: Optional[list[str]], announce: Optional[list[str]]) -> None:
    if listen:
        extra["swarm.host_maddrs"] = list(listen)
    if announce:
        extra["swarm.announce_maddrs"] = list(announce)


@command("bootstrap")
def bootstrap_cmd(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
                  train: bool = typer.Option(False, "--train/--serve-only", help="Also train (default: only keep "
                                                                                  "the DHT and records alive)."),
                  listen: Optional[list[str]] = ListenOpt, announce: Optional[list[str]] = AnnounceOpt,
                  rounds: Optional[int] = typer.Option(None, "--rounds", metavar="N", help="With --train: leave "
                                                       "after this round (swarm.rounds; default: until stopped)."),
                  output_dir: Optional[Path] = OutputOpt,
                  device: Optional[str] = DeviceOpt, genesis: Optional[Path] = GenesisOpt,
                  admission_file: Optional[Path] = AdmissionOpt,
                  status_port: Optional[int] = typer.Option(None, "--status-port", min=0, max=65535, metavar="PORT",
                                                            help="Also serve the status page on this port "
                                                                 "(at metrics.host; 0: any free port)."),
                  maddrs_file: Optional[Path] = typer.Option(None, "--maddrs-file", hidden=True),
                  verbose: bool = VerboseOpt) -> None:
    """Start a long-lived bootstrap peer with a stable identity; prints the multiaddrs others join with. Its output
    folder keeps the peers it saw and the run's end (peers back after it learn that it is over) across restarts."""
    extra: dict[str, Any] = {"swarm.serve_only": not train}
    if genesis is not None:
        extra["run.genesis"] = str(genesis)
    if admission_file is not None:
        extra["run.admission"] = str(admission_file)
    _addresses(extra, listen, announce)
    if rounds is not None:
        extra["swarm.rounds"] = rounds
    if output_dir is not None:
        extra["run.output_dir"] = str(output_dir)
    cfg = _load(config, set_, extra)
    _setup_logging(verbose)
    metrics = cfg.run.output_dir / "metrics.jsonl" if train else None  # the status page reads a run folder's rows
    _run_peer(cfg, train=train, peer_index=None, device=device, metrics=metrics, summary=None, evaluate=train,
              verbose=verbose, maddrs_file=maddrs_file, status_port=status_port)


@command("join")
def join_cmd(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
             initial_peer: Optional[list[str]] = PeerOpt,
             listen: Optional[list[str]] = ListenOpt, announce: Optional[list[str]] = AnnounceOpt,
             rounds: Optional[int] = typer.Option(None, "--rounds", metavar="N", help="Leave after this round "
                                                  "(swarm.rounds; default: train until stopped)."),
             peer_index: Optional[int] = typer.Option(None, "--peer-index", min=0, metavar="N",
                                                      help="Data shard of this peer; default: derived from its "
                                                           "identity, so every volunteer reads its own slice."),
             output_dir: Optional[Path] = OutputOpt, device: Optional[str] = DeviceOpt,
             metrics: Optional[Path] = typer.Option(None, "--metrics", metavar="FILE",
                                                    help="Append a JSON line per round here (default: "
                                                         "metrics.jsonl in the run folder)."),
             summary: Optional[Path] = typer.Option(None, "--summary", metavar="FILE",
                                                    help="Write the final summary JSON here."),
             no_eval: bool = typer.Option(False, "--no-eval", help="Skip the validation loss at start and end."),
             genesis: Optional[Path] = GenesisOpt, admission_file: Optional[Path] = AdmissionOpt,
             maddrs_file: Optional[Path] = typer.Option(None, "--maddrs-file", hidden=True),
             verbose: bool = VerboseOpt) -> None:
    """Join a swarm: download the current weights (verified by hash), then train and exchange every round."""
    extra: dict[str, Any] = {} if genesis is None else {"run.genesis": str(genesis)}
    if admission_file is not None:
        extra["run.admission"] = str(admission_file)
    if rounds is not None:
        extra["swarm.rounds"] = rounds
    if output_dir is not None:
        extra["run.output_dir"] = str(output_dir)
    _addresses(extra, listen, announce)
    cfg = _swarm_cfg(config, set_, initial_peer, extra)
    if not cfg.swarm.initial_peers and not (cfg.run.output_dir / "addressbook.json").exists():
        typer.echo("error: join needs --initial-peer MADDR (an address `gradnode bootstrap` prints) or "
                   "swarm.initial_peers; only a peer back in a run folder that knows peers finds them itself",
                   err=True)
        raise typer.Exit(2)
    _setup_logging(verbose)
    metrics = metrics or cfg.run.output_dir / "metrics.jsonl"
    _run_peer(cfg, train=True, peer_index=peer_index, device=device, metrics=metrics, summary=summary,
              evaluate=not no_eval, verbose=verbose, maddrs_file=maddrs_file)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@command("status")
def status_cmd(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
               initial_peer: Optional[list[str]] = PeerOpt,
               as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
               serve: Optional[int] = typer.Option(None, "--serve", min=0, max=65535, metavar="PORT",
                                                   help="Instead of printing once, serve a live status page on "
                                                        "this port (at metrics.host; 0: any free port) until "
                                                        "Ctrl+C."),
               run_dir: Optional[Path] = typer.Option(None, "--run-dir", metavar="DIR", help="A run folder "
                                                      "(simulate's, or a peer's run.output_dir), finished or not: "
                                                      "its run page with --serve, else its figures as JSON. With "
                                                      "--initial-peer, the live page adds what its files tell."),
               verbose: bool = VerboseOpt) -> None:
    """Print the swarm's members: peer, round, throughput, traffic, rejected updates, by how many peers each
    is ignored for repeated invalid updates, its reputation score (robust aggregation), last seen. With
    --serve, a web page of the same, with the loss curve and traffic per round, refreshing itself."""
    import tempfile

    cfg = _swarm_cfg(config, set_, initial_peer)
    if run_dir is not None and not cfg.swarm.initial_peers:
        _status_of_folder(cfg, run_dir, serve)
        return
    if not cfg.swarm.initial_peers:
        typer.echo("error: status needs --initial-peer (or swarm.initial_peers)", err=True)
        raise typer.Exit(2)
    _setup_logging(verbose)
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.WARNING)  # a read-only look: no chatter
    from rich.table import Table

    from gradnode.node.swarm import admission
    from gradnode.node.swarm.identity import load_or_create
    from gradnode.node.swarm.membership import Membership
    from gradnode.node.swarm.transport import Transport

    with _user_errors(verbose), tempfile.TemporaryDirectory() as tmp:
        sw = cfg.swarm.model_copy(update={"client_mode": True, "host_maddrs": ["/ip4/127.0.0.1/tcp/0"]})
        ident = load_or_create(Path(tmp) / "status.key")
        transport = Transport(sw, ident)
        try:
            transport.start()
            gate = admission.gate_of(cfg, transport.now)  # a permissioned run: admitted members only
            membership = Membership(transport, ident, cfg.run.run_id, cfg.swarm.record_ttl_s, gate=gate)
            if serve is not None:
                _serve_until_interrupted(membership, cfg, serve, run_dir)
                return
            members = membership.members(max_age=0)
            now = transport.now()
        finally:
            transport.close()
    from gradnode.node.status.watch import reputation

    rows = sorted(members.values(), key=lambda m: m.peer_id)
    held = [dict(m.scores) for m in rows if m.training]
    if as_json:
        typer.echo(json.dumps([{**m.model_dump(exclude={"public_key", "signature", "admission"}),
                                "admitted": bool(m.admission), "last_seen_s": now - m.time,
                                "ignored_by": sum(m.peer_id in other.ignoring for other in rows),
                                "reputation": reputation(m.peer_id, held)} for m in rows]))
        return
    table = Table(title=f"swarm {cfg.run.run_id}: {plural(len(rows), 'peer')}")
    for col in ("peer", "role", "round", "tok/s", "loss", "up MB", "down MB", "rejected", "ignored by", "reputation",
                "last seen", "version"):
        table.add_column(col)
    for m in rows:
        ignored_by = sum(m.peer_id in other.ignoring for other in rows)
        score = reputation(m.peer_id, held)
        table.add_row(m.peer_id[:16], "train" if m.training else "serve", str(m.round), f"{m.tokens_per_s:.0f}",
                      f"{m.loss:.3f}" if m.loss is not None else "-", f"{m.bytes_up / 1e6:.1f}",
                      f"{m.bytes_down / 1e6:.1f}", str(m.rejected), str(ignored_by) if ignored_by else "-",
                      f"{score:.2f}" if score < 1 else "-", f"{now - m.time:.0f}s ago", m.software_version)
    Console().print(table)


def _status_of_folder(cfg: Config, folder: Path, serve: Optional[int]) -> None:
    """`gradnode status --run-dir DIR` without a swarm: the run page of DIR's files (--serve), else their
    figures as one JSON object."""
    from gradnode.node.status.runfolder import RunFolder

    if not folder.is_dir():
        typer.echo(f"error: --run-dir {folder}: no such folder", err=True)
        raise typer.Exit(2)
    if serve is None:
        typer.echo(json.dumps(RunFolder(folder, target_rounds=cfg.swarm.rounds).snapshot()))
        return
    with _user_errors(False):
        _serve_until_interrupted(None, cfg, serve, folder)


def _serve_until_interrupted(membership: Any, cfg: Config, port: int, folder: Optional[Path] = None) -> None:
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    previous_term = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    close = _serve_status(membership, cfg, port, folder)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        close()
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


@command("health")
def health_cmd(output_dir: Path = typer.Option(..., "--output-dir", metavar="DIR",
                                              help="The peer's run folder (its run.output_dir)."),
               max_age: float = typer.Option(60.0, "--max-age", min=1.0, metavar="SECONDS",
                                             help="Older health reports count as a hung or dead peer.")) -> None:
    """Exit 0 while the peer of DIR trains in one swarm with the others (a container healthcheck).

    Unhealthy (exit 1, one line why): it follows another chain of weights than most peers it sees (a split
    swarm), sees fewer trainers than swarm.expected_peers, waits for peers, or stopped reporting."""
    from gradnode.node.swarm import health

    ok, why = health.check(output_dir, max_age)
    typer.echo(("healthy: " if ok else "unhealthy: ") + why)
    raise typer.Exit(0 if ok else 1)


# --- simulation and benchmarks ---

LinkOpt = typer.Option("auto", "--link", metavar="MODE", help="How --bandwidth caps each peer's link: netns = the "
                       "peer runs in its own network namespace behind a veth with tc tbf each way (root only; a real "
                       "slow link for TCP); bucket = a token bucket in the transport, on 127.0.0.1; auto = netns "
                       "where it works, else bucket.")


def _check_link(link: str, bandwidth: Optional[str]) -> None:
    """Fail fast with the reason (e.g. not root for --link netns), before any process starts."""
    from gradnode.node.sim.simulate import resolve_link

    if bandwidth is not None:
        from gradnode.node.config import parse_rate
        try:
            parse_rate(bandwidth)
        except ValueError as err:
            typer.echo(f"error: --bandwidth: {err}", err=True)
            raise typer.Exit(2) from None
    try:
        resolve_link(link, bandwidth)
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


@command("simulate")
def simulate_cmd(peers: int = typer.Option(4, "--peers", "-n", min=1, max=4096, metavar="N",
                                           help="Training peers (at most 64 as processes)."),
                 rounds: int = typer.Option(5, "--rounds", "-r", min=1, metavar="N", help="Rounds each peer trains."),
                 config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
                 as_json: bool = typer.Option(False, "--json", help="Print one JSON summary object."),
                 plot_path: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.png",
                                                          help="Write a PNG of loss per round (needs matplotlib)."),
                 bandwidth: Optional[str] = typer.Option(None, "--bandwidth", metavar="RATE", help="Cap each peer's "
                                                         "link, e.g. 10mbit, each way (see --link for how)."),
                 link: str = LinkOpt,
                 output_dir: Optional[Path] = typer.Option(None, "--output-dir", metavar="DIR", help="Folder for "
                                                           "logs and checkpoints; default runs/simulate-DATE-TIME."),
                 faults_spec: Optional[str] = typer.Option(
                     None, "--faults", metavar="SPEC",
                     help="Fault schedule, e.g. kill:2@r3,restart:2@r5 (comma-separated). `--faults help` lists "
                          "every kind with its grammar; docs/simulator.md explains them."),
                 seed: Optional[int] = typer.Option(None, "--seed", min=0, metavar="N", help="run.seed, and the "
                                                    "picks of '?' in --faults: the same seed gives the same run."),
                 timeout: float = typer.Option(3600.0, "--timeout", min=10.0, metavar="SECONDS",
                                               help="Stop every peer after this many seconds."),
                 keep_checkpoints: int = typer.Option(1, "--keep-checkpoints", min=1, metavar="N",
                                                      help="Checkpoints each peer keeps (checkpoint.keep)."),
                 clean: bool = typer.Option(False, "--clean", help="Remove the run folder after the summary."),
                 serve: Optional[int] = typer.Option(None, "--serve", min=1, max=65535, metavar="PORT",
                                                     help="Watch it live: the bootstrap serves the status page on "
                                                          "this port, every process Prometheus metrics on a free "
                                                          "port (listed in RUN/prometheus-targets.json; "
                                                          "RUN/prometheus.yml is a Prometheus config that scrapes "
                                                          "them)."),
                 virtual: bool = typer.Option(False, "--virtual", help="No processes: the round protocol's core "
                                              "for every peer on one virtual clock (node/sim/virtual.py), seeded; "
                                              "checks safety every round. Reads the swarm's deadline settings from "
                                              "--config/--set."),
                 late_records: float = typer.Option(0.01, "--late-records", min=0.0, max=1.0, metavar="P",
                                                    help="--virtual: the chance that a record reaches one reader up "
                                                         "to 8 s late (the DHT hid it for a while)."),
                 model_params: Optional[int] = typer.Option(None, "--model-params", min=1, metavar="N",
                                                            help="--virtual: the updates' size is the codec's for "
                                                                 "a model of N parameters; default: the config's "
                                                                 "model."),
                 round_s: float = typer.Option(2.0, "--round-s", min=0.01, metavar="SECONDS",
                                               help="--virtual: a median peer's inner steps of one round."),
                 committee: Optional[str] = typer.Option(None, "--committee", metavar="K,W,J",
                                                         help="Draw K contributors, W witnesses and J newcomer "
                                                              "slots a round (protocol/committee.py) instead of "
                                                              "all-to-all: the committee.* settings."),
                 verbose: bool = VerboseOpt) -> None:
    """Start a bootstrap and N peers as processes on this machine, show them live, print a summary."""
    import shutil
    import time as _time

    from gradnode.node.sim import faults
    from gradnode.node.sim import simulate as sim

    if faults_spec is not None and faults_spec.strip() == "help":
        typer.echo(faults.help_text())
        return
    if virtual:
        _simulate_virtual(peers, rounds, seed or 0, config, set_ or [], faults_spec, late_records, as_json,
                          model_params, round_s, committee)
        return
    if peers > 64:
        typer.echo("error: --peers: at most 64 processes on one machine (--virtual runs more)", err=True)
        raise typer.Exit(2)
    overrides = [*(set_ or []), f"checkpoint.keep={keep_checkpoints}"]
    if committee is not None:
        from gradnode.node.sim.scenario import parse_committee

        try:
            k, w, j = parse_committee(committee)
        except ValueError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
        overrides += [f"committee.contributors={k}", f"committee.witnesses={w}", f"committee.newcomers={j}"]
    _load(config, overrides)  # fail fast on a bad config, before any process starts
    _setup_logging(verbose)
    _check_plot(plot_path)
    _check_link(link, bandwidth)
    try:
        faults.parse(faults_spec, peers, rounds, seed or 0)  # fail fast, before any process starts
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    with _user_errors(verbose):
        out = _writable(output_dir or Path("runs") / f"simulate-{_time.strftime('%Y%m%d-%H%M%S')}", "--output-dir")
        _say(f"run folder: {out}")
        settings = sim.SimSettings(peers=peers, rounds=rounds, config=config, out_dir=out, bandwidth=bandwidth,
                                   link=link, overrides=overrides, faults=faults_spec, seed=seed, timeout_s=timeout,
                                   serve=serve)
        if serve is not None:
            _say(f"status page: http://127.0.0.1:{serve}/ (once the bootstrap is up); Prometheus: "
                 f"prometheus --config.file={out / 'prometheus.yml'}")
        try:
            summary = sim.run(settings, console=ERR)
        except KeyboardInterrupt as err:
            typer.echo("interrupted: all peers stopped", err=True)
            raise typer.Exit(128 + getattr(err, "signum", signal.SIGINT)) from None
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        sim.print_summary(summary)
    if plot_path is not None:
        _plot(lambda: sim.plot(summary, plot_path), plot_path)
    if clean:
        shutil.rmtree(out, ignore_errors=True)
        _say(f"run folder {out} removed (--clean)")
    else:
        _say(f"run folder: {out} ({_size(out)}); remove it with `rm -rf {out}`, or pass --clean next time")
    if not summary["identical_hashes"]:
        raise typer.Exit(1)


def _simulate_virtual(peers: int, rounds: int, seed: int, config: Optional[Path], overrides: list[str],
                      faults_spec: Optional[str], late: float, as_json: bool, model_params: Optional[int],
                      round_s: float, committee: Optional[str] = None) -> None:
    from gradnode.node.sim import scenario, summary, virtual

    try:
        faults = scenario.parse_faults(faults_spec, peers)
        if committee is not None:
            faults["committee"] = scenario.parse_committee(committee)
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    cfg = _load(config, overrides)
    out = virtual.run(scenario.of_config(cfg, model_params=model_params, peers=peers, rounds=rounds, seed=seed,
                                             late_p=late, compute_s=round_s, **faults))
    if as_json:
        typer.echo(json.dumps(out))
    else:
        summary.print_summary(out)
    if out["final_hashes"] != 1 or out["stalled"]:
        raise typer.Exit(1)


@command("codec", bench_app)
def bench_codec_cmd(params: int = typer.Option(20_000_000, "--params", min=10_000, metavar="N",
                                               help="Model size for the pseudo-gradient (parameters)."),
                    device: str = typer.Option("cpu", "--device", metavar="DEVICE", help="cpu or cuda."),
                    steps: int = typer.Option(4, "--steps", min=1, metavar="N",
                                              help="AdamW steps in the pseudo-gradient."),
                    repeats: int = typer.Option(7, "--repeats", min=1, metavar="N",
                                                help="Timed repeats (best is kept)."),
                    threads: int = typer.Option(0, "--threads", min=0, metavar="N",
                                                help="torch CPU threads for every measurement; 0 keeps torch's "
                                                     "default (use 1 on a machine shared with other jobs)."),
                    as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Compression ratio, speed and error of the update codec on a real pseudo-gradient."""
    if device not in ("cpu", "cuda"):
        typer.echo("error: --device must be cpu or cuda", err=True)
        raise typer.Exit(2)
    from gradnode.node.bench.codec import print_table, run

    result = run(params, device=device, steps=steps, repeats=repeats, threads=threads)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        print_table(result)


@command("swarm", bench_app)
def bench_swarm_cmd(sizes: str = typer.Option("2,4,8", "--sizes", metavar="N,N,...",
                                              help="Swarm sizes for the traffic table."),
                    rounds: int = typer.Option(6, "--rounds", min=2, metavar="N", help="Rounds per swarm."),
                    bandwidth: str = typer.Option("20mbit", "--bandwidth", metavar="RATE",
                                                  help="Link cap for the utilisation run."),
                    link: str = LinkOpt,
                    config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
                    as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Utilisation at 4 peers under a link cap, non-overlapped communication, bytes per peer at 2/4/8."""
    from gradnode.node.bench import swarm as bench_swarm

    _load(config, set_)
    _check_link(link, bandwidth)
    counts = [int(x) for x in sizes.split(",") if x.strip()]
    result = bench_swarm.run(counts, rounds=rounds, bandwidth=bandwidth, config=config, overrides=list(set_ or []),
                             link=link)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        bench_swarm.print_result(result)


@command("traffic", bench_app)
def bench_traffic_cmd(sizes: str = typer.Option("4,8", "--sizes", metavar="N,N,...", help="Swarm sizes."),
                      rounds: int = typer.Option(6, "--rounds", min=3, metavar="N", help="Rounds per swarm."),
                      seed: int = typer.Option(0, "--seed", min=0, metavar="N", help="run.seed and the simulator's."),
                      config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
                      as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Bytes and DHT records per peer and round: a real swarm on 127.0.0.1 beside the virtual simulator."""
    from gradnode.node.bench import traffic as bench_traffic

    _load(config, set_)
    counts = [int(x) for x in sizes.split(",") if x.strip()]
    result = bench_traffic.run(counts, rounds=rounds, config=config, overrides=list(set_ or []), seed=seed)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        bench_traffic.print_result(result)


@command("scale", bench_app)
def bench_scale_cmd(sizes: str = typer.Option("8,32,64,128", "--sizes", metavar="N,N,...", help="Swarm sizes."),
                    rounds: int = typer.Option(12, "--rounds", min=4, metavar="N", help="Rounds per swarm."),
                    committee: str = typer.Option("8,16,2", "--committee", metavar="K,W,J",
                                                  help="Drawn contributors, witnesses and newcomer slots a round."),
                    all_max: int = typer.Option(64, "--all-to-all-max", min=0, metavar="N",
                                                help="The largest N also run all-to-all."),
                    round_s: float = typer.Option(30.0, "--round-s", min=0.1, metavar="SECONDS",
                                                  help="A median peer's inner steps of one round."),
                    seed: int = typer.Option(0, "--seed", min=0, metavar="N", help="The simulator's seed."),
                    loopback: str = typer.Option("", "--loopback", metavar="N,N,...",
                                                 help="Also run real processes on 127.0.0.1 at these sizes "
                                                      "(e.g. 4,8,16), with the small model of `bench swarm`."),
                    loopback_committee: str = typer.Option("2,3,1", "--loopback-committee", metavar="K,W,J",
                                                           help="The budget of the --loopback swarms."),
                    loopback_rounds: int = typer.Option(8, "--loopback-rounds", min=4, metavar="N",
                                                        help="Rounds of each --loopback swarm."),
                    config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt,
                    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
                    plot_path: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.png",
                                                             help="Bytes and records against N.")) -> None:
    """A peer's bytes, records and held updates per round as N grows: a committee beside all-to-all (virtual),
    and with --loopback the same per-peer figures from real processes."""
    from gradnode.node.bench import scale as bench_scale
    from gradnode.node.sim import scenario

    cfg = _load(config, set_)
    _check_plot(plot_path)
    try:
        counts = [int(x) for x in sizes.split(",") if x.strip()]
        budget = scenario.parse_committee(committee)
        if not counts or min(counts) < 2 or max(counts) > 10_000:
            raise ValueError(f"--sizes {sizes!r}: swarm sizes 2..10000")
        real_counts = [int(x) for x in loopback.split(",") if x.strip()]
        if real_counts and (min(real_counts) < 2 or max(real_counts) > 32):
            raise ValueError(f"--loopback {loopback!r}: real swarm sizes 2..32")
        real_budget = scenario.parse_committee(loopback_committee)
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    result = bench_scale.run(cfg, counts, rounds=rounds, seed=seed, committee=budget, all_max=all_max,
                             round_s=round_s)
    if real_counts:
        result["loopback_committee"] = list(real_budget)
        result["loopback"] = bench_scale.loopback(real_counts, rounds=loopback_rounds, seed=seed,
                                                  committee=real_budget)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        bench_scale.print_result(result)
    if plot_path is not None:
        _plot(lambda: bench_scale.plot(result, str(plot_path)), plot_path)


@command("quality", bench_app)
def bench_quality_cmd(
        replicas: int = typer.Option(4, "--replicas", "-r", min=1, max=64, metavar="N",
                                     help="Replicas (peers) per algorithm."),
        rounds: int = typer.Option(20, "--rounds", "-n", min=1, metavar="N", help="Outer rounds per algorithm."),
        inner_steps: int = typer.Option(15, "--inner-steps", min=1, metavar="H", help="Inner steps per round."),
        size: str = typer.Option("small", "--size", metavar="SIZE", help="Model size: small (default, ~3 min on 2 "
                                 "CPU cores in all), medium or large."),
        algorithms: Optional[list[str]] = typer.Option(None, "--algorithm", "-a", metavar="NAME", help="Run only "
                                                       "these (repeatable): ddp, diloco, sparseloco-packed12, "
                                                       "sparseloco-rice."),
        inner_lr: float = typer.Option(1.5e-3, "--inner-lr", metavar="LR", help="Peak inner AdamW lr, every "
                                       "algorithm (measured best for each)."),
        sparseloco_lr: float = typer.Option(1.0, "--sparseloco-lr", metavar="LR",
                                            help="Outer learning rate of SparseLoCo."),
        ef_beta: float = typer.Option(0.9, "--ef-beta", metavar="BETA",
                                      help="SparseLoCo error-feedback decay (measured best)."),
        diloco_lr: float = typer.Option(0.5, "--diloco-lr", metavar="LR",
                                        help="Outer learning rate of DiLoCo (measured best)."),
        aggregation: str = typer.Option("coord_mean", "--aggregation", metavar="RULE", help="SparseLoCo/DiLoCo "
                                        "aggregation: coord_mean (measured best), mean or robust."),
        seed: int = typer.Option(0, "--seed", min=0, metavar="N", help="Seed of models and data."),
        committee_k: int = typer.Option(0, "--committee", min=0, metavar="K", help="Also run each SparseLoCo "
                                        "algorithm with K contributors drawn per round, and all-to-all with K "
                                        "replicas."),
        newcomers: int = typer.Option(1, "--newcomers", min=0, metavar="J", help="The committee's newcomer slots."),
        undrawn: str = typer.Option("carry,feedback,drop", "--undrawn", metavar="RULES", help="What undrawn "
                                    "replicas do with their work, one run each: carry, feedback, drop."),
        set_: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE", help="Override a config key for "
                                                 "every algorithm, e.g. --set inner.batch_size=16 (repeatable)."),
        device: Optional[str] = typer.Option(None, "--device", metavar="DEVICE", help="cpu, cuda (default: auto)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
        plot_path: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.png",
                                                 help="Write a PNG of val loss vs tokens (needs matplotlib)."),
        verbose: bool = VerboseOpt) -> None:
    """Compressed vs dense training: DDP AdamW, DiLoCo, SparseLoCo (12-bit and entropy-coded indices); with
    --committee, SparseLoCo under a drawn committee."""
    from rich.progress import Progress
    from rich.table import Table

    from gradnode.node.bench import quality as bq

    _quiet_logging(verbose)
    if aggregation not in ("mean", "coord_mean", "robust"):
        typer.echo("error: --aggregation must be mean, coord_mean or robust", err=True)
        raise typer.Exit(2)
    _check_plot(plot_path)
    settings = bq.BenchSettings(replicas=replicas, rounds=rounds, inner_steps=inner_steps, size=size, seed=seed,
                                inner_lr=inner_lr, sparseloco_lr=sparseloco_lr, ef_beta=ef_beta, diloco_lr=diloco_lr,
                                aggregation=aggregation, committee=committee_k, newcomers=newcomers,
                                undrawn=tuple(u.strip() for u in undrawn.split(",") if u.strip()), device=device)
    try:
        settings.overrides = dict(parse_override(o) for o in set_ or [])
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    names = tuple(algorithms) if algorithms else bq.ALGORITHMS
    with _user_errors(verbose):
        with Progress(console=ERR, transient=True) as progress:
            tasks: dict[str, Any] = {}

            def advance(n: str, r: int) -> None:
                if n not in tasks:
                    tasks[n] = progress.add_task(n, total=rounds)
                progress.update(tasks[n], completed=r)

            results = bq.run_bench(settings, names, advance)
    if as_json:
        typer.echo(json.dumps(bq.results_json(settings, results)))
    else:
        console = Console() if sys.stdout.isatty() else Console(width=130)  # keep the table whole in logs
        table = Table(title=f"quality: {replicas} replicas, H={inner_steps}, {rounds} rounds, "
                            f"{results[0].params:,} params, {results[0].tokens:,} tokens each")
        for col in ("algorithm", "val loss", "bits/param/round", "bytes/peer/round", "x smaller than fp32",
                    "work reached", "time"):
            table.add_column(col, justify="left" if col == "algorithm" else "right")
        for r in results:
            table.add_row(r.algorithm, f"{r.val_loss:.4f}", f"{r.bits_per_param_per_round:.4g}",
                          f"{r.bytes_per_peer_per_round:,.0f}", f"{r.fp32_ratio:,.1f}", f"{r.reached:.0%}",
                          f"{r.seconds:.0f} s")
        console.print(table)
        for goal, measured, bound, met in bq.goals(results):
            op = ">=" if "smaller" in goal else "<="
            console.print(f"{'met ' if met else 'MISSED'} {goal}: {measured:.4f} ({op} {bound})")
    if plot_path is not None:
        title = f"{replicas} replicas, H={inner_steps}, {rounds} rounds ({size})"
        _plot(lambda: bq.plot(results, str(plot_path), title), plot_path)


@command("compressors", bench_app)
def bench_compressors_cmd(
        replicas: int = typer.Option(4, "--replicas", "-r", min=1, max=64, metavar="N", help="Replicas per row."),
        rounds: int = typer.Option(12, "--rounds", "-n", min=1, metavar="N", help="Outer rounds per row."),
        inner_steps: int = typer.Option(15, "--inner-steps", min=1, metavar="H", help="Inner steps per round."),
        size: str = typer.Option("small", "--size", metavar="SIZE", help="Model size: tiny (a test), small "
                                 "(default, ~13 min on 2 CPU cores in all), medium or large."),
        family: Optional[list[str]] = typer.Option(None, "--family", "-f", metavar="NAME", help="Run only these "
                                                   "families (repeatable), plus today's SparseLoCo."),
        seed: int = typer.Option(0, "--seed", min=0, metavar="N", help="Seed of models and data."),
        lrs: Optional[list[float]] = typer.Option(None, "--lr", min=0.01, max=10.0, metavar="LR", help="Outer "
                                                  "learning rates to sweep (repeatable): every row runs at each "
                                                  "instead of its own, today's SparseLoCo at its own too."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
        plot_path: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.png",
                                                 help="Write a PNG of val loss vs bytes (needs matplotlib)."),
        verbose: bool = VerboseOpt) -> None:
    """Every compressor family side by side: bytes, loss at equal tokens, speed, whether codes can be summed."""
    from rich.progress import Progress
    from rich.table import Table

    from gradnode.node.bench import compressors as bc
    from gradnode.node.bench.quality import BenchSettings

    _quiet_logging(verbose)
    if plot_path is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            _say("--plot skipped: matplotlib is not installed (pip install 'gradnode[plot]')")
            plot_path = None
    rows = bc.ROWS if not family else tuple(r for r in bc.ROWS if r == bc.REFERENCE or
                                            r.settings.family.value in family)
    rows = bc.swept(rows, lrs or ())
    settings = BenchSettings(replicas=replicas, rounds=rounds, inner_steps=inner_steps, size=size, seed=seed)
    with _user_errors(verbose):
        with Progress(console=ERR, transient=True) as progress:
            tasks = {r.key: progress.add_task(f"{r.label} lr {r.lr:g}", total=rounds) for r in rows}
            report = bc.run(settings, rows, on_row=lambda n, r: progress.update(tasks[n], completed=r))
    if as_json:
        typer.echo(json.dumps(bc.report_json(report)))
    else:
        console = Console() if sys.stdout.isatty() else Console(width=150)
        first = report.rows[0]
        table = Table(title=f"compressors: {replicas} replicas, H={inner_steps}, {rounds} rounds, "
                            f"{first.params:,} params, {first.tokens:,} tokens each, {report.seconds:.0f} s")
        for col in ("compressor", "lr", "bytes/param", "x fp32", "val loss", "/sparseloco", "/diloco", "/ddp",
                    "enc GB/s", "dec GB/s", "summable"):
            table.add_column(col, justify="left" if col == "compressor" else "right")
        for t in bc.table(report):
            table.add_row(t["compressor"], f"{t['outer_lr']:g}", f"{t['bytes_per_param']:.4g}",
                          f"{t['fp32_ratio']:,.1f}", f"{t['val_loss']:.4f}", f"{t['vs_sparseloco']:.3f}",
                          f"{t['vs_diloco']:.3f}", f"{t['vs_ddp']:.3f}", f"{t['encode_gbps']:.3g}",
                          f"{t['decode_gbps']:.3g}", "yes" if t["summable"] else "no")
        console.print(table)
        best = report.best_within()
        if best is not None:
            console.print(f"fewest bytes within 1% of SparseLoCo's loss: {best.label} "
                          f"({best.bytes_per_param:.4g} bytes/param, {best.fp32_ratio:,.0f}x smaller than fp32)")
    if plot_path is not None:
        _plot(lambda: bc.plot(report, str(plot_path)), plot_path)


def _parse_groups(text: str) -> tuple[tuple[int, int], ...]:
    """'4:1,8:2' -> ((4, 1), (8, 2))."""
    try:
        out = tuple((int(r), int(a)) for r, a in (g.split(":") for g in text.split(",") if g.strip()))
    except ValueError:
        raise ValueError(f"--groups must read like 4:1,8:2 (replicas:attackers), got {text!r}") from None
    if not out:
        raise ValueError("--groups is empty")
    return out


@command("robust", bench_app)
def bench_robust_cmd(
        rounds: int = typer.Option(15, "--rounds", "-n", min=1, metavar="N", help="Outer rounds per run."),
        inner_steps: int = typer.Option(10, "--inner-steps", min=1, metavar="H", help="Inner steps per round."),
        size: str = typer.Option("small", "--size", metavar="SIZE", help="Model size: small (default, 0.12M "
                                 "params, under 10 min on 2 CPU cores in all), tiny (tests), medium (1.66M) or "
                                 "node (the default config's 3.2M model and batch)."),
        rules: Optional[list[str]] = typer.Option(None, "--rule", metavar="RULE", help="Run only these rules "
                                                  "(repeatable): coord_mean, robust."),
        attacks: Optional[list[str]] = typer.Option(None, "--attack", "-a", metavar="NAME", help="Run only these "
                                                    "attacks (repeatable): signflip, scaled, noise, zeros, targeted, "
                                                    "copy, replay, lazy."),
        groups: str = typer.Option("4:1,8:2", "--groups", metavar="R:A,...", help="Replicas R of which A attack, "
                                   "per group (A < R/2)."),
        score: bool = typer.Option(True, "--score/--no-score", help="The witnesses' loss check in front of the "
                                   "robust rule."),
        score_rows: int = typer.Option(8, "--score-rows", min=2, metavar="N", help="Random windows a witness "
                                       "scores each update on."),
        own_rows: int = typer.Option(0, "--own-rows", min=0, metavar="N", help="Also score each update on N rows "
                                     "of its sender's assigned batches (Templar's own-data check; reported in "
                                     "--json as own_advantage_*, never used for the verdict)."),
        jobs: int = typer.Option(2, "--jobs", "-j", min=1, metavar="N", help="Runs at a time (processes of one "
                                 "torch thread; the figures do not depend on it)."),
        seed: int = typer.Option(0, "--seed", min=0, metavar="N", help="Seed of models, data and attacks."),
        set_: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE", help="Override a config key "
                                                 "in every run, e.g. --set inner.batch_size=16 (repeatable)."),
        device: Optional[str] = typer.Option(None, "--device", metavar="DEVICE", help="cpu, cuda (default: auto)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
        plot_path: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.png",
                                                 help="Write a PNG of the loss ratios (needs matplotlib)."),
        verbose: bool = VerboseOpt) -> None:
    """Attackers with valid keys vs the aggregation rules: loss under each attack / the clean run's."""
    from rich.progress import Progress
    from rich.table import Table

    from gradnode.node.bench import robust as br

    _quiet_logging(verbose)
    _check_plot(plot_path)
    try:
        parsed = _parse_groups(groups)
        overrides = dict(parse_override(o) for o in set_ or [])
        settings = br.RobustSettings(rounds=rounds, inner_steps=inner_steps, size=size, seed=seed, groups=parsed,
                                     rules=tuple(rules) if rules else br.RULES,
                                     attacks=tuple(attacks) if attacks else br.ATTACKS, score=score,
                                     score_rows=score_rows, own_rows=own_rows, jobs=jobs, device=device, overrides=overrides)
        settings.validate()
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    with _user_errors(verbose):
        with Progress(console=ERR, transient=True) as progress:
            task = progress.add_task("runs", total=len(br.plan(settings)))
            results = br.run_bench(settings, lambda label, done, total: progress.update(
                task, completed=done, description=label))
    if as_json:
        typer.echo(json.dumps(br.results_json(settings, results)))
    else:
        console = Console() if sys.stdout.isatty() else Console(width=130)
        table = Table(title=f"robust: H={inner_steps}, {rounds} rounds, {size} model, "
                            f"{'with' if score else 'without'} the witnesses' loss check")
        for col in ("rule", "attack", "attackers", "val loss", "clean", "ratio", "attackers left out",
                    "honest left out", "time"):
            table.add_column(col, justify="left" if col in ("rule", "attack") else "right")
        for r in results:
            table.add_row(r.rule, r.attack, f"{r.attackers}/{r.replicas}", f"{r.val_loss:.4f}",
                          f"{r.clean_val_loss:.4f}", f"{r.ratio:.4f}",
                          f"{r.attacker_left_out}/{r.attacker_updates}" if r.attackers else "-",
                          f"{r.honest_left_out}/{r.honest_updates}", f"{r.seconds:.0f} s")
        console.print(table)
        for goal, measured, bound, met in br.goals(results, size):
            mark = "figure" if met is None else "met   " if met else "MISSED"
            console.print(f"{mark} {goal}: {measured:.4f} (goal <= {bound}{'' if met is not None else ' at --size node'})")
    if plot_path is not None:
        title = f"bench robust: H={inner_steps}, {rounds} rounds ({size})"
        _plot(lambda: br.plot(results, str(plot_path), title), plot_path)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
