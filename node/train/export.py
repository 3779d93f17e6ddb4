"""Exporting a checkpoint's agreed weights (theta_g, see restore.py) for use outside a swarm.

``safetensors`` (the built-in GPT, model.kind 'gpt'): ``model.safetensors`` holds the fp32 weights under the
model's parameter names, ``config.json`` the model config, the run id, the round, the weights hash (the one
peers publish) and the gradnode version. With ``model.tie_embeddings`` the output head is the input
embedding: safetensors refuses tensors that share memory, so only ``tok.weight`` is stored and
``config.json`` names the tie (``"tied": {"head.weight": "tok.weight"}``); :func:`load_safetensors`
rebuilds ``GPT`` from the config, which ties the head to the embedding again, then loads the weights and
checks their hash.

``hf``: a folder that ``transformers.AutoModelForCausalLM.from_pretrained`` loads (``config.json``,
``model.safetensors``, ``generation_config.json``), plus ``gradnode.json`` (run id, round, weights hash,
version). A model.kind 'hf' model is its transformers model's ``save_pretrained``. The built-in GPT maps
onto ``GPT2LMHeadModel``: pre-LayerNorm with bias and the same eps, learned positions, exact (erf) GELU
(``activation_function='gelu'``, not GPT-2's tanh ``gelu_new``), attention scaled by 1/sqrt(head dim), no
bias in the head, head tied or not as configured. GPT-2's Conv1D layers store weights as (in, out), ours
(out, in): they are transposed; GPT-2 has biases where ours has none: they are exported as zeros. Before
anything is written, the converted model's logits are compared with the GPT's on a fixed input; beyond
``HF_RTOL``/``HF_ATOL`` the export is refused.

Tokens are bytes (ids 0-255 are the UTF-8 bytes of the text); there is no tokenizer file. Every export is
written to a temporary sibling folder and renamed to its name when complete.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from gradnode.node import __version__
from gradnode.node.config import ModelConfig
from gradnode.node.train.engine import weights_hash
from gradnode.node.train.model import GPT
from gradnode.node.train.restore import Restored

log = logging.getLogger(__name__)

FORMATS = ("auto", "safetensors", "hf")
FORMAT = "gradnode-gpt"  # config.json's "format" of a safetensors export
FORMAT_VERSION = 1
TOKENS = "bytes: ids 0-255 are the UTF-8 bytes of the text (no tokenizer file)"
# the GPT-2 conversion's logits may differ from the GPT's by float rounding only (other matmul kernels)
HF_RTOL = 1e-5
HF_ATOL = 1e-5


@dataclass(frozen=True)
class Exported:
    out: Path
    format: str
    files: dict[str, int]  # file name -> bytes
    seconds: float
    weights_hash: str
    max_logit_diff: float | None = None  # hf export of the built-in GPT: its self-check

    @property
    def bytes(self) -> int:
        return sum(self.files.values())


def export(restored: Restored, out: Path | str, fmt: str = "auto") -> Exported:
    """Write ``restored``'s weights to the new (or empty) folder ``out`` in format ``fmt`` (see FORMATS)."""
    out = Path(out)
    kind = restored.cfg.model.kind
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}: use {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = "safetensors" if kind == "gpt" else "hf"
    if fmt == "safetensors" and kind != "gpt":
        raise ValueError("format safetensors is the built-in GPT's (model.kind 'gpt'); a model.kind 'hf' model "
                         "exports as format hf (save_pretrained, its weights in safetensors)")
    if fmt == "hf":
        require_transformers()
    t0 = time.perf_counter()
    diff = None
    with _staging(out) as tmp:
        if fmt == "safetensors":
            _write_safetensors(restored, tmp)
        elif kind == "gpt":
            diff = _write_gpt2(restored, tmp)
        else:
            _write_hf(restored, tmp)
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    result = Exported(out, fmt, files, time.perf_counter() - t0, restored.weights_hash, diff)
    log.info("exported format=%s out=%s bytes=%d", fmt, out, result.bytes)
    return result


def provenance(restored: Restored) -> dict[str, Any]:
    """Where exported weights come from: run, round, hash (as peers publish it), gradnode version."""
    return {"run_id": restored.run_id, "round": restored.round, "weights_hash": restored.weights_hash,
            "gradnode_version": __version__, "checkpoint": str(restored.path)}


@contextlib.contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A temporary sibling folder, renamed to ``out`` when the block succeeds, removed when it fails."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder: export into a new or empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        for path in tmp.iterdir():
            path.chmod(0o644)  # safetensors writes 0600; an export is meant to be read by others
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


# --- safetensors: the built-in GPT under its own names ---------------------------------------------------


def _write_safetensors(restored: Restored, folder: Path) -> None:
    from safetensors.torch import save_file

    cfg = restored.cfg.model
    # theta_g has the model's parameter names, tied weights once: the head is not among them when tied
    tensors = {n: t.contiguous() for n, t in sorted(restored.params.items())}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt", "gradnode_format": FORMAT})
    _write_json(folder / "config.json", {
        "format": FORMAT, "format_version": FORMAT_VERSION, "architecture": "gradnode.node.train.model.GPT",
        "model": cfg.model_dump(mode="json"), "tied": {"head.weight": "tok.weight"} if cfg.tie_embeddings else {},
        "dtype": "float32", "tokens": TOKENS, **provenance(restored)})


@torch.no_grad()
def load_safetensors(folder: Path | str) -> tuple[GPT, dict[str, Any]]:
    """The built-in GPT of a safetensors export (eval mode, CPU) and its config.json; ValueError when the
    folder is not one, or its weights do not match the hash it records."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        info = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder}: unreadable config.json ({err})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT or info.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{folder}: not a gradnode safetensors export ({FORMAT} v{FORMAT_VERSION})")
    cfg = ModelConfig.model_validate(info["model"])
    try:
        tensors = load_file(str(folder / "model.safetensors"))
    except (OSError, SafetensorError) as err:
        raise ValueError(f"{folder}: unreadable model.safetensors ({err})") from None
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten; leave the caller's RNG alone
        model = GPT(cfg)
    params = dict(model.named_parameters())  # the tied head is the embedding: not listed on its own
    if sorted(tensors) != sorted(params):
        raise ValueError(f"{folder}: model.safetensors holds {sorted(tensors.keys() ^ params.keys())} "
                         "where the config's model differs")
    for name, p in params.items():
        if tensors[name].shape != p.shape:
            raise ValueError(f"{folder}: {name} is {tuple(tensors[name].shape)}, the config says {tuple(p.shape)}")
        p.copy_(tensors[name])
    for alias, source in info.get("tied", {}).items():
        assert model.get_parameter(alias) is model.get_parameter(source), f"{alias} is not tied to {source}"
    if weights_hash(tensors) != info.get("weights_hash"):
        raise ValueError(f"{folder}: the weights do not match config.json's weights_hash (damaged or altered)")
    return model.eval(), info


# --- hf: a folder transformers loads ----------------------------------------------------------------------


def require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ValueError("format hf needs transformers: pip install 'gradnode[hf]' (or export as format "
                         "safetensors)") from None


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No progress bars from save_pretrained in a command's output."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _write_hf(restored: Restored, folder: Path) -> None:
    with _quiet_transformers():
        restored.model.inner.save_pretrained(str(folder))
    _write_json(folder / "gradnode.json", {"tokens": TOKENS, **provenance(restored)})


def gpt2_config(cfg: ModelConfig, layer_norm_eps: float) -> Any:
    """The transformers GPT2Config that computes what the built-in GPT of ``cfg`` computes."""
    import transformers

    return transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.seq_len, n_embd=cfg.d_model, n_layer=cfg.n_layer,
        n_head=cfg.n_head, n_inner=cfg.d_ff or 4 * cfg.d_model, activation_function="gelu",
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=layer_norm_eps,
        scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
        tie_word_embeddings=cfg.tie_embeddings, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        architectures=["GPT2LMHeadModel"])


def gpt2_state_dict(params: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """theta_g of the built-in GPT under GPT2LMHeadModel's names: Conv1D weights transposed, zero biases."""
    out = {"transformer.wte.weight": params["tok.weight"], "transformer.wpe.weight": params["pos.weight"],
           "transformer.ln_f.weight": params["ln_f.weight"], "transformer.ln_f.bias": params["ln_f.bias"],
           "lm_head.weight": params["tok.weight"] if cfg.tie_embeddings else params["head.weight"]}
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[f"{theirs}{b}.weight"] = params[f"{ours}{a}.weight"]
            out[f"{theirs}{b}.bias"] = params[f"{ours}{a}.bias"]
        for a, b in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"), ("fc", "mlp.c_fc"),
                     ("out", "mlp.c_proj")):
            w = params[f"{ours}{a}.weight"]
            out[f"{theirs}{b}.weight"] = w.t().contiguous()
            out[f"{theirs}{b}.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
    return out


@torch.no_grad()
def _write_gpt2(restored: Restored, folder: Path) -> float:
    """The built-in GPT as GPT2LMHeadModel, checked on a fixed input before it is written; returns the largest
    logit difference seen."""
    import transformers

    cfg, gpt = restored.cfg.model, restored.model
    eps = {m.eps for m in gpt.modules() if isinstance(m, nn.LayerNorm)}
    assert len(eps) == 1, "the GPT's layer norms differ in eps: revisit the GPT-2 mapping"
    with torch.random.fork_rng(devices=[]):
        hf = transformers.GPT2LMHeadModel(gpt2_config(cfg, eps.pop()))
    hf.load_state_dict(gpt2_state_dict(restored.params, cfg), strict=True)
    hf.eval()
    x = torch.randint(0, min(cfg.vocab_size, 256), (2, min(cfg.seq_len, 64)),
                      generator=torch.Generator().manual_seed(0))
    ours, theirs = gpt(x), hf(input_ids=x).logits
    diff = float((ours - theirs).abs().max())
    if not torch.allclose(theirs, ours, rtol=HF_RTOL, atol=HF_ATOL):
        raise ValueError(f"the built-in GPT does not map exactly onto GPT2LMHeadModel with transformers "
                         f"{transformers.__version__} (logits differ by up to {diff:.3g}): export as format "
                         "safetensors instead")
    with _quiet_transformers():
        hf.save_pretrained(str(folder))
    _write_json(folder / "gradnode.json", {"tokens": TOKENS, "architecture": "gradnode GPT as GPT2LMHeadModel "
                                           "(zero biases)", "max_logit_diff": diff, **provenance(restored)})
    return diff
