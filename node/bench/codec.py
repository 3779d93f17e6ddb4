"""`gradnode bench codec`: compression ratio and speed of the update codec on a real pseudo-gradient.

The pseudo-gradient comes from real AdamW steps of the built-in GPT on the byte-level stdlib corpus
(sized to about --params parameters), so magnitudes, correlations and tensor shapes are those the codec
meets in training. Every speed is the best of several repeats, measured in the same run next to a
plain tensor copy and a naive reference encoder (torch.topk per chunk, per-tensor affine 2-bit values,
12-bit packed indices), so the figures can be compared on any machine. The native encoder
(gradnode.node.train.native) runs when it builds here: on CPU, and on CUDA after one copy of the update to the
host (backend 'host+native'); `encode_gbps_torch` is the pure-torch path on the same device and input (same
bytes), so the speed-up stays visible.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from gradnode.node.train import native
from gradnode.node.config import DataConfig, ModelConfig
from gradnode.protocol import CodecParams, decode_update, encode_update
from gradnode.protocol.chunking import layout
from gradnode.protocol.codec import cpu_kernel, set_cpu_kernel

log = logging.getLogger(__name__)


def model_config_for(n_params: int, seq_len: int = 64) -> ModelConfig:
    """A GPT of about n_params parameters: 6 layers, width a multiple of 64 (4 layers when tiny)."""
    from gradnode.node.train.model import gpt_param_count

    n_layer = 6 if n_params >= 2_000_000 else 2
    d = 64
    while True:
        cfg = ModelConfig(n_layer=n_layer, n_head=max(1, (d + 64) // 64), d_model=d + 64, seq_len=seq_len)
        if gpt_param_count(cfg) > n_params:
            break
        d += 64
    return ModelConfig(n_layer=n_layer, n_head=max(1, d // 64), d_model=d, seq_len=seq_len)


def pseudo_gradient(n_params: int, steps: int, device: torch.device, seed: int = 0) -> dict[str, Tensor]:
    """start - local after `steps` AdamW steps (after two warm-up steps) on the stdlib corpus."""
    from gradnode.node.train.data import Batches, load_corpus
    from gradnode.node.train.model import build_model

    cfg = model_config_for(n_params)
    model = build_model(cfg, seed).to(device)
    batches = Batches(load_corpus(DataConfig(max_bytes=8 << 20)), cfg.seq_len, 8, "bench-codec", seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

    def step(i: int) -> None:
        x, y = batches.train(0, i)
        logits = model(x.to(device))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.to(device).flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for i in range(2):
        step(i)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    for i in range(2, 2 + steps):
        step(i)
    return {n: (start[n] - p.detach()).contiguous() for n, p in model.named_parameters()}


def reference_encode(update: dict[str, Tensor], chunk: int = 4096, k: int = 64) -> bytes:
    """Naive SparseLoCo encoder: torch.topk per chunk, per-tensor affine 2-bit values, 12-bit indices."""
    side = math.isqrt(chunk)
    out = []
    for t in update.values():
        if t.dim() == 2 and t.shape[0] % side == 0 and t.shape[1] % side == 0:
            r, c = t.shape
            chunks = t.reshape(r // side, side, c // side, side).permute(0, 2, 1, 3).reshape(-1, chunk)
        else:
            flat = t.reshape(-1)
            chunks = torch.nn.functional.pad(flat, (0, (-flat.numel()) % chunk)).view(-1, chunk)
        idx = chunks.abs().topk(min(k, chunks.shape[1]), dim=1).indices
        vals = chunks.gather(1, idx).reshape(-1)
        lo, hi = vals.min(), vals.max()
        scale = (hi - lo).clamp(min=1e-30) / 3
        codes = ((vals - lo) / scale).round().clamp(0, 3).to(torch.int64)
        codes = torch.nn.functional.pad(codes, (0, (-codes.numel()) % 4)).view(-1, 4)
        packed_vals = (codes << torch.tensor([0, 2, 4, 6], device=codes.device)).sum(1).to(torch.uint8)
        ids = idx.reshape(-1)
        ids = torch.nn.functional.pad(ids, (0, ids.numel() % 2)).view(-1, 2)
        word = ids[:, 0] | (ids[:, 1] << 12)
        packed_ids = ((word.unsqueeze(1) >> torch.tensor([0, 8, 16], device=word.device)) & 0xFF).to(torch.uint8)
        out += [torch.stack([lo, scale]).cpu().numpy().tobytes(), packed_vals.cpu().numpy().tobytes(),
                packed_ids.cpu().numpy().tobytes()]
    return b"".join(out)


def _best(fn: Callable[[], Any], repeats: int, device: torch.device) -> tuple[float, Any]:
    best, result = math.inf, None
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, result


def run(n_params: int = 20_000_000, device: str = "cpu", steps: int = 4, repeats: int = 7,
        threads: int = 0) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    native.install()
    t0 = time.perf_counter()
    update = pseudo_gradient(n_params, steps, dev)
    train_s = time.perf_counter() - t0
    numel = sum(t.numel() for t in update.values())
    fp32_bytes = 4 * numel

    def gbps(seconds: float) -> float:
        return fp32_bytes / seconds / 1e9

    dst = {n: torch.empty_like(t) for n, t in update.items()}
    memcpy_s, _ = _best(lambda: [dst[n].copy_(t) for n, t in update.items()], repeats, dev)
    clone_s, _ = _best(lambda: [t.clone() for t in update.values()], repeats, dev)
    ratios, payloads, timings = {}, {}, {}
    for coding in ("packed12", "rice"):
        params = CodecParams(index_coding=coding)
        enc_s, payload = _best(lambda: encode_update(update, params=params, run_id="bench", sender="bench"),
                               repeats, dev)
        dec_s, decoded = _best(lambda: decode_update(payload, device=dev), repeats, dev)
        payloads[coding], ratios[coding] = payload, fp32_bytes / len(payload)
        timings[coding] = (enc_s, dec_s, decoded)
    ref_s, ref_payload = _best(lambda: reference_encode(update), repeats, dev)
    best_coding = max(ratios, key=ratios.get)
    enc_s, dec_s, decoded = timings[best_coding]
    # on CUDA the native kernel takes the update in one copy to the host (node/train/native.py)
    native_kernel = cpu_kernel()
    backend = "torch" if native_kernel is None or dev.type not in native_kernel.devices else \
        "native" if dev.type == "cpu" else "host+native"
    torch_s = enc_s
    if backend != "torch":
        params = CodecParams(index_coding=best_coding)
        kernel = set_cpu_kernel(None)
        try:
            torch_s, torch_payload = _best(lambda: encode_update(update, params=params, run_id="bench",
                                                                 sender="bench"), repeats, dev)
        finally:
            set_cpu_kernel(kernel)
        assert torch_payload == payloads[best_coding], "native and torch encoders disagree"
    num = den = 0.0
    for name, t in update.items():
        topk_only = t.float() * decoded.masks[name]
        num += float((decoded.tensors[name] - topk_only).double().square().sum())
        den += float(topk_only.double().square().sum())
    info_bits = sum(g.n_chunks * (math.log2(math.comb(g.chunk_numel, min(64, g.chunk_numel)))
                                  + 2 * min(64, g.chunk_numel))
                    for t in update.values() for g in layout(tuple(t.shape), 4096))
    return {
        "params": numel,
        "tensors": len(update),
        "device": str(dev),
        "threads": torch.get_num_threads(),
        "train_steps": steps,
        "train_s": round(train_s, 2),
        "codec": {"chunk": 4096, "topk": 64, "bits": 2, "best_coding": best_coding},
        "payload_bytes": {c: len(p) for c, p in payloads.items()},
        "reference_payload_bytes": len(ref_payload),
        "ratio_fp32": {c: round(r, 2) for c, r in ratios.items()},
        "best_ratio_fp32": round(ratios[best_coding], 2),
        "info_limit_ratio_fp32": round(8 * fp32_bytes / info_bits, 2),
        "bits_per_param": round(8 * len(payloads[best_coding]) / numel, 4),
        "backend": backend,
        "encode_gbps": round(gbps(enc_s), 3),
        "encode_gbps_torch": round(gbps(torch_s), 3),
        "decode_gbps": round(gbps(dec_s), 3),
        "encode_gbps_per_coding": {c: round(gbps(v[0]), 3) for c, v in timings.items()},
        "decode_gbps_per_coding": {c: round(gbps(v[1]), 3) for c, v in timings.items()},
        "memcpy_gbps": round(gbps(memcpy_s), 3),
        "clone_gbps": round(gbps(clone_s), 3),
        "reference_encode_gbps": round(gbps(ref_s), 3),
        "encode_vs_memcpy": round(memcpy_s / enc_s, 3),
        "encode_vs_reference": round(ref_s / enc_s, 2),
        "encode_vs_torch": round(torch_s / enc_s, 2),
        "rel_error": round(math.sqrt(num / max(den, 1e-300)), 4),
        "repeats": repeats,
    }


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"codec on a real pseudo-gradient: {result['params']:,} params, {result['tensors']} tensors, "
                        f"{result['device']}, {result['threads']} threads")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("goal", justify="right")
    rows = [
        ("ratio vs fp32, packed12", f"{result['ratio_fp32']['packed12']:.1f}x", "~146x"),
        ("ratio vs fp32, rice", f"{result['ratio_fp32']['rice']:.1f}x", ">= 200x"),
        ("information limit", f"{result['info_limit_ratio_fp32']:.1f}x", ""),
        ("bits per parameter", f"{result['bits_per_param']:.4f}", ""),
        (f"encode GB/s (fp32 input, {result['backend']})", f"{result['encode_gbps']:.3f}",
         ">= reference, >= 0.25 memcpy"),
        ("encode GB/s, torch path", f"{result['encode_gbps_torch']:.3f}", ""),
        ("decode GB/s", f"{result['decode_gbps']:.3f}", ""),
        ("reference encode GB/s", f"{result['reference_encode_gbps']:.3f}", ""),
        ("memcpy GB/s (copy_ into buffer)", f"{result['memcpy_gbps']:.3f}", ""),
        ("clone GB/s (alloc + copy)", f"{result['clone_gbps']:.3f}", ""),
        ("encode / memcpy", f"{result['encode_vs_memcpy']:.3f}", ">= 0.25"),
        ("rel. L2 error vs top-k only", f"{result['rel_error']:.4f}", ""),
    ]
    for row in rows:
        table.add_row(*row)
    Console().print(table)
