"""GPT-OSS MoE layer with MXFP4 experts: x[T, H] -> [T, H] (router excluded), three launches:

  mlp1      per expert: rows x[token(slot)] of its slots (expert-sorted order) times W1[e]^T + b1[e], then the
            GPT-OSS SwiGLU on interleaved gate/linear columns -> act[position, I] (bf16)
  mlp2      per expert: act rows times W2[e]^T + b2[e], times the slot's gate weight -> y[position, H] (bf16)
  combine   out[t] = sum over the token's k slots of y[inverse[slot]]

Both GEMM launches have a grid fixed by T, k, E and the tile shape; programs whose expert has no tokens
exit at once, so any routing (zero-token experts, duplicates, everything on one expert) runs under one
captured graph without a host sync. The decode variants give every expert-sorted position a row of programs
and each BLOCK_M chunk of an expert's positions its own program (see _program_rows): one token launches 4
rows of programs, not 128, and a hot expert's tokens are spread out instead of looped over.

Variants (VARIANTS, kind "moe"):
  moe_gemv  decode: grid (sorted position, N tile); each program streams its expert's weight tile once for
            BLOCK_M of its tokens. CUDA cores, exact for every scale byte.
  moe_h2    moe_gemv's structure with gemv_h2's packed half2 FMAs: x goes to fp16 first (x_to_f16, one
            small launch) and mlp1 stores the SwiGLU output as scaled fp16 in the same permuted order, so
            mlp2 reads it directly. Exact for scale bytes 0..253.
  moe_h2g   moe_h2 with gemv_h2g's K loop (plane-major fp16 activations, half2 sums per block). (Its mlp2 per
            token over the token's k experts with the combine fused, COMBINE, was about twice as slow on the
            H100, each program streaming k weight tiles in a row, and was removed in stop 76.)
  moe_tc    grouped GEMM on tensor cores: grid (token tile, N tile) over the concatenated per-expert tiles
            of BLOCK_M tokens (an expert with c tokens owns ceil(c / BLOCK_M) tiles); W decoded to bf16 in
            registers as the MMA's M side. Exact for scale bytes 14..240.
  moe_fused (kernels/moe_fused.py) moe_h2g's arithmetic in one launch: x to fp16, mlp1, mlp2 and the combine as
            stages of one grid chained by device counters.
  moe_mma   (kernels/moe_mma.py) moe_tc's grid with gemv_mma's K loop: mma.sync on weights decoded in the MMA's
            operand registers, no shared memory; the best from ~2 to ~64 tokens per expert.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._triton import pdl_enter, pdl_launch, pdl_release, reg_cap, tl, triton
from .decode import F16_TRICK, decode_bf16, e8m0_to_f32, gemv_products, tc_dot
from .formats import MXFP4Tensor, _check_tensor
from .linear_f16 import (
    h2_tiles,
    h2g_first_loads,
    h2g_loads,
    h2g_pointers,
    h2g_step,
    h2g_tail_loads,
    plane_words,
    x_to_f16,
)
from .linear_mma import decode_f16_word_major
from .prepare import PreparedMXFP4, prepare_mxfp4, shuffle_nibbles, tile_mxfp4
from .routing import Routing
from .sync import consume, scratch, signal_count, wait_count
from .variants import (
    Variant,
    get_variant,
    register,
    rule_block_k_multiple_of_32,
    rule_dot_k,
    rule_gemv_registers,
    rule_h2g_pipeline,
    rule_h2g_words,
    rule_mma_registers,
    rule_pow2,
    rule_scale_span,
    rule_scale_window,
    rule_tiled_k,
)

# ------------------------------------------------------------------------------------------------------------
# Epilogues shared by both variants


@triton.jit
def swiglu(g, lin, alpha, limit, scale=1.0):
    """GPT-OSS SwiGLU of gate g and linear lin (fp32): the gate clamped above at limit, lin to +-limit, +1;
    times scale (a power of two, so folding it into the +1 is exact). The sigmoid takes sm_90's approximate
    exp2 and division (a few ulp in fp32, far below the fp16 or bf16 the activation is stored in): Triton's
    tl.sigmoid divides with IEEE rounding, ~10 instructions more per element in the epilogue of moe_mma."""
    g = tl.minimum(g, limit)
    lin = tl.minimum(tl.maximum(lin, -limit), limit)
    sig = tl.fdiv(1.0, 1.0 + tl.exp2(g * (-alpha * 1.4426950408889634)), ieee_rounding=False)  # sigmoid(alpha g)
    return g * sig * (lin * scale + scale)


@triton.jit
def word_major_pos(i):
    """Position of element i in x_to_f16's word-major order: element q of a group of 8 sits at 2q (q < 4) or
    2q - 7."""
    q = i % 8
    return i - q + tl.where(q < 4, 2 * q, 2 * q - 7)


@triton.jit
def _epilogue(acc, rm, rn, mmask, nmask, e, slots, b_ptr, gate_ptr, out_ptr, N, alpha, limit,
              PHASE: tl.constexpr, BLOCK_N: tl.constexpr, ACT16: tl.constexpr = False, act_scale=1.0, PLANE=0):
    """acc [BM, BN] fp32 for rows rm (sorted positions) and columns rn of expert e.

    PHASE 1: + b1, SwiGLU over column pairs (2i gate, 2i+1 linear) -> out = act[rm, i] with I = N / 2;
             ACT16: stored as fp16 times act_scale in x_to_f16's order (for moe_h2/moe_h2g): word-major, or
             plane-major with PLANE words per plane when PLANE > 0.
    PHASE 2: + b2, times the slot's gate weight -> out = y[rm, rn].
    """
    acc += tl.load(b_ptr + e * N + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    if PHASE == 1:
        g, lin = tl.split(tl.reshape(acc, (acc.shape[0], BLOCK_N // 2, 2)))
        if ACT16:
            a = swiglu(g, lin, alpha, limit, act_scale)  # scaled for fp16
        else:
            a = swiglu(g, lin, alpha, limit)
        ri = rn // 2
        ri = tl.reshape(ri, (BLOCK_N // 2, 2))
        ri, _ = tl.split(ri)
        half = N // 2
        amask = mmask[:, None] & (ri < half)[None, :]
        if ACT16:
            q = ri % 8
            if PLANE > 0:  # element 8w + q: plane q % 4, word w, high half when q >= 4
                pos = (q % 4) * (2 * PLANE) + (ri // 8) * 2 + q // 4
                width = 8 * PLANE
            else:
                pos = word_major_pos(ri)
                width = half
            tl.store(out_ptr + rm[:, None] * width + pos[None, :], a.to(tl.float16), mask=amask)
        else:
            tl.store(out_ptr + rm[:, None] * half + ri[None, :], a.to(tl.bfloat16), mask=amask)
    else:
        gate = tl.load(gate_ptr + slots, mask=mmask, other=0.0)
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], (acc * gate[:, None]).to(tl.bfloat16),
                 mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _source_rows(sorted_ptr, rm, mmask, TOPK, PHASE: tl.constexpr):
    """Rows of the GEMM input for sorted positions rm: tokens for mlp1 (x), positions for mlp2 (act)."""
    slots = tl.load(sorted_ptr + rm, mask=mmask, other=0)
    if PHASE == 1:
        src = slots // TOPK
    else:
        src = rm
    return slots, tl.where(mmask, src, 0)


@triton.jit
def _program_rows(i, ids_ptr, sorted_ptr, offs_ptr, BLOCK_M: tl.constexpr):
    """(expert, sorted positions rm, their mask, has work) of decode program i (grid dim 0, or moe_fused's item).

    Grid dim 0 walks the T*k expert-sorted positions; program i works on positions i..i+BLOCK_M-1 of its
    expert when i starts a BLOCK_M chunk of them, and the others exit. Only experts with tokens get
    programs, and an expert with many tokens is spread over many programs that read its weights
    concurrently (mostly from L2) instead of one program passing over them again and again.
    """
    e = tl.load(ids_ptr + tl.load(sorted_ptr + i))
    start = tl.load(offs_ptr + e)
    end = tl.load(offs_ptr + e + 1)
    rm = i + tl.arange(0, BLOCK_M)
    return e, rm, rm < end, (i - start) % BLOCK_M == 0


@triton.jit
def _expert_rows(w_ptr, s_ptr, e, N, K, BLOCK_N: tl.constexpr):
    """Rows (this program's N tile) of expert e: their indices, mask and word/scale row pointers."""
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_c = tl.minimum(rn, N - 1)  # rows past N read row N-1 (never stored)
    w_base = w_ptr + e.to(tl.int64) * N * (K // 8) + rn_c[:, None] * (K // 8)
    s_base = s_ptr + e.to(tl.int64) * N * (K // 32) + rn_c[:, None] * (K // 32)
    return rn, rn < N, w_base, s_base


# ------------------------------------------------------------------------------------------------------------
# moe_gemv


@triton.jit
def _moe_gemv_kernel(a_ptr, ids_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, TOPK,
                     alpha, limit, PHASE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    e, rm, mmask, active = _program_rows(tl.program_id(0), ids_ptr, sorted_ptr, offs_ptr, BLOCK_M)
    if active:
        KW = K // 8
        rw = tl.arange(0, BLOCK_K // 8)
        rn, nmask, w_base, s_base = _expert_rows(w_ptr, s_ptr, e, N, K, BLOCK_N)
        slots, src = _source_rows(sorted_ptr, rm, mmask, TOPK, PHASE)
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K // 8), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kw = k0 // 8 + rw
            km = kw < KW
            v = tl.load(w_base + kw[None, :], mask=km[None, :], other=0).to(tl.uint32, bitcast=True)
            s = tl.load(s_base + (kw // 4)[None, :], mask=km[None, :], other=0)
            p = gemv_products(v, a_ptr + src[:, None].to(tl.int64) * K + (kw * 8)[None, :],
                              mmask[:, None] & km[None, :])
            acc += p * e8m0_to_f32(s)[None]
        out = tl.sum(acc, axis=2) * F16_TRICK
        _epilogue(out, rm, rn, mmask, nmask, e, slots, b_ptr, gate_ptr, out_ptr, N, alpha, limit, PHASE, BLOCK_N)


# ------------------------------------------------------------------------------------------------------------
# moe_h2


@triton.jit
def _moe_h2_kernel(x16_ptr, xs_ptr, ids_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K,
                   TOPK, alpha, limit, act_scale, PHASE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Input rows are fp16 words from x_to_f16 (mlp1: per-token scale xs) or the ACT16 epilogue (mlp2: act_scale)."""
    e, rm, mmask, active = _program_rows(tl.program_id(0), ids_ptr, sorted_ptr, offs_ptr, BLOCK_M)
    if active:
        rw = tl.arange(0, BLOCK_K // 8)
        rn, nmask, w_base, s_base = _expert_rows(w_ptr, s_ptr, e, N, K, BLOCK_N)
        slots, src = _source_rows(sorted_ptr, rm, mmask, TOPK, PHASE)
        xp = x16_ptr + src[:, None].to(tl.int64) * (K // 2) + (rw * 4)[None, :]  # 4 x16 words per weight word
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K // 8), tl.float32)
        acc = h2_tiles(acc, w_base + rw[None, :], s_base + (rw // 4)[None, :], xp, rw, 0, K, BLOCK_K)
        if PHASE == 1:
            xs = tl.load(xs_ptr + src)
        else:
            xs = tl.zeros((BLOCK_M,), tl.float32) + 1.0 / act_scale
        out = tl.sum(acc, axis=2) * (xs * (F16_TRICK * 0.5))[:, None]  # 0.5: h2_step doubles the scales
        _epilogue(out, rm, rn, mmask, nmask, e, slots, b_ptr, gate_ptr, out_ptr, N, alpha, limit, PHASE, BLOCK_N,
                  PHASE == 1, act_scale)


@triton.jit
def _moe_h2g_kernel(xq_ptr, xs_ptr, ids_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K,
                    TOPK, alpha, limit, act_scale, PLANE, OUT_PLANE, w_stride_e, s_stride_e, PHASE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr = 1,
                    TILED: tl.constexpr = False, DEINT: tl.constexpr = False, PREFETCH: tl.constexpr = False,
                    NIB: tl.constexpr = False, chain_ptr=None, S=0, NEED=0, CHAIN: tl.constexpr = False,
                    EARLY: tl.constexpr = False):
    """moe_h2 with gemv_h2g's K loop (h2g_step; NIB: as gemv_h2g): input rows are
    plane-major x16 words with PLANE words per plane, from x_to_f16(planes=True) (mlp1) or the ACT16 epilogue
    (mlp2, OUT_PLANE of mlp1). STAGES > 1 pipelines the K loop through shared memory as in gemv_h2g (x rows then
    broadcast over the tile's rows).
    mlp2 (PHASE 2) reads its routing before the PDL wait, overlapping that chain of dependent loads with
    mlp1's tail: route wrote it two launches back and had finished before mlp1 let mlp2 start. mlp1 waits
    first (but with EARLY, below): with x16 from router_logits it directly follows route.
    CHAIN: the grid is (N tiles, positions), so a position's N tiles run together and the first positions'
    act rows are done first; mlp1 counts each program's stores on its position's counter (chain_ptr[i]); mlp2
    skips the PDL wait and waits for its own position's NEED mlp1 programs (it starts during mlp1's last wave),
    its last of NEED readers (its N tiles) zeroing both counters (chain_ptr[S + i] counts them).
    EARLY (mlp1, when the layer launched x_to_f16 itself, so route wrote the routing two launches back): the
    routing reads and PREFETCH's first weight tile come before the PDL wait, while x_to_f16 still runs; a
    program with no work then never waits. For mlp2 without CHAIN (the launcher's EARLY=2), the same with
    its first weight tile loaded during mlp1's tail (its routing is read before the wait either way)."""
    if CHAIN:
        i = tl.program_id(1)
        pid_n = tl.program_id(0)
    else:
        i = tl.program_id(0)
        pid_n = tl.program_id(1)
    if PHASE == 1:
        if not EARLY:
            pdl_enter()
    e, rm, mmask, active = _program_rows(i, ids_ptr, sorted_ptr, offs_ptr, BLOCK_M)
    if PHASE == 2:
        if CHAIN:
            pdl_release()
        elif not EARLY:
            pdl_enter()
    if active:
        if CHAIN and PHASE == 2:
            wait_count(chain_ptr + i, NEED)
        h2g_tile(e, i, rm, mmask, pid_n, xq_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr,
                 out_ptr, N, K, TOPK, alpha, limit, act_scale, PLANE, OUT_PLANE, w_stride_e, s_stride_e, PHASE,
                 BLOCK_M, BLOCK_N, BLOCK_K, STAGES, TILED, DEINT, PREFETCH, NIB=NIB, EARLY=EARLY)
        if CHAIN:
            if PHASE == 1:
                signal_count(chain_ptr + i)
            else:
                consume(chain_ptr + S + i, chain_ptr + i, tl.num_programs(0))


@triton.jit
def h2g_tile(e, start, rm, mmask, pid_n, xq_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr,
             out_ptr, N, K, TOPK, alpha, limit, act_scale, PLANE, OUT_PLANE, w_stride_e, s_stride_e,
             PHASE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             STAGES: tl.constexpr, TILED: tl.constexpr, DEINT: tl.constexpr, PREFETCH: tl.constexpr = False,
             wait_ptr=None, wait_need=0, WAIT: tl.constexpr = False, NIB: tl.constexpr = False,
             EARLY: tl.constexpr = False):
    """One moe_h2g program's work: N tile pid_n of expert e for sorted positions rm = start + 0..BLOCK_M-1
    (mask mmask), epilogue included. WAIT (moe_fused): the first K tile's weights are loaded, then the program
    waits until the count at wait_ptr reaches wait_need (its input rows are written by other programs of the
    same launch) before it reads any input row, so the weight loads are in flight while it waits. PREFETCH:
    the next K tile's weights are loaded before this one is used (two tiles in flight: with K = 2880 and
    BLOCK_K = 2048, the whole row tile at once). EARLY: the PDL wait (pdl_enter) comes here, after the routing
    reads and the first weight tile's loads, before any input row is read."""
    G: tl.constexpr = BLOCK_K // 32
    TW: tl.constexpr = BLOCK_K // 8
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_c = tl.minimum(rn, N - 1)
    KB = K // 32
    word = tl.arange(0, TW)[None, :] + 0 * rn_c[:, None]
    if STAGES > 1:
        xw = tl.arange(0, TW)
    else:
        xw = word
    rg = tl.arange(0, G)
    wp, sp = h2g_pointers(w_ptr + e.to(tl.int64) * w_stride_e, s_ptr + e.to(tl.int64) * s_stride_e, rn_c, word,
                          rg, N, K, TILED, DEINT)
    WSTEP: tl.constexpr = TW * (16 if TILED else 1)
    SSTEP: tl.constexpr = G * (16 if TILED else 1)
    slots, src = _source_rows(sorted_ptr, rm, mmask, TOPK, PHASE)
    last = tl.load(offs_ptr + e + 1) - 1
    acc = tl.zeros((BLOCK_N, G, BLOCK_M), tl.float32)
    full = KB // G
    v_next, s_next = h2g_first_loads(wp, sp, word, rg, full, TW, G, PREFETCH)
    if EARLY:
        pdl_enter()
    for t in tl.range(0, full, num_stages=STAGES):
        v, s, v_next, s_next = h2g_loads(wp, sp, word, rg, t, full, v_next, s_next, TW, G, WSTEP, SSTEP, PREFETCH)
        if WAIT:
            if t == 0:
                wait_count(wait_ptr, wait_need)
        acc = h2g_tokens(acc, v, s, xq_ptr, t * TW, xw, word, sorted_ptr, start, last, TOPK, PLANE, PHASE, BLOCK_M,
                         G, False, NIB)
        wp += WSTEP
        sp += SSTEP
    if full * G < KB:
        wm, v, s = h2g_tail_loads(wp, sp, word, rg, full, K, TW, G)
        if WAIT:
            if full == 0:
                wait_count(wait_ptr, wait_need)
        acc = h2g_tokens(acc, v, s, xq_ptr, full * TW, word, wm, sorted_ptr, start, last, TOPK, PLANE, PHASE,
                         BLOCK_M, G, True, NIB)
    if PHASE == 1:
        xs = tl.load(xs_ptr + src)
    else:
        xs = tl.zeros((BLOCK_M,), tl.float32) + 1.0 / act_scale
    out = tl.trans(tl.sum(acc, axis=1)) * (xs * (F16_TRICK * 0.5))[:, None]  # 0.5: h2g_step doubles scales
    _epilogue(out, rm, rn, mmask, rn < N, e, slots, b_ptr, gate_ptr, out_ptr, N, alpha, limit, PHASE, BLOCK_N,
              PHASE == 1, act_scale, OUT_PLANE)


@triton.jit
def h2g_tokens(acc, v, s, xq_ptr, k0, xw, xm, sorted_ptr, start, last, TOPK, PLANE, PHASE: tl.constexpr,
               BLOCK_M: tl.constexpr, G: tl.constexpr, MASK: tl.constexpr, NIB: tl.constexpr = False):
    """h2g_step of one K tile (words v, scales s) for the BLOCK_M sorted positions start.. of a chunk (clamped
    to last, the expert's last position: read, never stored), x words k0 + xw of each position's input row."""
    for i in tl.static_range(BLOCK_M):
        xr = _h2g_source(sorted_ptr, tl.minimum(start + i, last), TOPK, PHASE)
        acc = h2g_step(acc, v, s, xq_ptr + xr * (4 * PLANE) + k0 + xw, xm, i, PLANE, G, MASK, NIB)
    return acc


@triton.jit
def _h2g_source(sorted_ptr, p, TOPK, PHASE: tl.constexpr):
    """Input row (int64) of sorted position p for h2g_step (a chunk's positions past its expert are clamped
    to the expert's last one by the caller: read, never stored)."""
    if PHASE == 1:
        return (tl.load(sorted_ptr + p) // TOPK).to(tl.int64)
    else:
        return p.to(tl.int64)


def act16_scale(limit: float) -> float:
    """Power of two that moe_h2 multiplies the SwiGLU output by before storing it as fp16.

    |act| <= limit * (limit + 1) (the gate is clamped above at limit, the linear half to +-limit), so the
    scaled value stays below 2^15 and keeps fp16's full 11-bit precision down to small magnitudes.
    """
    if not 0 < limit < 180:
        raise ValueError(f"moe_h2 stores the SwiGLU output in fp16 and needs 0 < limit < 180, got {limit}")
    return float(2.0 ** math.floor(math.log2(32768.0 / (limit * (limit + 1)))))


# ------------------------------------------------------------------------------------------------------------
# moe_tc


@triton.jit
def tile_rows(offs_ptr, tile, re, E, BLOCK_M: tl.constexpr, EXTRA: tl.constexpr = 0):
    """(expert, first sorted position, end of the expert's positions, whether the tile exists) of token tile
    `tile`, where an expert with c slots owns ceil(c / BLOCK_M) tiles in expert order and spare programs of the
    worst-case grid (tile_slots) get False. re: arange over a power of two >= E (expert_span) in the caller's
    layout. Every program derives its tile from the offsets (one load round and a scan) because a per-call
    table of tile offsets cost five small torch launches, ~12 us of a layer whatever its size
    (results/20261124T002538-h100-80gb-hbm3-moe-stages). EXTRA (moe_mma's ABSORB): a last tile of at most EXTRA
    slots after a full one is not a tile of its own; the full tile before it runs to the expert's end."""
    em = re < E
    lo = tl.load(offs_ptr + re, mask=em, other=0)
    hi = tl.load(offs_ptr + 1 + re, mask=em, other=0)
    n = _tiles_per_expert(hi - lo, BLOCK_M, EXTRA)
    last = tl.cumsum(n, 0)  # tiles of experts 0..e
    e = tl.sum((last <= tile).to(tl.int32), 0)  # the first expert whose tiles reach past `tile`
    here = re == e
    m0 = tl.sum(tl.where(here, lo, 0), 0) + (tile - tl.sum(tl.where(here, last - n, 0), 0)) * BLOCK_M
    return e, m0, tl.sum(tl.where(here, hi, 0), 0), e < E


@triton.jit
def tile_count(offs_ptr, re, E, BLOCK_M: tl.constexpr, EXTRA: tl.constexpr = 0):
    """The routing's token tiles, the ones tile_rows numbers as live (the sum over experts of ceil(count /
    BLOCK_M)): a persistent grid's work runs to this count times the programs of a tile, not to tile_slots'
    worst case. re and EXTRA as tile_rows'."""
    em = re < E
    lo = tl.load(offs_ptr + re, mask=em, other=0)
    hi = tl.load(offs_ptr + 1 + re, mask=em, other=0)
    return tl.sum(_tiles_per_expert(hi - lo, BLOCK_M, EXTRA), 0)


@triton.jit
def _tiles_per_expert(c, BLOCK_M: tl.constexpr, EXTRA: tl.constexpr):
    """ceil(c / BLOCK_M), less the last tile where it holds at most EXTRA slots after a full one."""
    n = (c + (BLOCK_M - 1)) // BLOCK_M
    if EXTRA:
        n -= ((c > BLOCK_M) & ((c - 1) % BLOCK_M < EXTRA)).to(tl.int32)
    return n


@triton.jit
def _moe_tc_kernel(a_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KA,
                   TOPK, alpha, limit, act_scale, SMAX, E, PHASE: tl.constexpr, EP: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, F16: tl.constexpr = False):
    """Grouped GEMM: acc[N tile, token tile] += decoded W tile @ input tile, per K step of BLOCK_K.

    F16=False: bf16 weights (decode_bf16) against bf16 rows (x, or mlp1's bf16 act).
    F16=True: fp16 weights E2M1 * 2^(s - SMAX + 1) decoded with packed half2 ops (moe_mma's numerics, in
    x_to_f16's word-major order) against fp16 rows (x_to_f16's, or mlp1's ACT16 act), rescaled in the epilogue.
    About 2x fewer instructions per weight than the bf16 decode, so a token tile of 256 keeps the tensor cores
    ahead of instruction issue (the limit of moe_mma's prefill)."""
    e, m0, end, live = tile_rows(offs_ptr, tl.program_id(0), tl.arange(0, EP), E, BLOCK_M)
    if live:  # the grid is sized for the worst case; spare programs exit
        rm = m0 + tl.arange(0, BLOCK_M)
        mmask = rm < end
        slots, src = _source_rows(sorted_ptr, rm, mmask, TOPK, PHASE)
        KW = K // 8
        rw = tl.arange(0, BLOCK_K // 8)
        rk = tl.arange(0, BLOCK_K)
        rn, nmask, w_base, s_base = _expert_rows(w_ptr, s_ptr, e, N, K, BLOCK_N)
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kw = k0 // 8 + rw
            km = kw < KW
            v = tl.load(w_base + kw[None, :], mask=km[None, :], other=0).to(tl.uint32, bitcast=True)
            s = tl.load(s_base + (kw // 4)[None, :], mask=km[None, :], other=127)
            if F16:
                w = decode_f16_word_major(v, s, SMAX)
            else:
                w = decode_bf16(v, s)
            k = k0 + rk
            x = tl.load(a_ptr + src[None, :].to(tl.int64) * KA + k[:, None], mask=mmask[None, :] & (k < K)[:, None],
                        other=0.0)
            acc = tc_dot(w, x, acc)
        out = tl.trans(acc)
        if F16:
            wscale = ((SMAX - 1).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(SMAX - 128)
            if PHASE == 1:
                out = out * (tl.load(xs_ptr + src) * wscale)[:, None]
            else:
                out = out * (wscale / act_scale)
        _epilogue(out, rm, rn, mmask, nmask, e, slots, b_ptr, gate_ptr, out_ptr, N, alpha, limit, PHASE, BLOCK_N,
                  F16 and PHASE == 1, act_scale)


@triton.jit
def _combine_kernel(y_ptr, inv_ptr, out_ptr, H, TOPK: tl.constexpr, TOPK_P2: tl.constexpr, BLOCK_H: tl.constexpr,
                    SPLITS: tl.constexpr = 1, SLICE=0):
    """out[t] = fp32 sum of token t's TOPK rows of y, in slot order (SPLITS > 1: of each slot's SPLITS rows,
    SLICE elements apart, in slice order). The rows' positions are read before the PDL wait: route wrote them,
    and every launch since waited for the one before it before letting its successor start."""
    t = tl.program_id(0)
    kk = tl.arange(0, TOPK_P2)
    pos = tl.load(inv_ptr + t * TOPK + kk, mask=kk < TOPK, other=0).to(tl.int64)
    pdl_enter()
    rh = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = rh < H
    acc = tl.zeros((BLOCK_H,), tl.float32)
    for j in tl.static_range(TOPK):
        row = tl.sum(tl.where(kk == j, pos, 0))
        for q in tl.static_range(SPLITS):
            acc += tl.load(y_ptr + q * SLICE + row * H + rh, mask=hm, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * H + rh, acc.to(tl.bfloat16), mask=hm)


@triton.jit
def _swiglu_rows_kernel(h_ptr, gate_ptr, a_ptr, I, KP, alpha, limit, BLOCK: tl.constexpr):
    """Row r of a [S, KP]: gate[r] * swiglu(h[r]) in columns < I, gate[r] in column I, zeros beyond."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < I
    gate = tl.load(gate_ptr + r).to(tl.float32)
    g = tl.load(h_ptr + r * 2 * I + 2 * c, mask=m, other=0.0).to(tl.float32)
    lin = tl.load(h_ptr + r * 2 * I + 2 * c + 1, mask=m, other=0.0).to(tl.float32)
    val = tl.where(m, swiglu(g, lin, alpha, limit) * gate, tl.where(c == I, gate, 0.0))
    tl.store(a_ptr + r * KP + c, val.to(tl.bfloat16), mask=c < KP)


def swiglu_rows(h: torch.Tensor, gates: torch.Tensor, kp: int, alpha: float = 1.702,
                limit: float = 7.0) -> torch.Tensor:
    """h [S, 2I] bf16 (gate/linear columns interleaved), gates [S] -> [S, kp] bf16 (kp > I): each row's
    SwiGLU times its gate, then the gate itself in column I (a bias column for the next GEMM to scale its bias
    by the gate too), zeros after. One pass: the glue of a grouped-GEMM layer (labkit.bench_moe.TorchBf16MoE)."""
    S, two_i = h.shape
    I = two_i // 2
    if kp <= I:
        raise ValueError(f"kp must exceed I={I} (column I holds the gate), got {kp}")
    a = torch.empty((S, kp), device=h.device, dtype=torch.bfloat16)
    if S:
        _swiglu_rows_kernel[(S, triton.cdiv(kp, 1024))](h.contiguous(), gates.contiguous(), a, I, kp, float(alpha),
                                                        float(limit), BLOCK=1024)
    return a


@dataclass(frozen=True)
class MoESlots:
    """A MoE layer's output before its combine (moe_mxfp4(combine=False)): rows [T*k, H] bf16, each slot's
    mlp2 row times its gate weight in expert-sorted order, and inverse [T*k] int32 (the row of slot t*k + j).
    Token t's output is the fp32 sum of its k rows rounded to bf16: combine() launches exactly that, and
    kernels.add_rms_norm accepts it as its residual and sums inside its own launch instead (decode saves
    one launch per layer). splits > 1 (moe_mma's SPLITK2 without ATOMIC, combine() only): rows holds that many
    [T*k, H] fp32 blocks, each K slice's shares, which combine() adds in slice order."""

    rows: torch.Tensor
    inverse: torch.Tensor
    top_k: int
    splits: int = 1

    @property
    def shape(self) -> tuple[int, int]:
        return self.inverse.numel() // self.top_k, self.rows.shape[1]

    def combine(self) -> torch.Tensor:
        """The [T, H] bf16 layer output."""
        T, H = self.shape
        out = torch.empty((T, H), device=self.rows.device, dtype=torch.bfloat16)
        if T:
            _combine_kernel[(T, triton.cdiv(H, 1024))](self.rows, self.inverse, out, H, TOPK=self.top_k,
                                                       TOPK_P2=triton.next_power_of_2(self.top_k),
                                                       BLOCK_H=1024, SPLITS=self.splits,
                                                       SLICE=self.rows.shape[0] // self.splits * H
                                                       if self.splits > 1 else 0,
                                                       **pdl_launch(inner=True))
        return out


# ------------------------------------------------------------------------------------------------------------
# Launchers


def _decode_grid(r: Routing, N: int, block_n: int) -> tuple[int, int]:
    """Grid of the decode kernels: every expert-sorted position times every N tile (see _program_rows)."""
    return r.sorted.numel(), triton.cdiv(N, block_n)


def _launch_gemv(phase, src, r: Routing, p: PreparedMXFP4, b, out, alpha, limit, cfg):
    E, N, K = p.shape
    grid = _decode_grid(r, N, cfg["BLOCK_N"])
    _moe_gemv_kernel[grid](src, r.ids, r.sorted, r.offsets, p.words, p.scales, b, r.weights, out, N, K, r.top_k,
                           float(alpha), float(limit), PHASE=phase, BLOCK_M=cfg["BLOCK_M"],
                           BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
                           num_stages=cfg.get("num_stages", 1))


def _launch_h2(phase, x16, xs, r: Routing, p: PreparedMXFP4, b, out, alpha, limit, act_scale, cfg):
    E, N, K = p.shape
    grid = _decode_grid(r, N, cfg["BLOCK_N"])
    _moe_h2_kernel[grid](x16.view(torch.int32), xs, r.ids, r.sorted, r.offsets, p.words, p.scales, b, r.weights, out,
                         N, K, r.top_k, float(alpha), float(limit), act_scale, PHASE=phase,
                         BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                         num_warps=cfg["num_warps"], num_stages=1)


def _launch_h2g(phase, xq, xs, r: Routing, p: PreparedMXFP4, b, out, alpha, limit, act_scale, cfg, inner=True,
                chain=None, need=0):
    """inner: a launch of this layer call precedes it (x_to_f16's, or mlp1's for mlp2). chain: CHAIN's
    counters (2 per sorted position); mlp2 waits for `need` mlp1 programs per position. Returns the launch's
    N tiles."""
    E, N, K = p.shape
    if cfg.get("TILED"):
        p = tile_mxfp4(p, deinterleave=phase == 1)
    p = _nibbles(p, cfg)
    grid = _decode_grid(r, N, cfg["BLOCK_N"])
    extra = reg_cap(cfg.get("MAXNREG") if phase == 1 else cfg.get("MAXNREG2"))
    if phase == 1 and inner and cfg.get("EARLY"):  # x16 from router_logits: route's launch came just before
        extra["EARLY"] = True
    if phase == 2 and cfg.get("EARLY") == 2:  # mlp2 always follows this call's mlp1 (rule: not with CHAIN)
        extra["EARLY"] = True
    if chain is not None:
        grid = grid[::-1]
        extra.update(chain_ptr=chain, S=r.sorted.numel(), NEED=need, CHAIN=True)
    _moe_h2g_kernel[grid](xq.view(torch.int32), xs, r.ids, r.sorted, r.offsets, p.words, p.scales, b, r.weights,
                          out, N, K, r.top_k, float(alpha), float(limit), act_scale, plane_words(K),
                          plane_words(N // 2), p.words.stride(0), p.scales.stride(0), PHASE=phase,
                          BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                          STAGES=cfg.get("num_stages", 1), TILED=p.tiled, DEINT=p.deinterleaved,
                          PREFETCH=cfg.get("PREFETCH", False), NIB=p.shuffled, num_warps=cfg["num_warps"],
                          **extra, **pdl_launch(inner))
    return grid[0] if chain is not None else grid[1]


def _nibbles(p: PreparedMXFP4, cfg) -> PreparedMXFP4:
    """shuffle_nibbles' copy of p for a NIB config (made once, cached), else p."""
    return shuffle_nibbles(p) if cfg.get("NIB") else p


def _launch_tc(phase, src, xs, r: Routing, p: PreparedMXFP4, b, out, alpha, limit, act_scale, cfg):
    E, N, K = p.shape
    BM = cfg["BLOCK_M"]
    grid = (tile_slots(r, BM), triton.cdiv(N, cfg["BLOCK_N"]))
    _moe_tc_kernel[grid](src, xs, r.sorted, r.offsets, p.words, p.scales, b, r.weights, out, N, K,
                         src.shape[1], r.top_k, float(alpha), float(limit), float(act_scale), p.scale_max, E,
                         PHASE=phase, EP=expert_span(E), BLOCK_M=BM, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                         F16=cfg.get("F16", False), num_warps=cfg["num_warps"], num_stages=cfg.get("num_stages", 3))


def tile_slots(r: Routing, block_m: int) -> int:
    """Grid size over token tiles: the most the sum over experts of ceil(count / BLOCK_M) can be for any routing
    of S slots (at most min(E, S) experts hold a slot, each adding at most BLOCK_M - 1 to its count's round-up).
    Programs past the routing's tiles exit, each at the cost of its launch and the offsets' scan: this bound
    (against cdiv(S, BLOCK_M) + min(E, S) before) took 120b at 32 tokens from 378.3 to 374.9 us, and a grid of
    exactly the routing's tiles would reach 371.9 (results/20261127T061335-h100-80gb-hbm3-spare-tiles)."""
    S = r.sorted.numel()
    return (S + min(r.num_experts, S) * (block_m - 1)) // block_m


def expert_span(E: int) -> int:
    """The power of two >= E that tile_rows' vector over experts spans."""
    return max(2, triton.next_power_of_2(E))


def _run(kind, x, r, p1, b1, p2, b2, alpha, limit, cfg, x16=None, combine=True):
    T, H = x.shape
    S = r.sorted.numel()
    I2 = p1.shape[1]
    act = torch.empty((S, I2 // 2), device=x.device, dtype=torch.bfloat16)
    y = torch.empty((S, H), device=x.device, dtype=torch.bfloat16)
    out = torch.empty((T, H), device=x.device, dtype=torch.bfloat16)
    if S == 0:
        return out
    if kind == "gemv":
        _launch_gemv(1, x, r, p1, b1, act, alpha, limit, cfg)
        _launch_gemv(2, act, r, p2, b2, y, alpha, limit, cfg)
    elif kind == "h2":
        scale = act16_scale(limit)
        x16, xs = x_to_f16(x)
        act = act.view(torch.float16)
        _launch_h2(1, x16, xs, r, p1, b1, act, alpha, limit, scale, cfg)
        _launch_h2(2, act, xs, r, p2, b2, y, alpha, limit, scale, cfg)
    elif kind == "h2g":
        scale = act16_scale(limit)
        xq, xs = x16 if x16 is not None else x_to_f16(x, planes=True)
        act = torch.empty((S, 8 * plane_words(I2 // 2)), device=x.device, dtype=torch.float16)
        chain = scratch(x.device, ("moe_h2g_chain",), 2 * S) if cfg.get("CHAIN") else None
        need = _launch_h2g(1, xq, xs, r, p1, b1, act, alpha, limit, scale, cfg, inner=x16 is None, chain=chain)
        cfg2 = {**cfg, "BLOCK_N": cfg.get("BLOCK_N2") or cfg["BLOCK_N"],  # mlp2's own tile and warps, when set
                "num_warps": cfg.get("WARPS2") or cfg["num_warps"]}
        _launch_h2g(2, act, xs, r, p2, b2, y, alpha, limit, scale, cfg2, chain=chain, need=need)
    else:
        if cfg.get("F16"):  # fp16 rows in x_to_f16's word-major order; act stored the same way by mlp1
            scale = act16_scale(limit)
            x, xs = x_to_f16(x)  # (a plane-major x16 from router_logits is moe_h2g's, not this order)
            act = act.view(torch.float16)
        else:
            scale, xs = 1.0, x  # xs unused
        _launch_tc(1, x, xs, r, p1, b1, act, alpha, limit, scale, cfg)
        _launch_tc(2, act, xs, r, p2, b2, y, alpha, limit, scale, cfg)
    slots = MoESlots(y, r.inverse, r.top_k)
    return slots.combine() if combine else slots


def _run_moe_gemv(x, r, p1, b1, p2, b2, alpha, limit, x16=None, combine=True, **cfg):
    return _run("gemv", x, r, p1, b1, p2, b2, alpha, limit, cfg, x16, combine)


def _run_moe_h2(x, r, p1, b1, p2, b2, alpha, limit, x16=None, combine=True, **cfg):
    return _run("h2", x, r, p1, b1, p2, b2, alpha, limit, cfg, x16, combine)


def _run_moe_h2g(x, r, p1, b1, p2, b2, alpha, limit, x16=None, combine=True, **cfg):
    return _run("h2g", x, r, p1, b1, p2, b2, alpha, limit, cfg, x16, combine)


def _run_moe_tc(x, r, p1, b1, p2, b2, alpha, limit, x16=None, combine=True, **cfg):
    return _run("tc", x, r, p1, b1, p2, b2, alpha, limit, cfg, x16, combine)


# ------------------------------------------------------------------------------------------------------------
# Registry and entry point

_pow2 = rule_pow2("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "BLOCK_N2")


def _rule_tc(cfg, problem):
    return rule_dot_k(cfg, problem) or rule_mma_registers(cfg, problem)


register(Variant(
    name="moe_gemv", kind="moe", op="moe", fn=_run_moe_gemv,
    space={"BLOCK_M": (1, 2, 4, 8), "BLOCK_N": (32, 64, 128), "BLOCK_K": (64, 128, 256), "num_warps": (4, 8)},
    defaults={"BLOCK_M": 4, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4},
    rules=(_pow2, rule_block_k_multiple_of_32, rule_gemv_registers),
    description="decode: one program per (BLOCK_M tokens of an expert, N tile) streams that weight tile once",
))
register(Variant(
    name="moe_h2", kind="moe", op="moe", fn=_run_moe_h2,
    space={"BLOCK_M": (1, 2, 4), "BLOCK_N": (16, 32, 64), "BLOCK_K": (128, 256, 512), "num_warps": (2, 4)},
    defaults={"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4},
    rules=(_pow2, rule_block_k_multiple_of_32, rule_gemv_registers, rule_scale_window(0, 253)),
    description="decode with packed half2 FMAs (as gemv_h2): fp16 activations, act stored as scaled fp16",
))
def _rule_h2g_warps2(cfg, problem):
    """WARPS2 equal to num_warps would repeat a config."""
    if cfg.get("WARPS2") is not None and cfg["WARPS2"] == cfg["num_warps"]:
        return f"WARPS2={cfg['WARPS2']} equals num_warps (None repeats this config)"
    return None


def _rule_h2g_chain(cfg, problem):
    """CHAIN orders mlp1 and a separate mlp2 launch, with the sorted positions on grid axis 1 (at most 65535)."""
    if not cfg.get("CHAIN"):
        return None
    if problem.get("m", 0) * problem.get("top_k", 1) > 65535:
        return "CHAIN's grid puts the T*k sorted positions on grid axis 1 (at most 65535)"
    if cfg.get("EARLY") == 2:
        return "EARLY=2 moves mlp2's PDL wait, which CHAIN's mlp2 has not (it waits on counters): use EARLY=True"
    return None


register(Variant(
    name="moe_h2g", kind="moe", op="moe", fn=_run_moe_h2g,
    space={"BLOCK_M": (1, 2, 4, 8), "BLOCK_N": (4, 8, 16, 32, 64), "BLOCK_K": (128, 256, 512, 1024, 2048),
           "num_warps": (1, 2, 4), "num_stages": (1, 2, 3, 4),
           "BLOCK_N2": (None, 4, 8, 16, 32),
           "TILED": (False, True), "PREFETCH": (False, True), "NIB": (False, True), "CHAIN": (False, True),
           "MAXNREG": (None, 48, 56, 64, 72), "EARLY": (False, True, 2), "WARPS2": (None, 1, 2, 4),
           "MAXNREG2": (None, 64, 72)},
    defaults={"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 1,
              "BLOCK_N2": None, "TILED": False, "PREFETCH": False, "NIB": False, "CHAIN": False, "MAXNREG": None,
              "EARLY": False, "WARPS2": None, "MAXNREG2": None},
    rules=(_pow2, rule_block_k_multiple_of_32, rule_h2g_words, rule_h2g_pipeline, rule_scale_window(0, 253),
           rule_tiled_k, _rule_h2g_warps2, _rule_h2g_chain),
    description="moe_h2 with gemv_h2g's K loop: plane-major fp16 activations in the weights' register layout; "
                "num_stages > 1: the K loop pipelined through a cp.async ring in shared memory; BLOCK_N2: mlp2's "
                "row tile when it differs from mlp1's (None: BLOCK_N); PREFETCH: the next K tile's weights in "
                "flight while one is used (register double buffer, as gemv_h2g); NIB: reads shuffle_nibbles' copy "
                "(decode in 9 instructions per word instead of 15); CHAIN: mlp2 starts during mlp1's last wave, each "
                "program once its own position's act row is stored (device counters, as moe_mma's CHAIN); MAXNREG: "
                "mlp1's registers per thread capped (more programs per SM, as gemv_h2g's; mlp2's builds are small, "
                "and a cap lets ptxas take more); EARLY: mlp1 reads its routing and PREFETCH's first weight tile "
                "before the PDL wait, while x_to_f16 runs (only when the layer converts x itself: with x16 given, "
                "route's launch came just before and mlp1 waits first); EARLY=2: mlp2 (without CHAIN) too, its "
                "first weight tile during mlp1's tail; WARPS2, MAXNREG2: mlp2's own num_warps and register cap (with "
                "BLOCK_N2, its own program shape: mlp1's leader shape is not the one-token lm_head's)",
))
def _rule_tc_numerics(cfg, problem):
    """bf16 weights (decode_bf16) are exact for scale bytes 14..240; F16's fp16 weights while they span <= 24."""
    return rule_scale_span(cfg, problem) if cfg.get("F16") else rule_scale_window(14, 240)(cfg, problem)


register(Variant(
    name="moe_tc", kind="moe", op="moe", fn=_run_moe_tc,
    space={"BLOCK_M": (16, 32, 64, 128, 256), "BLOCK_N": (64, 128), "BLOCK_K": (64, 128), "num_warps": (4, 8),
           "num_stages": (2, 3), "F16": (False, True)},
    defaults={"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3, "F16": False},
    rules=(_pow2, rule_block_k_multiple_of_32, _rule_tc, _rule_tc_numerics),
    description="grouped GEMM on tensor cores over per-expert tiles of BLOCK_M tokens; F16: fp16 weights decoded "
                "with half2 ops against x_to_f16's rows (about half the bf16 decode's instructions per weight)",
))


def moe_problem(tokens: int, r: Routing, p1: PreparedMXFP4, p2: PreparedMXFP4) -> dict:
    """The problem dict MoE variants' rules see."""
    return {"op": "moe", "m": tokens, "tokens": tokens, "experts": p1.shape[0], "top_k": r.top_k,
            "n": p1.shape[1], "k": p1.shape[2], "scale_min": min(p1.scale_min, p2.scale_min),
            "scale_max": max(p1.scale_max, p2.scale_max), "tiled": p1.tiled, "shuffled": p1.shuffled}


def _check_moe_args(x, routing, w1, b1, w2, b2):
    _check_tensor("x", x, (torch.bfloat16,))
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, H], got shape {tuple(x.shape)}")
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be a Routing (kernels.route or Routing.from_ids), got {type(routing).__name__}")
    for name, w in (("w1", w1), ("w2", w2)):
        if not isinstance(w, (MXFP4Tensor, PreparedMXFP4)):
            raise TypeError(f"{name} must be an MXFP4Tensor, got {type(w).__name__}")
        if len(w.shape) != 3:
            raise ValueError(f"{name} must be 3-D [E, N, K], got shape {w.shape}")
    t1, t2 = (isinstance(w, PreparedMXFP4) and w.tiled for w in (w1, w2))
    if t1 != t2:
        raise ValueError("w1 and w2 must share one layout: both tiled (tile_mxfp4) or both row-major")
    if (isinstance(w1, PreparedMXFP4) and w1.shuffled) != (isinstance(w2, PreparedMXFP4) and w2.shuffled):
        raise ValueError("w1 and w2 must share one layout: both shuffled (shuffle_nibbles) or neither")
    if t1 and (not w1.deinterleaved or w2.deinterleaved):
        raise ValueError("tiled MoE weights: w1 needs tile_mxfp4(..., deinterleave=True) (gate rows, then linear "
                         "rows), w2 plain tile_mxfp4")
    E, I2, H = w1.shape
    if x.shape[1] != H:
        raise ValueError(f"x has H={x.shape[1]} but w1 has H={H}")
    if I2 % 2 or tuple(w2.shape) != (E, H, I2 // 2):
        raise ValueError(f"w2 must have shape {(E, H, I2 // 2)} to match w1 {tuple(w1.shape)}, got {tuple(w2.shape)}")
    if routing.num_experts != E:
        raise ValueError(f"routing has {routing.num_experts} experts but w1 has {E}")
    if routing.tokens != x.shape[0]:
        raise ValueError(f"routing covers {routing.tokens} tokens but x has {x.shape[0]}")
    for name, b, shape in (("b1", b1, (E, I2)), ("b2", b2, (E, H))):
        _check_tensor(name, b, (torch.bfloat16, torch.float32, torch.float16))
        if tuple(b.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(b.shape)}")


def moe_mxfp4(x: torch.Tensor, routing: Routing, w1, b1: torch.Tensor, w2, b2: torch.Tensor, *,
              alpha: float = 1.702, limit: float = 7.0, variant: str = "auto", x16=None, combine: bool = True,
              **config) -> torch.Tensor | MoESlots:
    """GPT-OSS MoE layer: x [T, H] bf16, routing from route()/Routing.from_ids, w1 MXFP4 [E, 2I, H] (gate and
    linear rows interleaved), b1 [E, 2I], w2 MXFP4 [E, H, I], b2 [E, H] -> [T, H] bf16.

    variant="auto" picks from the host-side table in kernels.tables by T (no device sync).
    x16: x already converted by x_to_f16(x, planes=True) (router_logits(x16=True) makes it in its own
    launch); the moe_h2g variant then skips its conversion launch, the others do not need it.
    combine=False: the output before its combine launch, as MoESlots (or the [T, H] tensor where the config
    already fused the combine), for kernels.add_rms_norm to sum as its residual.
    """
    _check_moe_args(x, routing, w1, b1, w2, b2)
    if x16 is not None:
        xq, xs = x16
        T, H = x.shape
        if tuple(xq.shape) != (T, 8 * plane_words(H)) or xq.dtype != torch.float16 or tuple(xs.shape) != (T,) \
                or xs.dtype != torch.float32:
            raise ValueError(f"x16 must be x_to_f16(x, planes=True) of x {tuple(x.shape)}: fp16 "
                             f"[{T}, {8 * plane_words(H)}] and fp32 [{T}], got {xq.dtype} {tuple(xq.shape)} and "
                             f"{xs.dtype} {tuple(xs.shape)}")
    p1 = w1 if isinstance(w1, PreparedMXFP4) else prepare_mxfp4(w1)
    p2 = w2 if isinstance(w2, PreparedMXFP4) else prepare_mxfp4(w2)
    if not x.is_contiguous():
        x = x.contiguous()
    problem = moe_problem(x.shape[0], routing, p1, p2)
    if variant == "auto":
        from .tables import pick_moe

        variant, picked = pick_moe(problem)
        config = {**picked, **config}
    v = get_variant(variant, "moe")
    cfg = v.check(config, problem)
    return v.fn(x, routing, p1, b1.contiguous(), p2, b2.contiguous(), alpha, limit, x16=x16, combine=combine, **cfg)
