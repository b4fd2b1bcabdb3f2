"""GPT-OSS attention: qkv with bias, half-split YaRN RoPE, GQA, sinks, sliding window, KV cache.

`attention` is the torch reference; `attention_kernels` computes the same with the lab's kernels: at
decode-sized row counts the qkv projection with RoPE and the cache writes in one launch
(kernels.qkv_rope_kv_write), attention (kernels.attention_sinks) and the out projection through the lab's
bf16 GEMV (kernels.linear_bf16); else cuBLAS projections around kernels.rope_kv_write.

Static shapes throughout: queries attend over the whole preallocated cache with a mask built on the device
from the position tensor, so a decode step has no host sync and can be captured in a CUDA graph. Scores
and softmax are fp32; each head's sink logit joins the softmax as an extra column and is dropped after.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels import attention_sinks, qkv_rope_kv_write, rope_kv_write
from kernels.linear_bf16 import MAX_ROWS, gemv_bf16, pick

from .cache import KVCache
from .config import ModelConfig
from .rope import apply_rope
from .weights import LayerWeights


def kv_head_map(config: ModelConfig) -> torch.Tensor:
    """kv head read by each query head: h // (q_heads / kv_heads), or h % kv_heads under fault gqa_mod."""
    h = torch.arange(config.q_heads)
    return h % config.kv_heads if "gqa_mod" in config.faults else h // config.group


def attention(x: torch.Tensor, lw: LayerWeights, config: ModelConfig, layer: int, cache: KVCache,
              positions: torch.Tensor, kv_map: torch.Tensor) -> torch.Tensor:
    """Attention output (before the residual add) for normed x [B, T, H]; writes k, v at `positions`.

    positions: [T] int64 device tensor (cache.pos + arange(T)).
    """
    B, T, _ = x.shape
    c = config
    qkv = F.linear(x, lw.qkv_w, lw.qkv_b)
    q, k, v = qkv.split([c.q_heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], dim=-1)
    q = q.reshape(B, T, c.q_heads, c.head_dim)
    k = k.reshape(B, T, c.kv_heads, c.head_dim)
    v = v.reshape(B, T, c.kv_heads, c.head_dim)
    pairs = "consecutive" if "rope_pairs" in c.faults else "half"
    cos, sin = cache.cos.index_select(0, positions), cache.sin.index_select(0, positions)
    q, k = apply_rope(q, cos, sin, pairs=pairs), apply_rope(k, cos, sin, pairs=pairs)

    cache.k[layer].index_copy_(1, positions, k.to(cache.k.dtype))
    cache.v[layer].index_copy_(1, positions, v.to(cache.v.dtype))
    keys = cache.k[layer].index_select(2, kv_map)  # [B, S, Hq, d]: each query head's kv head
    values = cache.v[layer].index_select(2, kv_map)

    S = cache.max_len
    key_pos = torch.arange(S, device=x.device)
    allowed = key_pos[None, :] <= positions[:, None]  # causal; unwritten slots lie in the future
    window = c.window(layer)
    if window:
        allowed = allowed & (key_pos[None, :] > positions[:, None] - window)
    scores = torch.einsum("bthd,bshd->bhts", q.to(torch.float32), keys.to(torch.float32))
    scores = (scores * (1.0 / math.sqrt(c.head_dim))).masked_fill(~allowed, float("-inf"))
    if "sinks_dropped" not in c.faults:
        sinks = lw.sinks.to(torch.float32).view(1, c.q_heads, 1, 1).expand(B, c.q_heads, T, 1)
        scores = torch.cat((scores, sinks), dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., :S]
    out = torch.einsum("bhts,bshd->bthd", probs, values.to(torch.float32))
    out = out.reshape(B, T, c.q_heads * c.head_dim).to(x.dtype)
    return F.linear(out, lw.out_w, lw.out_b)


#: where the lab's GEMV takes the qkv projection (kernels.linear_bf16.pick), its epilogue does RoPE and the
#: cache writes (kernels.qkv_rope_kv_write: a launch fewer); else the projection, then rope_kv_write
QKV_ROPE = True


def project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The bf16 projections of the kernel backend: the lab's GEMV where kernels.linear_bf16.pick measured it
    faster (decode row counts), else cuBLAS."""
    rows = x.numel() // x.shape[-1]
    cfg = pick(rows, *w.shape) if rows <= MAX_ROWS else None
    return gemv_bf16(x, w, b, **cfg) if cfg else F.linear(x, w, b)


def attention_kernels(x: torch.Tensor, lw: LayerWeights, config: ModelConfig, layer: int, cache: KVCache,
                      positions: torch.Tensor, kv_map: torch.Tensor) -> torch.Tensor:
    """`attention` through the lab's kernels (see the module docstring; same faults, same numbers up to the bf16
    rounding of the softmax probabilities before the PV product)."""
    B, T, _ = x.shape
    c = config
    k_cache, v_cache = cache.k[layer], cache.v[layer]
    pairs = "consecutive" if "rope_pairs" in c.faults else "half"
    cfg = pick(B * T, *lw.qkv_w.shape) if B * T <= MAX_ROWS else None
    if cfg and QKV_ROPE:
        q = qkv_rope_kv_write(x, lw.qkv_w, lw.qkv_b, positions, cache.cos, cache.sin, k_cache, v_cache, c.q_heads,
                              pairs=pairs, block_k=cfg["block_k"], num_warps=cfg["num_warps"])
    else:
        qkv = project(x, lw.qkv_w, lw.qkv_b)
        q = rope_kv_write(qkv, positions, cache.cos, cache.sin, k_cache, v_cache, c.q_heads, pairs=pairs)
    sinks = None if "sinks_dropped" in c.faults else lw.sinks
    out = attention_sinks(q, k_cache, v_cache, positions, kv_map, sinks, window=c.window(layer) or 0)
    return project(out.reshape(B, T, c.q_heads * c.head_dim), lw.out_w, lw.out_b)
