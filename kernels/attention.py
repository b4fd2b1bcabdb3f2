"""GPT-OSS attention pieces as a few launches, so a decode layer is not forty small torch kernels.

  rope_kv_write    qkv rows [B*T, (Hq + 2 Hkv) d] -> rotated q [B, T, Hq, d], and rotated k / plain v written
                   into the KV cache at each token's position (one program per token and head)
  qkv_rope_kv_write  the qkv projection (bf16 GEMV, a few rows) with rope_kv_write in its epilogue: one launch
  attention_sinks  flash-style attention of q over the cache: causal, optional sliding window, each query
                   head reading the kv head kv_map[h], and a per-head sink logit that joins the softmax
                   denominator only (GPT-OSS); scores and softmax in fp32, P rounded to bf16 for the PV dot.
                   One query per sequence (decode) takes a split-keys path instead (all fp32), whose last
                   split of each head merges the head

Positions come from a device tensor and the key loop bounds from the positions the program loads, so both are
graph-capturable and a decode step reads only the keys it can see (the window, or 0..pos).
"""

from __future__ import annotations

import math

import torch

from ._triton import pdl_enter, pdl_launch, tl, triton
from .decode import tc_dot
from .formats import _check_tensor
from .linear_bf16 import MAX_ROWS, fits, gemv_rows
from .sync import scratch

PAIRS = ("half", "consecutive")
#: decode attention: each head's last split merges the head while the split launch has at most this many
#: programs (batch x q heads x splits), else a merge launch follows. Measured on the H200 (gpt-oss-120b decode
#: graph, .device/decode_flags.py): 576 programs (one sequence) 30-42 us a step faster, 2304 (four) 35 us and
#: 4608 (eight) 73 us slower:
#: each program's release (a fence, then the atomic) lengthens every wave, the launch it saves is paid once.
MERGE_MAX_PROGRAMS = 1024


@triton.jit
def _pair_offsets(i, D: tl.constexpr, HALF_PAIRS: tl.constexpr):
    """Offsets in a head of the elements RoPE pair i rotates: (i, i + d/2), or (2i, 2i + 1) (the consecutive-pairs
    bug)."""
    if HALF_PAIRS:
        return i, i + D // 2
    else:
        return 2 * i, 2 * i + 1


@triton.jit
def _store_rope_pair(x1, x2, row, b, pos, h, i, o1, o2, mask, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, HQ, HKV, S,
                     D: tl.constexpr):
    """Pair i (offsets o1, o2) of head h of token row `row` (sequence b, position pos), its two bf16 projection
    values as fp32 x1, x2: rotated into q (q heads) or into the k cache (k heads), copied into the v cache (v
    heads). Shared by _rope_kv_kernel (a vector of pairs of one row) and _qkv_rope_kernel (one pair of rows)."""
    if h < HQ + HKV:
        c = tl.load(cos_ptr + pos * (D // 2) + i, mask=mask)
        s = tl.load(sin_ptr + pos * (D // 2) + i, mask=mask)
        y1 = (x1 * c - x2 * s).to(tl.bfloat16)
        y2 = (x2 * c + x1 * s).to(tl.bfloat16)
        if h < HQ:
            dst = q_ptr + (row.to(tl.int64) * HQ + h) * D
        else:
            dst = k_ptr + ((b * S + pos) * HKV + (h - HQ)).to(tl.int64) * D
    else:
        y1 = x1.to(tl.bfloat16)
        y2 = x2.to(tl.bfloat16)
        dst = v_ptr + ((b * S + pos) * HKV + (h - HQ - HKV)).to(tl.int64) * D
    tl.store(dst + o1, y1, mask=mask)
    tl.store(dst + o2, y2, mask=mask)


@triton.jit
def _rope_kv_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, T, HQ, HKV, S,
                    D: tl.constexpr, HALF_PAIRS: tl.constexpr):
    pdl_enter()
    row = tl.program_id(0)  # b * T + t
    h = tl.program_id(1)  # 0..HQ-1 q heads, then HKV k heads, then HKV v heads
    pos = tl.load(pos_ptr + row % T)
    src = qkv_ptr + row.to(tl.int64) * (HQ + 2 * HKV) * D + h * D
    i = tl.arange(0, D // 2)
    o1, o2 = _pair_offsets(i, D, HALF_PAIRS)
    x1 = tl.load(src + o1).to(tl.float32)
    x2 = tl.load(src + o2).to(tl.float32)
    _store_rope_pair(x1, x2, row, row // T, pos, h, i, o1, o2, None, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, HQ,
                     HKV, S, D)


@triton.jit
def _qkv_rope_kernel(x_ptr, w_ptr, b_ptr, pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, M, T, K, HQ, HKV, S,
                     D: tl.constexpr, HALF_PAIRS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """Program p: the two qkv rows RoPE rotates together (head p // (D/2), pair p % (D/2)) through
    kernels.linear_bf16.gemv_rows, rounded to bf16 as the projection's output, then _store_rope_pair for
    every token row."""
    p = tl.program_id(0)
    h = p // (D // 2)
    i = p % (D // 2)
    o1, o2 = _pair_offsets(i, D, HALF_PAIRS)
    two = tl.arange(0, 2)
    rn = h * D + tl.where(two == 0, o1, o2)
    y = gemv_rows(x_ptr, w_ptr, rn, M, K, BLOCK_M, BLOCK_K)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn).to(tl.float32)[None, :]
    x1, x2 = tl.split(y.to(tl.bfloat16).to(tl.float32))  # the projection's bf16 output, as rope_kv_write reads it
    rm = tl.arange(0, BLOCK_M)
    mmask = rm < M
    pos = tl.load(pos_ptr + rm % T, mask=mmask, other=0)
    _store_rope_pair(x1, x2, rm, rm // T, pos, h, i, o1, o2, mmask, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, HQ, HKV,
                     S, D)


def qkv_rope_kv_write(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, positions: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      q_heads: int, *, pairs: str = "half", block_k: int = 1024, num_warps: int = 2) -> torch.Tensor:
    """rope_kv_write(x @ w^T + b) in one launch for a few rows: x [B, T, H] bf16 (B * T <= linear_bf16.MAX_ROWS),
    w [(Hq + 2 Hkv) d, H] bf16. Each program streams the two weight rows that RoPE pairs (kernels.linear_bf16's
    GEMV with block_n=2, block_k, num_warps) and rotates them in its epilogue, so the projection's output never
    goes through memory and the decode step has a launch fewer. Same bits as gemv_bf16(block_n=2, block_k,
    num_warps) followed by rope_kv_write. Returns q [B, T, Hq, d] bf16."""
    if pairs not in PAIRS:
        raise ValueError(f"pairs must be one of {PAIRS}, got {pairs!r}")
    _check_tensor("x", x, (torch.bfloat16,))
    _check_tensor("w", w, (torch.bfloat16,))
    B, T, H = x.shape
    _, S, HKV, D = k_cache.shape
    if w.dim() != 2 or tuple(w.shape) != ((q_heads + 2 * HKV) * D, H):
        raise ValueError(f"w must be [{(q_heads + 2 * HKV) * D}, {H}] for {q_heads} q heads and a cache of "
                         f"{tuple(k_cache.shape)}, got {tuple(w.shape)}")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise ValueError(f"b must have shape ({w.shape[0]},), got {tuple(b.shape)}")
    if B * T > MAX_ROWS:
        raise ValueError(f"qkv_rope_kv_write takes at most {MAX_ROWS} rows, got {B * T}: use a GEMM and rope_kv_write")
    if D & (D - 1) or D < 2 or k_cache.shape != v_cache.shape or k_cache.shape[0] != B:
        raise ValueError(f"caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not match x {tuple(x.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    if not fits(B * T, 2, block_k, num_warps):
        raise ValueError(f"block_k={block_k} partial sums for {B * T} rows do not fit {num_warps} warps")
    q = torch.empty((B, T, q_heads, D), device=x.device, dtype=torch.bfloat16)
    if B * T:
        _qkv_rope_kernel[((q_heads + 2 * HKV) * D // 2,)](
            x.contiguous(), w.contiguous(), b if b is not None else w, positions, cos, sin, q, k_cache, v_cache,
            B * T, T, H, q_heads, HKV, S, D=D, HALF_PAIRS=pairs == "half", HAS_BIAS=b is not None,
            BLOCK_M=triton.next_power_of_2(B * T), BLOCK_K=block_k, num_warps=num_warps, **pdl_launch())
    return q


def rope_kv_write(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, q_heads: int, *, pairs: str = "half") -> torch.Tensor:
    """Rotate q and k of qkv [B, T, (Hq + 2 Hkv) d] (bf16) at `positions` [T] (int64, device) with RoPE tables
    cos/sin [max_len, d/2] fp32; write k and v into k_cache/v_cache [B, S, Hkv, d] (bf16, in place) and return
    q [B, T, Hq, d] bf16. pairs: "half" (GPT-OSS) or "consecutive" (the fault)."""
    if pairs not in PAIRS:
        raise ValueError(f"pairs must be one of {PAIRS}, got {pairs!r}")
    _check_tensor("qkv", qkv, (torch.bfloat16,))
    B, T, W = qkv.shape
    _, S, HKV, D = k_cache.shape
    if W != (q_heads + 2 * HKV) * D or k_cache.shape != v_cache.shape or k_cache.shape[0] != B:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not match {q_heads} q heads and a cache of "
                         f"{tuple(k_cache.shape)}")
    if D & (D - 1) or D < 2:
        raise ValueError(f"head_dim must be a power of two, got {D}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    q = torch.empty((B, T, q_heads, D), device=qkv.device, dtype=torch.bfloat16)
    if B * T:
        _rope_kv_kernel[(B * T, q_heads + 2 * HKV)](qkv.contiguous(), positions, cos, sin, q, k_cache, v_cache, T,
                                                    q_heads, HKV, S, D=D, HALF_PAIRS=pairs == "half", num_warps=1,
                                                    **pdl_launch())
    return q


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, kvmap_ptr, sink_ptr, o_ptr, T, HQ, HKV, S, window, sm_scale,
                      D: tl.constexpr, HAS_SINKS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr):
    pid_t = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    kvh = tl.load(kvmap_ptr + h)
    rt = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = rt < T
    rd = tl.arange(0, D)
    pos = tl.load(pos_ptr + rt, mask=tmask, other=0)
    q = tl.load(q_ptr + ((b * T + rt[:, None]) * HQ + h).to(tl.int64) * D + rd[None, :], mask=tmask[:, None],
                other=0.0)
    hi = tl.minimum(tl.max(pos, axis=0) + 1, S)
    first = tl.maximum(tl.min(tl.where(tmask, pos, S), axis=0) - window + 1, 0)  # oldest key in the window
    lo = tl.where(window > 0, (first // BLOCK_S) * BLOCK_S, 0)
    m = tl.full((BLOCK_T,), -1e30, tl.float32)  # finite, so fully masked blocks give exp(-inf) = 0, not NaN
    den = tl.zeros((BLOCK_T,), tl.float32)
    acc = tl.zeros((BLOCK_T, D), tl.float32)
    kv_base = (b * S * HKV + kvh).to(tl.int64) * D
    for s0 in range(lo, hi, BLOCK_S):
        rs = s0 + tl.arange(0, BLOCK_S)
        smask = rs < hi
        kp = kv_base + (rs[:, None] * HKV).to(tl.int64) * D + rd[None, :]
        k = tl.load(k_ptr + kp, mask=smask[:, None], other=0.0)
        sc = tc_dot(q, tl.trans(k), tl.zeros((BLOCK_T, BLOCK_S), tl.float32)) * sm_scale
        ok = smask[None, :] & (rs[None, :] <= pos[:, None]) & ((window == 0) | (rs[None, :] > pos[:, None] - window))
        sc = tl.where(ok, sc, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, axis=1))
        p = tl.exp(sc - m_new[:, None])
        corr = tl.exp(m - m_new)
        den = den * corr + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kp, mask=smask[:, None], other=0.0)
        acc = tc_dot(p.to(tl.bfloat16), v, acc * corr[:, None])
        m = m_new
    if HAS_SINKS:
        sink = tl.load(sink_ptr + h).to(tl.float32)
        m_new = tl.maximum(m, sink)
        corr = tl.exp(m - m_new)
        den = den * corr + tl.exp(sink - m_new)
        acc = acc * corr[:, None]
    out = acc / den[:, None]
    tl.store(o_ptr + ((b * T + rt[:, None]) * HQ + h).to(tl.int64) * D + rd[None, :], out.to(tl.bfloat16),
             mask=tmask[:, None])


@triton.jit
def _attention_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, kvmap_ptr, part_ptr, ml_ptr, ctr_ptr, sink_ptr, o_ptr, HQ,
                            HKV, S, window, sm_scale, NSPLIT, D: tl.constexpr, SPLIT: tl.constexpr,
                            BLOCK_S: tl.constexpr, MERGE: tl.constexpr, HAS_SINKS: tl.constexpr,
                            BLOCK_P: tl.constexpr):
    """Decode (one query per sequence): program (b * HQ + h, split) folds keys [split * SPLIT, + SPLIT) that the
    query can see into an unnormalized partial (acc [D], running max, denominator).

    One-block splits load their older keys and values before the PDL wait: the position and the cache rows
    before it were written in earlier steps; only q and the newest row (rope_kv_write, the launch before)
    are read after it.

    MERGE: each program then counts itself on its head's counter (ctr_ptr[b * HQ + h], counting on from call
    to call: kernels.sync's add_partial pattern), and the head's last split merges the head's partials, so
    the merge costs no launch of its own."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    b = bh // HQ
    kvh = tl.load(kvmap_ptr + bh % HQ)
    pos = tl.load(pos_ptr)
    hi = tl.minimum(tl.minimum(pos + 1, S), sp * SPLIT + SPLIT)
    lo = tl.maximum(sp * SPLIT, tl.where(window > 0, pos - window + 1, 0))
    rd = tl.arange(0, D)
    kv_base = (b * S * HKV + kvh).to(tl.int64) * D
    if SPLIT == BLOCK_S:  # one block: K and V of the split in the same load round, no loop
        rs = sp * SPLIT + tl.arange(0, BLOCK_S)
        ok = (rs >= lo) & (rs < hi)
        kp = kv_base + (rs[:, None] * HKV).to(tl.int64) * D + rd[None, :]
        old = (ok & (rs != pos))[:, None]
        k = tl.load(k_ptr + kp, mask=old, other=0.0)
        v = tl.load(v_ptr + kp, mask=old, other=0.0)
        pdl_enter()
        q = tl.load(q_ptr + bh.to(tl.int64) * D + rd).to(tl.float32) * sm_scale
        new = (ok & (rs == pos))[:, None]
        k = tl.where(new, tl.load(k_ptr + kp, mask=new, other=0.0), k).to(tl.float32)
        v = tl.where(new, tl.load(v_ptr + kp, mask=new, other=0.0), v).to(tl.float32)
        sc = tl.where(ok, tl.sum(k * q[None, :], axis=1), float("-inf"))
        m = tl.maximum(tl.max(sc, axis=0), -1e30)  # finite: an empty split gives exp(-1e30) = 0 in the merge
        p = tl.exp(sc - m)
        acc = tl.sum(p[:, None] * v, axis=0)
        den = tl.sum(p, axis=0)
    else:
        pdl_enter()
        q = tl.load(q_ptr + bh.to(tl.int64) * D + rd).to(tl.float32) * sm_scale
        m = tl.max(tl.full((BLOCK_S,), -1e30, tl.float32), axis=0)
        den = tl.sum(tl.zeros((BLOCK_S,), tl.float32), axis=0)
        acc = tl.zeros((D,), tl.float32)
        for s0 in range(lo, hi, BLOCK_S):
            rs = s0 + tl.arange(0, BLOCK_S)
            smask = rs < hi
            kp = kv_base + (rs[:, None] * HKV).to(tl.int64) * D + rd[None, :]
            k = tl.load(k_ptr + kp, mask=smask[:, None], other=0.0).to(tl.float32)
            v = tl.load(v_ptr + kp, mask=smask[:, None], other=0.0).to(tl.float32)
            sc = tl.where(smask, tl.sum(k * q[None, :], axis=1), float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, axis=0))
            p = tl.exp(sc - m_new)
            corr = tl.exp(m - m_new)
            acc = acc * corr + tl.sum(p[:, None] * v, axis=0)
            den = den * corr + tl.sum(p, axis=0)
            m = m_new
    part = bh.to(tl.int64) * NSPLIT + sp
    tl.store(part_ptr + part * D + rd, acc)
    tl.store(ml_ptr + part * 2, m)
    tl.store(ml_ptr + part * 2 + 1, den)
    if MERGE:
        tl.debug_barrier()  # every thread's stores before the release (kernels.sync.signal_count's pattern)
        done = tl.atomic_add(ctr_ptr + bh, 1, sem="acq_rel") + 1
        if done % NSPLIT == 0:
            _merge_head(part_ptr, ml_ptr, sink_ptr, o_ptr, bh, HQ, NSPLIT, D, HAS_SINKS, BLOCK_P)


@triton.jit
def _attention_merge_kernel(part_ptr, ml_ptr, sink_ptr, o_ptr, HQ, NSPLIT, D: tl.constexpr,
                            HAS_SINKS: tl.constexpr, BLOCK_P: tl.constexpr):
    """Program b * HQ + h: the softmax-weighted merge of its NSPLIT partials and the sink -> bf16 output."""
    pdl_enter()
    _merge_head(part_ptr, ml_ptr, sink_ptr, o_ptr, tl.program_id(0), HQ, NSPLIT, D, HAS_SINKS, BLOCK_P)


@triton.jit
def _merge_head(part_ptr, ml_ptr, sink_ptr, o_ptr, bh, HQ, NSPLIT, D: tl.constexpr, HAS_SINKS: tl.constexpr,
                BLOCK_P: tl.constexpr):
    """Head bh's NSPLIT partials and its sink -> its bf16 output. Loads bypass L1 (.cg): the partials were
    written by other programs, some maybe on this SM, into a buffer earlier calls used too."""
    rp = tl.arange(0, BLOCK_P)
    pm = rp < NSPLIT
    rd = tl.arange(0, D)
    base = bh.to(tl.int64) * NSPLIT
    m = tl.load(ml_ptr + (base + rp) * 2, mask=pm, other=-1e30, cache_modifier=".cg")
    den = tl.load(ml_ptr + (base + rp) * 2 + 1, mask=pm, other=0.0, cache_modifier=".cg")
    acc = tl.load(part_ptr + (base + rp)[:, None] * D + rd[None, :], mask=pm[:, None], other=0.0,
                  cache_modifier=".cg")
    top = tl.max(m, axis=0)
    if HAS_SINKS:
        sink = tl.load(sink_ptr + bh % HQ).to(tl.float32)
        top = tl.maximum(top, sink)
    w = tl.exp(m - top)
    total = tl.sum(den * w, axis=0)
    if HAS_SINKS:
        total += tl.exp(sink - top)
    out = tl.sum(acc * w[:, None], axis=0) / total
    tl.store(o_ptr + bh.to(tl.int64) * D + rd, out.to(tl.bfloat16))


def decode_split(S: int) -> int:
    """Keys per program of the decode path: 64, doubled until at most 64 programs cover a cache of S slots
    (so a long context stays at <= 64 partials per head for the merge)."""
    split = 64
    while triton.cdiv(S, split) > 64:
        split *= 2
    return split


def attention_sinks(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                    kv_map: torch.Tensor, sinks: torch.Tensor | None, *, window: int = 0,
                    block_t: int = 16, block_s: int = 64) -> torch.Tensor:
    """Attention of q [B, T, Hq, d] (bf16, rotated) at `positions` [T] over k_cache/v_cache [B, S, Hkv, d].

    Query head h reads kv head kv_map[h] ([Hq] int, device). Keys at positions <= the query's are visible
    (causal; later slots may hold stale entries and are never read), and with window > 0 only the last
    `window` of them. sinks [Hq] (or None) adds exp(sink) to each head's softmax denominator. -> [B, T, Hq, d] bf16.
    Under PDL the decode path (T == 1) reads `positions` and the cache rows before the position ahead of its
    wait for the previous kernel, so those must not be written by the launch just before (the row at the
    position may be: rope_kv_write's).
    """
    _check_tensor("q", q, (torch.bfloat16,))
    B, T, HQ, D = q.shape
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4 or k_cache.shape[0] != B or k_cache.shape[3] != D:
        raise ValueError(f"caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not match q {tuple(q.shape)}")
    if kv_map.numel() != HQ:
        raise ValueError(f"kv_map must have one entry per query head ({HQ}), got {kv_map.numel()}")
    if sinks is not None and sinks.numel() != HQ:
        raise ValueError(f"sinks must have one entry per query head ({HQ}), got {sinks.numel()}")
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    S, HKV = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    if T == 1 and B:
        _decode(q.contiguous(), k_cache, v_cache, positions, kv_map, sinks, out, window)
    elif B * T:
        _attention_kernel[(triton.cdiv(T, block_t), B * HQ)](
            q.contiguous(), k_cache, v_cache, positions, kv_map, sinks if sinks is not None else q, out, T, HQ, HKV, S,
            int(window), 1.0 / math.sqrt(D), D=D, HAS_SINKS=sinks is not None, BLOCK_T=block_t, BLOCK_S=block_s,
            num_warps=4)
    return out


def _decode(q, k_cache, v_cache, positions, kv_map, sinks, out, window: int) -> None:
    """One query per sequence: split the visible keys over programs (flash-decoding), then merge.

    The prefill kernel gives each head one program that walks every key in turn; at decode that is 64
    programs doing ~10 dependent steps each (7.7 us per layer on the H100 at 576 keys). Splitting the keys
    spreads the same reads over ~10x more programs, and each head's last split merges it (up to
    MERGE_MAX_PROGRAMS; else a merge launch follows). Splits past the query's position, or before its window,
    are skipped by the programs themselves (graph-safe). Every call adds nsplit to each head's counter, so
    calls share counters by nsplit (the scratch key): each counter stays a multiple of it between calls.
    """
    B, _, HQ, D = q.shape
    S, HKV = k_cache.shape[1], k_cache.shape[2]
    split = decode_split(S)
    nsplit = triton.cdiv(S, split)
    part = torch.empty((B * HQ * nsplit, D), device=q.device, dtype=torch.float32)
    ml = torch.empty((B * HQ * nsplit, 2), device=q.device, dtype=torch.float32)
    fused = B * HQ * nsplit <= MERGE_MAX_PROGRAMS
    ctr = scratch(q.device, ("attention_merge", nsplit), B * HQ) if fused else None
    sink_ptr = sinks if sinks is not None else q
    merge = dict(HAS_SINKS=sinks is not None, BLOCK_P=triton.next_power_of_2(nsplit))
    _attention_split_kernel[(B * HQ, nsplit)](q, k_cache, v_cache, positions, kv_map, part, ml, ctr, sink_ptr, out,
                                              HQ, HKV, S, int(window), 1.0 / math.sqrt(D), nsplit, D=D, SPLIT=split,
                                              BLOCK_S=min(split, 64), MERGE=fused, **merge, num_warps=4,
                                              **pdl_launch())
    if not fused:  # 4 warps like the split kernel: the same reduction layouts, so the same bits either way
        _attention_merge_kernel[(B * HQ,)](part, ml, sink_ptr, out, HQ, nsplit, D=D, **merge, num_warps=4,
                                           **pdl_launch())
