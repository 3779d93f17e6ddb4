"""Models: a small built-in GPT (nanoGPT-like, pre-LayerNorm) and Hugging Face causal LMs from a config.

Every model built here maps token ids ``(B, T)`` to logits ``(B, T, V)``. Weights are always
randomly initialised from ``torch.manual_seed`` state; nothing is ever downloaded.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradnode.node.config import ModelConfig

log = logging.getLogger(__name__)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, d_ff, bias=False)
        self.out = nn.Linear(d_ff, d_model, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    """Decoder-only transformer with learned positions and (optionally) tied input/output embeddings."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.seq_len = cfg.seq_len
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_head, d_ff, cfg.dropout) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok.weight
        self.apply(self._init)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "out.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        t = idx.shape[1]
        assert t <= self.seq_len, f"sequence of {t} tokens exceeds model.seq_len={self.seq_len}"
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class HFCausalLM(nn.Module):
    """A transformers causal LM built from a local or cached config, random init, returning logits."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        try:
            import transformers
        except ImportError:
            raise ValueError("model.kind='hf' needs the optional extra: pip install 'gradnode[hf]'") from None
        try:
            hf_cfg = transformers.AutoConfig.from_pretrained(cfg.hf_config, local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(f"model.hf_config: cannot load transformers config {cfg.hf_config!r} "
                             f"from disk or cache (nothing is downloaded): {err}") from None
        if getattr(hf_cfg, "vocab_size", cfg.vocab_size) < 256:
            raise ValueError("model.hf_config: vocab_size must be >= 256 for the byte-level corpus")
        self.seq_len = cfg.seq_len
        self.inner = transformers.AutoModelForCausalLM.from_config(hf_cfg)

    def forward(self, idx: Tensor) -> Tensor:
        return self.inner(input_ids=idx, use_cache=False).logits


def build_model(cfg: ModelConfig, seed: int) -> nn.Module:
    """The model named by ``cfg``, initialised from ``seed`` (identical on every peer of a run)."""
    if cfg.vocab_size < 256:
        raise ValueError(f"model.vocab_size ({cfg.vocab_size}) must be >= 256: the corpus is byte-level")
    torch.manual_seed(seed)
    model = GPT(cfg) if cfg.kind == "gpt" else HFCausalLM(cfg)
    log.info("model built kind=%s params=%d", cfg.kind, count_params(model))
    return model


def count_params(model: nn.Module) -> int:
    """Trainable parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def gpt_param_count(cfg: ModelConfig) -> int:
    """Closed-form parameter count of the built-in GPT (used to size presets without building them)."""
    d, v, t, n = cfg.d_model, cfg.vocab_size, cfg.seq_len, cfg.n_layer
    d_ff = cfg.d_ff or 4 * d
    per_block = 4 * d + 3 * d * d + d * d + 2 * d * d_ff  # two LayerNorms, qkv, proj, MLP
    head = 0 if cfg.tie_embeddings else v * d
    return v * d + t * d + n * per_block + 2 * d + head
