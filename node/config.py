"""The node's configuration tree: one strict pydantic model, loaded from YAML or TOML.

Every section forbids unknown keys and bounds its fields, so that a typo or a bad value fails
before any work starts, with a message naming the dotted key to change. This module must not
import torch (``gradnode --help`` stays fast).
"""

from __future__ import annotations

import difflib
import enum
import ipaddress
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

if TYPE_CHECKING:
    from gradnode.protocol.committee import Budget


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    run_id: str = Field("gradnode-tiny", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
                        description="Swarm identifier: peers only accept updates and state of the same run.")
    seed: int = Field(0, ge=0, description="Seed for model init and data order (shared by the whole swarm).")
    output_dir: Path = Field(Path("runs/default"), description="Folder for checkpoints, keys, logs and metrics.")
    genesis: Path | None = Field(None, description="The run's genesis file (`gradnode run init`): its rules must "
                                 "equal this config's, and its run id replaces run.run_id.")
    admission: Path | None = Field(None, description="This peer's admission certificate (`gradnode admit`), for a "
                                   "run whose genesis names a run authority.")


class ModelConfig(_Section):
    kind: Literal["gpt", "hf"] = Field("gpt", description="Built-in GPT ('gpt') or a Hugging Face causal LM ('hf').")
    n_layer: int = Field(4, ge=1, le=128, description="Transformer blocks (gpt).")
    n_head: int = Field(4, ge=1, le=128, description="Attention heads per block (gpt).")
    d_model: int = Field(256, ge=8, le=16384, description="Hidden width (gpt); must divide by n_head.")
    d_ff: int | None = Field(None, ge=8, description="MLP width (gpt); default 4 * d_model.")
    seq_len: int = Field(128, ge=8, le=65536, description="Context length in tokens.")
    vocab_size: int = Field(256, ge=2, le=1_000_000, description="Vocabulary size; 256 for the byte-level corpus.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout probability (gpt).")
    tie_embeddings: bool = Field(True, description="Share input embedding and output head weights (gpt).")
    hf_config: str | None = Field(None, description="Path or cached name of a transformers config (kind='hf'); "
                                                    "weights are randomly initialised, never downloaded.")

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.kind == "gpt" and self.d_model % self.n_head:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})")
        if self.kind == "hf" and not self.hf_config:
            raise ValueError("model.hf_config is required when model.kind is 'hf'")
        return self


class DataConfig(_Section):
    source: Literal["stdlib", "text", "hf"] = Field(
        "stdlib", description="'stdlib': the running interpreter's standard-library sources (no download); "
                              "'text': local text files or folders in data.paths; 'hf': a Hugging Face dataset.")
    paths: list[Path] = Field(default_factory=list, description="Files or folders of text (source='text').")
    hf_dataset: str | None = Field(None, description="Dataset name or local path (source='hf').")
    hf_split: str = Field("train", description="Dataset split (source='hf').")
    hf_text_field: str = Field("text", description="Column holding the text (source='hf').")
    val_fraction: float = Field(0.02, gt=0.0, lt=0.5, description="Share of the corpus held out for validation.")
    max_bytes: int = Field(64 * 2**20, ge=1024, description="Upper bound on corpus bytes loaded into memory.")

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.source == "text" and not self.paths:
            raise ValueError("data.paths must list at least one file or folder when data.source is 'text'")
        if self.source == "hf" and not self.hf_dataset:
            raise ValueError("data.hf_dataset is required when data.source is 'hf'")
        return self


class InnerConfig(_Section):
    steps: int = Field(20, ge=1, le=100_000, description="H: inner optimizer steps per round.")
    batch_size: int = Field(16, ge=1, description="Sequences per micro-batch.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches accumulated per inner step.")
    lr: float = Field(3e-3, gt=0.0, le=1.0, description="Peak inner AdamW learning rate.")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="Cosine floor as a fraction of inner.lr.")
    warmup_steps: int = Field(20, ge=0, description="Linear warmup, in inner steps.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas.")
    weight_decay: float = Field(0.1, ge=0.0, description="AdamW decoupled weight decay.")
    grad_clip: float = Field(1.0, ge=0.0, description="Global gradient-norm clip; 0 disables it.")
    schedule_steps: int | None = Field(None, ge=1, le=100_000_000,
                                       description="Length of the warmup + cosine schedule in inner steps; "
                                                   "default: rounds x inner.steps. Past it the LR stays at the floor.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto' picks CUDA when available.")
    bf16: bool = Field(True, description="bf16 autocast on CUDA (ignored on CPU).")


FAMILIES = ("sparseloco", "random-k", "powersgd", "sign", "dct-topk", "quant", "dense")  # protocol.compress.Family


class CodecConfig(_Section):
    family: Literal[FAMILIES] = Field(  # type: ignore[valid-type]
        "sparseloco", description="The compressor (docs/compressors.md): 'sparseloco' is today's codec, set by "
                                  "chunk, topk, bits and index_coding; any other family is set by codec.options.")
    chunk: int = Field(4096, ge=16, le=65536, description="sparseloco: values per chunk (64x64 tiles for 2-D weights).")
    topk: int = Field(64, ge=1, description="sparseloco: values kept per chunk, by magnitude.")
    bits: int = Field(2, ge=1, le=8, description="sparseloco: bits per kept value.")
    index_coding: Literal["packed12", "rice"] = Field(
        "rice", description="sparseloco: 'packed12' fixed 12-bit in-chunk indices (Templar); 'rice' entropy-coded "
                            "gaps.")
    options: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="Another family's settings, by the fields of its settings class in "
                                          "protocol/compress (e.g. density for random-k, rank for powersgd; "
                                          "warmup_rounds and small_numel for every family). Unset: its defaults.")

    @model_validator(mode="after")
    def _check(self) -> "CodecConfig":
        if self.topk > self.chunk:
            raise ValueError(f"codec.topk ({self.topk}) must not exceed codec.chunk ({self.chunk})")
        if self.family == "sparseloco" and self.options:
            raise ValueError("codec.options set another family's settings: sparseloco takes codec.chunk, "
                             "codec.topk, codec.bits and codec.index_coding")
        if self.family != "sparseloco":
            self.settings()  # refused at load, not rounds later
        return self

    def settings(self) -> Any:
        """The family's settings (a protocol.compress Options) for any family but sparseloco. An int where the
        field is a float is taken as that float; anything else of the wrong type is refused."""
        from dataclasses import fields  # here, not at the top: the families import torch

        from gradnode.protocol.compress import KINDS, Family, ProtocolError
        kind = KINDS[Family(self.family)][0]
        declared = {f.name: type(f.default) for f in fields(kind)}
        unknown = sorted(set(self.options) - set(declared))
        if unknown:
            raise ValueError(f"codec.options: {', '.join(unknown)} not a setting of {self.family} "
                             f"(its settings: {', '.join(sorted(declared))})")
        values = {k: float(v) if declared[k] is float and type(v) is int else v for k, v in self.options.items()}
        wrong = [k for k, v in values.items() if type(v) is not declared[k]]
        if wrong:
            raise ValueError(f"codec.options.{wrong[0]} must be a {declared[wrong[0]].__name__}")
        try:
            return kind(**values)
        except ProtocolError as err:
            raise ValueError(f"codec.options: {err}") from None


class OuterConfig(_Section):
    algorithm: Literal["sparseloco", "diloco", "ddp"] = Field(
        "sparseloco", description="'sparseloco': compressed pseudo-gradients with error feedback; "
                                  "'diloco': dense pseudo-gradients, Nesterov outer momentum; "
                                  "'ddp': gradients averaged every step (reference).")
    lr: float = Field(1.0, gt=0.0, le=10.0, description="Outer learning rate.")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="Outer momentum (0 for SparseLoCo, ~0.9 for DiLoCo).")
    nesterov: bool = Field(False, description="Nesterov outer momentum (DiLoCo).")
    ef_beta: float = Field(0.95, ge=0.0, le=1.0, description="Error-feedback decay.")
    undrawn: Literal["drop", "carry", "feedback"] = Field(
        "drop", description="What a peer outside a round's committee does with its work: discards it ('drop'), "
                            "keeps it as local progress ('carry'), or folds it into error feedback ('feedback').")
    aggregation: Literal["mean", "coord_mean", "robust"] = Field(
        "robust", description="'robust': coord_mean of the updates that pass deterministic screens, weighted by "
                              "reputation (protocol/robust.py); 'coord_mean': each coordinate averaged over its "
                              "senders; 'mean': averaged over contributing peers.")
    clip_to_median: bool = Field(True, description="Clip each peer's update to the round's median norm.")
    max_step_ratio: float = Field(
        1.0, gt=0.0, le=1e6, description="Every peer skips a round's outer step alike when its aggregate's norm "
                                         "exceeds this multiple of the shared weights' norm, or holds inf/NaN.")

    @model_validator(mode="after")
    def _check(self) -> "OuterConfig":
        if self.undrawn == "feedback" and self.algorithm != "sparseloco":  # refused at load, not rounds later
            raise ValueError("outer.undrawn='feedback' needs error feedback: outer.algorithm='sparseloco'")
        return self


_RATE_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
               "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024.0, "mib": 2.0**20, "gib": 2.0**30}


def parse_rate(text: str) -> float:
    """'10mbit' -> 1.25e6 bytes/s; units: bit, kbit, mbit, gbit (bits/s) or b, kb, mb, gb, kib, mib, gib (bytes/s)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)(?:/s|ps)?\s*", text.lower())
    if not m or m.group(2) not in _RATE_UNITS:
        raise ValueError(f"bad rate '{text}': use e.g. 10mbit, 500kbit, 2MB (units {', '.join(_RATE_UNITS)})")
    rate = float(m.group(1)) * _RATE_UNITS[m.group(2)]
    if not 1e3 <= rate <= 1e11:
        raise ValueError(f"rate '{text}' must lie between 8kbit and 800gbit")
    return rate


_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_MADDR_ARGS = {"ip4": "ip4", "ip6": "ip6", "dns": "host", "dns4": "host", "dns6": "host", "tcp": "port", "udp": "port",
               "p2p": "peer", "ipfs": "peer", "quic": None, "quic-v1": None, "ws": None, "wss": None,
               "p2p-circuit": None, "tls": None, "noise": None}


def peer_id_ok(text: str) -> bool:
    """A base58 multihash of 34 bytes (sha2-256, RSA keys: Qm...) or an identity multihash (ed25519 keys)."""
    if not 30 <= len(text) <= 64 or any(c not in _B58 for c in text):
        return False
    n = 0
    for c in text:
        n = n * 58 + _B58.index(c)
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return (raw[:2] == b"\x12\x20" and len(raw) == 34) or (len(raw) >= 2 and raw[0] == 0 and raw[1] == len(raw) - 2)


def check_multiaddr(text: str, need_peer_id: bool = False) -> str:
    """``text`` if it reads as a libp2p multiaddr (e.g. /ip4/1.2.3.4/tcp/31337/p2p/Qm...), a trailing /ipfs/ as
    /p2p/, else ValueError naming what is wrong; ``need_peer_id``: it must end with /p2p/<peer id> (an address to
    dial)."""
    parts = text.split("/")
    if not text.startswith("/") or len(parts) < 3:
        raise ValueError(f"{text!r} is not a multiaddr: write it like /ip4/1.2.3.4/tcp/31337/p2p/Qm...")
    i, last = 1, None
    while i < len(parts):
        proto = parts[i]
        if proto not in _MADDR_ARGS:
            raise ValueError(f"{text!r}: unknown protocol {proto!r} (expected ip4, ip6, dns, tcp, udp, p2p, ...)")
        kind, i = _MADDR_ARGS[proto], i + 1
        if kind is not None:
            value = parts[i] if i < len(parts) else ""
            i += 1
            if not _MADDR_VALUE[kind](value):
                raise ValueError(f"{text!r}: {value!r} is not a valid {kind} for /{proto}")
        last = proto
    if need_peer_id and last not in ("p2p", "ipfs"):
        raise ValueError(f"{text!r} has no peer id: a peer's address ends with /p2p/<its peer id>, as "
                         "`gradnode bootstrap` prints it")
    if last == "ipfs":  # the old name of /p2p/: the peer's own id, which every reader takes after the last /p2p/
        head, _, peer = text.rpartition("/ipfs/")
        return f"{head}/p2p/{peer}"
    return text


def peer_id_of(maddr: str) -> str | None:
    """The peer id a multiaddr ends with (after its last /p2p/; ``check_multiaddr`` spells /ipfs/ so), or None."""
    return maddr.rsplit("/p2p/", 1)[1] if "/p2p/" in maddr else None


class Reach(enum.Enum):
    """Who can dial an address: any machine, the machines of this network, or this machine only."""

    PUBLIC = "any machine"
    NETWORK = "this network"
    MACHINE = "this machine only"


def reach_of(maddr: str) -> Reach:
    """Who can dial ``maddr`` (/ip4/ or /ip6/ addresses; a DNS name counts as public)."""
    parts = maddr.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return Reach.PUBLIC
    try:
        ip = ipaddress.ip_address(parts[2])
    except ValueError:
        return Reach.PUBLIC
    if ip.is_loopback:
        return Reach.MACHINE
    return Reach.NETWORK if ip.is_private or ip.is_link_local or ip in _SHARED_SPACE else Reach.PUBLIC


_SHARED_SPACE = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: not reachable from the internet


def _ip(value: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(value).version == version
    except ValueError:
        return False


_MADDR_VALUE = {"ip4": lambda v: _ip(v, 4), "ip6": lambda v: _ip(v, 6),
                "port": lambda v: v.isdigit() and int(v) < 65536,
                "host": lambda v: re.fullmatch(r"[A-Za-z0-9.-]{1,253}", v) is not None, "peer": peer_id_ok}


class CommitteeConfig(_Section):
    """A round's committee (protocol/committee.py): with ``contributors`` set, a round takes the updates of
    that many keys drawn from the ledger, plus ``newcomers`` new keys, and ``witnesses`` drawn keys decide it."""

    contributors: int = Field(0, ge=0, le=4096, description="Updates drawn from the ledger per round; 0: every "
                                                             "peer sends and every recent contributor witnesses.")
    witnesses: int = Field(0, ge=0, le=4096, description="Witnesses drawn per round, whose reports decide it.")
    newcomers: int = Field(0, ge=0, le=4096, description="Updates per round from keys outside the ledger.")

    @model_validator(mode="after")
    def _check(self) -> "CommitteeConfig":
        self.budget()  # its own checks
        return self

    def budget(self) -> "Budget":
        from gradnode.protocol.committee import Budget

        return Budget(self.contributors, self.witnesses, self.newcomers)


class SwarmConfig(_Section):
    initial_peers: list[str] = Field(default_factory=list, description="Multiaddrs of known peers (bootstrap).")
    host_maddrs: list[str] = Field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"],
                                   description="Addresses to listen on.")
    announce_maddrs: list[str] = Field(default_factory=list, description="Public addresses to advertise.")
    client_mode: bool = Field(False, description="Accept no inbound connections (peer behind NAT): listen on no "
                                                 "address, push own updates to reachable peers, fetch from them.")
    identity_path: Path | None = Field(None, description="Key file; default <run.output_dir>/identity.key.")
    identity_check: bool = Field(True, description="At start, ask the swarm whether another process runs this "
                                 "key (one more libp2p daemon and a lookup; `gradnode simulate` turns it off).")
    rounds: int = Field(0, ge=0, description="Rounds to train before leaving; 0 means until stopped.")
    deadline_slack: float = Field(1.5, ge=1.0, le=100.0,
                                  description="Round deadline = slack x the median peer's observed round time, "
                                              "counted from the round's start; 1.5 leaves stragglers half a "
                                              "round.")
    min_deadline_s: float = Field(2.0, gt=0.0, le=3600.0, description="Lower bound on the round deadline, seconds.")
    max_wait_s: float = Field(120.0, gt=0.0, le=86400.0,
                              description="Upper bound on waiting for one round's outcome before giving up on it "
                                          "(skipped rounds keep their content in error feedback).")
    commit_grace_s: float = Field(3.0, ge=0.0, le=600.0,
                                  description="Least wait, after this peer's own report, for the other eligible "
                                              "witnesses' reports (a deadline window when that is longer).")
    record_ttl_s: float = Field(60.0, gt=0.0, le=86400.0, description="Lifetime of membership records in the DHT.")
    bandwidth: str | None = Field(None, description="Cap on this peer's link, e.g. '10mbit' (token bucket in the "
                                                    "transport, each direction).")
    max_update_bytes: int = Field(64 * 2**20, ge=1024, le=2**34,
                                  description="Largest update blob accepted from a peer; bigger ones are rejected.")
    max_fetches: int = Field(8, ge=1, le=1024,
                             description="Updates fetched at once; the others wait their turn, so that each "
                                         "completes at the link's full share instead of all at the end.")
    max_state_bytes: int = Field(2**34, ge=1024, le=2**40, description="Largest model state accepted from a peer.")
    state_chunk_bytes: int = Field(4 * 2**20, ge=2**16, le=2**28,
                                   description="State is served and fetched in chunks of this size, from several "
                                               "peers in parallel.")
    serve_only: bool = Field(False, description="Keep the DHT and serve state, but do not train (bootstrap).")
    hash_check: bool = Field(True, description="Publish a weight hash per round; re-sync when it disagrees with "
                                               "the majority.")
    overlap: bool = Field(True, description="Exchange round r while round r+1's inner steps run (one-round-delayed "
                                            "outer update); False waits for each round's exchange.")
    min_steps: int = Field(1, ge=1, le=100_000,
                           description="Fewest inner steps a slow peer runs before the round's cut time may "
                                       "end them.")
    min_peers: int = Field(2, ge=1, le=10_000,
                           description="Training peers, this one included, a peer must see to train (a swarm "
                                       "already training counts); it waits for them, saying so. 1: training "
                                       "alone is allowed.")
    shutdown_grace_s: float = Field(30.0, ge=0.0, le=3600.0,
                                    description="After SIGTERM or SIGINT a peer has one round plus this long to "
                                                "finish its round and checkpoint; then it ends at once.")
    connect_timeout_s: float = Field(60.0, ge=0.0, le=86400.0,
                                     description="How long a starting peer keeps trying its initial peers and "
                                                 "address book when none answers, before it gives up (exit 2).")
    expected_peers: int = Field(0, ge=0, le=10_000,
                                description="Training peers the operator expects in the run; `gradnode health` "
                                            "fails while this peer sees fewer. 0: no expectation.")
    catchup_rounds: int = Field(8, ge=0, le=10_000,
                                description="Rounds of applied updates every peer keeps and serves; a peer at "
                                            "most this many rounds behind replays them when they weigh less "
                                            "than the state. 0: no replay.")
    state_upload_slots: int = Field(4, ge=1, le=1024,
                                    description="State chunks this peer uploads at once; further requests get "
                                                "'busy' and go to another donor (joiners spread over donors).")
    own_update_copies: int = Field(2, ge=0, le=1024,
                                   description="Copies of its own update a peer serves per window (half of "
                                               "swarm.min_deadline_s, at most 2 s); past them, others fetch from "
                                               "the holders. 0: no cap.")
    ignore_after: int = Field(3, ge=1, le=1000, description="Rejected updates after which a sender is ignored "
                                                            "(its announcements not fetched, its pushes refused).")
    ignore_rounds: int = Field(10, ge=0, le=10**6, description="Rounds a sender stays ignored (0: never ignore).")
    max_streams_per_peer: int = Field(8, ge=1, le=1024,
                                      description="Inbound streams one peer may hold open at once (fetches and "
                                                  "pushes); more are refused at once, unread.")
    pushes_per_round: int = Field(3, ge=1, le=100,
                                  description="Pushes a peer may make of its own update of one round (retries "
                                              "included); more, and pushes of another peer's update, are refused "
                                              "unread.")
    min_stream_bytes_per_s: int = Field(16384, ge=0, le=2**34,
                                        description="A blob transfer slower than this after its first second is "
                                                    "dropped, and its holder tried last for a minute. 0: no floor.")
    score_rows: int = Field(0, ge=0, le=1024,
                            description="Training windows on which a witness checks that an update does not raise "
                                        "the loss, else leaves it out of its report "
                                        "(node/train/score.py). 0: off; 4 or more when on.")
    score_z: float = Field(5.0, ge=0.0, le=100.0,
                           description="Standard errors of slack the loss check gives an update before rejecting "
                                       "it.")
    push_peers: int = Field(2, ge=1, le=64,
                            description="Reachable peers a client-mode peer pushes each of its updates to; they "
                                        "verify, hold and serve it for everyone else.")
    fault: Literal["none", "corrupt", "forge", "tamper_state", "drift", "tokens", "dense", "slowhold",
                   "intruder", "pushflood", "flood", "replayleave", "equivocate", "crossrun", "sybilvotes", "lowid", "futurestate",
                   "badmomentum", "signflip", "noise", "freerider", "lazy"] = Field(
        "none", description="Testing aid: how this peer misbehaves on purpose from swarm.fault_round "
                            "(node/swarm/adversary.py tells each); honest peers must reject it or bound its cost.")
    fault_round: int = Field(1, ge=0, le=2**40, description="Testing aid: the round from which swarm.fault applies.")
    fault_partition_file: Path | None = Field(
        None, description="Testing aid: a JSON file {\"blocked\": [peer ids]}, re-read every second; this peer "
                          "drops their records, streams and dials, as if the network between them were cut.")
    slowdown: float = Field(1.0, ge=1.0, le=100.0,
                            description="Testing aid: make every inner step this many times slower (sleep), "
                                        "but the process's first (torch's start-up).")

    @field_validator("score_rows")
    @classmethod
    def _check_score_rows(cls, value: int) -> int:
        if value == 1:
            raise ValueError("must be 0 (off) or at least 2 (a standard error needs two rows)")
        return value

    @field_validator("initial_peers")
    @classmethod
    def _check_peers(cls, value: list[str]) -> list[str]:
        return [check_multiaddr(m, need_peer_id=True) for m in value]

    @field_validator("host_maddrs", "announce_maddrs")
    @classmethod
    def _check_maddrs(cls, value: list[str]) -> list[str]:
        return [check_multiaddr(m) for m in value]

    @field_validator("bandwidth")
    @classmethod
    def _check_bandwidth(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rate(value)
        return value

    def bandwidth_bytes_per_s(self) -> float | None:
        return None if self.bandwidth is None else parse_rate(self.bandwidth)


class CheckpointConfig(_Section):
    every_rounds: int = Field(1, ge=0, description="Save every N rounds; 0 disables periodic saves.")
    keep: int = Field(2, ge=1, description="Checkpoints kept on disk.")
    resume: bool = Field(True, description="Resume from the newest valid checkpoint in run.output_dir.")


class MetricsConfig(_Section):
    """What a peer exposes about its own run while it runs (each peer's own choice, never a shared rule)."""

    port: int = Field(0, ge=0, le=65535, description="Serve Prometheus metrics on this TCP port at /metrics; 0: off.")
    host: str = Field("127.0.0.1", description="Address the metrics port and the status page listen on "
                      "('0.0.0.0' in containers).")
    eval_every: int = Field(0, ge=0, le=10**6, description="Validation loss every N applied rounds, for the "
                            "metrics and the log (costs about 8 forward passes); 0: at the start and end only.")
    tensorboard_dir: Path | None = Field(None, description="Also write the per-round metrics as TensorBoard "
                                         "scalars here (needs `pip install 'gradnode[tensorboard]'`).")
    wandb_project: str | None = Field(None, max_length=128, description="Also log the per-round metrics to this "
                                      "Weights & Biases project (needs `pip install 'gradnode[wandb]'`).")
    wandb_mode: Literal["offline", "online"] = Field("offline", description="'offline' (the default) writes "
                                                     "local files and needs no account; 'online' uploads.")

    @field_validator("host")
    @classmethod
    def _check_host(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)") from None
        return value


class Config(_Section):
    """The whole tree; every section has defaults, so an empty file is the embedded default."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    inner: InnerConfig = Field(default_factory=InnerConfig)
    codec: CodecConfig = Field(default_factory=CodecConfig)
    outer: OuterConfig = Field(default_factory=OuterConfig)
    committee: CommitteeConfig = Field(default_factory=CommitteeConfig)
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    rounds: int = Field(50, ge=1, description="Rounds to train (gradnode train).")

    @model_validator(mode="after")
    def _check(self) -> "Config":
        if self.codec.family != "sparseloco" and self.outer.algorithm != "sparseloco":
            raise ValueError(f"codec.family={self.codec.family!r} compresses with error feedback: "
                             f"outer.algorithm='sparseloco' (outer.algorithm={self.outer.algorithm!r} sends fp32)")
        return self


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the section at ``loc`` (e.g. ('inner',) -> InnerConfig's fields)."""
    model: type[BaseModel] = Config
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return list(model.model_fields)


def format_validation(err: ValidationError, source: str, origins: dict[str, str] | None = None) -> str:
    """One line per problem, each naming the dotted key; a mistyped key gets the nearest valid one. A key set by
    an override is blamed on it (``origins``: dotted key -> where it was set, e.g. '--set inner.lr=1e-3'), the
    others on ``source``."""
    origins = origins or {}
    lines, blamed = [], set()
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(loc[:-1])
            near = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
            msg = f"unknown key; did you mean `{near[0]}`?" if near else \
                f"unknown key; the keys here are {', '.join(allowed)}" if allowed else "unknown key"
        origin = next((o for k, o in origins.items() if key == k or key.startswith(k + ".")), None)
        blamed.add(origin or source)
        line = f"  {msg}" if e["type"] == "value_error" and key.split(".")[0] in msg else f"  {key}: {msg}"
        lines.append(line + (f" (from {origin})" if origin else ""))
    head = f"invalid config {source}:" if source in blamed else "invalid setting:" if len(lines) == 1 else \
        "invalid settings:"
    return "\n".join([head, *lines])


def config_from_dict(data: dict[str, Any], source: str = "<dict>", origins: dict[str, str] | None = None) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation(err, source, origins)) from None


def load_config(path: Path | str | None, overrides: dict[str, Any] | None = None,
                origins: dict[str, str] | None = None) -> Config:
    """Load a YAML or TOML file (None: the embedded default), then apply dotted-key overrides (``origins``: where
    each was set, named in an error about it)."""
    data: dict[str, Any] = {}
    source = "<default>"
    if path is not None:
        path = Path(path)
        source = str(path)
        if path.is_dir():
            found = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".toml"))
            raise ConfigError(f"{path} is a folder: name a config file" +
                              (f" in it, e.g. {path / found[0]} (it holds {', '.join(found)})" if found else ""))
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        text = path.read_text()
        try:
            loaded = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
        except (yaml.YAMLError, tomllib.TOMLDecodeError) as err:
            raise ConfigError(f"cannot parse {path}: {err}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections")
        data = loaded
    return bind_genesis(config_from_dict(with_overrides(data, overrides), source, origins))


def with_overrides(data: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``data`` (a config tree as dicts, changed in place) with dotted-key overrides applied."""
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{dotted}: '{part}' is not a section")
            node = child
        node[leaf] = value
    return data


# The values every peer of a run must hold alike (a genesis fixes them); device, data and swarm settings
# are each peer's own.
_LOCAL = {"inner": {"device", "bf16"}}
_SHARED_SECTIONS = ("model", "codec", "outer", "inner", "committee")


def shared_rules(cfg: Config) -> dict[str, Any]:
    """The run's shared rules as JSON types, by section (see protocol/genesis.py)."""
    dump = cfg.model_dump(mode="json")
    rules: dict[str, Any] = {s: {k: v for k, v in dump[s].items() if k not in _LOCAL.get(s, set())}
                             for s in _SHARED_SECTIONS}
    if cfg.codec.family == "sparseloco":  # the rules of a run from before the families: a sparseloco run
        del rules["codec"]["family"], rules["codec"]["options"]
    rules["run"] = {"seed": cfg.run.seed}
    return rules


def bind_genesis(cfg: Config) -> Config:
    """With run.genesis set: check that this config's shared rules equal the genesis's, and take its run id."""
    from gradnode.protocol.genesis import Genesis, GenesisError, differences

    path = cfg.run.genesis
    if path is None:
        return cfg
    try:
        genesis = Genesis.from_json(Path(path).read_bytes())
    except OSError as err:
        raise ConfigError(f"run.genesis: cannot read {path}: {err.strerror or err}") from None
    except GenesisError as err:
        raise ConfigError(f"run.genesis: {path} is not a genesis file: {err}") from None
    diff = differences(genesis.rules, shared_rules(cfg))
    if diff:
        shown = "; ".join(f"{k}: run has {a!r}, this config {b!r}" for k, a, b in diff[:6])
        raise ConfigError(f"this config differs from the run's genesis {path} in {len(diff)} rule(s): {shown} "
                          f"(use the run's config file)")
    cfg.run.run_id = genesis.run_id
    return cfg


def parse_override(item: str) -> tuple[str, Any]:
    """'inner.lr=1e-3' -> ('inner.lr', 0.001); the value is parsed as YAML (numbers, lists, bools)."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override '{item}' must look like section.key=value")
    return key.strip(), yaml.safe_load(raw)
