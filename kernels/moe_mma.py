"""moe_mma: the MoE layer's two GEMMs on tensor cores fed the way gemv_mma feeds them (kernels/linear_mma.py):
MXFP4 weights decoded in the registers mma.sync reads them from, no shared memory between load and MMA.

Why: from ~2 tokens per expert up, the CUDA-core decode variants (moe_h2g) run out of instruction issue (every
token adds FMAs per weight), and moe_tc moves every decoded tile through shared memory for tl.dot. Here a
weight costs its decode alone whatever the number of tokens up to BLOCK_M, so a layer whose experts hold
2..64 tokens each (prefill chunks, batched decode) streams each expert's weights about once at a cost that
barely grows with the tokens.

Grid: (per-expert BLOCK_M-token tiles, as moe_tc: an expert with c tokens owns ceil(c / BLOCK_M) of them and
spare programs exit, N tiles). mlp1 computes its gate rows (2j) and linear rows (2j + 1) as two MMA
accumulators, so the SwiGLU pairs meet in the same registers (no shuffle), and stores the activation as
scaled fp16 in x_to_f16's word-major order: exactly the B operand mlp2 loads. mlp2 stores the gate-weighted
rows in expert-sorted order for the combine (or kernels.add_rms_norm).

Numerics are gemv_mma's: fp16 weights E2M1 * 2^(s - SMAX + 1) (exact while the layer's scale bytes span at
most 24 binades), fp16 activations rescaled per token (mlp1) or by act16_scale (mlp2), fp32 accumulation.

Options measured on the H100: TILED (read tile_mxfp4's chunk-major copies: 2-23% faster, results/20261123T040447-
...-moe-mma-tiled) and STAGES (a cp.async ring in shared memory instead of register loads: slower at most points,
...035210-...-moe-mma-ring; kept for the comparison) and WGMMA (sm_90 wgmma on the same decoded registers, x in
logical K order through a cp.async ring, mlp1's gate and linear rows stacked in one accumulator; RING_W: the
weights through the ring too): 1.3-1.8x faster from 512 tokens (results/20261123T053157-...-moe-mma-wgmma,
...051500-...-ncu-moe-wgmma). TMA=2 (with RING_W): each step's words, scale bytes and x rows as TMA boxes instead
of every thread's cp.async copies (x from an expert-sorted copy for mlp1), which the latency-bound loop needs:
the copies cost it a quarter of its rate (.device/wgmma_ladder.py, results/20261127T032852-h100-80gb-hbm3-wgmma-
ladder), and the smaller build fits 3 programs per SM with MAXNREG=168: 4-15% faster from 1024 tokens
(results/20261127T034718-h100-80gb-hbm3-moe-mma-tma2-wide, ...034933-...-moe-mma-tma2-caps).
"""

from __future__ import annotations

import torch

from . import ring_sync
from ._triton import INTERP, INTERPRETED, pdl_launch, pdl_release, reg_cap, tl, triton
from .decode import tc_dot
from .linear_f16 import logical_pos, logical_pos_half, sm_count, x_to_f16
from .linear_mma import (
    SHARED_BYTES,
    _tile_offsets,
    _x_step,
    decode_step,
    gluon,
    mma_layouts,
    wg_layouts,
    wgmma_reason,
)
from .moe import MoESlots, act16_scale, expert_span, swiglu, tile_count, tile_rows, tile_slots, word_major_pos
from .prepare import shuffle_nibbles, step_major, tail_half, tile_mxfp4
from .sync import consume, proxy_fence_global, scratch, signal_count, take_item, wait_count
from .trace import trace_args, trace_end, trace_mark
from .variants import Variant, register, rule_pow2, rule_scale_span

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .linear_mma import (
        _g_mark,
        _g_pdl_enter,
        _g_step,
        _g_wg_program,
        _g_word_offsets,
        ring_layouts,
        ring_tail_layout,
        row_layout,
        tma_descriptors,
        wg_ring_layouts,
    )


@triton.jit
def _source(sorted_ptr, rm, end, m0, TOPK, PHASE: tl.constexpr):
    """Input row of each sorted position: its token (mlp1) or the position itself (mlp2); positions past the
    expert's last read the tile's first row (computed, never stored)."""
    mmask = rm < end
    if PHASE == 1:
        return tl.where(mmask, tl.load(sorted_ptr + rm, mask=mmask, other=0), tl.load(sorted_ptr + m0)) // TOPK
    else:
        return tl.where(mmask, rm, m0)


@triton.jit
def _rows(j, N, PHASE: tl.constexpr, TILED: tl.constexpr):
    """Weight rows of output columns j: (gate 2j, linear 2j + 1) for mlp1 (tiled: gate j, linear j in the second
    half, which starts at a whole 16-row group), (j, j) for mlp2; clamped to N."""
    if PHASE == 1:
        if TILED:
            c = tl.minimum(j, N // 2 - 1)
            return c, c + (N // 2 + 15) // 16 * 16
        return tl.minimum(2 * j, N - 2), tl.minimum(2 * j + 1, N - 1)
    else:
        c = tl.minimum(j, N - 1)
        return c, c


@triton.jit
def _epi_token(rm, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE: tl.constexpr):
    """The epilogue's per-token factor [1, BLOCK_M] of sorted positions rm: mlp1 the token's x scale times the
    weights' 2^(SMAX - 128), mlp2 the gate weight. Two dependent loads that need neither mlp1 nor the K loop,
    so EPI_EARLY issues them before both."""
    mmask = rm < end
    slots = tl.load(sorted_ptr + rm, mask=mmask, other=0)
    if PHASE == 1:
        wscale = ((SMAX - 1).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(SMAX - 128)
        return (tl.load(xs_ptr + slots // TOPK) * wscale)[None, :]
    else:
        return tl.load(gate_ptr + slots, mask=mmask, other=0.0)[None, :]


@triton.jit
def _epi_bias(j, e, b_ptr, N, PHASE: tl.constexpr):
    """The epilogue's bias rows [BLOCK_N, 1] of columns j, for acc_a and acc_b: mlp1 gate and linear, mlp2 b2
    (twice)."""
    if PHASE == 1:
        jc = tl.minimum(j, N // 2 - 1)
        return tl.load(b_ptr + e * N + 2 * jc)[:, None], tl.load(b_ptr + e * N + 2 * jc + 1)[:, None]
    else:
        bias = tl.load(b_ptr + e * N + tl.minimum(j, N - 1))[:, None]
        return bias, bias


@triton.jit
def _epilogue(acc_a, acc_b, j, J0, rm, end, tok, bias_a, bias_b, out_ptr, N, OUTW, alpha, limit, act_scale, SMAX,
              PHASE: tl.constexpr, LOGICAL: tl.constexpr, sorted_ptr, TOPK, ATOMIC: tl.constexpr,
              TAIL: tl.constexpr = False):
    """acc [columns j, sorted positions rm] with _epi_token's tok and _epi_bias' rows -> mlp1: SwiGLU(gate acc_a,
    linear acc_b) * act_scale as fp16 at act[rm, word-major (LOGICAL: logical K order) position of j] (row width
    OUTW); mlp2: (acc_a + b2) * gate weight as bf16 y[rm, j]. In logical order the columns past N / 2 are spread
    over the last 128-chunks of a row of OUTW (whole K steps): the program holding column j zeroes padding
    columns N / 2 * (q + 1) + j (mlp2 reads them); J0, the program's first column, bounds that loop, so programs
    whose columns reach no padding column skip it (it was 4% of the 20b mlp1's executed instructions at 8192
    tokens). ATOMIC (mlp2): the bf16 rows are added into out[token of rm, j] ([T, N], zeroed beforehand) by
    relaxed atomics instead of stored at y[rm, j]; the interpreter, whose programs run one at a time, adds with a
    load and a store. TAIL (mlp1, logical, N / 2 % 128 == 64: mlp2 runs TAIL): the half last chunk's columns in
    x_to_f16's half_tail order (logical_pos_half), and no padding zeroed (mlp2's ring and half step never read it).
    """
    mmask = rm < end
    if PHASE == 1:
        half = N // 2
        g = acc_a * tok + bias_a.to(tl.float32)
        lin = acc_b * tok + bias_b.to(tl.float32)
        a = swiglu(g, lin, alpha, limit, act_scale)  # scaled for fp16
        row = out_ptr + rm[None, :].to(tl.int64) * OUTW
        if LOGICAL and TAIL:
            pos = tl.where(j < half // 128 * 128, logical_pos(j % 128), logical_pos_half(j % 128))
            tl.store(row + (j - j % 128 + pos)[:, None], a.to(tl.float16), mask=mmask[None, :] & (j < half)[:, None])
        elif LOGICAL:
            tl.store(row + (j - j % 128 + logical_pos(j % 128))[:, None], a.to(tl.float16),
                     mask=mmask[None, :] & (j < half)[:, None])
            for q in range(0, tl.cdiv(tl.maximum(OUTW - half - J0, 0), half)):  # padding column half * (q + 1) + j
                jz = half * (q + 1) + j
                zmask = mmask[None, :] & ((jz < OUTW) & (j < half))[:, None]
                tl.store(row + (jz - jz % 128 + logical_pos(jz % 128))[:, None],
                         tl.where(zmask, 0.0, 0.0).to(tl.float16), mask=zmask)
        else:
            tl.store(row + word_major_pos(j)[:, None], a.to(tl.float16),
                     mask=mmask[None, :] & (j < half)[:, None])
    else:
        wscale = ((SMAX - 1).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(SMAX - 128)
        y = acc_a * (wscale / act_scale) + bias_a.to(tl.float32)
        v = (y * tok).to(tl.bfloat16)
        ymask = mmask[None, :] & (j < N)[:, None]
        if ATOMIC:  # an expert holds a token once, so a program's rows are distinct tokens
            token = tl.load(sorted_ptr + rm, mask=mmask, other=0) // TOPK
            dst = out_ptr + token[None, :].to(tl.int64) * N + j[:, None]
            if INTERP:
                tl.store(dst, (tl.load(dst, mask=ymask, other=0.0).to(tl.float32) + v.to(tl.float32)).to(tl.bfloat16),
                         mask=ymask)
            else:
                tl.atomic_add(dst, v, mask=ymask, sem="relaxed")
        else:  # in out's type: bf16 rows, or fp32 shares of SPLITK2's slices (summed by the combine)
            tl.store(out_ptr + rm[None, :].to(tl.int64) * N + j[:, None], (y * tok).to(out_ptr.dtype.element_ty),
                     mask=ymask)


@triton.jit
def _moe_mma_twin(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP,
                  OUTW, TOPK, alpha, limit, act_scale, SMAX, E, WE, SE, PHASE: tl.constexpr, EP: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, TILED: tl.constexpr,
                  LOGICAL: tl.constexpr, NIB: tl.constexpr, chain_ptr, TILES, NEED, CHAIN: tl.constexpr,
                  ATOMIC: tl.constexpr = False, SPLITK: tl.constexpr = 1, KS=0, PERSIST: tl.constexpr = False,
                  NT=0, ticket_ptr=None, TICKET: tl.constexpr = False, SLICE=0):
    """moe_mma's steps in plain Triton (the interpreter path): same words, decode, K order and epilogue
    (LOGICAL: x and act in logical K order, as WGMMA reads them; CHAIN: the counters as the WGMMA kernel;
    ATOMIC: mlp2 adds into the layer output, as the WGMMA kernel; SPLITK: program_id(1) is the N tile times
    SPLITK plus the K slice, as the WGMMA kernel's program_id(0); PERSIST: a grid of programs each taking every
    num_programs-th of the routing's tiles' NT programs' work, as the WGMMA kernel's; TICKET: after the first,
    the next item by ticket, kernels.sync.take_item; SLICE: as the WGMMA kernel's)."""
    if PERSIST:
        total = tile_count(offs_ptr, tl.arange(0, EP), E, BLOCK_M) * NT
        w = tl.program_id(0)
        while w < total:
            _twin_item(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP, OUTW,
                       TOPK, alpha, limit, act_scale, SMAX, E, WE, SE, PHASE, EP, BLOCK_M, BLOCK_N, CHUNKS, TILED,
                       LOGICAL, NIB, chain_ptr, TILES, NEED, CHAIN, ATOMIC, SPLITK, KS, w // NT, w % NT, NT)
            if TICKET:
                w = take_item(ticket_ptr, total, tl.num_programs(0))
            else:
                w += tl.num_programs(0)
    else:
        if SPLITK > 1 and not ATOMIC:  # the slice's own rows of out
            out_ptr += tl.program_id(1) % SPLITK * SLICE
        _twin_item(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP, OUTW,
                   TOPK, alpha, limit, act_scale, SMAX, E, WE, SE, PHASE, EP, BLOCK_M, BLOCK_N, CHUNKS, TILED,
                   LOGICAL, NIB, chain_ptr, TILES, NEED, CHAIN, ATOMIC, SPLITK, KS, tl.program_id(0),
                   tl.program_id(1), tl.num_programs(1))


@triton.jit
def _twin_item(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP, OUTW, TOPK,
               alpha, limit, act_scale, SMAX, E, WE, SE, PHASE: tl.constexpr, EP: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, TILED: tl.constexpr,
               LOGICAL: tl.constexpr, NIB: tl.constexpr, chain_ptr, TILES, NEED, CHAIN: tl.constexpr,
               ATOMIC: tl.constexpr, SPLITK: tl.constexpr, KS, tile, pid_n, NT):
    """One program's work of _moe_mma_twin: token tile `tile`, N tile times SPLITK plus K slice `pid_n`, of a
    tile's NT."""
    pn = pid_n // SPLITK
    ks = pid_n % SPLITK * KS
    e, m0, end, live = tile_rows(offs_ptr, tile, tl.arange(0, EP), E, BLOCK_M)
    if live:
        if CHAIN and PHASE == 2:
            wait_count(chain_ptr + tile, NEED)
        KW = K // 8
        KB = K // 32
        j = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        ra, rb = _rows(j, N, PHASE, TILED)
        cc = tl.arange(0, CHUNKS)
        t = tl.arange(0, 4)
        word = (cc * 16)[None, :, None, None] + (t * 4)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]
        block = (cc * 4)[None, :, None] + t[None, None, :]
        w_e = w_ptr + e.to(tl.int64) * WE
        s_e = s_ptr + e.to(tl.int64) * SE
        wa, sa = _tile_offsets(ra, cc, t, tl.arange(0, 4), KW, TILED)
        wb, sb = _tile_offsets(rb, cc, t, tl.arange(0, 4), KW, TILED)
        WSTEP: tl.constexpr = CHUNKS * (256 if TILED else 16)  # words and scale bytes one step advances
        SSTEP: tl.constexpr = CHUNKS * (64 if TILED else 4)
        rm = m0 + tl.arange(0, BLOCK_M)
        src = _source(sorted_ptr, rm, end, m0, TOPK, PHASE)
        xpos = (cc * 128)[None, :, None, None] + (t * 32)[None, None, :, None] + tl.arange(0, 32)[None, None, None, :]
        xofs = (src.to(tl.int64) * KP)[:, None, None, None] + xpos
        acc_a = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
        acc_b = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
        STEP: tl.constexpr = CHUNKS * 16  # weight words per row and step
        c_end = tl.cdiv(KW, STEP)
        if SPLITK > 1:  # the last slice takes the rest (with TAIL's slices of K's whole steps, the half chunk)
            c_end = tl.where(pid_n % SPLITK == SPLITK - 1, c_end, tl.minimum(c_end, (ks + KS) // (STEP * 8)))
        for c in range(ks // (STEP * 8), c_end):
            wm = c * STEP + word < KW
            sm = c * (STEP // 4) + block < KB
            if LOGICAL:  # as the compiled WGMMA kernel: whole steps copied unmasked (rows padded to them)
                tl.device_assert(KP % (STEP * 8) == 0, "x rows must be padded to whole K steps")
                xb = _x_step(tl.load(x_ptr + xofs + c * STEP * 8), LOGICAL)
            else:
                xb = _x_step(tl.load(x_ptr + xofs + c * STEP * 8, mask=c * STEP * 8 + xpos < K, other=0.0), LOGICAL)
            va = tl.load(w_e + wa + c * WSTEP, mask=wm, other=0)
            sva = tl.load(s_e + sa + c * SSTEP, mask=sm, other=0)
            acc_a = tc_dot(decode_step(va, sva, SMAX, NIB), xb, acc_a)
            if PHASE == 1:
                vb = tl.load(w_e + wb + c * WSTEP, mask=wm, other=0)
                svb = tl.load(s_e + sb + c * SSTEP, mask=sm, other=0)
                acc_b = tc_dot(decode_step(vb, svb, SMAX, NIB), xb, acc_b)
        tok = _epi_token(rm, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE)
        bias_a, bias_b = _epi_bias(j, e, b_ptr, N, PHASE)
        if SPLITK > 1:  # one slice adds the bias
            bias_a = tl.where(ks == 0, bias_a, 0.0).to(bias_a.dtype)
            bias_b = bias_a
        _epilogue(acc_a, acc_b, j, pn * BLOCK_N, rm, end, tok, bias_a, bias_b, out_ptr, N, OUTW,
                  alpha, limit, act_scale, SMAX, PHASE, LOGICAL, sorted_ptr, TOPK, ATOMIC)
        if CHAIN:
            _chain_done(chain_ptr, tile, TILES, NT, PHASE)


@triton.jit
def _chain_done(chain_ptr, tile, TILES, n_tiles, PHASE: tl.constexpr):
    """CHAIN, after the epilogue: mlp1 counts its stores on the tile's counter; mlp2 counts itself as a reader
    of the tile, the last of its n_tiles readers zeroing both counters."""
    if PHASE == 1:
        signal_count(chain_ptr + tile)
    else:
        consume(chain_ptr + TILES + tile, chain_ptr + tile, n_tiles)


if gluon is not None:
    _g_tile_rows_of = gluon.jit(tile_rows.fn)
    _g_tile_count_of = gluon.jit(tile_count.fn)
    _g_source = gluon.jit(_source.fn)
    _g_rows = gluon.jit(_rows.fn)
    _g_epilogue = gluon.jit(_epilogue.fn)
    _g_epi_token = gluon.jit(_epi_token.fn)
    _g_epi_bias = gluon.jit(_epi_bias.fn)
    _g_chain_done = gluon.jit(_chain_done.fn)
    _g_wait_count = gluon.jit(wait_count.fn)
    _g_take_item = gluon.jit(take_item.fn)
    _g_proxy_fence = gluon.jit(proxy_fence_global.fn)
    _g_pdl_release = gluon.jit(pdl_release.fn)
    _g_trace_mark = gluon.jit(trace_mark.fn)
    _g_trace_end = gluon.jit(trace_end.fn)

    @gluon.jit
    def _g_tile_rows(offs_ptr, tile, E, EP: gl.constexpr, BLOCK_M: gl.constexpr, EXTRA: gl.constexpr = 0):
        """tile_rows with its vector over experts in a plain blocked layout (a scan needs one)."""
        experts = gl.arange(0, EP, layout=gl.BlockedLayout([1], [32], [gl.num_warps()], [0]))
        return _g_tile_rows_of(offs_ptr, tile, experts, E, BLOCK_M, EXTRA)

    @gluon.jit
    def _g_tile_count(offs_ptr, E, EP: gl.constexpr, BLOCK_M: gl.constexpr):
        """tile_count with its vector over experts in a plain blocked layout."""
        experts = gl.arange(0, EP, layout=gl.BlockedLayout([1], [32], [gl.num_warps()], [0]))
        return _g_tile_count_of(offs_ptr, experts, E, BLOCK_M)

    @gluon.jit
    def _g_tile(sorted_ptr, w_ptr, s_ptr, e, m0, end, N, K, KP, TOPK, WE, SE, PHASE: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CHUNKS: gl.constexpr, TILED: gl.constexpr,
                LW: gl.constexpr, LX: gl.constexpr):
        """The offsets the K steps of expert e's token tile (sorted positions m0..end) load from: weight words
        and scale bytes of the two row sets (layout LW), their K positions for the tail masks (group, block),
        and x's gathered rows (layout LX; K positions xpos)."""
        ra, rb = _g_rows(gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=row_layout(LW)), N, PHASE, TILED)
        w_e = w_ptr + e.to(gl.int64) * WE
        s_e = s_ptr + e.to(gl.int64) * SE
        wa, sa, group, block = _g_word_offsets(ra, K // 8, CHUNKS, TILED, LW)
        wb, sb, _, _ = _g_word_offsets(rb, K // 8, CHUNKS, TILED, LW)
        LXC: gl.constexpr = gl.SliceLayout(3, LX)
        rm = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, gl.SliceLayout(2, LXC)))
        src = _g_source(sorted_ptr, rm, end, m0, TOPK, PHASE)
        xc = gl.arange(0, CHUNKS, layout=gl.SliceLayout(0, gl.SliceLayout(2, LXC)))
        xt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LXC)))
        xr = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LX))))
        xpos = (xc * 128)[None, :, None, None] + (xt * 32)[None, None, :, None] + xr[None, None, None, :]
        xofs = gl.multiple_of(src.to(gl.int64) * KP, 8)[:, None, None, None] + xpos  # K % 32 == 0
        return w_e, s_e, wa, sa, wb, sb, group, block, xofs, xpos

    @gluon.jit
    def _g_load(w_e, s_e, wofs, sofs, group, block, c, KW, KB, STEP: gl.constexpr, MASKED: gl.constexpr,
                TILED: gl.constexpr):
        """Words and scale bytes of K step c (MASKED: the K tail, words past K read zeros)."""
        WSTEP: gl.constexpr = STEP * (16 if TILED else 1)  # tiled: 16 rows' chunks between a row's chunks
        SSTEP: gl.constexpr = STEP // 4 * (16 if TILED else 1)
        if MASKED:
            v = gl.load(w_e + wofs + c * WSTEP, mask=c * STEP + group < KW, other=0)
            s = gl.load(s_e + sofs + c * SSTEP, mask=c * (STEP // 4) + block < KB, other=0)
        else:
            v = gl.load(w_e + wofs + c * WSTEP)
            s = gl.load(s_e + sofs + c * SSTEP)
        return v, s

    @gluon.jit
    def _moe_mma_kernel(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N,
                        K, KP, OUTW, TOPK, alpha, limit, act_scale, SMAX, E, WE, SE, PHASE: gl.constexpr,
                        EP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CHUNKS: gl.constexpr,
                        TILED: gl.constexpr, PREFETCH: gl.constexpr, LW: gl.constexpr, LX: gl.constexpr,
                        MMA: gl.constexpr, NIB: gl.constexpr):
        """gemv_mma's K loop over one expert's token tile; x rows gathered per token (mlp1) or position (mlp2)."""
        _g_pdl_enter()
        e, m0, end, live = _g_tile_rows(offs_ptr, gl.program_id(0), E, EP, BLOCK_M)
        if live:
            w_e, s_e, wa, sa, wb, sb, group, block, xofs, xpos = _g_tile(
                sorted_ptr, w_ptr, s_ptr, e, m0, end, N, K, KP, TOPK, WE, SE, PHASE, BLOCK_M,
                BLOCK_N, CHUNKS, TILED, LW, LX)
            KW = K // 8
            KB = K // 32
            A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
            B_L: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
            acc_a = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
            acc_b = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
            STEP: gl.constexpr = CHUNKS * 16
            full = KW // STEP
            if PREFETCH:  # register double buffer: step c + 1's words are in flight while step c is decoded
                va_n, sa_n = _g_load(w_e, s_e, wa, sa, group, block, 0, gl.minimum(full, 1) * STEP, KB, STEP, True,
                                     TILED)
                if PHASE == 1:
                    vb_n, sb_n = _g_load(w_e, s_e, wb, sb, group, block, 0, gl.minimum(full, 1) * STEP, KB, STEP,
                                         True, TILED)
            for c in range(0, full):
                if PREFETCH:
                    va, sva = va_n, sa_n
                    lim = (c + 1 + gl.minimum(full - 1 - c, 1)) * STEP  # past the last full step: nothing
                    va_n, sa_n = _g_load(w_e, s_e, wa, sa, group, block, c + 1, lim, KB, STEP, True, TILED)
                    if PHASE == 1:
                        vb, svb = vb_n, sb_n
                        vb_n, sb_n = _g_load(w_e, s_e, wb, sb, group, block, c + 1, lim, KB, STEP, True, TILED)
                else:
                    va, sva = _g_load(w_e, s_e, wa, sa, group, block, c, KW, KB, STEP, False, TILED)
                    if PHASE == 1:
                        vb, svb = _g_load(w_e, s_e, wb, sb, group, block, c, KW, KB, STEP, False, TILED)
                xq = gl.load(x_ptr + xofs + c * (STEP * 8))
                acc_a = _g_step(acc_a, va, sva, xq, SMAX, A_L, B_L, NIB)
                if PHASE == 1:
                    acc_b = _g_step(acc_b, vb, svb, xq, SMAX, A_L, B_L, NIB)
            if full * STEP < KW:  # the K tail: words and x past K read zeros
                xq = gl.load(x_ptr + xofs + full * (STEP * 8), mask=full * (STEP * 8) + xpos < K, other=0.0)
                va, sva = _g_load(w_e, s_e, wa, sa, group, block, full, KW, KB, STEP, True, TILED)
                acc_a = _g_step(acc_a, va, sva, xq, SMAX, A_L, B_L, NIB)
                if PHASE == 1:
                    vb, svb = _g_load(w_e, s_e, wb, sb, group, block, full, KW, KB, STEP, True, TILED)
                    acc_b = _g_step(acc_b, vb, svb, xq, SMAX, A_L, B_L, NIB)
            j = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
            rm = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
            tok = _g_epi_token(rm, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE)
            bias_a, bias_b = _g_epi_bias(j, e, b_ptr, N, PHASE)
            _g_epilogue(acc_a, acc_b, j, gl.program_id(1) * BLOCK_N, rm, end, tok, bias_a, bias_b, out_ptr, N, OUTW,
                        alpha, limit, act_scale, SMAX, PHASE, False, sorted_ptr, TOPK, False)


    @gluon.jit
    def _g_issue(ws_a, ws_b, xs, w_e, wa, wb, group, x_ptr, xcofs, xcpos, c, KW, K, STEP: gl.constexpr,
                 STAGES: gl.constexpr, PHASE: gl.constexpr, TILED: gl.constexpr):
        """Start the cp.async copies of K step c into its ring slot and commit them as one group; words and x
        past K (the tail, and steps past the last) are zero-filled."""
        slot = c % STAGES
        wm = c * STEP + group < KW
        WSTEP: gl.constexpr = STEP * (16 if TILED else 1)  # tiled: 16 rows' chunks between a row's chunks
        async_copy.async_copy_global_to_shared(ws_a.index(slot), w_e + wa + c * WSTEP, mask=wm)
        if PHASE == 1:
            async_copy.async_copy_global_to_shared(ws_b.index(slot), w_e + wb + c * WSTEP, mask=wm)
        async_copy.async_copy_global_to_shared(xs.index(slot), x_ptr + xcofs + c * (STEP * 8),
                                               mask=c * (STEP * 8) + xcpos < K)
        async_copy.commit_group()

    @gluon.jit
    def _moe_ring_kernel(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N,
                         K, KP, OUTW, TOPK, alpha, limit, act_scale, SMAX, E, WE, SE, PHASE: gl.constexpr,
                         EP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CHUNKS: gl.constexpr,
                         TILED: gl.constexpr, STAGES: gl.constexpr, LW: gl.constexpr, LX: gl.constexpr,
                         MMA: gl.constexpr, SW: gl.constexpr, SX: gl.constexpr, LXCP: gl.constexpr,
                         NIB: gl.constexpr):
        """moe_mma's K loop with the weight words and x of the next STAGES - 1 steps in flight as cp.async
        copies into a shared-memory ring (no registers held by loads in flight); scale bytes one step ahead
        in registers (a sixteenth of the bytes; their rows are not 4-byte aligned for cp.async)."""
        _g_pdl_enter()
        e, m0, end, live = _g_tile_rows(offs_ptr, gl.program_id(0), E, EP, BLOCK_M)
        if live:
            w_e, s_e, wa, sa, wb, sb, group, block, xcofs, xcpos = _g_tile(
                sorted_ptr, w_ptr, s_ptr, e, m0, end, N, K, KP, TOPK, WE, SE, PHASE, BLOCK_M,
                BLOCK_N, CHUNKS, TILED, LW, LXCP)
            KW = K // 8
            KB = K // 32
            ws_a = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, CHUNKS, 4, 4], SW)
            ws_b = ws_a
            if PHASE == 1:
                ws_b = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, CHUNKS, 4, 4], SW)
            xs = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, CHUNKS, 4, 32], SX)
            A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
            B_L: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
            acc_a = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
            acc_b = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
            STEP: gl.constexpr = CHUNKS * 16
            steps = gl.cdiv(KW, STEP)
            for q in gl.static_range(STAGES - 1):
                _g_issue(ws_a, ws_b, xs, w_e, wa, wb, group, x_ptr, xcofs, xcpos, q, KW, K, STEP, STAGES, PHASE,
                         TILED)
            sva_n = gl.load(s_e + sa, mask=block < KB, other=0)
            svb_n = sva_n
            if PHASE == 1:
                svb_n = gl.load(s_e + sb, mask=block < KB, other=0)
            for c in range(0, steps):
                sva = sva_n
                svb = svb_n
                nb = (c + 1) * (STEP // 4)
                SSTEP: gl.constexpr = STEP // 4 * (16 if TILED else 1)
                sva_n = gl.load(s_e + sa + (c + 1) * SSTEP, mask=nb + block < KB, other=0)
                if PHASE == 1:
                    svb_n = gl.load(s_e + sb + (c + 1) * SSTEP, mask=nb + block < KB, other=0)
                async_copy.wait_group(STAGES - 2)
                gl.thread_barrier()  # step c's copies (every thread's) landed; step c - 1's slot is free
                _g_issue(ws_a, ws_b, xs, w_e, wa, wb, group, x_ptr, xcofs, xcpos, c + STAGES - 1, KW, K, STEP,
                         STAGES, PHASE, TILED)
                slot = c % STAGES
                xq = xs.index(slot).load(LX)
                acc_a = _g_step(acc_a, ws_a.index(slot).load(LW), sva, xq, SMAX, A_L, B_L, NIB)
                if PHASE == 1:
                    acc_b = _g_step(acc_b, ws_b.index(slot).load(LW), svb, xq, SMAX, A_L, B_L, NIB)
            async_copy.wait_group(0)
            j = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
            rm = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
            tok = _g_epi_token(rm, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE)
            bias_a, bias_b = _g_epi_bias(j, e, b_ptr, N, PHASE)
            _g_epilogue(acc_a, acc_b, j, gl.program_id(1) * BLOCK_N, rm, end, tok, bias_a, bias_b, out_ptr, N, OUTW,
                        alpha, limit, act_scale, SMAX, PHASE, False, sorted_ptr, TOPK, False)

    @gluon.jit
    def _g_epi_pair(acc, PHASE: gl.constexpr, EPI: gl.constexpr):
        """A WGMMA accumulator [BLOCK_N, tokens] as the epilogue's (acc_a, acc_b) [column, token] in EPI's layout:
        mlp1's gate and linear rows (stacked in acc) as a pair in one thread (the split moves no data); mlp2's
        rows twice, 8 consecutive rows of a token per thread (one 16-byte store of y)."""
        BLOCK_N: gl.constexpr = acc.shape[0]
        LP: gl.constexpr = gl.SliceLayout(2, EPI) if PHASE == 1 else EPI
        if PHASE == 1:
            pair = gl.convert_layout(gl.permute(gl.reshape(acc, [2, BLOCK_N // 2, acc.shape[1]]), (1, 2, 0)), EPI)
            acc_a, acc_b = gl.split(pair)
            return gl.convert_layout(acc_a, LP, assert_trivial=True), gl.convert_layout(acc_b, LP, assert_trivial=True)
        else:
            acc_a = gl.convert_layout(acc, EPI)
            return acc_a, acc_a

    @gluon.jit
    def _g_rows_epilogue(acc, r0, end, je, J0, bias_a, bias_b, xs_ptr, sorted_ptr, gate_ptr, out_ptr, N, OUTW, TOPK,
                         alpha, limit, act_scale, SMAX, PHASE: gl.constexpr, EPI: gl.constexpr, ATOMIC: gl.constexpr,
                         TAIL_OUT: gl.constexpr):
        """ABSORB: _g_wg_tile's epilogue of the extra accumulator [BLOCK_N, W], sorted positions r0 .. r0 + W - 1
        (its token loads here, after the K loop)."""
        W: gl.constexpr = acc.shape[1]
        LP: gl.constexpr = gl.SliceLayout(2, EPI) if PHASE == 1 else EPI
        acc_a, acc_b = _g_epi_pair(acc, PHASE, EPI)
        rme = r0 + gl.arange(0, W, layout=gl.SliceLayout(0, LP))
        tok = _g_epi_token(rme, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE)
        _g_epilogue(acc_a, acc_b, je, J0, rme, end, tok, bias_a, bias_b, out_ptr, N, OUTW, alpha, limit, act_scale,
                    SMAX, PHASE, True, sorted_ptr, TOPK, ATOMIC, TAIL_OUT)

    @gluon.jit
    def _g_wg_tile(x_ptr, xs_ptr, sorted_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP, OUTW, TOPK, alpha,
                   limit, act_scale, SMAX, WE, SE, e, m0, end, tile, pid_n, NT, chain_ptr, TILES, NEED, wdesc, sdesc,
                   GE, trace_ptr,
                   PHASE: gl.constexpr, BLOCK_N: gl.constexpr, CHUNKS: gl.constexpr, TILED: gl.constexpr,
                   STAGES: gl.constexpr, RING_W: gl.constexpr, EPI: gl.constexpr, SW: gl.constexpr, SS: gl.constexpr,
                   LSC: gl.constexpr, NIB: gl.constexpr, CHAIN: gl.constexpr, EPI_EARLY: gl.constexpr,
                   XSKIP: gl.constexpr, TMA: gl.constexpr, TRACE: gl.constexpr, xdesc, BLOCK_M: gl.constexpr,
                   LW: gl.constexpr, MMA: gl.constexpr, LXCP: gl.constexpr, SX: gl.constexpr,
                   SM: gl.constexpr = False, GT=0, ATOMIC: gl.constexpr = False, SPLITK: gl.constexpr = 1, KS=0,
                   WAIT_LATE: gl.constexpr = False, tails=None, TAIL: gl.constexpr = False,
                   TAIL_OUT: gl.constexpr = False, xdesc2=None, PAIRED: gl.constexpr = False):
        """One live token tile of _moe_wg_kernel (its K loop and epilogue) on a BLOCK_M-wide build (TRACE: CHAIN's
        wait marks the program's record in trace_ptr again past it), the N tile's program pid_n of the tile's NT.
        SPLITK > 1 (mlp2, ATOMIC): pid_n is the N tile times SPLITK plus the K slice, which multiplies K from
        slice * KS for at most KS and adds its share (the bias with slice 0's) into the output. WAIT_LATE: the
        program's PDL wait here, after the tile's routing reads (offsets, sorted positions, gate weights: written
        two launches back, by route) and bias loads, before x's and its token scales' (x_to_f16's); 2: in the
        K loop, after its first weight copies too (kernels.linear_mma._g_wg_program's EARLY). TAIL: the K tail's
        half chunk as a half step (tails: tail_half's words and scale bytes of the expert stack, and their strides
        per expert), against x's (or act's) half_tail columns from K // 128 * 128; TAIL_OUT (mlp1): act stored for an
        mlp2 that runs TAIL (_epilogue). xdesc2 (ABSORB, TMA=2): the box of x's EXTRA rows after BLOCK_M; a tile
        running past BLOCK_M tokens (tile_rows' last tile of its expert, absorbing the one after it) multiplies
        them into a second accumulator on the same decoded weights and stores them by a second epilogue.
        PAIRED (mlp1, TMA): its rows are one box of each kind (tma_descriptors(paired=True)'s 4-D views: the
        expert's gate half g0 = 2 e and the program's groups g1 in each half)."""
        COLS: gl.constexpr = BLOCK_N // 2 if PHASE == 1 else BLOCK_N
        LP: gl.constexpr = gl.SliceLayout(2, EPI) if PHASE == 1 else EPI  # the epilogue's [column, token]
        pn = pid_n
        ks = 0
        if SPLITK > 1:
            ks = pn % SPLITK * KS
            pn = pn // SPLITK
        if EPI_EARLY:  # loads that need neither mlp1 nor the K loop, ahead of both
            rme = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, LP))
            if not WAIT_LATE:  # mlp1's token scales come from x_to_f16
                tok = _g_epi_token(rme, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE)
            if EPI_EARLY == 2:
                je = pn * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(1, LP))
                bias_a, bias_b = _g_epi_bias(je, e, b_ptr, N, PHASE)
        if CHAIN and PHASE == 2:
            _g_wait_count(chain_ptr + tile, NEED)
            if TMA == 2:  # act by TMA boxes after a generic-proxy acquire
                _g_proxy_fence()
            if TRACE:
                _g_trace_mark(trace_ptr, 1)
        r = gl.arange(0, BLOCK_N, layout=row_layout(LW))
        ra, rb = _g_rows(pn * COLS + r % COLS, N, PHASE, TILED)
        rm = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LXCP))
        src = _g_source(sorted_ptr, rm, end, m0, TOPK, PHASE)
        xofs = (gl.multiple_of(src.to(gl.int64) * KP, 128)[:, None]
                + gl.arange(0, 128 * CHUNKS, layout=gl.SliceLayout(0, LXCP))[None, :])
        if WAIT_LATE == 1:
            _g_pdl_enter()
            if EPI_EARLY:
                tok = _g_epi_token(rme, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE)
        xok = None
        if XSKIP:  # the copies' rows that hold a token (the others zero-filled, not read)
            xok = (rm < end)[:, None] & (xofs >= 0)  # the second term only broadcasts
        g0 = 0
        g1 = None
        if TMA:
            if PAIRED:  # the expert's gate half, and the program's groups in each half (4-D boxes)
                g0 = 2 * e
                g1 = pn * (BLOCK_N // 32)
            elif PHASE == 1:  # the gate rows' groups, and the linear rows' in the second half
                g0 = e * GE + pn * (BLOCK_N // 32)
                g1 = g0 + GE // 2
            else:
                g0 = e * GE + pn * (BLOCK_N // 16)
        w_e = w_ptr + e.to(gl.int64) * WE
        s_e = s_ptr + e.to(gl.int64) * SE
        kl = None
        if SPLITK > 1:  # the slice's first chunk: chunk strides of the tiled copy, or of the step-major one
            w_e += ks // 128 * (GT * 256 if SM else 256)
            s_e += ks // 128 * (GT * 64 if SM else 64)
            xofs += ks
            kl = gl.maximum(gl.where(pid_n % SPLITK == SPLITK - 1, K - ks, gl.minimum(K - ks, KS)), 0)
        tw_e = None
        ts_e = None
        xtofs = None
        if TAIL:
            tw_ptr, ts_ptr, TWE, TSE = tails
            tw_e = tw_ptr + e.to(gl.int64) * TWE
            ts_e = ts_ptr + e.to(gl.int64) * TSE
            LXT: gl.constexpr = ring_tail_layout(BLOCK_N, BLOCK_M, gl.num_warps(), 3)
            srct = gl.convert_layout(src, gl.SliceLayout(1, LXT)).to(gl.int64)
            xtofs = (srct * KP + K // 128 * 128)[:, None] + gl.arange(0, 64, layout=gl.SliceLayout(0, LXT))[None, :]
        acc = _g_wg_program(w_e, s_e, gl.where(r < COLS, ra, rb), x_ptr, xofs, K, SMAX, BLOCK_M, BLOCK_N, CHUNKS,
                            TILED, STAGES, RING_W, LW, MMA, SX, SW, SS, LSC, NIB, wdesc, sdesc, g0, TMA, WAIT_LATE == 2,
                            xdesc, m0, xok=xok, g1=g1, SM=SM, GT=GT, KL=kl, TAIL=TAIL, tw_e=tw_e, ts_e=ts_e,
                            xtofs=xtofs, xdesc2=xdesc2, absorb=end - m0 > BLOCK_M)
        if xdesc2 is not None:
            acc, acc_x = acc
        if WAIT_LATE == 2 and EPI_EARLY:  # past the loop's PDL wait
            tok = _g_epi_token(rme, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE)
        acc_a, acc_b = _g_epi_pair(acc, PHASE, EPI)
        if not EPI_EARLY and PHASE == 1:  # in the order the loads had in one epilogue (the same build)
            rme = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, LP))
            tok = _g_epi_token(rme, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE)
        if EPI_EARLY != 2:
            je = pn * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(1, LP))
            bias_a, bias_b = _g_epi_bias(je, e, b_ptr, N, PHASE)
        if not EPI_EARLY and PHASE == 2:
            rme = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, LP))
            tok = _g_epi_token(rme, end, xs_ptr, sorted_ptr, gate_ptr, TOPK, SMAX, PHASE)
        if SPLITK > 1:  # one slice adds the bias
            bias_a = gl.where(ks == 0, bias_a, 0.0).to(bias_a.dtype)
            bias_b = bias_a
        _g_epilogue(acc_a, acc_b, je, pn * COLS, rme, end, tok, bias_a, bias_b, out_ptr, N, OUTW,
                    alpha, limit, act_scale, SMAX, PHASE, True, sorted_ptr, TOPK, ATOMIC, TAIL_OUT)
        if xdesc2 is not None:
            if end - m0 > BLOCK_M:
                _g_rows_epilogue(acc_x, m0 + BLOCK_M, end, je, pn * COLS, bias_a, bias_b, xs_ptr, sorted_ptr, gate_ptr,
                                 out_ptr, N, OUTW, TOPK, alpha, limit, act_scale, SMAX, PHASE, EPI, ATOMIC, TAIL_OUT)
        if CHAIN:
            if TMA == 2 and PHASE == 1:  # act's generic stores before the release mlp2's TMA reads follow
                _g_proxy_fence()
            _g_chain_done(chain_ptr, tile, TILES, NT, PHASE)


    @gluon.jit
    def _moe_wg_kernel(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N,
                       K, KP, OUTW, TOPK, alpha, limit, act_scale, SMAX, E, WE, SE, PHASE: gl.constexpr,
                       EP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CHUNKS: gl.constexpr,
                       TILED: gl.constexpr, STAGES: gl.constexpr, RING_W: gl.constexpr, LW: gl.constexpr,
                       MMA: gl.constexpr, LXCP: gl.constexpr, SX: gl.constexpr, EPI: gl.constexpr, SW: gl.constexpr,
                       SS: gl.constexpr, LSC: gl.constexpr, NIB: gl.constexpr, chain_ptr, TILES, NEED,
                       CHAIN: gl.constexpr, EPI_EARLY: gl.constexpr, XSKIP: gl.constexpr, wdesc, sdesc, xdesc, GE,
                       TMA: gl.constexpr, trace_ptr, TRACE: gl.constexpr, HALF: gl.constexpr, xdesc_h,
                       LW_H: gl.constexpr, MMA_H: gl.constexpr, LXCP_H: gl.constexpr, SX_H: gl.constexpr,
                       SM: gl.constexpr = False, GT=0, ATOMIC: gl.constexpr = False, SPLITK: gl.constexpr = 1,
                       KS=0, PERSIST: gl.constexpr = False, NT=0, WAIT_LATE: gl.constexpr = False,
                       ticket_ptr=None, TICKET: gl.constexpr = False, tw_ptr=None, ts_ptr=None, TWE=0, TSE=0,
                       TAIL: gl.constexpr = False, TAIL_OUT: gl.constexpr = False, SLICE=0, xdesc2=None,
                       PAIRED: gl.constexpr = False, NOBAR: gl.constexpr = False):
        """moe_mma's K loop on wgmma (WGMMA=True, kernels.linear_mma._g_wg_program): the expert tile's gathered x
        rows go once per program through shared memory. mlp1 stacks its BLOCK_N weight rows: gate rows of
        BLOCK_N / 2 columns, then their linear rows, one accumulator (half the registers of two); the epilogue
        brings each column's pair into one thread (layout EPI, through shared memory); mlp2's brings 8 consecutive
        rows of a token into one thread (one 16-byte store, not 8 scattered 2-byte ones). The grid is (N tiles,
        token tiles): the programs running together share one x tile and one expert's weights, which stay in
        L2 (token tiles first, 120b's 8192-token mlp1 read 6x its weights from DRAM and was L2-bound).
        CHAIN: mlp1 programs count their stores per token tile (chain_ptr[tile]); mlp2 skips the PDL wait and
        waits for its own tile's NEED mlp1 programs instead, so it runs in mlp1's last wave. EPI_EARLY: the
        epilogue's per-token loads (_epi_token; 2: its bias loads too) before the CHAIN wait and the K loop, not
        after them. XSKIP: x rows past the expert's last position are not copied (kernels.linear_mma.x_live).
        TMA: the weights' words and scale bytes by TMA boxes (kernels.linear_mma._g_wg_tma_loop; GE 16-row
        groups per expert, mlp1 a gate and a linear box per step); TMA=2 the tile's x rows too, a box of
        positions m0.. of an expert-sorted copy (mlp1: x gathered per position; mlp2: act itself). TRACE: each
        program's record for kernels.trace (start, past its PDL or CHAIN wait, end, SM). HALF: a tile holding at
        most BLOCK_M / 2 positions runs the half-width build of the same program (wgmma N = BLOCK_M / 2; layouts
        *_H, x box xdesc_h): an expert's last, part-filled tile costs the tensor cores half as much. ATOMIC (mlp2):
        the gate-weighted rows are added into the layer output (_epilogue), no combine launch after. PERSIST: a
        grid of programs each doing every num_programs-th of the routing's tile_count * NT programs' work (NT:
        a token tile's programs), N tiles fastest, instead of one program per slot of the worst-case grid;
        TICKET: each item after the first by ticket (kernels.sync.take_item: programs finishing first take more).
        TAIL, TAIL_OUT: _g_wg_tile's (tw_ptr, ts_ptr: tail_half's copy, TWE and TSE its words and bytes per expert).
        SLICE (mlp2, SPLITK > 1 without ATOMIC): K slice q stores its fp32 shares at out + q * SLICE (the
        combine sums the slices in order). xdesc2 (ABSORB): tiles numbered by tile_rows' EXTRA (its box's rows),
        the x box of a tile's rows past BLOCK_M (_g_wg_tile). PAIRED (mlp1, TMA): _g_wg_tile's. NOBAR (TMA):
        kernels.ring_sync drops the TMA loop's redundant barriers from this build's PTX."""
        tails = (tw_ptr, ts_ptr, TWE, TSE)
        if NOBAR:
            _g_mark(gl.program_id(0))
        if TRACE:  # the program's record, its words stored as they happen
            _g_trace_mark(trace_ptr, 0)
        if CHAIN and PHASE == 2:
            _g_pdl_release()
        elif not WAIT_LATE:
            _g_pdl_enter()
        if TRACE:
            _g_trace_mark(trace_ptr, 1)
        if PERSIST:  # every num_programs-th program's work of the routing's tiles, N tiles fastest
            total = _g_tile_count(offs_ptr, E, EP, BLOCK_M) * NT
            w = gl.program_id(0)
            while w < total:
                _g_wg_item(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP,
                           OUTW, TOPK, alpha, limit, act_scale, SMAX, E, WE, SE, PHASE, EP, BLOCK_M, BLOCK_N, CHUNKS,
                           TILED, STAGES, RING_W, LW, MMA, LXCP, SX, EPI, SW, SS, LSC, NIB, chain_ptr, TILES, NEED,
                           CHAIN, EPI_EARLY, XSKIP, wdesc, sdesc, xdesc, GE, TMA, trace_ptr, TRACE, HALF, xdesc_h,
                           LW_H, MMA_H, LXCP_H, SX_H, SM, GT, ATOMIC, SPLITK, KS, w // NT, w % NT, NT, WAIT_LATE,
                           tails, TAIL, TAIL_OUT, PAIRED=PAIRED)
                if TICKET:
                    w = _g_take_item(ticket_ptr, total, gl.num_programs(0))
                else:
                    w += gl.num_programs(0)
            if WAIT_LATE and total <= gl.program_id(0):  # no work: the PDL release all the same
                _g_pdl_enter()
            live = total > gl.program_id(0)
        else:  # N tiles vary fastest: an x tile and an expert's weights stay in L2
            if SPLITK > 1 and not ATOMIC:  # the slice's own rows of out
                out_ptr += gl.program_id(0) % SPLITK * SLICE
            live = _g_wg_item(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP,
                              OUTW, TOPK, alpha, limit, act_scale, SMAX, E, WE, SE, PHASE, EP, BLOCK_M, BLOCK_N,
                              CHUNKS, TILED, STAGES, RING_W, LW, MMA, LXCP, SX, EPI, SW, SS, LSC, NIB, chain_ptr,
                              TILES, NEED, CHAIN, EPI_EARLY, XSKIP, wdesc, sdesc, xdesc, GE, TMA, trace_ptr, TRACE,
                              HALF, xdesc_h, LW_H, MMA_H, LXCP_H, SX_H, SM, GT, ATOMIC, SPLITK, KS,
                              gl.program_id(1), gl.program_id(0), gl.num_programs(0), WAIT_LATE=WAIT_LATE,
                              tails=tails, TAIL=TAIL, TAIL_OUT=TAIL_OUT, xdesc2=xdesc2, PAIRED=PAIRED)
        if TRACE:
            _g_trace_end(trace_ptr, live)

    @gluon.jit
    def _g_wg_item(x_ptr, xs_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP, OUTW,
                   TOPK, alpha, limit, act_scale, SMAX, E, WE, SE, PHASE: gl.constexpr, EP: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CHUNKS: gl.constexpr, TILED: gl.constexpr,
                   STAGES: gl.constexpr, RING_W: gl.constexpr, LW: gl.constexpr, MMA: gl.constexpr,
                   LXCP: gl.constexpr, SX: gl.constexpr, EPI: gl.constexpr, SW: gl.constexpr, SS: gl.constexpr,
                   LSC: gl.constexpr, NIB: gl.constexpr, chain_ptr, TILES, NEED, CHAIN: gl.constexpr,
                   EPI_EARLY: gl.constexpr, XSKIP: gl.constexpr, wdesc, sdesc, xdesc, GE, TMA: gl.constexpr,
                   trace_ptr, TRACE: gl.constexpr, HALF: gl.constexpr, xdesc_h, LW_H: gl.constexpr,
                   MMA_H: gl.constexpr, LXCP_H: gl.constexpr, SX_H: gl.constexpr, SM: gl.constexpr, GT,
                   ATOMIC: gl.constexpr, SPLITK: gl.constexpr, KS, tile, pid_n, NT,
                   WAIT_LATE: gl.constexpr = False, tails=None, TAIL: gl.constexpr = False,
                   TAIL_OUT: gl.constexpr = False, xdesc2=None, PAIRED: gl.constexpr = False):
        """One program's work of _moe_wg_kernel: token tile `tile` (if the routing has it; returned), N tile
        program pid_n of the tile's NT."""
        if xdesc2 is None:
            e, m0, end, live = _g_tile_rows(offs_ptr, tile, E, EP, BLOCK_M)
        else:  # ABSORB: an expert's last tile of at most EXTRA tokens runs in the tile before it
            e, m0, end, live = _g_tile_rows(offs_ptr, tile, E, EP, BLOCK_M, xdesc2.block_shape[0])
        if live:
            if HALF:  # a constexpr branch first: builds without HALF never instantiate the half-width tile
                if end - m0 <= BLOCK_M // 2:
                    _g_wg_tile(x_ptr, xs_ptr, sorted_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP,
                               OUTW, TOPK, alpha, limit, act_scale, SMAX, WE, SE, e, m0, end, tile, pid_n, NT,
                               chain_ptr, TILES, NEED, wdesc, sdesc, GE, trace_ptr, PHASE, BLOCK_N, CHUNKS,
                               TILED, STAGES, RING_W, EPI, SW, SS, LSC, NIB, CHAIN, EPI_EARLY, XSKIP, TMA, TRACE,
                               xdesc_h, BLOCK_M // 2, LW_H, MMA_H, LXCP_H, SX_H, SM, GT, ATOMIC, SPLITK, KS,
                               WAIT_LATE=WAIT_LATE, tails=tails, TAIL=TAIL, TAIL_OUT=TAIL_OUT, PAIRED=PAIRED)
                else:
                    _g_wg_tile(x_ptr, xs_ptr, sorted_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP,
                               OUTW, TOPK, alpha, limit, act_scale, SMAX, WE, SE, e, m0, end, tile, pid_n, NT,
                               chain_ptr, TILES, NEED, wdesc, sdesc, GE, trace_ptr, PHASE, BLOCK_N, CHUNKS,
                               TILED, STAGES, RING_W, EPI, SW, SS, LSC, NIB, CHAIN, EPI_EARLY, XSKIP, TMA, TRACE,
                               xdesc, BLOCK_M, LW, MMA, LXCP, SX, SM, GT, ATOMIC, SPLITK, KS,
                               WAIT_LATE=WAIT_LATE, tails=tails, TAIL=TAIL, TAIL_OUT=TAIL_OUT, xdesc2=xdesc2,
                               PAIRED=PAIRED)
            else:
                _g_wg_tile(x_ptr, xs_ptr, sorted_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KP,
                           OUTW, TOPK, alpha, limit, act_scale, SMAX, WE, SE, e, m0, end, tile, pid_n, NT,
                           chain_ptr, TILES, NEED, wdesc, sdesc, GE, trace_ptr, PHASE, BLOCK_N, CHUNKS,
                           TILED, STAGES, RING_W, EPI, SW, SS, LSC, NIB, CHAIN, EPI_EARLY, XSKIP, TMA, TRACE,
                           xdesc, BLOCK_M, LW, MMA, LXCP, SX, SM, GT, ATOMIC, SPLITK, KS,
                           WAIT_LATE=WAIT_LATE, tails=tails, TAIL=TAIL, TAIL_OUT=TAIL_OUT, xdesc2=xdesc2,
                           PAIRED=PAIRED)
        return live


def _launch(phase, x16, xs, r, p, b, out, out_width, alpha, limit, act_scale, cfg, chain=None, need=0,
            gathered=False) -> int:
    """Launch mlp1 (phase 1) or mlp2; returns its programs per token tile. chain: CHAIN's counters (mlp1 counts
    its stores into them, mlp2 waits for `need` of them per tile). gathered: x16 holds mlp1's x rows per
    expert-sorted position (TMA=2, read as boxes only), not per token. mlp2 runs cfg's SPLITK2 K slices as given
    (run_moe_mma caps them at K's steps and passes 1 where they have nowhere to meet): by ATOMIC's additions, or
    each into its own rows of out."""
    E, N, K = p.shape
    BM = cfg["BLOCK_M"]
    BN = 16 * cfg["ROWS"] * cfg["num_warps"]
    compiled_wg = cfg["WGMMA"] and not INTERPRETED and gluon is not None
    cols = BN // 2 if phase == 1 and compiled_wg else BN  # the compiled WGMMA mlp1 stacks gate and linear rows
    step = 128 * cfg["CHUNKS"]
    steps = -(-K // step)
    split = int(cfg.get("SPLITK2") or 1) if phase == 2 else 1
    # whole steps a slice, the last taking the rest; with TAIL the slices share K's whole steps and the last adds
    # the half chunk (2880: 11 + 11.5 steps, not 12 + 10.5)
    whole = K // step if cfg.get("TAIL") else steps
    splits = dict(SPLITK=split, KS=-(-whole // split) * step if split > 1 else 0,
                  SLICE=r.sorted.numel() * N if split > 1 and not cfg.get("ATOMIC") else 0)
    grid = (tile_slots(r, BM), triton.cdiv(N // 2 if phase == 1 else N, cols) * split)
    chained = dict(chain_ptr=r.offsets if chain is None else chain, TILES=grid[0], NEED=need, CHAIN=chain is not None)
    nt = grid[1]  # a token tile's programs
    persist = int(cfg.get("PERSIST1") or 0) if phase == 1 else 0
    ticket = bool(persist and cfg.get("TICKET1"))
    tickets = dict(ticket_ptr=scratch(x16.device, ("moe_mma_ticket",), 1, torch.int32) if ticket else None,
                   TICKET=ticket)
    if compiled_wg:
        grid = grid[::-1]
    if persist:  # programs per SM, each taking every grid-th program's work (no more than the worst case has)
        grid = (min(persist * sm_count(x16.device), grid[0] * grid[1]), 1)
    if cfg["TILED"]:
        p = tile_mxfp4(p, deinterleave=phase == 1)
    if cfg["NIB"]:
        p = shuffle_nibbles(p)
    args = (x16, xs, r.sorted, r.offsets, p.words, p.scales, b, r.weights, out, N, K, x16.shape[1],
            out_width, r.top_k, float(alpha), float(limit), float(act_scale), p.scale_max, E, p.words.stride(0),
            p.scales.stride(0))
    meta = dict(PHASE=phase, EP=expert_span(E), BLOCK_M=BM, BLOCK_N=BN, CHUNKS=cfg["CHUNKS"], TILED=cfg["TILED"],
                NIB=cfg["NIB"])
    if INTERPRETED or gluon is None:
        _moe_mma_twin[grid](*args, **meta, LOGICAL=cfg["WGMMA"], **chained,
                            ATOMIC=bool(cfg.get("ATOMIC")) and phase == 2, **splits, PERSIST=bool(persist), NT=nt,
                            **tickets)
    elif compiled_wg:
        nw = cfg["num_warps"]
        LW, LXCP, MMA, SX = wg_layouts(BM, cfg["ROWS"], cfg["CHUNKS"], nw)
        if phase == 1:  # a column's gate/linear pair per thread
            EPI = gl.BlockedLayout([1, 1, 2], [4, 8, 1], [nw, 1, 1], [2, 1, 0])
        else:  # 8 consecutive rows of one token per thread
            EPI = gl.BlockedLayout([8, 1], [min(32, BN // 8), max(1, 256 // BN)], [1, nw], [0, 1])
        extra = {**reg_cap(cfg.get("MAXNREG")), **pdl_launch(inner=True)}
        SW, SS, LSC = wg_ring_layouts(BM, cfg["ROWS"], cfg["CHUNKS"], nw)
        tma = int(cfg.get("TMA") or 0)
        sm = bool(cfg.get("STEP_MAJOR"))
        wdesc = sdesc = xdesc = None
        paired = bool(cfg.get("PAIRED")) and phase == 1 and bool(tma)
        if tma:  # mlp1's tile is two boxes of each kind (its gate rows and its linear rows), or one PAIRED
            wdesc, sdesc = tma_descriptors(p, BN // 16 if paired else BN // 16 // (2 if phase == 1 else 1),
                                           cfg["CHUNKS"], sm, paired=paired)
        gt = 0
        ring_sm = sm and not tma  # TMA's boxes find the copy through their descriptors, the cp.async ring here
        if ring_sm:  # expert e's group g is group e * G + g of every chunk
            sw, ss = step_major(p)
            groups = p.words.shape[1]
            gt = sw.shape[1]
            args = (*args[:4], sw, ss, *args[6:-2], groups * 256, groups * 64)
        half = bool(cfg.get("HALF"))
        LW_H, LXCP_H, MMA_H, SX_H = wg_layouts(BM // 2, cfg["ROWS"], cfg["CHUNKS"], nw) if half else (LW, LXCP, MMA, SX)
        xdesc_h = xdesc2 = None
        extra_rows = int(cfg.get("ABSORB") or 0)
        if tma == 2:  # new each call, as gemv_mma's x16 (a CUDA graph keeps the captured descriptor)
            if phase == 1 and not gathered:
                raise ValueError("moe_mma TMA=2: mlp1 reads x gathered per sorted position (x_to_f16(rows=...))")
            xdesc = TensorDescriptor(x16, list(x16.shape), [x16.shape[1], 1], [BM, 128 * cfg["CHUNKS"]], SX)
            if half:
                xdesc_h = TensorDescriptor(x16, list(x16.shape), [x16.shape[1], 1], [BM // 2, 128 * cfg["CHUNKS"]],
                                           SX_H)
            if extra_rows:  # ABSORB: the rows of a tile past BLOCK_M
                xdesc2 = TensorDescriptor(x16, list(x16.shape), [x16.shape[1], 1], [extra_rows, 128 * cfg["CHUNKS"]],
                                          gl.NVMMASharedLayout.get_default_for([extra_rows, 128 * cfg["CHUNKS"]],
                                                                               gl.float16))
        tails = {}
        if cfg.get("TAIL"):  # tail_half's copy of the expert stack: expert e's groups from e * G
            tw, ts = tail_half(p)
            tails = dict(tw_ptr=tw, ts_ptr=ts, TWE=p.words.shape[-4] * 128, TSE=p.words.shape[-4] * 64)
        _moe_wg_kernel[grid](*args, **meta, STAGES=cfg["STAGES"], RING_W=cfg["RING_W"], LW=LW, MMA=MMA,
                             LXCP=LXCP, SX=SX, EPI=EPI, SW=SW, SS=SS, LSC=LSC, num_warps=nw,
                             EPI_EARLY=int(cfg.get("EPI_EARLY") or 0), XSKIP=bool(cfg.get("XSKIP")), **chained,
                             wdesc=wdesc, sdesc=sdesc, xdesc=xdesc, GE=p.words.shape[-4] if tma else 0, TMA=tma,
                             **trace_args(f"mlp{phase}", grid, r.offsets), HALF=half, xdesc_h=xdesc_h, LW_H=LW_H,
                             MMA_H=MMA_H, LXCP_H=LXCP_H, SX_H=SX_H, SM=ring_sm, GT=gt,
                             ATOMIC=bool(cfg.get("ATOMIC")) and phase == 2, **splits, PERSIST=bool(persist), NT=nt,
                             WAIT_LATE=int(cfg.get("WAIT_LATE") or 0) if phase == 1 else 0, **tickets, **extra,
                             TAIL=bool(cfg.get("TAIL")), TAIL_OUT=bool(cfg.get("TAIL_OUT")), **tails, xdesc2=xdesc2,
                             PAIRED=paired, NOBAR=bool(cfg.get("NOBAR")) and bool(tma))
    else:
        LW, LX, MMA = mma_layouts(BM, cfg["ROWS"], cfg["CHUNKS"], cfg["num_warps"])
        extra = {**reg_cap(cfg.get("MAXNREG")), **pdl_launch(inner=True)}
        if cfg.get("STAGES"):
            SW, SX, LXCP = ring_layouts(BM, cfg["ROWS"], cfg["CHUNKS"], cfg["num_warps"])
            _moe_ring_kernel[grid](*args, **meta, STAGES=cfg["STAGES"], LW=LW, LX=LX, MMA=MMA, SW=SW, SX=SX,
                                   LXCP=LXCP, num_warps=cfg["num_warps"], **extra)
        else:
            _moe_mma_kernel[grid](*args, **meta, PREFETCH=cfg["PREFETCH"], LW=LW, LX=LX, MMA=MMA,
                                  num_warps=cfg["num_warps"], **extra)
    return nt


def run_moe_mma(x, r, p1, b1, p2, b2, alpha, limit, x16=None, combine=True, *, BLOCK_M, ROWS, CHUNKS,
                PREFETCH=False, num_warps=4, MAXNREG=None, STAGES=0, TILED=False, WGMMA=False, RING_W=False,
                NIB=False, CHAIN=False, ROWS2=None, STAGES2=None, EPI_EARLY=0, XSKIP=False, TMA=False, HALF=False,
                STEP_MAJOR=False, ATOMIC=False, SPLITK2=1, PERSIST1=0, WAIT_LATE=False, TICKET1=False,
                MAXNREG2=None, TAIL=False, ABSORB=0, PAIRED=False, NOBAR=False):
    """Launcher (moe_mxfp4's contract): x to word-major fp16, mlp1 -> fp16 act in the same order, mlp2 -> gate-
    weighted rows; a program takes BLOCK_M tokens of one expert and BLOCK_N = 16 * ROWS * num_warps output columns
    (mlp1: twice as many weight rows), K in steps of CHUNKS * 128. MAXNREG caps the registers per thread (ptxas
    spills past it): more resident warps for a loop that waits on its loads. STAGES > 0 keeps the next STAGES - 1
    steps' weights and x in flight as cp.async copies into shared memory instead of in registers (the compiled
    kernel only; the interpreter runs the same arithmetic). TILED reads tile_mxfp4's chunk-major copies of the
    weights (w1 de-interleaved; made on first use, cached), where each warp streams contiguous memory. WGMMA
    multiplies with sm_90's wgmma: the same decoded registers, x and act in logical K order (rows padded to whole
    steps of 128 * CHUNKS) copied once per program into a ring of STAGES (>= 2) shared-memory slots, mlp1's BLOCK_N
    weight rows stacked as BLOCK_N / 2 gate rows then their linear rows (one accumulator); RING_W (with TILED)
    copies the weights' words and scales through the same ring. NIB reads shuffle_nibbles' copy of the words (made
    once, cached): 9 instead of 15 decode instructions per word. CHAIN (WGMMA): mlp2 starts during mlp1's last wave,
    each program once its own token tile's act rows are stored, ordered by device counters (made once per grid shape
    and reset by their last reader; a layer call interrupted between its two launches would leave them set). ROWS2:
    mlp2's own ROWS (its own row tile; mlp2 has half mlp1's rows, so at 16-32 tokens it runs in fewer waves).
    STAGES2 (WGMMA): mlp2's own ring depth (its programs, which end the layer, stream at the bytes they keep in
    flight). EPI_EARLY (WGMMA): the epilogue's loads issued before the K loop (1: token scales or gate weights, 2:
    biases too). XSKIP (WGMMA): the x rows of a token tile past its expert's last position are zero-filled instead
    of copied (they repeated the tile's first row from L2; a per-copy mask, 2-20 more sm_90 loop instructions). TMA
    (WGMMA, RING_W, CHUNKS=1): the ring's words and scale bytes copied by the tensor memory accelerator instead of
    by every thread; TMA=2 x's rows too, from an expert-sorted copy of x gathered once per call for mlp1 (S rows of
    fp16) and from act for mlp2. HALF (WGMMA): token tiles holding at most BLOCK_M / 2 positions (an expert's last,
    part-filled one) run a half-width build of the program (wgmma N = BLOCK_M / 2), the others the full one; the
    interpreter runs the same arithmetic either way. STEP_MAJOR (WGMMA, RING_W): the ring's copies (or TMA's boxes)
    read prepare.step_major's copy of the tiled weights (made on first use, cached), where a step's words are one
    piece and the programs running together read neighbouring pieces; the interpreter reads the tiled copy. ATOMIC
    (WGMMA; with combine only): mlp2 adds its gate-weighted bf16 rows into the layer output by atomics (x_to_f16's
    launch zeroes it), so no combine launch follows mlp2; the order of a token's k additions varies from run to run,
    and each rounds to bf16 (the combine sums in fp32 and rounds once). SPLITK2: mlp2's K in SPLITK2 slices of
    whole steps, each its own program (slice 0 adds the bias), so mlp2's programs, which end the layer, are
    1 / SPLITK2 as long; with ATOMIC each adds its share into the output, without it each stores its fp32 shares
    in rows of its own that the combine sums in slice order (deterministic, one launch more); without the combine
    it is ignored. PERSIST1 (WGMMA):
    mlp1's grid is that many programs per SM, each doing every grid-th of the routing's programs' work in order,
    instead of one program per slot of the worst-case grid: no spare programs to dispatch, and mlp2's PDL launch
    (which waits for every mlp1 program to start) comes at mlp1's start, so mlp2's programs take the slots mlp1's
    free with no launch between. The loop costs registers (mlp1 at 20b 16 tokens 167 against 119, 3 programs per
    SM): MAXNREG=128 or 168 keeps 4. (mlp2 in the same loop, without dynamic order, ran 5-30% slower: its
    programs held slots waiting for tiles not yet done, results/20261128T021958-h100-80gb-hbm3-moe-mma-persist2-a.)
    WAIT_LATE (WGMMA): an mlp1 program's PDL wait for x_to_f16 comes after its tile's routing reads (route's, two
    launches back) instead of first, so the layer's first reads overlap x_to_f16's launch; 2: after its first STAGES - 1
    steps' weight copies too. Persistent programs (PERSIST1) wait once per item; one program per slot, a program whose
    slot holds no tile ends without waiting (an exited program releases PDL as well): there `WAIT_LATE=2` was 1 us
    faster on 20b at 64 tokens and within 2 us either way at 128-512
    (results/20261128T093342-h100-80gb-hbm3-moe-mma-wait-late-slots-a). TICKET1 (with PERSIST1): a program's items after
    its first come by ticket from a device counter (kernels.sync.take_item), not every grid-th, so programs that finish
    first take more and mlp1's last items start as early as slots free (mlp2 then starts later: 0.3-1 us slower on 20b,
    0.5-2.6 us faster on 120b at 16-32 tokens, results/20261128T034042-h100-80gb-hbm3-moe-mma-ticket-a).
    MAXNREG2: mlp2's own register cap (its sm_90 leader build needs 90 registers, 5 programs per SM; capped at 80
    it has 71 and 7, at 64 it has 8, without spills), so more of mlp2's programs keep bytes in flight: 80 is
    0.7-1.2 us faster on 20b at 32 tokens and 1.7-4 us on 120b at 16-64, tied on 20b at 16 and 64; 64 is 6-25 us
    slower (results/20261128T061704-h100-80gb-hbm3-moe-mma-maxnreg2-a, ...062013-...-moe-mma-maxnreg2-ba).
    TAIL (WGMMA, RING_W without TMA, CHUNKS=1; compiled builds only, the interpreter reads the zero-padded chunk
    as before): where a launch's K ends in half a chunk (gpt-oss: K = 2880, 22.5 chunks), the ring runs the whole
    steps and the half chunk runs as a half step (half the decode and wgmmas of the padded step) from
    prepare.tail_half's copy, against x_to_f16's half_tail order (mlp1) or act stored in that order (mlp2);
    SPLITK2's slices then share K's whole steps and the last adds the half chunk (2880: 11 + 11.5 steps); the
    padded step's work cost the 20b layer at 16-32 tokens about 3 us (H = I = 2880 timed like 2944,
    results/20261128T070627-h100-80gb-hbm3-moe-parts). Measured (five rounds, results/20261128T072424-h100-80gb-
    hbm3-moe-mma-tail-a to ...074358-...-moe-mma-tail-split-ab-new2): with MAXNREG2=80 and without TICKET1, the
    median of 13 rounds 0.8 us faster on 20b at 16 tokens and 0.4 at 32 (133.0-134.1 and 146.6-148.0 us), 2-6 us
    on 120b at 32-64 with 8-token tiles; 120b 128 with 32-token tiles 8 us; on 20b with TICKET1 or MAXNREG2=72
    slower, and 10-20 us slower on 20b at 128-256 with 16-token tiles. It recovers a third of the padded step's
    cost at most: the half step keeps its wait and wgmma latency. ABSORB (WGMMA, TMA=2, not PERSIST1; compiled
    builds only, the interpreter runs the same arithmetic on its own tiles): an expert's last tile of at most
    ABSORB tokens after a full one is no tile of its own (kernels.moe.tile_rows' EXTRA); the full tile before it
    takes those rows as a second TMA box into a second accumulator, multiplied on the same decoded weights, and
    stores them by a second epilogue. Such a tile cost a program almost as long as a full one (it decodes the
    same weights): 27.6 against 35.4 us on 20b at 512 tokens, where uniform routing made 675 of 2160 mlp1
    programs such tiles of 1-16 tokens (results/20261129T101256-h200-moe-timeline-uniform). PAIRED (WGMMA, TMA,
    not STEP_MAJOR; compiled builds only): mlp1's TMA boxes are 4-D views of w1 with the gate and linear halves
    as a dimension (kernels.linear_mma.tma_descriptors(paired=True)), so each step copies one box of words and
    one of scale bytes instead of two of each: Triton 3.6 puts a CTA barrier after every TMA copy of the ring,
    and mlp1's loop had 8 barriers and 383 sm_90 instructions a step against mlp2's 6 and 349 (`./lab sass
    --loops`). NOBAR (TMA; compiled builds only): kernels.ring_sync drops the barriers Triton adds around a TMA
    step's copies (gemv_mma's NOBAR).
    x16 (plane-major) is not used."""
    T, H = x.shape
    S = r.sorted.numel()
    I = p1.shape[1] // 2
    step = 128 * CHUNKS  # WGMMA copies whole steps of x unmasked: rows padded to them, zeros past K
    act = torch.empty((S, -(-I // step) * step if WGMMA else I), device=x.device, dtype=torch.float16)
    if S == 0:
        return torch.empty((T, H), device=x.device, dtype=torch.bfloat16)
    atomic = bool(ATOMIC and combine)
    # SPLITK2's slices meet by ATOMIC's additions, or (with the combine) each stores fp32 shares in its own rows
    split = min(int(SPLITK2 or 1), -(-I // step)) if combine else 1
    if atomic:
        y = torch.empty((T, H), device=x.device, dtype=torch.bfloat16)
    else:
        y = torch.empty((S * split, H), device=x.device, dtype=torch.float32 if split > 1 else torch.bfloat16)
    cfg = dict(BLOCK_M=BLOCK_M, ROWS=ROWS, CHUNKS=CHUNKS, PREFETCH=PREFETCH, num_warps=num_warps, MAXNREG=MAXNREG,
               STAGES=STAGES, TILED=TILED, WGMMA=WGMMA, RING_W=RING_W, NIB=NIB, CHAIN=CHAIN, EPI_EARLY=EPI_EARLY,
               XSKIP=XSKIP, TMA=TMA, HALF=HALF, STEP_MAJOR=STEP_MAJOR, ATOMIC=atomic, SPLITK2=split,
               PERSIST1=PERSIST1, WAIT_LATE=WAIT_LATE, TICKET1=TICKET1, ABSORB=ABSORB, PAIRED=PAIRED, NOBAR=NOBAR)
    if NOBAR and TMA and WGMMA:
        ring_sync.check()
    tail = bool(TAIL and WGMMA and RING_W and not TMA and CHUNKS == 1) and not INTERPRETED and gluon is not None
    tail1, tail2 = tail and H % 128 == 64, tail and I % 128 == 64  # mlp1's K is H, mlp2's is I
    scale = act16_scale(limit)
    # TMA=2 (compiled): mlp1's x rows in expert-sorted order, so that a tile's rows are one box (the TMA cannot
    # gather), made by the conversion's one launch; mlp1 then reads nothing else of x
    gather = TMA == 2 and WGMMA and not INTERPRETED and gluon is not None
    xq, xs = x_to_f16(x, pad=step, logical=WGMMA, rows=r.sorted if gather else None, top_k=r.top_k,
                      zero=y if atomic else None, half_tail=tail1)
    chain = scratch(x.device, ("moe_mma_chain",), 2 * tile_slots(r, BLOCK_M)) if CHAIN else None
    need = _launch(1, xq, xs, r, p1, b1, act, act.shape[1], alpha, limit, scale,
                   {**cfg, "TAIL": tail1, "TAIL_OUT": tail2}, chain, gathered=gather)
    _launch(2, act, xs, r, p2, b2, y, H, alpha, limit, scale,
            {**cfg, "ROWS": ROWS2 or ROWS, "STAGES": STAGES2 or STAGES, "MAXNREG": MAXNREG2 or MAXNREG,
             "TAIL": tail2}, chain, need)
    if atomic:
        return y
    slots = MoESlots(y, r.inverse, r.top_k, splits=split)
    return slots.combine() if combine else slots


def _rule_registers(cfg, problem):
    """Per thread mlp1 keeps 2 * BLOCK_M * CHUNKS x registers, ROWS * BLOCK_M accumulators (two tiles) and
    16 * ROWS * CHUNKS weight words, which PREFETCH about triples (next words plus the decode's temporaries).
    Fitted to sm_90 builds (triton 3.6, E=128, H=2880): BLOCK_M=64 CHUNKS=1, BLOCK_M=8 ROWS=2 CHUNKS=2 PREFETCH
    and BLOCK_M=32 ROWS=2 PREFETCH spill; every config this rule admits among the 13 compiled does not.
    WGMMA keeps no x in registers and one accumulator (kernels.linear_mma.wgmma_reason)."""
    if cfg.get("WGMMA"):
        return wgmma_reason(cfg)
    bm, rows, c = cfg["BLOCK_M"], cfg["ROWS"], cfg["CHUNKS"]
    x = 2 * bm * c
    regs = x + rows * bm + 16 * rows * c * (3 if cfg["PREFETCH"] else 1)
    if x > 64 or regs > 210:
        return f"~{regs} data registers per thread, {x} of them x (limits 210 and 64: larger builds spill)"
    return None


def _rule_ring(cfg, problem):
    """The ring (STAGES > 0) replaces PREFETCH and must fit in shared memory: per slot mlp1's two weight
    tiles (BLOCK_N rows of CHUNKS * 64 bytes each) and x (BLOCK_M tokens of CHUNKS * 256 bytes). CHAIN is
    built into the WGMMA kernel only, as are EPI_EARLY, XSKIP, TMA and NOBAR (whose other needs wgmma_reason checks).
    TMA lands mlp1's gate and linear boxes in the two halves of a slot: one chunk per step; with TMA=2 x's rows
    come as a box, so XSKIP would only repeat a config (with CHAIN, mlp2's box reads act published through device
    counters: the kernel puts an async-proxy fence on both sides, kernels.sync.proxy_fence_global)."""
    stages = cfg.get("STAGES") or 0
    if cfg.get("CHAIN") and not cfg.get("WGMMA"):
        return "CHAIN applies only with WGMMA"
    for opt in ("EPI_EARLY", "XSKIP", "TMA", "STEP_MAJOR", "ATOMIC", "NOBAR"):
        if cfg.get(opt) and not cfg.get("WGMMA"):
            return f"{opt} applies only with WGMMA"
    if cfg.get("TMA") and cfg["CHUNKS"] != 1:
        return "TMA lands mlp1's gate and linear boxes in the two halves of a slot: one chunk per step (CHUNKS=1)"
    if cfg.get("TMA") == 2 and cfg.get("XSKIP"):
        return "TMA=2 copies x's rows as one box (XSKIP masks cp.async copies; it would repeat a config)"
    if cfg.get("WGMMA"):  # WGMMA's STAGES is its x ring: wgmma_reason checks it
        return None
    if cfg.get("RING_W"):
        return "RING_W applies only with WGMMA"
    if not stages:
        return None
    if stages < 2:
        return f"STAGES={stages}: a ring needs at least 2 slots (0 turns it off)"
    if cfg["PREFETCH"]:
        return "PREFETCH (register double buffer) and STAGES (shared-memory ring) exclude each other"
    block_n = 16 * cfg["ROWS"] * cfg["num_warps"]
    need = stages * cfg["CHUNKS"] * (2 * block_n * 64 + cfg["BLOCK_M"] * 256)
    if need > SHARED_BYTES:
        return f"ring of {need} bytes of shared memory (at most {SHARED_BYTES})"
    return None


def _rule_rows2(cfg, problem):
    """ROWS2, STAGES2 and MAXNREG2 build mlp2 with ROWS = ROWS2, STAGES = STAGES2 and MAXNREG = MAXNREG2: that
    build is held to the register and ring rules too; a value equal to mlp1's would repeat the config without it.
    STAGES2 sizes WGMMA's ring only (the mma.sync builds' STAGES also chooses between their ring and register
    loads)."""
    mlp2 = dict(cfg)
    for own, of in (("ROWS2", "ROWS"), ("STAGES2", "STAGES"), ("MAXNREG2", "MAXNREG")):
        if cfg.get(own) is None:
            continue
        if cfg[own] == cfg[of]:
            return f"{own}={cfg[own]} equals {of} (None repeats this config)"
        mlp2 = {**mlp2, of: cfg[own], own: None}
    if cfg.get("STAGES2") is not None and not cfg.get("WGMMA"):
        return "STAGES2 applies only with WGMMA"
    if mlp2 == cfg:
        return None
    return _rule_registers(mlp2, problem) or _rule_ring(mlp2, problem)


def _rule_splitk2(cfg, problem):
    """SPLITK2 slices mlp2's K into programs whose shares meet in the output (ATOMIC's additions) or in the
    combine; the slices start at pointers moved along the cp.async ring's copies (RING_W, not TMA's boxes)."""
    if (cfg.get("SPLITK2") or 1) == 1:
        return None
    for opt in ("WGMMA", "RING_W"):
        if not cfg.get(opt):
            return f"SPLITK2 needs {opt}"
    if cfg.get("TMA"):
        return "SPLITK2 moves the cp.async ring's pointers (TMA's boxes would need their own coordinates)"
    return None


def _rule_persist(cfg, problem):
    """PERSIST1 loops the WGMMA kernel's mlp1 programs over their work (the mma.sync kernels have no loop) and
    TICKET1 orders that loop; WAIT_LATE moves the WGMMA kernel's mlp1 PDL wait, looped or not."""
    if cfg.get("PERSIST1") and not cfg.get("WGMMA"):
        return "PERSIST1 applies only with WGMMA"
    if cfg.get("WAIT_LATE") and not cfg.get("WGMMA"):
        return "WAIT_LATE applies only with WGMMA"
    if cfg.get("WAIT_LATE") == 2 and not (cfg.get("RING_W") or cfg.get("TMA")):
        return "WAIT_LATE=2 copies weights ahead of the wait in RING_W's or TMA's ring"
    if cfg.get("TICKET1") and not cfg.get("PERSIST1"):
        return "TICKET1 needs PERSIST1"
    return None


def _rule_tail(cfg, problem):
    """moe_mma's TAIL is the cp.async ring's form (wgmma_reason checks its other needs): its half step's buffers
    are filled by the ring's copies, not by TMA."""
    if cfg.get("TAIL") and cfg.get("TMA"):
        return "moe_mma's TAIL fills its half step from the cp.async ring's copies (not with TMA)"
    if cfg.get("TAIL") and not cfg.get("WGMMA"):
        return "TAIL applies only with WGMMA"
    return None


def _rule_half(cfg, problem):
    """HALF builds the program a second time at BLOCK_M / 2 (WGMMA only): wgmma's N is at least 8."""
    if not cfg.get("HALF"):
        return None
    if not cfg.get("WGMMA"):
        return "HALF applies only with WGMMA"
    if cfg["BLOCK_M"] < 16:
        return f"HALF needs BLOCK_M >= 16 (its half-width build is wgmma N = BLOCK_M / 2 >= 8), got {cfg['BLOCK_M']}"
    return None


def _rule_absorb(cfg, problem):
    """ABSORB (TMA=2's x boxes): an expert's last tile of at most ABSORB tokens after a full one runs in the
    tile before it, whose extra x rows come as a second box into a second accumulator (wgmma N = ABSORB >= 8);
    tiles are numbered that way in the non-persistent grid only (PERSIST1 counts its work by tile_count)."""
    extra = int(cfg.get("ABSORB") or 0)
    if not extra:
        return None
    if not cfg.get("WGMMA") or cfg.get("TMA") != 2:
        return "ABSORB applies only with WGMMA and TMA=2 (the extra rows come as a TMA box)"
    if extra > cfg["BLOCK_M"] // 2:
        return f"ABSORB={extra} exceeds BLOCK_M / 2 = {cfg['BLOCK_M'] // 2}"
    if cfg.get("PERSIST1"):
        return "ABSORB numbers the tiles of the non-persistent grid only (not with PERSIST1)"
    return None


def _rule_paired(cfg, problem):
    """PAIRED reads mlp1's gate and linear rows as one TMA box of each kind, through 4-D views of the tiled copy
    (not of prepare.step_major's)."""
    if cfg.get("PAIRED") and not (cfg.get("WGMMA") and cfg.get("TMA")):
        return "PAIRED applies only with WGMMA and TMA"
    if cfg.get("PAIRED") and cfg.get("STEP_MAJOR"):
        return "PAIRED's boxes view the tiled copy, not STEP_MAJOR's"
    return None


register(Variant(
    name="moe_mma", kind="moe", op="moe", fn=run_moe_mma,
    space={"BLOCK_M": (8, 16, 32, 64, 128), "ROWS": (1, 2), "CHUNKS": (1, 2, 4), "PREFETCH": (False, True),
           "num_warps": (1, 2, 4, 8), "MAXNREG": (None, 96, 128, 168), "STAGES": (0, 2, 3, 4, 6, 8),
           "TILED": (False, True), "WGMMA": (False, True), "RING_W": (False, True), "NIB": (False, True),
           "CHAIN": (False, True), "ROWS2": (None, 1, 2), "STAGES2": (None, 2, 3, 4, 6, 8),
           "EPI_EARLY": (0, 1, 2),
           "XSKIP": (False, True), "TMA": (False, True, 2), "HALF": (False, True), "STEP_MAJOR": (False, True),
           "ATOMIC": (False, True), "SPLITK2": (1, 2, 3, 4, 6), "PERSIST1": (0, 2, 3, 4, 5, 6, 8),
           "WAIT_LATE": (False, True, 2), "TICKET1": (False, True), "MAXNREG2": (None, 64, 72, 80, 96, 128),
           "TAIL": (False, True), "ABSORB": (0, 8, 16), "PAIRED": (False, True), "NOBAR": (False, True)},
    defaults={"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 2, "PREFETCH": False, "num_warps": 4, "MAXNREG": None,
              "STAGES": 0, "TILED": False, "WGMMA": False, "RING_W": False, "NIB": False, "CHAIN": False,
              "ROWS2": None, "STAGES2": None, "EPI_EARLY": 0, "XSKIP": False, "TMA": False, "HALF": False,
              "STEP_MAJOR": False, "ATOMIC": False, "SPLITK2": 1, "PERSIST1": 0,
              "WAIT_LATE": False, "TICKET1": False, "MAXNREG2": None, "TAIL": False, "ABSORB": 0, "PAIRED": False,
              "NOBAR": False},
    rules=(rule_pow2("BLOCK_M", "ROWS", "CHUNKS", "num_warps"), _rule_registers, _rule_ring, _rule_rows2, _rule_half,
           _rule_splitk2, _rule_persist, _rule_tail, _rule_absorb, _rule_paired, rule_scale_span),
    description="tensor cores (mma.sync) on weights decoded in the MMA's operand registers, per-expert token "
                "tiles of BLOCK_M (gemv_mma's K loop); mlp1's gate and linear rows as two accumulators; WGMMA: "
                "sm_90 wgmma on the same registers, x through a cp.async ring of STAGES shared-memory slots (TMA=2: "
                "words, scale bytes and x by TMA boxes); NIB: reads shuffle_nibbles' copy (9 decode instructions "
                "per word, not 15); HALF: part-filled token tiles on a half-width build; ABSORB: an expert's last "
                "few tokens in the tile before them; PAIRED: one TMA box for mlp1's gate and linear rows; NOBAR: "
                "the TMA loop's redundant barriers dropped from the PTX",
))
