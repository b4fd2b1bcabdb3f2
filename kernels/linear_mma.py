"""gemv_mma: tensor cores (mma.sync m16n8k16 on fp16) fed with MXFP4 weights decoded in the registers the MMA
reads them from: no shared memory and no layout shuffle between the load and the MMA.

Why: from 4 tokens up the CUDA-core GEMVs run out of instruction issue (every token adds FMAs per weight),
and Triton's tl.dot paths move the decoded tile through shared memory. Here the cost per weight is the decode
alone (~2.5 sm_90 instructions: shift/mask fp16x2 pairs and one half2 scale multiply per pair), whatever the
number of tokens up to BLOCK_M, because the tensor cores do the multiply-adds.

Fragment map. An m16n8k16 A fragment gives lane 4 g + t rows g and g + 8 and, in each 32-bit register, two
consecutive (logical) K. K is processed in chunks of 128 (16 words = 4 MXFP4 blocks per row): lane t loads
words 4t .. 4t+3 of its rows (one 16-byte load, all of block t: one scale byte per row), and word i feeds the
k-steps 2i and 2i+1: its pair (e_p, e_p+4), p = 2s + h (kernels/decode.py), is the register of k-step 2i + s at
columns 8h + 2t, 8h + 2t + 1. So logical K 32 i + 16 s + 8 h + 2 t + e holds element 32 t + 8 i + 4 e + 2 s + h of
the chunk. x is laid out so that the B fragment of lane 4 g + t is 64 contiguous bytes of token g's row: in
each group of 8, position 4 s + 2 h + e holds element 2 s + h + 4 e, which is x_to_f16's word-major order.

The layouts are written out as Gluon linear layouts and every hand-over to the MMA is checked by the compiler
to move no data (convert_layout(..., assert_trivial=True)). Gluon does not run in Triton's interpreter, so
without a GPU the same steps run as a plain Triton kernel (_mma_twin_kernel): same words, decode, logical K
order and x layout, with tl.dot in fp32.

Numerics are gemv_tc16's: fp16 weights E2M1 * 2^(s - SMAX + 1), exact while the weight's scale bytes span at
most 24 binades; fp16 activations rescaled per token by a power of two; fp32 accumulation.

TILED reads the same words from tile_mxfp4's chunk-major copy (kernels/prepare.py): each warp's 16 rows then
stream as one contiguous run, 10-21% faster on the lm_head at 2-64 tokens (results/20261123T040728-...-linear-
tiled); the lanes' fragments and the K order do not change, so the result is bit-identical.

WGMMA hands the same A registers to sm_90's wgmma (each warp's wgmma A fragment is its mma.sync A fragment);
B, x stored in logical K order (x_to_f16(logical=True)), is copied once per program into a cp.async ring in
shared memory instead of into every warp's registers, which lets token tiles grow to 128 (lm_head 16 tokens:
83% of the floor, results/20261123T053338-...-linear-wgmma). Same arithmetic, so the twin covers it too.
"""

from __future__ import annotations

import functools

import torch

from . import ring_sync
from ._triton import INTERPRETED, pdl_enter, pdl_launch, reg_cap, tl, triton
from .decode import NIB_DOWN_H2, e2m1_pairs, nib_pairs, tc_dot
from .linear_f16 import hmul2, scale_mult_h2, split_h2, x_to_f16
from .prepare import shuffle_nibbles, step_major, tail_half, tile_mxfp4
from .ring_sync import mark as _mark

CHUNK = 128  # K per step: 16 weight words, 4 MXFP4 blocks per row

try:  # Gluon ships with Triton >= 3.4; without it only the interpreter twin exists
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None


@triton.jit
def _halves(p, m):
    """fp16x2 pair words p scaled by m (None: as they are) -> [.., 2] fp16 (low element, high element)."""
    if m is None:
        lo, hi = split_h2(p)
    else:
        lo, hi = split_h2(hmul2(p, m))
    return tl.join(lo, hi)


@triton.jit
def decode_f16_word_major(v, s, SMAX):
    """Words [R, W] and one scale byte per word [R, W] -> fp16 [R, 8 W]: E2M1 * 2^(s - SMAX + 1) (exact while
    the scale bytes span at most 24 binades), element q of each word at position 2q (q < 4) or 2q - 7, i.e.
    x_to_f16's word-major order, so plain row loads of x_to_f16 rows meet them (moe_tc's F16 path)."""
    a, b, c, d = e2m1_pairs(v)
    m = scale_mult_h2(s, SMAX)
    t = tl.join(tl.join(_halves(a, m), _halves(b, m)), tl.join(_halves(c, m), _halves(d, m)))  # [R, W, h, p0, p1]
    return tl.reshape(tl.permute(t, (0, 1, 4, 3, 2)), (v.shape[0], v.shape[1] * 8))  # pair p = 2 p1 + p0, then h


@triton.jit
def decode_step(v, s, SMAX, NIB: tl.constexpr):
    """A K step's words [R, C, 4 (t), I (i)] of C chunks and their scale bytes [R, C, 4] -> fp16 [R, 32 I C] in
    logical K order: E2M1 * 2^(s - SMAX + 1) (I = 4: whole 128-K chunks; 2: TAIL's 64-K half chunk). NIB:
    words in shuffle_nibbles' layout (nib_pairs, 9 instead of 15 instructions per word); its pairs B, D come 2^8
    larger and get a multiplier 2^8 smaller (one more half2 multiply per block and row; exact, the smaller
    multiplier at worst an fp16 subnormal). s None (BC): no scale multiply, E2M1 * 2^-14 (NIB's B, D: * 2^-6),
    whose scales bc_mult applies after the MMA."""
    if s is None:
        m = None
        mb = None
    else:
        m = scale_mult_h2(s, SMAX)[:, :, :, None]
        mb = m
    if NIB:
        a, b, c, d = nib_pairs(v.to(tl.uint32, bitcast=True))
        if s is not None:
            mb = hmul2(m, (m & 0) | NIB_DOWN_H2)
    else:
        a, b, c, d = e2m1_pairs(v.to(tl.uint32, bitcast=True))
    w = tl.join(tl.join(_halves(a, m), _halves(b, mb)), tl.join(_halves(c, m), _halves(d, mb)))  # [R,C,t,i,e,h,s]
    w = tl.permute(w, (0, 1, 3, 6, 5, 2, 4))  # [R, C, i, s, h, t, e]
    return tl.reshape(w, (w.shape[0], w.shape[1] * w.shape[2] * 32))


@triton.jit
def _bc_twice(m):
    """[R, W] -> [R, 2 W], column j W + c holding column c (bc_mult's copy per token)."""
    return tl.reshape(tl.permute(tl.join(m, m), (0, 2, 1)), (m.shape[0], 2 * m.shape[1]))


@triton.jit
def bc_mult(s, SMAX, NIB: tl.constexpr, COLS: tl.constexpr, BC: tl.constexpr = 1):
    """BC: one chunk's scale bytes [R, 1, 4] (block t of each row) -> fp32 [R, COLS] multipliers, column n that
    of MMA column n % 8 (x_to_f16's bc rows, kernels.linear_f16.bc_keep): block t's 2^(s - SMAX + 15), so a
    column's sum times it is decode_step's (E2M1 * 2^(s - SMAX + 1) weights); BC=1's column 2 t + 1 (NIB's pair
    half h = 1, which decodes 2^8 larger) 2^(s - SMAX + 7). BC=2's x rows take that 2^8 themselves."""
    e = tl.maximum(tl.reshape(s, (s.shape[0], 4)).to(tl.int32) + (142 - SMAX), 1)
    m0 = (e << 23).to(tl.float32, bitcast=True)
    if NIB and BC == 1:
        m1 = m0 * 0.00390625
    else:
        m1 = m0
    m = tl.reshape(tl.join(m0, m1), (m0.shape[0], 8))
    if COLS >= 16:
        m = _bc_twice(m)
    if COLS >= 32:
        m = _bc_twice(m)
    if COLS >= 64:
        m = _bc_twice(m)
    if COLS >= 128:
        m = _bc_twice(m)
    return m


@triton.jit
def bc_sum(acc, BC: tl.constexpr = 1):
    """BC's accumulator [R, 8 G] -> [R, BC G] tokens: BC=1 a token's 8 columns added, BC=2 the 4 columns of each
    token of a pair (column 2 t + j: token 2 g + j)."""
    if BC == 1:
        return tl.sum(tl.reshape(acc, (acc.shape[0], acc.shape[1] // 8, 8)), axis=2)
    else:
        r = tl.sum(tl.reshape(acc, (acc.shape[0], acc.shape[1] // 8, 4, 2)), axis=2)
        return tl.reshape(r, (acc.shape[0], acc.shape[1] // 4))


@triton.jit
def _x_chunks(xq):
    """x words [BM, C, 4 (t), 32] as stored -> the B operand [128 C (logical K), BM]."""
    xq = tl.reshape(xq, (xq.shape[0], xq.shape[1], 4, 8, 2, 2))  # [BM, C, t, (i s), h, e]
    xq = tl.permute(xq, (1, 3, 4, 2, 5, 0))
    return tl.reshape(xq, (xq.shape[0] * 128, xq.shape[5]))


@triton.jit
def _x_step(xq, LOGICAL: tl.constexpr):
    """A step's x as loaded ([BM, C, 4, 32] stored positions) -> the B operand [128 C (logical K), BM]:
    word-major storage goes through _x_chunks, logical storage (WGMMA's) is already in K order."""
    if LOGICAL:
        return tl.trans(tl.reshape(xq, (xq.shape[0], xq.shape[1] * 128)))
    return _x_chunks(xq)


@triton.jit
def _mma_store(acc, xs_ptr, b_ptr, y_ptr, rn, rm, M, N, stride_ym, SMAX, HAS_BIAS: tl.constexpr):
    """acc [rows, tokens] -> y[token, row] in bf16: times the token's scale and 2^(SMAX - 128), plus bias."""
    xs = tl.load(xs_ptr + tl.minimum(rm, M - 1))
    wscale = ((SMAX - 1).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(SMAX - 128)
    out = acc * (xs * wscale)[None, :]
    if HAS_BIAS:
        out += tl.load(b_ptr + tl.minimum(rn, N - 1)).to(tl.float32)[:, None]
    tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], out.to(tl.bfloat16),
             mask=(rm < M)[None, :] & (rn < N)[:, None])


@triton.jit
def _tile_offsets(rows, cc, t, i, KW, TILED: tl.constexpr, SM: tl.constexpr = False, GT=0):
    """Offsets of K step 0's words [rows, chunks, lanes t, i] and scale bytes [rows, chunks, t]: row-major
    (rows KW words apart) or tile_mxfp4's chunk-major layout (16-row groups, 128-K chunks of 16 x 16 words);
    SM: prepare.step_major's copy of it (chunks outermost, GT groups a chunk)."""
    if TILED and SM:
        wrow = tl.multiple_of((rows // 16) * 256 + (rows % 16) * 16, 16)
        srow = (rows // 16) * 64 + (rows % 16) * 4
        wc = cc * (GT * 256)
        sc = cc * (GT * 64)
    elif TILED:
        kc = (KW + 15) // 16
        wrow = tl.multiple_of((rows // 16) * (kc * 256) + (rows % 16) * 16, 16)
        srow = (rows // 16) * (kc * 64) + (rows % 16) * 4
        wc = cc * 256
        sc = cc * 64
    else:
        wrow = tl.multiple_of(rows * KW, 4)  # K % 32 == 0: 16-byte aligned rows
        srow = rows * (KW // 4)
        wc = cc * 16
        sc = cc * 4
    w = wrow[:, None, None, None] + wc[None, :, None, None] + (t * 4)[None, None, :, None] + i[None, None, None, :]
    return w, srow[:, None, None] + sc[None, :, None] + t[None, None, :]


@triton.jit
def _mma_twin_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, KP, stride_ym, SMAX,
                     HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
                     TILED: tl.constexpr, LOGICAL: tl.constexpr, NIB: tl.constexpr, BC: tl.constexpr = False):
    """gemv_mma's steps in plain Triton (the interpreter path): same data, decode and K order (LOGICAL: x
    stored in logical K order, as WGMMA reads it). BC (CHUNKS=1): x is x_to_f16's bc rows (BLOCK_M of them,
    BLOCK_M / 8 * BC tokens) and each chunk's sums are scaled after the MMA (bc_mult)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    KW = K // 8
    KB = K // 32
    rows = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1)
    cc = tl.arange(0, CHUNKS)
    t = tl.arange(0, 4)
    word = (cc * 16)[None, :, None, None] + (t * 4)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]
    block = (cc * 4)[None, :, None] + t[None, None, :]
    wofs, sofs = _tile_offsets(rows, cc, t, tl.arange(0, 4), KW, TILED)
    WSTEP: tl.constexpr = CHUNKS * (256 if TILED else 16)  # words and scale bytes one step advances
    SSTEP: tl.constexpr = CHUNKS * (64 if TILED else 4)
    tok = tl.minimum(pid_m * BLOCK_M + tl.arange(0, BLOCK_M), (8 * tl.cdiv(M, BC) if BC else M) - 1)
    xofs = ((tok * KP)[:, None, None, None] + (cc * 128)[None, :, None, None] + (t * 32)[None, None, :, None]
            + tl.arange(0, 32)[None, None, None, :])
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for c in range(0, tl.cdiv(K, CHUNKS * 128)):
        v = tl.load(w_ptr + wofs + c * WSTEP, mask=c * CHUNKS * 16 + word < KW, other=0)
        s = tl.load(s_ptr + sofs + c * SSTEP, mask=c * CHUNKS * 4 + block < KB, other=0)
        xq = _x_step(tl.load(x_ptr + xofs + c * CHUNKS * 128), LOGICAL)
        if BC:
            p = tc_dot(decode_step(v, None, SMAX, NIB), xq, tl.zeros((BLOCK_N, BLOCK_M), tl.float32))
            acc += p * bc_mult(s, SMAX, NIB, BLOCK_M, BC)
        else:
            acc = tc_dot(decode_step(v, s, SMAX, NIB), xq, acc)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if BC:
        T: tl.constexpr = BLOCK_M // 8 * BC
        _mma_store(bc_sum(acc, BC), xs_ptr, b_ptr, y_ptr, rn, pid_m * T + tl.arange(0, T), M, N, stride_ym, SMAX,
                   HAS_BIAS)
    else:
        _mma_store(acc, xs_ptr, b_ptr, y_ptr, rn, pid_m * BLOCK_M + tl.arange(0, BLOCK_M), M, N, stride_ym, SMAX,
                   HAS_BIAS)


if gluon is not None:
    # the shared steps re-wrapped for Gluon (the Triton helpers they call are compiled along with them)
    _g_decode_step = gluon.jit(decode_step.fn)
    _g_x_chunks = gluon.jit(_x_chunks.fn)
    _g_store = gluon.jit(_mma_store.fn)
    _g_tile_offsets = gluon.jit(_tile_offsets.fn)
    _g_pdl_enter = gluon.jit(pdl_enter.fn)
    _g_bc_mult = gluon.jit(bc_mult.fn)
    _g_bc_sum = gluon.jit(bc_sum.fn)
    _g_mark = gluon.jit(_mark.fn)
    ring_sync.install()

    @gluon.constexpr_function
    def row_layout(LW):
        """Layout of a vector of weight rows that indexes the word layout LW's first dimension."""
        return gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LW)))

    @gluon.constexpr_function
    def width_layout(MMA, width):
        """The wgmma accumulator layout MMA at `width` x rows (wgmma N) instead of its own."""
        return gl.NVMMADistributedLayout(version=MMA.version, warps_per_cta=MMA.warps_per_cta,
                                         instr_shape=[MMA.instr_shape[0], width, MMA.instr_shape[2]])

    @gluon.jit
    def _g_wg_mma(w, A_L: gl.constexpr, xs, acc, xs2=None):
        """One K step's wgmma, acc += decoded weights w @ x slot xs ([BLOCK_M, K step] read transposed as B), and
        its wait. xs2 (moe_mma's ABSORB): acc is (the tile's accumulator, one of xs2's EXTRA rows), and a second
        wgmma adds xs2's rows on the same A registers."""
        a = gl.convert_layout(w, A_L, assert_trivial=True)
        if xs2 is None:
            acc = warpgroup_mma(a, xs.permute((1, 0)), acc, is_async=True)
            return warpgroup_mma_wait(0, deps=[acc])
        else:
            a0, a1 = acc
            a0 = warpgroup_mma(a, xs.permute((1, 0)), a0, is_async=True)
            a1 = warpgroup_mma(gl.convert_layout(a, gl.DotOperandLayout(0, a1.type.layout, 2), assert_trivial=True),
                               xs2.permute((1, 0)), a1, is_async=True)
            return warpgroup_mma_wait(0, deps=[a0, a1])

    @gluon.jit
    def _g_bc_mma(v, s, SMAX, NIB: gl.constexpr, A_L: gl.constexpr, xs, acc, BC: gl.constexpr):
        """BC: one chunk's words v and scale bytes s decoded without their scales, a wgmma of them against x slot
        xs (x_to_f16's bc rows) into columns of their own started from zero, then acc += those sums times their
        blocks' scales (bc_mult; the multipliers made before the wgmma, the FMAs in the accumulator's layout)."""
        L: gl.constexpr = acc.type.layout
        m = gl.convert_layout(_g_bc_mult(s, SMAX, NIB, acc.shape[1], BC), L, assert_trivial=True)
        a = gl.convert_layout(_g_decode_step(v, None, SMAX, NIB), A_L, assert_trivial=True)
        p = warpgroup_mma(a, xs.permute((1, 0)), gl.zeros(acc.shape, gl.float32, L), use_acc=False, is_async=True)
        p = warpgroup_mma_wait(0, deps=[p])
        return acc + p * m

    @gluon.jit
    def _g_word_offsets(rows, KW, CHUNKS: gl.constexpr, TILED: gl.constexpr, LW: gl.constexpr,
                        SM: gl.constexpr = False, GT=0):
        """Step 0's word offsets [rows, chunks, 4 (t), 4 (i)] (layout LW) and scale-byte offsets of weight rows
        `rows` (layout row_layout(LW)), with each lane's K positions for the tail masks: its first word
        (group) and its MXFP4 block (block)."""
        LS: gl.constexpr = gl.SliceLayout(3, LW)
        LC: gl.constexpr = gl.SliceLayout(2, LS)
        cc = gl.arange(0, CHUNKS, layout=gl.SliceLayout(0, LC))
        t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LS)))
        i = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LW))))
        wofs, sofs = _g_tile_offsets(rows, cc, t, i, KW, TILED, SM, GT)
        group = (cc * 16)[None, :, None, None] + (t * 4)[None, None, :, None]  # a lane's 4 words: in or out of K
        block = (cc * 4)[None, :, None] + t[None, None, :]
        return wofs, sofs, group, block

    @gluon.jit
    def _g_step(acc, v, s, xq, SMAX, A_L: gl.constexpr, B_L: gl.constexpr, NIB: gl.constexpr):
        """One K step: decode, hand both operands to the MMA with no data movement (checked), multiply-add."""
        return mma_v2(gl.convert_layout(_g_decode_step(v, s, SMAX, NIB), A_L, assert_trivial=True),
                      gl.convert_layout(_g_x_chunks(xq), B_L, assert_trivial=True), acc)

    @gluon.jit
    def _mma_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, KP, stride_ym, SMAX,
                    HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CHUNKS: gl.constexpr,
                    PREFETCH: gl.constexpr, TILED: gl.constexpr, LW: gl.constexpr, LX: gl.constexpr,
                    MMA: gl.constexpr, NIB: gl.constexpr):
        """Rows past N and tokens past M are clamped (computed, never stored); only the K tail is masked."""
        _g_pdl_enter()
        pid_n = gl.program_id(0)
        pid_m = gl.program_id(1)
        KW = K // 8
        KB = K // 32
        rows = gl.minimum(pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=row_layout(LW)), N - 1)
        wofs, sofs, group, block = _g_word_offsets(rows, KW, CHUNKS, TILED, LW)
        WSTEP: gl.constexpr = CHUNKS * (256 if TILED else 16)  # words and scale bytes one step advances
        SSTEP: gl.constexpr = CHUNKS * (64 if TILED else 4)
        LXC: gl.constexpr = gl.SliceLayout(3, LX)
        tok = gl.minimum(pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, gl.SliceLayout(2, LXC))),
                         M - 1)
        xc = gl.arange(0, CHUNKS, layout=gl.SliceLayout(0, gl.SliceLayout(2, LXC)))
        xt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LXC)))
        xr = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LX))))
        xofs = ((tok * KP)[:, None, None, None] + (xc * 128)[None, :, None, None] + (xt * 32)[None, None, :, None]
                + xr[None, None, None, :])
        A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
        B_L: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
        STEP: gl.constexpr = CHUNKS * 16  # words per row and step
        full = KW // STEP
        if PREFETCH:  # register double buffer: step c + 1's words are in flight while step c is decoded
            n = gl.minimum(full, 1)
            v_next = gl.load(w_ptr + wofs, mask=group < n * STEP, other=0)
            s_next = gl.load(s_ptr + sofs, mask=block < n * (STEP // 4), other=0)
        for c in range(0, full):
            if PREFETCH:
                v = v_next
                s = s_next
                n = gl.minimum(full - 1 - c, 1)
                v_next = gl.load(w_ptr + wofs + (c + 1) * WSTEP, mask=group < n * STEP, other=0)
                s_next = gl.load(s_ptr + sofs + (c + 1) * SSTEP, mask=block < n * (STEP // 4), other=0)
            else:
                v = gl.load(w_ptr + wofs + c * WSTEP)
                s = gl.load(s_ptr + sofs + c * SSTEP)
            acc = _g_step(acc, v, s, gl.load(x_ptr + xofs + c * (STEP * 8)), SMAX, A_L, B_L, NIB)
        if full * STEP < KW:  # the K tail: words past K load zeros (and x is zero-padded there)
            v = gl.load(w_ptr + wofs + full * WSTEP, mask=full * STEP + group < KW, other=0)
            s = gl.load(s_ptr + sofs + full * SSTEP, mask=full * (STEP // 4) + block < KB, other=0)
            acc = _g_step(acc, v, s, gl.load(x_ptr + xofs + full * (STEP * 8)), SMAX, A_L, B_L, NIB)
        rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
        rm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
        _g_store(acc, xs_ptr, b_ptr, y_ptr, rn, rm, M, N, stride_ym, SMAX, HAS_BIAS)

    @gluon.jit
    def x_live(c, steps, xok):
        """The x copies' mask of step c: inside K and, with xok (moe_mma's XSKIP), only the rows holding a token,
        so the rows past an expert's last position are zero-filled instead of read again from L2."""
        if xok is None:
            return c < steps
        else:
            return xok & (c < steps)

    @gluon.jit
    def _g_x_issue(xsm, x_ptr, xofs, c, steps, STEP: gl.constexpr, STAGES: gl.constexpr, xok=None):
        """Start the cp.async copy of step c's x rows (16 bytes per thread and copy) into ring slot c % STAGES
        and commit it as one group (past the last step: an empty group, so the waits stay uniform)."""
        async_copy.async_copy_global_to_shared(xsm.index(c % STAGES), x_ptr + xofs + c * (STEP * 8),
                                               mask=x_live(c, steps, xok))
        async_copy.commit_group()

    @gluon.jit
    def _g_wg_loop(acc, w_ptr, s_ptr, wofs, sofs, group, block, x_ptr, xofs, xsm, KW, KB, SMAX,
                   CHUNKS: gl.constexpr, TILED: gl.constexpr, STAGES: gl.constexpr, A_L: gl.constexpr,
                   NIB: gl.constexpr, xok=None):
        """The K loop on wgmma: acc [rows, BM] += decoded weights (rows' words at wofs, scales at sofs) @ x.

        Weights: the next step's words are loaded into registers while this step is decoded straight into
        wgmma's A registers (no data movement, checked). x (logical K order, rows at xofs): cp.async copies into
        a ring of STAGES shared-memory slots, STAGES - 1 steps ahead, read transposed as B. Each step waits for
        its MMA before the next decode: leaving it in flight (wait(1)) gives wrong results on the H100 even with
        the previous step's A listed in the wait's deps, because Triton hands the deps to ptxas only inside a
        comment of the wait's asm: ptxas sees the A registers dead after the HGMMA and the next step's decode
        overwrites them while it may still read them (sm_90 SASS; results/20261123T050813-h100-80gb-hbm3-moe-
        mma-wgmma, results/20261123T161917-h100-80gb-hbm3-linear-wgmma-overlap). Made legal with two A register
        sets each kept allocated by a never-taken store after its wait (cce7435), the overlap was correct and
        10-25% slower (results/20261124T031717-h100-80gb-hbm3-moe-overlap). A slot is refilled only after
        every warp passed the barrier that publishes the next step's x, i.e. after every warp's MMA on it.

        Barriers: Triton's barrier pass takes any two slots of the ring's one allocation to overlap and adds a
        CTA barrier wherever a slot written by a pending copy could be read. The barrier sits right after the
        copies' wait (the pass adds none of its own there) and the proxy fence after it: two barriers per K
        step, not four (1-3% faster from 512 tokens, results/20261124T051949-h100-80gb-hbm3-moe-bar-new). One
        per step needs one allocation per slot and the loop unrolled by STAGES (constant slot indices); that
        ran ~17% slower (...051218-...-moe-ab-new against ...051349-...-moe-ab-old), the unroll alone ~20%."""
        STEP: gl.constexpr = CHUNKS * 16  # words per row and step
        WSTEP: gl.constexpr = STEP * (16 if TILED else 1)  # tiled: 16 rows' chunks between a row's chunks
        SSTEP: gl.constexpr = STEP // 4 * (16 if TILED else 1)
        AHEAD: gl.constexpr = STAGES - 1
        steps = gl.cdiv(KW, STEP)
        for q in gl.static_range(AHEAD):
            _g_x_issue(xsm, x_ptr, xofs, q, steps, STEP, STAGES, xok)
        v_n = gl.load(w_ptr + wofs, mask=group < KW, other=0)
        s_n = gl.load(s_ptr + sofs, mask=block < KB, other=0)
        for c in range(0, steps):
            v, s = v_n, s_n
            more = gl.minimum(steps - 1 - c, 1)  # 0 on the last step: the next loads are all masked off
            v_n = gl.load(w_ptr + wofs + (c + 1) * WSTEP, mask=(c + 1) * STEP + group < KW * more, other=0)
            s_n = gl.load(s_ptr + sofs + (c + 1) * SSTEP, mask=(c + 1) * (STEP // 4) + block < KB * more, other=0)
            w = _g_decode_step(v, s, SMAX, NIB)
            async_copy.wait_group(AHEAD - 1)  # this thread's copies of step c landed
            gl.thread_barrier()  # every thread's copies landed; every warp retired step c - 1's MMA
            fence_async_shared()  # the copies (generic proxy) before the wgmma's reads (async proxy)
            _g_x_issue(xsm, x_ptr, xofs, c + AHEAD, steps, STEP, STAGES, xok)
            acc = _g_wg_mma(w, A_L, xsm.index(c % STAGES), acc)
        async_copy.wait_group(0)
        return acc

    @gluon.jit
    def _g_ring_issue(xsm, wsm, ssm, x_ptr, xofs, w_ptr, wofs, group, s_ptr, scofs, c, steps, KW, KB,
                      STEP: gl.constexpr, STAGES: gl.constexpr, xok=None, SM: gl.constexpr = False, GT=0,
                      PART: gl.constexpr = 0):
        """RING_W: start the cp.async copies of step c's x rows, weight words (each thread copies the words it
        reads later) and scale bytes (per chunk, four rows' 4 bytes each: 16 contiguous bytes in tile_mxfp4's
        layout, which is zero-padded to whole chunks and 16-row groups) into ring slot c % STAGES, as one
        group; past the last step nothing (zero-filled). SM: from prepare.step_major's copy (a chunk GT groups).
        PART 1: the weight copies only, not committed; PART 2: the x copy and the commit only."""
        slot = c % STAGES
        if PART != 2:
            _g_ring_issue_w(wsm, ssm, w_ptr, wofs, group, s_ptr, scofs, c, KW, STEP, STAGES, SM, GT)
        if PART != 1:
            async_copy.async_copy_global_to_shared(xsm.index(slot), x_ptr + xofs + c * (STEP * 8),
                                                   mask=x_live(c, steps, xok))
            async_copy.commit_group()

    @gluon.jit
    def _g_ring_issue_w(wsm, ssm, w_ptr, wofs, group, s_ptr, scofs, c, KW, STEP: gl.constexpr,
                        STAGES: gl.constexpr, SM: gl.constexpr, GT):
        """_g_ring_issue's weight words and scale bytes of step c."""
        slot = c % STAGES
        CHUNKS: gl.constexpr = STEP // 16
        if SM:
            cw = GT * 256  # words and scale bytes from one chunk to the next
            cs = GT * 64
        else:
            cw = 256
            cs = 64
        async_copy.async_copy_global_to_shared(wsm.index(slot), w_ptr + wofs + c * (CHUNKS * cw),
                                               mask=c * STEP + group < KW)
        NB4: gl.constexpr = ssm.shape[1] // CHUNKS  # rows // 4
        for q in gl.static_range(CHUNKS):
            async_copy.async_copy_global_to_shared(ssm.index(slot).slice(q * NB4, NB4),
                                                   s_ptr + scofs + (c * CHUNKS + q) * cs,
                                                   # the chunk's K test, broadcast over the copy (offsets >= 0)
                                                   mask=(scofs >= 0) & (c * CHUNKS + q < (KW + 15) // 16))

    @gluon.jit
    def _g_wg_ring_loop(acc, w_ptr, wofs, group, s_ptr, scofs, x_ptr, xofs, xsm, wsm, ssm, KW, KB, SMAX,
                        CHUNKS: gl.constexpr, STAGES: gl.constexpr, LW: gl.constexpr, A_L: gl.constexpr,
                        NIB: gl.constexpr, xok=None, SM: gl.constexpr = False, GT=0, EARLY: gl.constexpr = False,
                        TAIL: gl.constexpr = False, tail=None, LWH: gl.constexpr = None):
        """_g_wg_loop with the weights in the ring too (RING_W, tile_mxfp4's layout): every load of a step is
        a cp.async copy issued STAGES - 1 steps ahead, so no register waits on a load in flight (with
        register prefetch the loaded words are copied into the next step's registers within the step, which
        caps the prefetch at one step: long-scoreboard stalls dominated the 128-token tiles in Nsight Compute).

        Issuing a step as 2 or 4 wgmmas, each once its K slice is decoded (the slices' A registers kept
        allocated to the wait by shared stores in a never-taken branch; ea0df83), was bit-identical and no
        faster: geometric means 1.011-1.018, 1-6% slower from 512 tokens (results/20261124T090950-h100-80gb-
        hbm3-moe-slices, ...091124-...-linear-slices). ptxas issued the first slice early and the rest together,
        and two programs per SM already overlap one's decode with the other's wgmma.
        EARLY: the program's PDL wait comes after its first STAGES - 1 steps' weight copies, before any x copy
        (those weight copies join step 0's group).
        TAIL (one chunk per step; tail: _g_ring_tail_buffers' buffers and offsets): the ring runs K's whole steps
        only, and a half chunk left at the end (K % 128 == 64) runs as a half step from buffers of its own, filled
        in the group of the ring's first copies (_g_ring_tail_issue, _g_ring_tail_step)."""
        STEP: gl.constexpr = CHUNKS * 16
        if TAIL:
            steps = KW // STEP
            tail_live = steps * STEP < KW
            KW = steps * STEP  # the ring copies whole steps only
        else:
            steps = gl.cdiv(KW, STEP)
        if EARLY:
            if TAIL:
                _g_ring_tail_issue(tail, x_ptr, tail_live, PART=1)
            for q in gl.static_range(STAGES - 1):
                _g_ring_issue(xsm, wsm, ssm, x_ptr, xofs, w_ptr, wofs, group, s_ptr, scofs, q, steps, KW, KB,
                              STEP, STAGES, xok, SM, GT, PART=1)
            _g_pdl_enter()
            if TAIL:
                _g_ring_tail_issue(tail, x_ptr, tail_live, PART=2)
            for q in gl.static_range(STAGES - 1):
                _g_ring_issue(xsm, wsm, ssm, x_ptr, xofs, w_ptr, wofs, group, s_ptr, scofs, q, steps, KW, KB,
                              STEP, STAGES, xok, SM, GT, PART=2)
        else:
            if TAIL:
                _g_ring_tail_issue(tail, x_ptr, tail_live)
            for q in gl.static_range(STAGES - 1):
                _g_ring_issue(xsm, wsm, ssm, x_ptr, xofs, w_ptr, wofs, group, s_ptr, scofs, q, steps, KW, KB,
                              STEP, STAGES, xok, SM, GT)
        for c in range(0, steps):
            async_copy.wait_group(STAGES - 2)  # this thread's copies of step c landed
            gl.thread_barrier()  # every thread's copies landed; every warp is done with step c - 1's slot
            fence_async_shared()  # the copies (generic proxy) before the wgmma's reads (async proxy)
            _g_ring_issue(xsm, wsm, ssm, x_ptr, xofs, w_ptr, wofs, group, s_ptr, scofs, c + STAGES - 1,
                          steps, KW, KB, STEP, STAGES, xok, SM, GT)
            slot = c % STAGES
            v = wsm.index(slot).load(LW)
            s = ssm.index(slot).reshape([CHUNKS, ssm.shape[1] // CHUNKS * 4, 4]).permute((1, 0, 2)).load(
                gl.SliceLayout(3, LW))
            w = _g_decode_step(v, s, SMAX, NIB)
            acc = _g_wg_mma(w, A_L, xsm.index(slot), acc)
        async_copy.wait_group(0)
        if TAIL:
            if tail_live:
                acc = _g_ring_tail_step(acc, tail, SMAX, LWH, A_L, NIB)
        return acc

    @gluon.constexpr_function
    def ring_tail_layout(BLOCK_N, BLOCK_M, num_warps, k):
        """Layout k of ring_tail_layouts(BLOCK_N, BLOCK_M, num_warps), for kernels."""
        return ring_tail_layouts(BLOCK_N, BLOCK_M, num_warps)[k]

    @gluon.jit
    def _g_ring_tail_buffers(rows, tw_e, ts_e, xtofs, BLOCK_M: gl.constexpr):
        """TAIL's buffers (words [BLOCK_N, 1, 4, 2], scale bytes [BLOCK_N, 1, 4], x [BLOCK_M, 64]) and the copies'
        sources: rows' 8 words and 4 scale bytes in tail_half's copy (tw_e, ts_e: the weight's, or an expert's,
        first group) and x's half_tail columns (xtofs, layout ring_tail_layouts' LXT), as one tuple."""
        BLOCK_N: gl.constexpr = rows.shape[0]
        LWH: gl.constexpr = ring_tail_layout(BLOCK_N, BLOCK_M, gl.num_warps(), 0)
        SWH: gl.constexpr = ring_tail_layout(BLOCK_N, BLOCK_M, gl.num_warps(), 1)
        LTS: gl.constexpr = ring_tail_layout(BLOCK_N, BLOCK_M, gl.num_warps(), 2)
        SXT: gl.constexpr = ring_tail_layout(BLOCK_N, BLOCK_M, gl.num_warps(), 4)
        LS: gl.constexpr = gl.SliceLayout(3, LWH)
        r = gl.convert_layout(rows, row_layout(LWH))
        t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LS)))
        i = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LWH))))
        wrow = gl.multiple_of((r // 16) * 128 + (r % 16) * 8, 8)
        twofs = wrow[:, None, None, None] + (t * 2)[None, None, :, None] + i[None, None, None, :]
        rs = gl.convert_layout(rows, gl.SliceLayout(1, gl.SliceLayout(2, LTS)))
        b = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LTS)))
        srow = gl.multiple_of((rs // 16) * 64 + (rs % 16) * 4, 4)
        tsofs = gl.max_contiguous(gl.multiple_of(srow[:, None, None] + b[None, None, :], [1, 1, 4]), [1, 1, 4])
        wt = gl.allocate_shared_memory(gl.int32, [BLOCK_N, 1, 4, 2], SWH)
        st = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, 1, 4], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        xt = gl.allocate_shared_memory(gl.float16, [BLOCK_M, 64], SXT)
        return wt, st, xt, tw_e, twofs, ts_e, tsofs, xtofs

    @gluon.jit
    def _g_ring_tail_issue(tail, x_ptr, live, PART: gl.constexpr = 0):
        """TAIL: cp.async copies of the K tail's words, scale bytes (PART 1) and x rows (PART 2) into its buffers,
        none where not live (a K slice of whole steps), joining the caller's group (not committed here)."""
        wt, st, xt, tw_e, twofs, ts_e, tsofs, xtofs = tail
        if PART != 2:
            async_copy.async_copy_global_to_shared(wt, tw_e + twofs, mask=live & (twofs >= 0))
            async_copy.async_copy_global_to_shared(st, ts_e + tsofs, mask=live & (tsofs >= 0))
        if PART != 1:
            async_copy.async_copy_global_to_shared(xt, x_ptr + xtofs, mask=live & (xtofs >= 0))

    @gluon.jit
    def _g_ring_tail_step(acc, tail, SMAX, LWH: gl.constexpr, A_L: gl.constexpr, NIB: gl.constexpr):
        """TAIL's half step (the copies landed: the ring waited for their group): lane t of a row decodes its words
        2t and 2t + 1 (block t // 2, whose scale byte is its byte t), the wgmma takes 64 K (4 k-steps)."""
        wt, st, xt, tw_e, twofs, ts_e, tsofs, xtofs = tail
        gl.thread_barrier()  # every thread's tail copies landed
        fence_async_shared()  # the copies (generic proxy) before the wgmma's reads (async proxy)
        w = _g_decode_step(wt.load(LWH), st.load(gl.SliceLayout(3, LWH)), SMAX, NIB)
        acc = warpgroup_mma(gl.convert_layout(w, A_L, assert_trivial=True), xt.permute((1, 0)), acc, is_async=True)
        return warpgroup_mma_wait(0, deps=[acc])

    @gluon.jit
    def _g_tma_weights(wsm, ssm, bars, wdesc, sdesc, g0, c, steps, STEP: gl.constexpr, STAGES: gl.constexpr,
                       XBYTES: gl.constexpr = 0, g1=None, SEQ: gl.constexpr = False):
        """TMA: step c's weight words and scale bytes (16-row groups from g0) as two tensor-memory-accelerator
        copies into ring slot c % STAGES, issued by one thread and completing on the slot's mbarrier (none
        past the last step); the barrier expects XBYTES more (x's box, TMA=2). g1 (moe_mma's mlp1, one chunk per
        step): the slot's second half of groups from g1 instead (its linear rows), two boxes of each kind; with
        tma_descriptors(paired=...)'s 4-D views (moe_mma's PAIRED) one box of each kind lands both halves, g0 the
        expert's gate half (2 e) and g1 the program's first group in each half. SEQ: the words' box lands
        chunk-major ([CHUNKS, groups, 256]: tma_descriptors(chunk_major=True))."""
        slot = c % STAGES
        CHUNKS: gl.constexpr = STEP // 16
        live = c < steps
        bar = bars.index(slot)
        NG: gl.constexpr = wsm.shape[2] if SEQ else wsm.shape[1]
        mbarrier.expect(bar, NG * CHUNKS * (1024 + 64) + XBYTES, pred=live)
        if SEQ:
            tma.async_copy_global_to_shared(wdesc, [c * CHUNKS, g0, 0], bar, wsm.index(slot), pred=live)
            tma.async_copy_global_to_shared(sdesc, [c * CHUNKS, g0, 0], bar, ssm.index(slot), pred=live)
        elif g1 is None:
            tma.async_copy_global_to_shared(wdesc, [g0, c * CHUNKS, 0], bar, wsm.index(slot), pred=live)
            tma.async_copy_global_to_shared(sdesc, [c * CHUNKS, g0, 0], bar, ssm.index(slot), pred=live)
        elif len(wdesc.block_shape) == 4:  # PAIRED: [half, group, chunk, word] boxes of both halves
            H: gl.constexpr = wsm.shape[1] // 2
            tma.async_copy_global_to_shared(wdesc, [g0, g1, c, 0], bar, wsm.index(slot)._reinterpret(
                gl.int32, [2, H, 1, 256], wdesc.layout), pred=live)
            tma.async_copy_global_to_shared(sdesc, [c, g0, g1, 0], bar, ssm.index(slot)._reinterpret(
                gl.uint8, [1, 2, H, 64], sdesc.layout), pred=live)
        else:
            H: gl.constexpr = wsm.shape[1] // 2
            tma.async_copy_global_to_shared(wdesc, [g0, c, 0], bar, wsm.index(slot).slice(0, H), pred=live)
            tma.async_copy_global_to_shared(wdesc, [g1, c, 0], bar, wsm.index(slot).slice(H, H), pred=live)
            tma.async_copy_global_to_shared(sdesc, [c, g0, 0], bar, ssm.index(slot).slice(0, H, dim=1), pred=live)
            tma.async_copy_global_to_shared(sdesc, [c, g1, 0], bar, ssm.index(slot).slice(H, H, dim=1), pred=live)

    @gluon.jit
    def _g_tma_x(xsm, bars, xdesc, m0, c, steps, STEP: gl.constexpr, STAGES: gl.constexpr, SEQ: gl.constexpr = False,
                 xsm2=None, xdesc2=None):
        """TMA=2: step c's x rows (tokens from m0; rows past M read as zeros) as one more box on the slot's
        mbarrier; SEQ: one [BLOCK_M, 128] box per chunk, into x slots slot * CHUNKS + q. xsm2 (ABSORB): the EXTRA
        rows after BLOCK_M as a box of xdesc2 into xsm2's slot too."""
        slot = c % STAGES
        if SEQ and len(xdesc.block_shape) == 3:  # one box of the step's chunks, in swizzle-wide column pieces
            PIECES: gl.constexpr = xdesc.block_shape[0]  # of the step ([piece, token, piece width] view of x)
            xs = xsm._reinterpret(gl.float16, [STAGES, PIECES, xsm.shape[1], xdesc.block_shape[2]], xdesc.layout)
            tma.async_copy_global_to_shared(xdesc, [c * PIECES, m0, 0], bars.index(slot), xs.index(slot),
                                            pred=c < steps)
        elif SEQ:
            CHUNKS: gl.constexpr = STEP // 16
            for q in gl.static_range(CHUNKS):
                tma.async_copy_global_to_shared(xdesc, [m0, (c * CHUNKS + q) * 128], bars.index(slot),
                                                xsm.index(slot * CHUNKS + q), pred=c < steps)
        else:
            tma.async_copy_global_to_shared(xdesc, [m0, c * (STEP * 8)], bars.index(slot), xsm.index(slot),
                                            pred=c < steps)
            if xsm2 is not None:
                tma.async_copy_global_to_shared(xdesc2, [m0 + xsm.shape[1], c * (STEP * 8)], bars.index(slot),
                                                xsm2.index(slot), pred=c < steps)

    @gluon.jit
    def _g_tail_issue(wsm, ssm, xsm, bar, tdesc, tsdesc, xtdesc, g0, m0, k0):
        """TAIL: the program's K tail into a ring slot (words wsm, scale bytes ssm, x rows xsm, mbarrier bar): its
        groups' half chunks from prepare.tail_half (half a step's words: 512 bytes per group, as [NG, 1, 128]),
        their scale bytes, and x's last 64 K from column k0 (x_to_f16's half_tail order, [BLOCK_M, 64])."""
        NG: gl.constexpr = ssm.shape[1]
        BM: gl.constexpr = xsm.shape[0]
        mbarrier.expect(bar, NG * (512 + 64) + BM * 64 * 2)
        tma.async_copy_global_to_shared(tdesc, [g0, 0, 0], bar, wsm._reinterpret(gl.int32, [NG, 1, 128],
                                                                               tdesc.layout))
        tma.async_copy_global_to_shared(tsdesc, [0, g0, 0], bar, ssm._reinterpret(gl.uint8, [1, NG, 64], tsdesc.layout))
        tma.async_copy_global_to_shared(xtdesc, [m0, k0], bar, xsm._reinterpret(gl.float16, [BM, 64], xtdesc.layout))

    @gluon.jit
    def _g_tail_step(acc, wsm, ssm, xsm, bar, phase, xtdesc, SMAX, LWH: gl.constexpr, SWH: gl.constexpr,
                     A_L: gl.constexpr, NIB: gl.constexpr, BC: gl.constexpr = False):
        """TAIL's last K step, a half step from the slot _g_tail_issue filled: lane t of a row decodes its words
        2t and 2t + 1 (LWH: words [BLOCK_N, 1, 4 (t), 2 (i)]; block t // 2, whose scale byte tail_half put at
        byte t), and the wgmma takes 64 K (4 k-steps) against x's half_tail rows."""
        BLOCK_N: gl.constexpr = acc.shape[0]
        BM: gl.constexpr = xsm.shape[0]
        mbarrier.wait(bar, phase)
        v = wsm._reinterpret(gl.int32, [BLOCK_N, 1, 4, 2], SWH).load(LWH)
        s = ssm._reinterpret(gl.uint8, [1, BLOCK_N, 4], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])).permute(
            (1, 0, 2)).load(gl.SliceLayout(3, LWH))
        xs = xsm._reinterpret(gl.float16, [BM, 64], xtdesc.layout)
        if BC:  # lane t's block t // 2 has its scale byte at byte t, as bc_mult reads it
            return _g_bc_mma(v, s, SMAX, NIB, A_L, xs, acc, BC)
        w = _g_decode_step(v, s, SMAX, NIB)
        acc = warpgroup_mma(gl.convert_layout(w, A_L, assert_trivial=True), xs.permute((1, 0)), acc, is_async=True)
        return warpgroup_mma_wait(0, deps=[acc])

    @gluon.jit
    def _g_tma_issue(xsm, wsm, ssm, bars, x_ptr, xofs, wdesc, sdesc, xdesc, g0, m0, c, steps, STEP: gl.constexpr,
                     STAGES: gl.constexpr, XT: gl.constexpr, g1=None, xok=None, SEQ: gl.constexpr = False,
                     xsm2=None, xdesc2=None):
        """Step c into ring slot c % STAGES: its weights by TMA (_g_tma_weights), its x rows by TMA too (XT) or
        by cp.async as in _g_ring_issue (one group per step; past the last step an empty group)."""
        if XT:
            if xsm2 is None:
                XBYTES: gl.constexpr = xsm.shape[1] * STEP * 16
            else:  # ABSORB's extra box too
                XBYTES: gl.constexpr = (xsm.shape[1] + xsm2.shape[1]) * STEP * 16
            _g_tma_weights(wsm, ssm, bars, wdesc, sdesc, g0, c, steps, STEP, STAGES, XBYTES, g1, SEQ)
            _g_tma_x(xsm, bars, xdesc, m0, c, steps, STEP, STAGES, SEQ, xsm2, xdesc2)
        else:
            _g_tma_weights(wsm, ssm, bars, wdesc, sdesc, g0, c, steps, STEP, STAGES, 0, g1)
            _g_x_issue(xsm, x_ptr, xofs, c, steps, STEP, STAGES, xok)

    @gluon.jit
    def _g_tma_step(acc, wsm, ssm, bars, xsm, x_ptr, xofs, wdesc, sdesc, xdesc, g0, m0, c, steps, SMAX,
                    STEP: gl.constexpr, STAGES: gl.constexpr, LW: gl.constexpr, A_L: gl.constexpr, SW: gl.constexpr,
                    NIB: gl.constexpr, XT: gl.constexpr, g1=None, xok=None, SEQ: gl.constexpr = False, xsm2=None,
                    xdesc2=None, BC: gl.constexpr = False):
        """Step c of _g_wg_tma_loop: wait for its slot, issue step c + STAGES - 1, decode, wgmma. SEQ: the slot's
        chunks one at a time (LW, SW: one chunk's layouts), each decoded, multiplied and waited for before the
        next is read, so a chunk's A registers serve them all. BC (SEQ or one chunk a step): _g_bc_mma."""
        CHUNKS: gl.constexpr = STEP // 16
        if SEQ:  # wsm [STAGES, CHUNKS, groups, 256], else [STAGES, groups, CHUNKS, 256]
            BLOCK_N: gl.constexpr = wsm.shape[2] * 16
        else:
            BLOCK_N: gl.constexpr = wsm.shape[1] * 16
        slot = c % STAGES
        if SEQ:
            gl.thread_barrier()  # every warp is done with step c - 1's slot (the one step c + STAGES - 1 refills)
            mbarrier.wait(bars.index(slot), (c // STAGES) & 1)  # step c's words, scales and x landed
            NG: gl.constexpr = BLOCK_N // 16
            wv = wsm.index(slot)._reinterpret(gl.int32, [CHUNKS, NG, 256], gl.NVMMASharedLayout(0, 32, rank=2))
            sv = ssm.index(slot)._reinterpret(gl.uint8, [CHUNKS, NG, 64], gl.NVMMASharedLayout(0, 8, rank=2))
            for q in gl.static_range(CHUNKS):
                v = wv.index(q)._reinterpret(gl.int32, [BLOCK_N, 1, 4, 4], SW).load(LW)
                s = sv.index(q)._reinterpret(gl.uint8, [1, BLOCK_N, 4], gl.SwizzledSharedLayout(
                    1, 1, 1, [2, 1, 0])).permute((1, 0, 2)).load(gl.SliceLayout(3, LW))
                if q == 0:
                    _g_tma_issue(xsm, wsm, ssm, bars, x_ptr, xofs, wdesc, sdesc, xdesc, g0, m0, c + STAGES - 1,
                                 steps, STEP, STAGES, XT, g1, xok, SEQ)
                if BC:
                    acc = _g_bc_mma(v, s, SMAX, NIB, A_L, xsm.index(slot * CHUNKS + q), acc, BC)
                else:
                    acc = _g_wg_mma(_g_decode_step(v, s, SMAX, NIB), A_L, xsm.index(slot * CHUNKS + q), acc)
        else:
            if not XT:
                async_copy.wait_group(STAGES - 2)  # this thread's x copies of step c landed
            # every thread's x copies landed; every warp is done with step c - 1's slot. First in the step, so
            # that it also separates last step's TMA issue from this step's reads for Triton's barrier pass
            gl.thread_barrier()
            mbarrier.wait(bars.index(slot), (c // STAGES) & 1)  # step c's words and scales (and XT's x) landed
            if not XT:
                fence_async_shared()  # x's copies (generic proxy) before the wgmma's reads (async proxy)
            v = wsm.index(slot)._reinterpret(gl.int32, [BLOCK_N, CHUNKS, 4, 4], SW).load(LW)
            s = ssm.index(slot)._reinterpret(gl.uint8, [CHUNKS, BLOCK_N, 4], gl.SwizzledSharedLayout(
                1, 1, 1, [2, 1, 0])).permute((1, 0, 2)).load(gl.SliceLayout(3, LW))
            _g_tma_issue(xsm, wsm, ssm, bars, x_ptr, xofs, wdesc, sdesc, xdesc, g0, m0, c + STAGES - 1, steps, STEP,
                         STAGES, XT, g1, xok, False, xsm2, xdesc2)
            if BC:
                return _g_bc_mma(v, s, SMAX, NIB, A_L, xsm.index(slot), acc, BC)
            w = _g_decode_step(v, s, SMAX, NIB)
            if xsm2 is None:
                acc = _g_wg_mma(w, A_L, xsm.index(slot), acc)
            else:
                acc = _g_wg_mma(w, A_L, xsm.index(slot), acc, xsm2.index(slot))
        return acc

    @gluon.jit
    def _g_wg_tma_loop(acc, wdesc, sdesc, xdesc, g0, m0, x_ptr, xofs, xsm, KW, SMAX, CHUNKS: gl.constexpr,
                       STAGES: gl.constexpr, LW: gl.constexpr, A_L: gl.constexpr, SW: gl.constexpr,
                       NIB: gl.constexpr, EARLY: gl.constexpr, XT: gl.constexpr, g1=None, xok=None, tdesc=None,
                       tsdesc=None, xtdesc=None, LWH: gl.constexpr = None, SWH: gl.constexpr = None,
                       SEQ: gl.constexpr = False, xsm2=None, xdesc2=None, absorb=None, BC: gl.constexpr = False):
        """_g_wg_ring_loop with each step's weight words and scale bytes copied by TMA (tma_descriptors: a box
        lands in the slot exactly as RING_W's cp.async copies lay it out) instead of 16-byte cp.async copies by
        every thread; x stays on cp.async (XT: by TMA too, below). The builds take fewer registers (lm_head,
        32 tokens, 3 slots: 128 against 141, so 4 programs per SM instead of 3) but more instructions per step
        (373 against 336): Triton's barrier pass puts 3 more CTA barriers per step around the mbarrier operations
        (5, sm_90 SASS).
        Measured on the lm_head 0.7-2.7% faster at 16-32 tokens in three runs (results/20261124T130435-h100-
        80gb-hbm3-linear-tma, ...131803-..., ...133911-...); mbarriers of their own for words and scales (4
        barriers) measured no better (0.2-1.8%, ...132853-...). moe_mma's words alone by TMA (g1: mlp1's gate
        and linear boxes) measured 0-3% slower (...131655-...-moe-tma, results/20261127T034340-h100-80gb-hbm3-
        moe-mma-tma2); with x too (TMA=2) and 3 programs per SM it leads moe_mma from 1024 tokens
        (...20261127T034718-...-moe-mma-tma2-wide: 20b 4096 tokens 1939.1 -> 1672.0 us). EARLY: the
        program's PDL wait comes after its first steps' weight copies (the caller skips its own). XT (TMA=2):
        x's rows of a step as a third box on the same mbarrier (no cp.async group, no proxy fence): 64 tokens
        160.5 -> 149.4 us, 32 126.5 -> 124.9, 2-8 tied (results/20261124T160224-h100-80gb-hbm3-linear-mma-xtma).
        tdesc, tsdesc, xtdesc (TAIL, with XT and one chunk per step): the ring runs K's whole chunks, and the half
        chunk of the K tail lands in the slot and at the time the ring would copy one more step (_g_tail_issue,
        between two copies of the loop, whose body stays 358 sm_90 instructions at 2 tokens: issued from inside it,
        the tail's boxes made it 445), then runs as a half step (_g_tail_step). SEQ (XT, CHUNKS > 1): a step's
        CHUNKS chunks land in one slot on one mbarrier and are decoded and multiplied one at a time
        (_g_tma_step), so the ring's work per step (copies issued, the wait, the CTA barriers) is paid once per
        CHUNKS chunks while the A registers stay one chunk's; xsm holds STAGES * CHUNKS one-chunk x slots. xsm2,
        xdesc2, absorb (XT, not SEQ or the tail; moe_mma's ABSORB): a ring of the EXTRA x rows after BLOCK_M and
        acc the pair (the tile's accumulator, one of those rows); where `absorb` the ring and the loop run with the
        extra box and wgmma in every step, else as without them: the branch sits outside the loop (_g_tma_run),
        whose body then has no branch around a wgmma. BC: _g_bc_mma's steps (gemv_mma's BC)."""
        STEP: gl.constexpr = CHUNKS * 16
        # the slots' plain (unswizzled) layouts, as every tma_descriptors box lands (a PAIRED box reinterprets them)
        PLAIN_W: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)
        PLAIN_S: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=3)
        if xsm2 is None:
            BLOCK_N: gl.constexpr = acc.shape[0]
        else:  # ABSORB's pair of accumulators
            BLOCK_N: gl.constexpr = acc[0].shape[0]
        steps = gl.cdiv(KW, STEP)
        if tdesc is not None:
            steps = KW // STEP
        if SEQ:
            wsm = gl.allocate_shared_memory(gl.int32, [STAGES, CHUNKS, BLOCK_N // 16, 256], PLAIN_W)
        else:
            wsm = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N // 16, CHUNKS, 256], PLAIN_W)
        ssm = gl.allocate_shared_memory(gl.uint8, [STAGES, CHUNKS, BLOCK_N // 16, 64], PLAIN_S)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for q in gl.static_range(STAGES):
            mbarrier.init(bars.index(q), count=1)
        fence_async_shared()
        gl.thread_barrier()
        if xsm2 is None:
            acc = _g_tma_run(acc, wsm, ssm, bars, wdesc, sdesc, xdesc, g0, m0, x_ptr, xofs, xsm, steps, SMAX, STEP,
                             STAGES, LW, A_L, SW, NIB, EARLY, XT, g1, xok, tdesc, tsdesc, xtdesc, LWH, SWH, SEQ,
                             BC=BC)
        else:
            a0, a1 = acc
            if absorb:
                a0, a1 = _g_tma_run((a0, a1), wsm, ssm, bars, wdesc, sdesc, xdesc, g0, m0, x_ptr, xofs, xsm, steps,
                                    SMAX, STEP, STAGES, LW, A_L, SW, NIB, EARLY, XT, g1, xok, xsm2=xsm2,
                                    xdesc2=xdesc2)
            else:
                a0 = _g_tma_run(a0, wsm, ssm, bars, wdesc, sdesc, xdesc, g0, m0, x_ptr, xofs, xsm, steps, SMAX, STEP,
                                STAGES, LW, A_L, SW, NIB, EARLY, XT, g1, xok)
            acc = (a0, a1)
        if not XT:
            async_copy.wait_group(0)
        for q in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(q))
        return acc

    @gluon.jit
    def _g_tma_run(acc, wsm, ssm, bars, wdesc, sdesc, xdesc, g0, m0, x_ptr, xofs, xsm, steps, SMAX,
                   STEP: gl.constexpr, STAGES: gl.constexpr, LW: gl.constexpr, A_L: gl.constexpr, SW: gl.constexpr,
                   NIB: gl.constexpr, EARLY: gl.constexpr, XT: gl.constexpr, g1=None, xok=None, tdesc=None,
                   tsdesc=None, xtdesc=None, LWH: gl.constexpr = None, SWH: gl.constexpr = None,
                   SEQ: gl.constexpr = False, xsm2=None, xdesc2=None, BC: gl.constexpr = False):
        """_g_wg_tma_loop's ring and K loop over its allocated slots (xsm2, xdesc2: with ABSORB's extra rows)."""
        CHUNKS: gl.constexpr = STEP // 16
        if xsm2 is None:  # the bytes of a step's x boxes (TMA=2)
            XBYTES: gl.constexpr = xsm.shape[1] * STEP * 16 if XT else 0
        else:
            XBYTES: gl.constexpr = (xsm.shape[1] + xsm2.shape[1]) * STEP * 16
        if EARLY:  # the first steps' weights before the PDL wait (no kernel writes them), x after it
            for q in gl.static_range(STAGES - 1):
                _g_tma_weights(wsm, ssm, bars, wdesc, sdesc, g0, q, steps, STEP, STAGES, XBYTES, g1, SEQ)
            _g_pdl_enter()
            for q in gl.static_range(STAGES - 1):
                if XT:
                    _g_tma_x(xsm, bars, xdesc, m0, q, steps, STEP, STAGES, SEQ, xsm2, xdesc2)
                else:
                    _g_x_issue(xsm, x_ptr, xofs, q, steps, STEP, STAGES, xok)
        else:
            for q in gl.static_range(STAGES - 1):
                _g_tma_issue(xsm, wsm, ssm, bars, x_ptr, xofs, wdesc, sdesc, xdesc, g0, m0, q, steps, STEP, STAGES,
                             XT, g1, xok, SEQ, xsm2, xdesc2)
        if tdesc is None:
            for c in range(0, steps):
                acc = _g_tma_step(acc, wsm, ssm, bars, xsm, x_ptr, xofs, wdesc, sdesc, xdesc, g0, m0, c, steps, SMAX,
                                  STEP, STAGES, LW, A_L, SW, NIB, XT, g1, xok, SEQ, xsm2, xdesc2, BC)
        else:  # the tail goes where the ring would copy step `steps`: in step steps - STAGES + 1, after its barrier
            split = gl.maximum(steps - (STAGES - 1), 0)
            for c in range(0, split):
                acc = _g_tma_step(acc, wsm, ssm, bars, xsm, x_ptr, xofs, wdesc, sdesc, xdesc, g0, m0, c, steps, SMAX,
                                  STEP, STAGES, LW, A_L, SW, NIB, XT, g1, xok, SEQ, BC=BC)
            tail = steps % STAGES
            gl.thread_barrier()  # every warp is done with the slot's last step
            xt = tail * CHUNKS if SEQ else tail
            _g_tail_issue(wsm.index(tail), ssm.index(tail), xsm.index(xt), bars.index(tail), tdesc, tsdesc, xtdesc,
                          g0, m0, steps * (STEP * 8))
            for c in range(split, steps):
                acc = _g_tma_step(acc, wsm, ssm, bars, xsm, x_ptr, xofs, wdesc, sdesc, xdesc, g0, m0, c, steps, SMAX,
                                  STEP, STAGES, LW, A_L, SW, NIB, XT, g1, xok, SEQ, BC=BC)
            acc = _g_tail_step(acc, wsm.index(tail), ssm.index(tail), xsm.index(xt), bars.index(tail),
                               (steps // STAGES) & 1, xtdesc, SMAX, LWH, SWH, A_L, NIB, BC)
        return acc

    @gluon.jit
    def _g_scale_copy(rows, KW, LSC: gl.constexpr, SM: gl.constexpr = False):
        """Offsets [rows // 4, 16] (copy layout LSC) of the scale bytes of chunk 0 of step 0 in tile_mxfp4's
        layout: tile positions 4i .. 4i + 3 read weight rows g .. g + 3, g = rows[4i] rounded down to a multiple
        of 4, whose 4 bytes each are 16 contiguous bytes (one 16-byte copy, not four 4-byte ones). The tile's
        rows run in fours from multiples of 4 except where clamped at the weight's last row, whose positions are
        computed and never stored; rounding down keeps their copy inside the row's 16-row group."""
        NB: gl.constexpr = rows.shape[0]
        LR: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
        g = gl.min(gl.reshape(gl.convert_layout(rows, LR), [NB // 4, 4]), axis=1) // 4 * 4
        g = gl.convert_layout(g, gl.SliceLayout(1, LSC))
        b = gl.arange(0, 16, layout=gl.SliceLayout(0, LSC))
        if SM:  # prepare.step_major's copy: a chunk's groups side by side
            base = gl.multiple_of((g // 16) * 64 + (g % 16) * 4, 16)
        else:
            base = gl.multiple_of((g // 16) * (((KW + 15) // 16) * 64) + (g % 16) * 4, 16)
        return gl.max_contiguous(gl.multiple_of(base[:, None] + b[None, :], [16, 16]), [1, 16])

    @gluon.jit
    def _g_wg_program(w_ptr, s_ptr, rows, x_ptr, xofs, K, SMAX, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      CHUNKS: gl.constexpr, TILED: gl.constexpr, STAGES: gl.constexpr, RING_W: gl.constexpr,
                      LW: gl.constexpr, MMA: gl.constexpr, SX: gl.constexpr, SW: gl.constexpr, SS: gl.constexpr,
                      LSC: gl.constexpr, NIB: gl.constexpr, wdesc, sdesc, g0, TMA: gl.constexpr,
                      EARLY: gl.constexpr = False, xdesc=None, m0=0, xok=None, g1=None, tdesc=None, tsdesc=None,
                      xtdesc=None, LWH: gl.constexpr = None, SWH: gl.constexpr = None, SM: gl.constexpr = False,
                      GT=0, KL=None, TAIL: gl.constexpr = False, tw_e=None, ts_e=None, xtofs=None,
                      SEQ: gl.constexpr = False, xdesc2=None, absorb=None, BC: gl.constexpr = False):
        """A WGMMA program's accumulator [BLOCK_N weight rows `rows`, BLOCK_M x rows at xofs]: the ring(s) in
        shared memory and the K loop (_g_wg_tma_loop with TMA, where the rows are the 16-row groups from g0, and
        with g1 the second half's from g1; _g_wg_ring_loop with RING_W; else _g_wg_loop). xok: which x copies
        to make (x_live; not with TMA=2). SM (RING_W): w_ptr and s_ptr are prepare.step_major's copy, GT groups
        a chunk. KL (RING_W): the K this program multiplies, from pointers moved to a slice's first chunk; the
        row offsets still follow the weight's K. EARLY (TMA or RING_W): the PDL wait is the loop's, after its first
        weight copies. TAIL (RING_W, CHUNKS=1): a half last chunk runs as a half step (_g_wg_ring_loop) from
        tail_half's copy (tw_e, ts_e: its first group for these rows) and x's half_tail columns (xtofs). SEQ (TMA=2):
        the TMA loop's slots of CHUNKS chunks taken one chunk at a time (LW, SW, SX: one chunk's layouts).
        xdesc2 (TMA=2, moe_mma's ABSORB): the box of x's EXTRA rows after BLOCK_M, multiplied where `absorb` (the
        tile runs past BLOCK_M) into a second accumulator; the result is then the pair (_g_wg_tma_loop). BC (TMA=2):
        _g_bc_mma's steps, the accumulator [BLOCK_N, BLOCK_M] of bc rows (8 columns a token)."""
        if KL is None:
            KL = K
        if SEQ:
            xsm = gl.allocate_shared_memory(gl.float16, [STAGES * CHUNKS, BLOCK_M, 128], SX)
        else:
            xsm = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, 128 * CHUNKS], SX)
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
        A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
        if xdesc2 is not None:
            EXTRA: gl.constexpr = xdesc2.block_type.shape[0]
            xsm2 = gl.allocate_shared_memory(gl.float16, [STAGES, EXTRA, 128 * CHUNKS], xdesc2.layout)
            acc = (acc, gl.zeros([BLOCK_N, EXTRA], gl.float32, width_layout(MMA, EXTRA)))
            acc = _g_wg_tma_loop(acc, wdesc, sdesc, xdesc, g0, m0, x_ptr, xofs, xsm, K // 8, SMAX, CHUNKS, STAGES, LW,
                                 A_L, SW, NIB, EARLY, TMA == 2, g1, xok, tdesc, tsdesc, xtdesc, LWH, SWH, SEQ,
                                 xsm2, xdesc2, absorb)
        elif TMA:
            acc = _g_wg_tma_loop(acc, wdesc, sdesc, xdesc, g0, m0, x_ptr, xofs, xsm, K // 8, SMAX, CHUNKS, STAGES, LW,
                                 A_L, SW, NIB, EARLY, TMA == 2, g1, xok, tdesc, tsdesc, xtdesc, LWH, SWH, SEQ, BC=BC)
        else:
            wofs, sofs, group, block = _g_word_offsets(rows, K // 8, CHUNKS, TILED, LW, SM, GT)
            if RING_W:
                wsm = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, CHUNKS, 4, 4], SW)
                ssm = gl.allocate_shared_memory(gl.uint8, [STAGES, CHUNKS * BLOCK_N // 4, 16], SS)  # chunk-major
                scofs = _g_scale_copy(rows, K // 8, LSC, SM)
                tail = None
                LWT: gl.constexpr = ring_tail_layout(BLOCK_N, BLOCK_M, gl.num_warps(), 0)
                if TAIL:
                    tail = _g_ring_tail_buffers(rows, tw_e, ts_e, xtofs, BLOCK_M)
                acc = _g_wg_ring_loop(acc, w_ptr, wofs, group, s_ptr, scofs, x_ptr, xofs, xsm, wsm, ssm, KL // 8,
                                      KL // 32, SMAX, CHUNKS, STAGES, LW, A_L, NIB, xok, SM, GT, EARLY, TAIL, tail,
                                      LWT)
            else:
                acc = _g_wg_loop(acc, w_ptr, s_ptr, wofs, sofs, group, block, x_ptr, xofs, xsm, K // 8, K // 32,
                                 SMAX, CHUNKS, TILED, STAGES, A_L, NIB, xok)
        return acc

    @gluon.jit
    def _wg_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, KP, stride_ym, SMAX,
                   HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CHUNKS: gl.constexpr,
                   TILED: gl.constexpr, STAGES: gl.constexpr, RING_W: gl.constexpr, LW: gl.constexpr,
                   LXCP: gl.constexpr, MMA: gl.constexpr, SX: gl.constexpr, SW: gl.constexpr, SS: gl.constexpr,
                   LSC: gl.constexpr, NIB: gl.constexpr, wdesc, sdesc, xdesc, TMA: gl.constexpr,
                   EARLY: gl.constexpr, tdesc=None, tsdesc=None, xtdesc=None, LWH: gl.constexpr = None,
                   SWH: gl.constexpr = None, SM: gl.constexpr = False, GT=0, TAIL: gl.constexpr = False,
                   tw_ptr=None, ts_ptr=None, SEQ: gl.constexpr = False, BC: gl.constexpr = False,
                   NOBAR: gl.constexpr = False):
        """gemv_mma's K loop on wgmma (WGMMA=True, _g_wg_program): x goes once per program through shared memory
        instead of into every warp's registers. EARLY (TMA): the PDL wait is the TMA loop's, after its first
        weight copies. TAIL (RING_W without TMA): the cp.async ring's half step from tail_half's copy (tw_ptr,
        ts_ptr). BC (TMA=2): x is x_to_f16's bc rows, BLOCK_M of them a program (BLOCK_M / 8 * BC tokens)."""
        if not EARLY:
            _g_pdl_enter()
        pid_m = gl.program_id(0)  # token tiles vary fastest: each weight tile is read once from DRAM
        pid_n = gl.program_id(1)
        if NOBAR:  # kernels.ring_sync drops the loop's redundant barriers from this build's PTX
            pid_n = _g_mark(pid_n)
        rows = gl.minimum(pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=row_layout(LW)), N - 1)
        tok = gl.minimum(pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LXCP)), M - 1)
        xofs = (tok * KP)[:, None] + gl.arange(0, 128 * CHUNKS, layout=gl.SliceLayout(0, LXCP))[None, :]
        xtofs = None
        if TAIL:
            LXT: gl.constexpr = ring_tail_layout(BLOCK_N, BLOCK_M, gl.num_warps(), 3)
            tt = gl.convert_layout(tok, gl.SliceLayout(1, LXT))
            xtofs = (tt * KP + K // 128 * 128)[:, None] + gl.arange(0, 64, layout=gl.SliceLayout(0, LXT))[None, :]
        acc = _g_wg_program(w_ptr, s_ptr, rows, x_ptr, xofs, K, SMAX, BLOCK_M, BLOCK_N, CHUNKS, TILED, STAGES, RING_W,
                            LW, MMA, SX, SW, SS, LSC, NIB, wdesc, sdesc, pid_n * (BLOCK_N // 16), TMA, EARLY,
                            xdesc, pid_m * BLOCK_M, None, None, tdesc, tsdesc, xtdesc, LWH, SWH, SM, GT,
                            TAIL=TAIL, tw_e=tw_ptr, ts_e=ts_ptr, xtofs=xtofs, SEQ=SEQ, BC=BC)
        if BC:
            out = _g_bc_sum(acc, BC)
            LO: gl.constexpr = out.type.layout
            T: gl.constexpr = BLOCK_M // 8 * BC
            rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LO))
            rm = pid_m * T + gl.arange(0, T, layout=gl.SliceLayout(0, LO))
            _g_store(out, xs_ptr, b_ptr, y_ptr, rn, rm, M, N, stride_ym, SMAX, HAS_BIAS)
        else:
            rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
            rm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
            _g_store(acc, xs_ptr, b_ptr, y_ptr, rn, rm, M, N, stride_ym, SMAX, HAS_BIAS)


@triton.constexpr_function
def _log2(v: int) -> int:
    return v.bit_length() - 1


_LANES = [[0, 0, 1, 0], [0, 0, 2, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]]  # lane 4 g + t: t, then rows g


@triton.constexpr_function
def word_layout(ROWS: int, CHUNKS: int, num_warps: int, WORDS: int = 4):
    """Layout of a step's weight words [BLOCK_N, CHUNKS, 4 (t), WORDS (i)] (mma_layouts' LW): registers i, row
    + 8, the chunks, then the ROWS 16-row groups of a warp; lanes t then g; warps 16-row groups. WORDS=2: TAIL's
    half step, lane t holding words 2t and 2t + 1 of the row's half chunk."""
    reg = ([[0, 0, 0, 1 << j] for j in range(_log2(WORDS))] + [[8, 0, 0, 0]]
           + [[0, 1 << j, 0, 0] for j in range(_log2(CHUNKS))]
           + [[16 * num_warps << j, 0, 0, 0] for j in range(_log2(ROWS))])
    warp = [[16 << j, 0, 0, 0] for j in range(_log2(num_warps))]
    return gl.DistributedLinearLayout(reg, _LANES, warp, [], [16 * ROWS * num_warps, CHUNKS, 4, WORDS])


@functools.cache
def mma_layouts(BLOCK_M: int, ROWS: int, CHUNKS: int, num_warps: int):
    """(weight-word layout, x layout, MMA layout) of a gemv_mma config, as Gluon linear layouts.

    Words [BLOCK_N, CHUNKS, 4 (t), 4 (i)]: registers i (one 16-byte load), row + 8, the chunks, then the ROWS
    16-row groups of a warp; lanes t then g; warps 16-row groups. x [BLOCK_M, CHUNKS, 4 (t), 32]: 32 contiguous
    fp16 per lane, chunk and token, token tiles of 8 in registers, every warp holding the same x.
    """
    LW = word_layout(ROWS, CHUNKS, num_warps)
    xreg = ([[0, 0, 0, 1 << j] for j in range(5)] + [[0, 1 << j, 0, 0] for j in range(_log2(CHUNKS))]
            + [[8 << j, 0, 0, 0] for j in range(_log2(BLOCK_M // 8))])
    LX = gl.DistributedLinearLayout(xreg, _LANES, [[0, 0, 0, 0]] * _log2(num_warps), [], [BLOCK_M, CHUNKS, 4, 32])
    MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    return LW, LX, MMA


SHARED_BYTES = 227 * 1024  # the most shared memory one sm_90 program may use


def wgmma_reason(cfg: dict) -> str | None:
    """Why a WGMMA config of gemv_mma / moe_mma cannot run (None if it can). Per thread: ROWS * BLOCK_M / 2
    accumulators, 32 * ROWS * CHUNKS decoded A registers and 16 * ROWS * CHUNKS words (this step's and the
    next). Fitted to sm_90 builds (triton 3.6, gpt-oss shapes): estimates up to 224 with at most 64
    accumulators took 190-222 registers without spilling; BLOCK_M=256 (128 accumulators) spilled."""
    if cfg["num_warps"] % 4:
        return f"num_warps={cfg['num_warps']}: wgmma runs on whole warpgroups (multiples of 4 warps)"
    if cfg.get("PREFETCH"):
        return "WGMMA always prefetches the next step's words (PREFETCH would repeat a config)"
    rows, c = cfg["ROWS"], cfg["CHUNKS"]
    seq = cfg.get("SEQ", False)
    if seq and (cfg.get("TMA") != 2 or c == 1):
        return "SEQ takes a slot of CHUNKS > 1 chunks landed by TMA=2 one chunk at a time"
    if cfg.get("BC") and (cfg.get("TMA") != 2 or not (seq or c == 1)):
        return "BC scales each chunk's wgmma (TMA=2, one chunk a wgmma: SEQ or CHUNKS=1)"
    if cfg.get("BC") == 2 and not cfg.get("NIB"):
        return "BC=2 puts NIB's 2^8 of pair half h = 1 into x's rows (it needs NIB)"
    if cfg.get("NOBAR") and not cfg.get("TMA"):
        return "NOBAR drops barriers of TMA's ring (it needs TMA)"
    acc = rows * cfg["BLOCK_M"] // 2 * (2 if cfg.get("BC") else 1)  # BC: a chunk's sums beside the accumulator
    regs = acc + 48 * rows * (1 if seq else c)
    if regs > 224 or acc > 64:
        return (f"~{regs} data registers per thread, {acc} accumulators (ROWS*BLOCK_M/2 + 48*ROWS*CHUNKS > 224 or "
                "ROWS*BLOCK_M/2 > 64: larger builds spill)")
    ring_w = cfg.get("RING_W", False)
    if cfg.get("TMA") and not ring_w:
        return "TMA copies the weights of RING_W's ring (it needs RING_W)"
    if cfg.get("EARLY") and not cfg.get("TMA"):
        return "EARLY issues TMA's first weight copies before the PDL wait (it needs TMA)"
    if cfg.get("STEP_MAJOR") and not ring_w:
        return "STEP_MAJOR lays out the weights the ring copies (it needs RING_W)"
    if cfg.get("TAIL") and ((c != 1 and not seq) or not (cfg.get("TMA") == 2 or (ring_w and not cfg.get("TMA")))):
        return ("TAIL runs the K tail's half chunk beside a ring of one-chunk steps (CHUNKS=1, or SEQ's chunks), "
                "landed by TMA (TMA=2) or by the cp.async ring's copies (RING_W without TMA)")
    if ring_w and not cfg.get("TILED"):
        return "RING_W copies tile_mxfp4's layout (a row's scale bytes of a chunk together): it needs TILED"
    need = cfg["STAGES"] * c * (cfg["BLOCK_M"] * 256 + (16 * rows * cfg["num_warps"] * 68 if ring_w else 0))
    if need > SHARED_BYTES:
        return f"ring of {need} bytes of shared memory (at most {SHARED_BYTES})"
    if cfg["STAGES"] < 2:
        return f"STAGES={cfg['STAGES']}: the x ring needs at least 2 slots"
    return None


@functools.cache
def wg_layouts(BLOCK_M: int, ROWS: int, CHUNKS: int, num_warps: int):
    """(weight-word layout, x copy layout, wgmma accumulator layout, x slot layout) of a WGMMA config: the
    words as for mma.sync (each warp's wgmma A fragment is its mma.sync A fragment); x rows [BLOCK_M,
    128 CHUNKS] copied 16 bytes per thread (lanes along a row first) into 128-byte-swizzled slots."""
    LW, _, _ = mma_layouts(BLOCK_M, ROWS, CHUNKS, num_warps)
    cols = min(16 * CHUNKS, 32)  # lanes per row
    copy = gl.BlockedLayout([1, 8], [32 // cols, cols], [num_warps, 1], [1, 0])
    MMA = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 16])
    return LW, copy, MMA, gl.NVMMASharedLayout.get_default_for([BLOCK_M, 128 * CHUNKS], gl.float16)


@functools.cache
def wg_ring_layouts(BLOCK_M: int, ROWS: int, CHUNKS: int, num_warps: int):
    """(word slot, scale slot, scale copy layout) of RING_W: words as ring_layouts stores them, scale bytes
    [CHUNKS * BLOCK_N / 4, 16] (chunk-major) plainly, copied 16 bytes (4 rows x 4) per thread and chunk."""
    SW, _, _ = ring_layouts(BLOCK_M, ROWS, CHUNKS, num_warps)
    SS = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    LSC = gl.BlockedLayout([1, 16], [32, 1], [num_warps, 1], [1, 0])
    return SW, SS, LSC


@functools.cache
def ring_layouts(BLOCK_M: int, ROWS: int, CHUNKS: int, num_warps: int):
    """(weight slot, x slot, x copy layout) of a config's cp.async ring in shared memory (a ring of STAGES
    slots is allocated as [STAGES, *slot shape] with the slot's layout).

    Weight words [BLOCK_N, CHUNKS, 4 (t), 4 (i)] are stored so that the 32 lanes' 16-byte reads of one
    register of the word layout (mma_layouts) are 512 contiguous bytes: i, t, rows 1-8, chunks, rows 16+.
    Each thread copies exactly the words it reads later. x [BLOCK_M, CHUNKS, 4 (t), 32]: 16-byte pieces, then
    t, then tokens 1-4, then the rest of the lane's 64 bytes, so one register of the x layout is again 512
    contiguous bytes for the warp; the whole program copies each step's x once (16 bytes per thread and copy)
    and every warp reads it.
    """
    BLOCK_N = 16 * ROWS * num_warps
    w = ([[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [0, 0, 2, 0]] + [[1 << j, 0, 0, 0] for j in range(4)]
         + [[0, 1 << j, 0, 0] for j in range(_log2(CHUNKS))]
         + [[16 << j, 0, 0, 0] for j in range(_log2(BLOCK_N // 16))])
    x = ([[0, 0, 0, 1 << j] for j in range(3)] + [[0, 0, 1, 0], [0, 0, 2, 0]] + [[1 << j, 0, 0, 0] for j in range(3)]
         + [[0, 0, 0, 8], [0, 0, 0, 16]] + [[0, 1 << j, 0, 0] for j in range(_log2(CHUNKS))]
         + [[8 << j, 0, 0, 0] for j in range(_log2(BLOCK_M // 8))])
    # copy: 8 fp16 per register group, lanes over t and tokens 1-4 (conflict-free stores), warps then registers
    # over the rest; warps beyond the tile repeat a copy (broadcast)
    rest = ([[0, 0, 0, 8], [0, 0, 0, 16]] + [[0, 1 << j, 0, 0] for j in range(_log2(CHUNKS))]
            + [[8 << j, 0, 0, 0] for j in range(_log2(BLOCK_M // 8))])
    nw = _log2(num_warps)
    warp = (rest + [[0, 0, 0, 0]] * nw)[:nw]
    reg = [[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4]] + rest[nw:]
    lane = [[0, 0, 1, 0], [0, 0, 2, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]]
    copy = gl.DistributedLinearLayout(reg, lane, warp, [], [BLOCK_M, CHUNKS, 4, 32])
    return gl.SharedLinearLayout(w), gl.SharedLinearLayout(x), copy


def tma_descriptors(p, NG: int, CHUNKS: int, step_major_copy: bool = False, chunk_major: bool = False,
                    paired: bool = False):
    """(words, scales) TMA descriptors of tile_mxfp4's copy p for boxes of NG 16-row groups and CHUNKS chunks:
    words viewed [G, KC, 256] (a box lands group, chunk, row, word: RING_W's slot order), scales [KC, G, 64]
    (a box lands chunk-major, as RING_W's scale slot); groups past G read as zeros. An expert stack [E, N, K]
    is viewed as E * G groups (expert e's group g is e * G + g). step_major_copy: the same views of
    prepare.step_major's copy (chunks outermost in memory), so the boxes land exactly as they do from p.
    chunk_major (SEQ): words viewed [KC, G, 256], so a box lands chunk by chunk, each as a one-chunk box would.
    paired (moe_mma's PAIRED, mlp1's deinterleaved copy, one chunk per step): 4-D views with the gate and linear
    halves of each expert as a dimension, words [2 E, G / 2, KC, 256] and scales [KC, 2 E, G / 2, 64], so a box of
    [2, NG / 2] groups lands a program's NG / 2 gate groups and then the same columns' linear groups, as the two
    3-D boxes of each kind did: one TMA copy of each kind instead of two, and Triton 3.6 puts a CTA barrier after
    every copy of the ring (mlp1's sm_90 loop 383 -> 344 instructions, 8 -> 6 barriers: `./lab sass --loops`).
    Made once per box shape and cached on p."""
    cache = p.__dict__.setdefault("_tma", {})
    key = (NG, CHUNKS, step_major_copy, chunk_major, paired)
    if paired and key not in cache:
        if not p.deinterleaved or step_major_copy or chunk_major or CHUNKS != 1:
            raise ValueError("paired boxes read mlp1's deinterleaved tiled copy, one chunk per step")
        halves, KC = 2 * p.words.shape[:-3].numel() // p.words.shape[-4], p.words.shape[-3]
        GH = p.words.shape[-4] // 2  # groups per half
        cache[key] = (
            TensorDescriptor(p.words, [halves, GH, KC, 256], [GH * KC * 256, KC * 256, 256, 1], [2, NG // 2, 1, 256],
                             gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=4)),
            TensorDescriptor(p.scales, [KC, halves, GH, 64], [64, GH * KC * 64, KC * 64, 1], [1, 2, NG // 2, 64],
                             gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=4)))
    if key not in cache:
        G, KC = p.words.shape[:-3].numel(), p.words.shape[-3]
        words, scales = step_major(p) if step_major_copy else (p.words, p.scales)
        wstride, sstride = ([256, G * 256, 1], [G * 64, 64, 1]) if step_major_copy else \
            ([KC * 256, 256, 1], [64, KC * 64, 1])
        wshape, wbox = [G, KC, 256], [NG, CHUNKS, 256]
        if chunk_major:
            wshape, wbox, wstride = [KC, G, 256], [CHUNKS, NG, 256], [wstride[1], wstride[0], 1]
        cache[key] = (
            TensorDescriptor(words, wshape, wstride, wbox,
                             gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)),
            TensorDescriptor(scales, [KC, G, 64], sstride, [CHUNKS, NG, 64],
                             gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=3)))
    return cache[key]


@triton.constexpr_function
def tail_layouts(ROWS: int, num_warps: int):
    """(register layout, shared layout) of TAIL's half-step words [BLOCK_N, 1, 4 (t), 2 (i)]: mma_layouts' word
    layout with two words per lane instead of four (lane t's words 2t, 2t + 1 of the row's half chunk), read from
    a slot holding tail_half's rows densely (8 words per row)."""
    dense = ([[0, 0, 0, 1], [0, 0, 1, 0], [0, 0, 2, 0]]
             + [[1 << j, 0, 0, 0] for j in range(_log2(16 * ROWS * num_warps))])
    return word_layout(ROWS, 1, num_warps, 2), gl.SharedLinearLayout(dense)


@functools.cache
def tail_layouts_host(ROWS: int, num_warps: int):
    """tail_layouts for a launcher, cached: building the layouts costs ~0.1 ms of host time a call."""
    return tail_layouts(ROWS, num_warps)


@triton.constexpr_function
def ring_tail_layouts(BLOCK_N: int, BLOCK_M: int, num_warps: int):
    """(word registers, word buffer, scale copy, x copy, x buffer) layouts of the cp.async ring's TAIL: the words
    as TMA's TAIL reads them (tail_layouts: lane t's words 2t, 2t + 1, 8 bytes a copy), a row's 4 scale bytes per
    thread (one 4-byte copy), x's [BLOCK_M, 64] half rows 16 bytes a thread into a 128-byte-swizzled buffer (the
    wgmma's B operand of 64 K). Constexpr functions (as are the layouts they build on): kernels call them too."""
    LWH, SWH = tail_layouts(BLOCK_N // (16 * num_warps), num_warps)
    LTS = gl.BlockedLayout([1, 1, 4], [32, 1, 1], [num_warps, 1, 1], [2, 1, 0])
    LXT = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    return LWH, SWH, LTS, LXT, gl.NVMMASharedLayout.get_default_for([BLOCK_M, 64], gl.float16)


def tail_descriptors(p, NG: int):
    """(words, scales) TMA descriptors of tail_half(p) for gemv_mma's TAIL: a program's NG groups' half chunks
    ([NG, 1, 128] words: 512 bytes a group) and their scale bytes ([1, NG, 64], landing like one chunk of
    tma_descriptors' scale box); groups past G read as zeros. Made once per NG and cached on p."""
    cache = p.__dict__.setdefault("_tma_tail", {})
    if NG not in cache:
        words, scales = tail_half(p)
        G = words.shape[0]
        cache[NG] = (
            TensorDescriptor(words, [G, 1, 128], [128, 128, 1], [NG, 1, 128],
                             gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)),
            TensorDescriptor(scales, [1, G, 64], [G * 64, 64, 1], [1, NG, 64],
                             gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=3)))
    return cache[NG]


def run_gemv_mma(x, p, bias, *, BLOCK_M, ROWS, CHUNKS=1, PREFETCH=False, num_warps=4, TILED=False, MAXNREG=None,
                 WGMMA=False, STAGES=3, RING_W=False, NIB=False, TMA=False, EARLY=False, TAIL=False,
                 STEP_MAJOR=False, SEQ=False, BC=False, NOBAR=False):
    """Launcher: x bf16 [M, K], p prepared weight [N, K]. A program takes BLOCK_N = 16 * ROWS * num_warps weight
    rows (ROWS 16-row MMA tiles per warp share each x fragment load) and BLOCK_M tokens, and walks K in steps
    of CHUNKS * 128 (CHUNKS 16-byte loads per row and lane in flight at once). TILED reads tile_mxfp4's
    chunk-major copy of the weight (made on first use, cached on p), where each warp streams contiguous memory.
    MAXNREG caps the registers per thread (ptxas spills past it). WGMMA multiplies with sm_90's wgmma: the
    same decoded A registers, x in logical K order copied once per program into a ring of STAGES shared-memory
    slots (the next step's words always prefetched; RING_W: the words and scales of tile_mxfp4's copy through
    the same ring). NIB reads shuffle_nibbles' copy of the words (of the tiled copy with TILED; made once,
    cached): 9 instead of 15 decode instructions per word. TMA (with RING_W): the ring's words and scales copied
    by the tensor memory accelerator (tma_descriptors), one bulk copy per slot; TMA=2 x's rows too (a box of
    [BLOCK_M, 128 CHUNKS] per step on the same mbarrier, rows past M read as zeros). EARLY (with TMA): the first
    steps' weight copies are issued before the PDL wait, while x_to_f16's launch still runs. TAIL (TMA=2,
    CHUNKS=1; a no-op unless K % 128 == 64, and without a GPU, where the interpreter twin reads the zero-padded
    chunk): the last chunk, half padding, runs as a half step from tail_half's copy (half the bytes, decode and
    wgmmas), against x_to_f16's half_tail order; with RING_W and no TMA (TAIL's other form) the same half step
    from buffers the cp.async ring fills with its first copies (_g_wg_ring_loop). STEP_MAJOR (with RING_W): the
    ring's copies (or TMA's boxes) read prepare.step_major's copy (made on first use, cached), where a step's
    words are one piece and the programs running together read neighbouring pieces; without a GPU the
    interpreter twin reads the tiled copy. SEQ (TMA=2, CHUNKS > 1): each ring slot holds CHUNKS chunks landed
    together, decoded and multiplied one chunk at a time (the copies, wait and barriers of a step once per CHUNKS
    chunks, the registers of one chunk); with TAIL when K's whole chunks are a multiple of CHUNKS. On an H200's
    lm_head with 2 slots 1-2% faster at 1-32 tokens (results/20261128T175617-h200-linear-h200-seq-a, ...175641-
    ...-b), where it trades issue for waits on its shallower ring (...181100-h200-ncu-h200-seq). SEQ=2: x's
    chunks of a step as one box instead of one box per chunk (Triton 3.6 puts a CTA barrier after every TMA copy
    of the ring: 7 barriers and 4 copies a step at CHUNKS=2, `./lab sass --loops`), a box of a [piece, token,
    64] view that lands the chunks' 64-column pieces in the order the per-chunk boxes do (a box [CHUNKS, token,
    128] landed each piece of every chunk in turn, and its results were wrong: results/20261129T123024-h200-
    linear-h200-seq-xbox). BC (WGMMA, TMA=2, SEQ or CHUNKS=1): block columns. Each chunk's wgmma starts from
    zero and puts the sums of each lane's MXFP4 block t (and pair half h) in MMA column 2 t + h of their own
    (x_to_f16's bc rows: 8 per token, BLOCK_M / 8 tokens a program); the block scales then multiply those 8
    columns in fp32 (bc_mult: 2 FMAs per row and chunk) instead of every decoded pair (16 half2 multiplies per
    row and chunk), and the columns are added once at the end. One token fills the 8 columns an n8 wgmma has
    anyway. BC=2 (NIB): column 2 t + j sums block t for token j of a pair (x's pair half h = 1 rows 2^8 smaller
    instead of a second multiplier), so an n8 wgmma serves two tokens. On an H200's lm_head at one token 77.7
    against 79.6 us (results/20261129T153649-h200-linear-h200-bc); 16-64 rows a program (2-8 tokens, BC=1) lost.
    NOBAR (TMA): kernels.ring_sync drops from the build's PTX the CTA barriers Triton 3.6 adds around a TMA step's
    copies and before its first wgmma (6 a step -> 1); bit-identical, on an H200's lm_head 0.1-1.4% faster at
    1-32 tokens and 160.5 -> 143.5 us at 64 with one-chunk steps (results/20261129T172903-h200-linear-h200-nobar-a)."""
    M, K = x.shape
    N = p.N
    if TILED:
        p = tile_mxfp4(p)
    if NIB:
        p = shuffle_nibbles(p)
    seq = bool(SEQ) and WGMMA and TMA == 2 and CHUNKS > 1 and not INTERPRETED and gluon is not None
    xbox = SEQ == 2  # the step's x chunks as one box
    half = (bool(TAIL and WGMMA) and (CHUNKS == 1 or (seq and (K // CHUNK) % CHUNKS == 0))
            and K % CHUNK == CHUNK // 2 and not INTERPRETED and gluon is not None)
    tail, ring_tail = half and TMA == 2, half and bool(RING_W) and not TMA  # TMA=2's boxes, or the cp.async ring
    bc = int(BC)
    if bc and not (WGMMA and TMA == 2 and (SEQ or CHUNKS == 1) and BLOCK_M % 8 == 0 and (NIB or bc == 1)):
        raise ValueError("BC needs WGMMA, TMA=2, SEQ or CHUNKS=1, BLOCK_M a multiple of 8 (8 x rows a group of BC "
                         "tokens), and BC=2 NIB")
    if NOBAR and TMA and WGMMA:
        ring_sync.check()
    x16, xs = x_to_f16(x, pad=CHUNK * (1 if seq else CHUNKS), logical=WGMMA, half_tail=tail or ring_tail, bc=bc)
    y = torch.empty((M, N), device=x.device, dtype=torch.bfloat16)
    BLOCK_N = 16 * ROWS * num_warps
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(x16.shape[0], BLOCK_M))
    args = (x16, xs, p.words, p.scales, bias if bias is not None else y, y, M, N, K, x16.shape[1], y.stride(0),
            p.scale_max)
    meta = dict(HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CHUNKS=CHUNKS, TILED=TILED, NIB=NIB)
    if INTERPRETED or gluon is None:
        if bc:  # the twin scales chunk by chunk
            meta["CHUNKS"] = 1
        _mma_twin_kernel[grid](*args, **meta, LOGICAL=WGMMA, BC=bc)
    elif WGMMA:
        lc = 1 if seq else CHUNKS  # the chunks a register or slot layout spans
        LW, LXCP, MMA, SX = wg_layouts(BLOCK_M, ROWS, lc, num_warps)
        SW, SS, LSC = wg_ring_layouts(BLOCK_M, ROWS, lc, num_warps)
        wdesc, sdesc = tma_descriptors(p, BLOCK_N // 16, CHUNKS, bool(STEP_MAJOR), seq) if TMA else (None, None)
        tdesc, tsdesc = tail_descriptors(p, BLOCK_N // 16) if tail else (None, None)
        LWH, SWH = tail_layouts_host(ROWS, num_warps) if tail else (None, None)
        # x16 is new each call, so its descriptor is too (host-side only; a CUDA graph keeps the captured one)
        xdesc = None
        if TMA == 2 and seq and xbox:  # the step's chunks as one box of a [piece, token, piece width] view
            # a slot [BLOCK_M, 128] holds its columns in pieces as wide as the swizzle (64 fp16 at 128 bytes), one
            # after another, as a per-chunk box lands them: the pieces of CHUNKS chunks in that order are one box
            kp, w = x16.shape[1], min(CHUNK, SX.swizzle_byte_width // 2 or CHUNK)
            xdesc = TensorDescriptor(x16, [kp // w, x16.shape[0], w], [w, kp, 1], [CHUNKS * CHUNK // w, BLOCK_M, w],
                                     gl.NVMMASharedLayout(SX.swizzle_byte_width, 16, rank=3))
        elif TMA == 2:
            xdesc = TensorDescriptor(x16, list(x16.shape), [x16.shape[1], 1], [BLOCK_M, CHUNK * lc], SX)
        xtdesc = TensorDescriptor(x16, list(x16.shape), [x16.shape[1], 1], [BLOCK_M, CHUNK // 2],
                                  gl.NVMMASharedLayout.get_default_for([BLOCK_M, CHUNK // 2], gl.float16)) \
            if tail else None
        gt = 0
        if STEP_MAJOR and not TMA:  # the ring's copies read the step-major copy
            sw, ss = step_major(p)
            gt = sw.shape[1]
            args = (*args[:2], sw, ss, *args[4:])
        tw, ts = tail_half(p) if ring_tail else (None, None)
        _wg_kernel[grid[::-1]](*args, **meta, STAGES=STAGES, RING_W=RING_W, LW=LW, LXCP=LXCP, MMA=MMA, SX=SX,
                               SW=SW, SS=SS, LSC=LSC, wdesc=wdesc, sdesc=sdesc, xdesc=xdesc, TMA=int(TMA),
                               EARLY=EARLY, tdesc=tdesc, tsdesc=tsdesc, xtdesc=xtdesc, LWH=LWH, SWH=SWH,
                               SM=bool(STEP_MAJOR) and not TMA, GT=gt, TAIL=ring_tail, tw_ptr=tw, ts_ptr=ts,
                               SEQ=seq, BC=bc, NOBAR=bool(NOBAR) and bool(TMA), num_warps=num_warps, **reg_cap(MAXNREG),
                               **pdl_launch(inner=True))
    else:
        LW, LX, MMA = mma_layouts(BLOCK_M, ROWS, CHUNKS, num_warps)
        _mma_kernel[grid](*args, **meta, PREFETCH=PREFETCH, LW=LW, LX=LX, MMA=MMA, num_warps=num_warps,
                          **reg_cap(MAXNREG), **pdl_launch(inner=True))
    return y
