"""fp16-math linear kernels: the decoded E2M1 pairs are already fp16x2 words, so fp16 arithmetic skips the
per-element conversions the bf16/fp32 paths pay for.

Activations are first rescaled per token by a power of two into fp16 (|x16| < 2^15, exact up to fp16's
11-bit mantissa) and stored with each 8-element group permuted to (0,4,1,5,2,6,3,7), the order in which a
weight word's fp16x2 pairs hold their elements; the result is scaled back by the same powers of two.

  gemv_h2    CUDA cores with packed half2 FMAs (fma.rn.f16x2): 4 instructions per 8 weights and token.
             Partial sums of 8 products stay in fp16, then go to fp32 with the block scale.
  gemv_h2g   the same FMAs with x plane-major (x_to_f16(planes=True)): x is loaded straight from global memory
             in the weight tile's register layout, and the 32 products of a block are summed in half2 before
             one fp32 conversion and scale multiply per block (h2g_step, shared with moe_h2g).
  gemv_tc16  tensor cores on fp16 weights scaled by their E8M0 block scale with one half2 multiply;
             exact for weights whose scale bytes span at most 24 binades (scale_max - scale_min <= 24).

Packed-half instructions are inline PTX where the kernels are compiled; the interpreter runs an fp32
emulation of the same arithmetic.
"""

from __future__ import annotations

import math
import os

import torch

from ._triton import INTERP, pdl_enter, pdl_launch, reg_cap, tl, triton
from .decode import (
    F16_TRICK,
    NIB_DOWN_H2,
    e2m1_pairs,
    e8m0_times_2,
    grouped_tile,
    half_hi,
    half_lo,
    interleave8,
    nib_pairs,
    pack_h2,
    tc_dot,
)


@triton.jit
def f16_row_scale(a):
    """(up, down) for a row with max |x| = a: up = 2^(14 - floor(log2 a)) puts the row below 2^15 in fp16
    with full precision, down = 1 / up undoes it (a = 0: up = 1)."""
    e = ((a.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127  # floor(log2 amax) for normal amax
    e = tl.where(a > 0, tl.maximum(e, -112), 14)
    up = ((141 - e).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(14 - e)
    down = ((e + 113).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(e - 14)
    return up, down


@triton.jit
def scale_mult_h2(s, SMAX):
    """Scale bytes -> fp16x2 words 2^(s - SMAX + 15) in both halves: exponent field f = s - SMAX + 30 (1..30,
    clamped at 1), placed as f * (2^10 + 2^26), which equals f << 10 | f << 26 because f < 2^5. Written as one
    add-max and one multiply: sm_90 builds take 2 instructions per scale byte, not 5 (shift, shift, or)."""
    return tl.maximum(s.to(tl.int32) + (30 - SMAX), 1).to(tl.uint32) * 0x04000400


@triton.jit
def store_x16_planes(o_ptr, xs_ptr, row, y, rh, K, PLANE):
    """Store row y [BLOCK_H] (elements rh, K of them; BLOCK_H >= 4 * PLANE) as x_to_f16(planes=True) does:
    fp16 times the row's power-of-two scale at its plane-major position (element 8w + q: plane q % 4,
    word w, high half for q >= 4), zeros in each plane's padding past K/4 (planes are PLANE fp16 wide), and
    the scale back in xs[row]."""
    hm = rh < K
    yf = tl.where(hm, y.to(tl.float32), 0.0)
    up, down = f16_row_scale(tl.max(tl.abs(yf), axis=0))
    q = rh % 8
    pos = (q % 4) * PLANE + (rh // 8) * 2 + q // 4
    tl.store(o_ptr + row * (4 * PLANE) + pos, (yf * up).to(tl.float16), mask=hm)
    pad = (rh % PLANE >= K // 4) & (rh < 4 * PLANE)
    tl.store(o_ptr + row * (4 * PLANE) + rh, tl.zeros_like(yf).to(tl.float16), mask=pad)
    tl.store(xs_ptr + row, down)


@triton.jit
def _x16_kernel(x_ptr, o_ptr, xs_ptr, rows_ptr, TOPK, K, stride_xm, stride_om, PLANE, BLOCK_K: tl.constexpr,
                PLANES: tl.constexpr, LOGICAL: tl.constexpr, GATHER: tl.constexpr, HALF: tl.constexpr = False,
                BLOCK_F: tl.constexpr = 0, z_ptr=None, ZERO: tl.constexpr = False, BC: tl.constexpr = 0):
    """Row m of x (bf16) -> fp16 times 2^(14 - floor(log2 amax)) in the order of x_to_f16; xs[m] undoes it.
    GATHER: output row p holds x row rows[p] // TOPK, and xs[m] is stored by the one p whose rows[p] % TOPK is 0.
    BC (x_to_f16's bc; TOPK then the number of tokens): output row p holds, at the positions that feed MMA
    column p % 8 (bc_keep), x row p // 8 (BC=1) or row 2 (p // 8) + p % 2 (BC=2; the last row where that is
    past TOPK), zeros elsewhere.
    BLOCK_F (a power of two >= K): the row is split over the grid's second axis, BLOCK_K positions a program
    (x16_slice), instead of one program a row. ZERO: the same programs also zero row m of z ([M, K] bf16)."""
    pdl_enter()
    p = tl.program_id(0)
    col = None
    if GATHER:
        slot = tl.load(rows_ptr + p)
        m = slot // TOPK
        o_ptr += (p - m).to(tl.int64) * stride_om  # so that row m lands at row p
        keep = slot % TOPK == 0
    elif BC:
        m = p // 8 if BC == 1 else tl.minimum(p // 8 * 2 + p % 2, TOPK - 1)
        o_ptr += (p - m).to(tl.int64) * stride_om
        keep = p % 8 < BC
        col = p % 8
    else:
        m = p
        keep = True
    if BLOCK_F:
        x16_slice(x_ptr, o_ptr, xs_ptr, m, tl.program_id(1), K, stride_xm, stride_om, BLOCK_K, BLOCK_F, LOGICAL, keep,
                  HALF, col, BC)
    else:
        x16_row(x_ptr, o_ptr, xs_ptr, m, K, stride_xm, stride_om, PLANE, BLOCK_K, PLANES, LOGICAL, keep, HALF, col,
                BC)
    if ZERO:  # the row's positions this program stores (the whole row without BLOCK_F), by one of its slots
        z_row = z_ptr + m.to(tl.int64) * K
        z_end = K
        if GATHER:
            z_end = tl.where(keep, K, 0)
        if BLOCK_F:
            zk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
            tl.store(z_row + zk, tl.zeros((BLOCK_K,), tl.bfloat16), mask=zk < z_end)
        else:
            for k0 in range(0, K, BLOCK_K):
                zk = k0 + tl.arange(0, BLOCK_K)
                tl.store(z_row + zk, tl.zeros((BLOCK_K,), tl.bfloat16), mask=zk < z_end)


@triton.jit
def x16_row(x_ptr, o_ptr, xs_ptr, m, K, stride_xm, stride_om, PLANE, BLOCK_K: tl.constexpr, PLANES: tl.constexpr,
            LOGICAL: tl.constexpr = False, keep_xs=True, HALF: tl.constexpr = False, col=None,
            BC: tl.constexpr = 1):
    """x_to_f16 of row m (one program; also moe_fused's first stage). A row of at most BLOCK_K output positions
    takes one pass: each element is gathered once into its output position (padding as zeros), so the row's
    max comes from the same registers that are then stored (one load round trip, not two). Longer rows: a
    max pass in blocks of BLOCK_K, then the gather pass. HALF (x_to_f16's half_tail): the last 128 positions
    from K - 64 are stored apart, in a 64-K step's order, by a second small gather (the index arithmetic on the
    row's 128 positions only). col (x_to_f16's bc): only the positions that feed MMA column col keep their value
    (_bc_zero)."""
    rk = tl.arange(0, BLOCK_K)
    end = stride_om if not HALF else K - 64  # positions stored by the main pass
    if stride_om <= BLOCK_K:
        src, ok = _x16_source(rk, K, PLANE, PLANES, LOGICAL)
        v = tl.load(x_ptr + m * stride_xm + src, mask=ok & (rk < stride_om), other=0.0).to(tl.float32)
        up, down = f16_row_scale(tl.max(tl.abs(v), axis=0))
        tl.store(o_ptr + m * stride_om + rk, _bc_zero(v * up, rk, col, BC).to(tl.float16), mask=rk < end)
    else:
        amax = tl.zeros((BLOCK_K,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            v = tl.load(x_ptr + m * stride_xm + k0 + rk, mask=k0 + rk < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(v))
        up, down = f16_row_scale(tl.max(amax, axis=0))
        for k0 in range(0, stride_om, BLOCK_K):
            pos = k0 + rk
            src, ok = _x16_source(pos, K, PLANE, PLANES, LOGICAL)
            v = tl.load(x_ptr + m * stride_xm + src, mask=ok, other=0.0).to(tl.float32)
            tl.store(o_ptr + m * stride_om + pos, _bc_zero(v * up, pos, col, BC).to(tl.float16), mask=pos < end)
    if HALF:
        _x16_half_tail(x_ptr, o_ptr, m, K, stride_xm, stride_om, up, m >= 0, col, BC)
    tl.store(xs_ptr + m, down, mask=keep_xs)


@triton.jit
def x16_slice(x_ptr, o_ptr, xs_ptr, m, j, K, stride_xm, stride_om, BLOCK_K: tl.constexpr, BLOCK_F: tl.constexpr,
              LOGICAL: tl.constexpr, keep_xs, HALF: tl.constexpr, col=None, BC: tl.constexpr = 1):
    """x16_row of row m split over programs: program j stores positions j * BLOCK_K .. + BLOCK_K (a few per
    thread: the position arithmetic is most of a row's instructions), after the max over the whole row (each
    program reads the row, from L2 after the first); program 0 stores xs and HALF's tail."""
    rf = tl.arange(0, BLOCK_F)
    xf = tl.load(x_ptr + m * stride_xm + rf, mask=rf < K, other=0.0).to(tl.float32)
    up, down = f16_row_scale(tl.max(tl.abs(xf), axis=0))
    pos = j * BLOCK_K + tl.arange(0, BLOCK_K)
    end = stride_om if not HALF else K - 64
    src, ok = _x16_source(pos, K, 0, False, LOGICAL)
    v = tl.load(x_ptr + m * stride_xm + src, mask=ok & (pos < end), other=0.0).to(tl.float32)
    tl.store(o_ptr + m * stride_om + pos, _bc_zero(v * up, pos, col, BC).to(tl.float16), mask=pos < end)
    if HALF:
        _x16_half_tail(x_ptr, o_ptr, m, K, stride_xm, stride_om, up, j == 0, col, BC)
    tl.store(xs_ptr + m, down, mask=keep_xs & (j == 0))


@triton.jit
def _x16_half_tail(x_ptr, o_ptr, m, K, stride_xm, stride_om, up, on, col=None, BC: tl.constexpr = 1):
    """x_to_f16's half_tail: the 128 positions from K - 64 hold the half chunk in a 64-K step's order (position
    q = 32 i + 16 s + 8 h + 2 t + e: element 16 t + 8 i + 4 e + 2 s + h), then zeros (stored where `on`)."""
    q = tl.arange(0, 128)
    el = logical_elem(q, 16)
    t = tl.load(x_ptr + m * stride_xm + K - 64 + el, mask=q < tl.where(on, 64, 0), other=0.0).to(tl.float32)
    tl.store(o_ptr + m * stride_om + K - 64 + q, _bc_zero(t * up, q, col, BC).to(tl.float16),
             mask=q < tl.where(on, 128, 0))


@triton.jit
def bc_keep(pos, col, BC: tl.constexpr = 1):
    """gemv_mma's BC: whether logical position pos feeds MMA column `col` of its 16-K step. An A fragment gives
    lane t the step's K 2t, 2t + 1 (pair half h = 0) and 2t + 8, 2t + 9 (h = 1) in every order x_to_f16 writes,
    since each is laid out in whole 16-K steps, and lane t holds MXFP4 block t of its rows: column 2 t + h sums
    that block's half h (BC=1), or column 2 t + j block t for token j of two (BC=2)."""
    t = (pos // 2) % 4
    if BC == 1:
        return t * 2 + (pos // 8) % 2 == col
    else:
        return t == col // 2


@triton.jit
def _bc_zero(v, pos, col, BC: tl.constexpr = 1):
    """v where bc_keep(pos, col) (every v without col), else 0; BC=2 also takes pair half h = 1 down 2^8 (NIB's
    pairs B, D decode 2^8 larger, and its two columns of a block share one multiplier)."""
    if col is None:
        return v
    elif BC == 1:
        return tl.where(bc_keep(pos, col), v, 0.0)
    else:
        return tl.where(bc_keep(pos, col, BC), tl.where((pos // 8) % 2 == 1, v * 0.00390625, v), 0.0)


@triton.jit
def _x16_source(pos, K, PLANE, PLANES: tl.constexpr, LOGICAL: tl.constexpr):
    """(element of x, in range) that x_to_f16's output position pos holds, in each of its three orders."""
    if PLANES:  # plane j (PLANE fp16 wide) holds the pairs (8w + j, 8w + j + 4) of every word w
        r = pos % PLANE
        src = (r // 2) * 8 + pos // PLANE + 4 * (r % 2)
        ok = r < K // 4
    elif LOGICAL:
        src = pos - pos % 128 + logical_elem(pos % 128)
        ok = src < K
    else:  # position p holds element (0,4,1,5,2,6,3,7)[p % 8] of its group of 8
        j = pos % 8
        src = pos - j + j // 2 + 4 * (j % 2)
        ok = pos < K
    return src, ok


@triton.jit
def logical_elem(q, T: tl.constexpr = 32):
    """Element of a 128-K chunk at position q of gemv_mma's logical K order (lanes' fragment registers in K
    order): q = 32 i + 16 s + 8 h + 2 t + e holds element 32 t + 8 i + 4 e + 2 s + h (kernels/linear_mma.py).
    T=16: the same for TAIL's 64-K half step (i < 2), whose lane t holds elements 16 t .. 16 t + 15."""
    return ((q // 2) % 4) * T + (q // 32) * 8 + (q % 2) * 4 + ((q // 16) % 2) * 2 + (q // 8) % 2


@triton.jit
def logical_pos(el):
    """Inverse of logical_elem: position of chunk element el = 32 t + 8 i + 4 e + 2 s + h in logical K order."""
    return ((el // 8) % 4) * 32 + ((el // 2) % 2) * 16 + (el % 2) * 8 + (el // 32) * 2 + (el // 4) % 2


@triton.jit
def logical_pos_half(el):
    """Inverse of logical_elem(q, 16): position of element el = 16 t + 8 i + 4 e + 2 s + h (el < 64) of a 64-K
    half step in x_to_f16's half_tail order (moe_mma's TAIL stores act's half last chunk so)."""
    return ((el // 8) % 2) * 32 + ((el // 2) % 2) * 16 + (el % 2) * 8 + (el // 16) * 2 + (el // 4) % 2


#: x_to_f16 splits each row over programs of SLICE output positions when it has at most SPLIT_ROWS rows
#: (LAB_X16_SPLIT_ROWS=0: never, for A/B runs against one program a row).
SLICE = 512
SPLIT_ROWS = int(os.environ.get("LAB_X16_SPLIT_ROWS", "16"))


def x_to_f16(x: torch.Tensor, planes: bool = False, pad: int = 1, logical: bool = False,
             rows: torch.Tensor | None = None, top_k: int = 1,
             half_tail: bool = False, zero: torch.Tensor | None = None,
             bc: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16 [M, K] -> (fp16 rows scaled per token, fp32 [M] scale back).

    Each row holds the fp16x2 words that pair with a weight word's pairs (8w + j, 8w + j + 4), j = 0..3:
    word-major ([M, K rounded up to a multiple of `pad`, zeros past K]: the 4 words of weight word w side by
    side) or, with planes=True, plane-major ([M, 4 * plane_words(K) * 2]: plane j holds pair j of every weight
    word, so consecutive weight words meet consecutive x words; planes are padded with zeros to a multiple of
    16 words for aligned vector loads) or, with logical=True, in gemv_mma's logical K order per 128-K chunk
    (kernels.linear_f16.logical_elem; [M, K rounded up to 128 and to `pad`]): the order wgmma reads its B
    operand from shared memory in, so rows are copied there as they are.

    rows (int [S], each of 0..M * top_k - 1 once, as a routing's sorted slots): the output's row p is x row
    rows[p] // top_k, as o.index_select(0, rows // top_k) but in the one launch (moe_mma TMA=2 reads a token
    tile's rows as one box); xs stays per token.

    half_tail (logical, K % 128 == 64, one chunk of padding at most): the last chunk's 64 elements in the logical
    order of a 64-K step (position 32 i + 16 s + 8 h + 2 t + e holds element 16 t + 8 i + 4 e + 2 s + h), zeros
    after them: gemv_mma's TAIL multiplies them as a half step. Every other reader takes the 128-K order.

    zero (bf16 [M, K], contiguous): zeroed by the same launch (moe_mma ATOMIC adds the layer's rows into it, so
    it needs no launch of its own to be cleared).

    bc (logical, no rows): gemv_mma's BC operand, 8 rows a group of bc tokens: row 8 g + c holds the positions
    of MMA column c (bc_keep) of token g (bc=1: [8 M, width]) or 2 g + c % 2 (bc=2: [8 ceil(M / 2), width]; its
    pair half h = 1 2^8 smaller, for NIB), zeros elsewhere; xs stays per token.
    """
    M, K = x.shape
    if bc not in (0, 1, 2):
        raise ValueError(f"bc is 0 (off), 1 or 2 tokens per 8 rows; got {bc!r}")
    if bc and (not logical or rows is not None or zero is not None):
        raise ValueError("bc needs logical order, no rows and no zero")
    if half_tail and not (logical and K % 128 == 64 and pad <= 128):
        raise ValueError(f"half_tail needs logical order, K % 128 == 64 and pad <= 128; got K={K}, pad={pad}")
    if zero is not None and (zero.shape != (M, K) or zero.dtype != torch.bfloat16 or not zero.is_contiguous()):
        raise ValueError(f"zero must be a contiguous bf16 [{M}, {K}] tensor, got {zero.dtype} {tuple(zero.shape)}")
    if logical:
        pad = math.lcm(pad, 128)
    width = 8 * plane_words(K) if planes else -(-K // pad) * pad
    S = M if rows is None else rows.numel()
    if bc:
        S = 8 * -(-M // bc)
    if rows is not None and S != M * top_k:
        raise ValueError(f"rows must hold each of the {M} tokens' {top_k} slots once, got {S} rows")
    o = torch.empty((S, width), device=x.device, dtype=torch.float16)
    xs = torch.empty((M,), device=x.device, dtype=torch.float32)
    if S and not planes and S <= SPLIT_ROWS and width > SLICE and K <= 8192:
        # few rows (decode): each row over several programs, SLICE positions each (x16_slice)
        _x16_kernel[(S, triton.cdiv(width, SLICE))](
            x, o, xs, o if rows is None else rows, M if bc else top_k, K, x.stride(0), width, 0, BLOCK_K=SLICE,
            PLANES=False, LOGICAL=logical, GATHER=rows is not None, HALF=half_tail, BLOCK_F=triton.next_power_of_2(K),
            num_warps=4, z_ptr=zero, ZERO=zero is not None, BC=int(bc), **pdl_launch())
    elif S:
        block = min(triton.next_power_of_2(max(K, width)), 8192)  # one load round per pass (decode: latency)
        _x16_kernel[(S,)](x, o, xs, o if rows is None else rows, M if bc else top_k, K, x.stride(0), width, width // 4,
                          BLOCK_K=block, PLANES=planes, LOGICAL=logical, GATHER=rows is not None, HALF=half_tail,
                          num_warps=4 if block <= 2048 else 8, z_ptr=zero, ZERO=zero is not None, BC=int(bc),
                          **pdl_launch())
    return o, xs


def plane_words(K: int) -> int:
    """int32 words per plane of a plane-major x16 row: K/8 rounded up to a multiple of 16."""
    return -(-K // 128) * 16


@triton.jit
def hfma2(a, b, c):
    """Packed half2 a * b + c on uint32 fp16x2 words."""
    if INTERP:
        return pack_h2(half_lo(a) * half_lo(b) + half_lo(c), half_hi(a) * half_hi(b) + half_hi(c))
    else:
        return tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def hmul2(a, b):
    """Packed half2 a * b on uint32 fp16x2 words."""
    if INTERP:
        return pack_h2(half_lo(a) * half_lo(b), half_hi(a) * half_hi(b))
    else:
        return tl.inline_asm_elementwise("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def split_h2(p):
    """uint32 fp16x2 words -> (low fp16, high fp16)."""
    if INTERP:
        return ((p & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True),
                (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True))
    else:
        return tl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [p],
                                         dtype=(tl.float16, tl.float16), is_pure=True, pack=1)


@triton.jit
def h2_step(acc, v, s, xp, kmask, MASK_K: tl.constexpr):
    """One K tile: 4 half2 FMAs per weight word and token, then to fp32 with the (doubled) block scale."""
    if MASK_K:
        xa = tl.load(xp + 0, mask=kmask[None, :], other=0)
        xb = tl.load(xp + 1, mask=kmask[None, :], other=0)
        xc = tl.load(xp + 2, mask=kmask[None, :], other=0)
        xd = tl.load(xp + 3, mask=kmask[None, :], other=0)
    else:
        xa = tl.load(xp + 0)
        xb = tl.load(xp + 1)
        xc = tl.load(xp + 2)
        xd = tl.load(xp + 3)
    a, b, c, d = e2m1_pairs(v.to(tl.uint32, bitcast=True))
    h = hmul2(a[None], xa.to(tl.uint32, bitcast=True)[:, None, :])
    h = hfma2(b[None], xb.to(tl.uint32, bitcast=True)[:, None, :], h)
    h = hfma2(c[None], xc.to(tl.uint32, bitcast=True)[:, None, :], h)
    h = hfma2(d[None], xd.to(tl.uint32, bitcast=True)[:, None, :], h)
    return acc + (half_lo(h) + half_hi(h)) * e8m0_times_2(s)[None]


@triton.jit
def h2_tiles(acc, wp, sp, xp, rw, t0, K, BLOCK_K: tl.constexpr):
    """h2_step over K tiles t0.. to the end of K, the last one masked when BLOCK_K does not divide K.

    wp, sp, xp point at tile t0 (weight words, scale bytes, x16 words) and advance with the tiles."""
    full = K // BLOCK_K
    for _ in range(t0, full):
        acc = h2_step(acc, tl.load(wp), tl.load(sp), xp, rw, False)
        wp += BLOCK_K // 8
        sp += BLOCK_K // 32
        xp += BLOCK_K // 2
    if full * BLOCK_K < K:
        km = full * (BLOCK_K // 8) + rw < K // 8
        acc = h2_step(acc, tl.load(wp, mask=km[None, :], other=0), tl.load(sp, mask=km[None, :], other=0), xp, km,
                      True)
    return acc


@triton.jit
def _gemv_h2_kernel(xw_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_ym,
                    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PREFETCH: tl.constexpr):
    """Rows past N and tokens past M are clamped (read twice, stored never), so only the K tail is masked."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    KW = K // 8
    KB = K // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rw = tl.arange(0, BLOCK_K // 8)
    rn_c = tl.minimum(rn, N - 1)
    rm_c = tl.minimum(rm, M - 1)
    wp = w_ptr + rn_c[:, None] * KW + rw[None, :]
    sp = s_ptr + rn_c[:, None] * KB + (rw // 4)[None, :]
    xp = xw_ptr + rm_c[:, None] * (KW * 4) + (rw * 4)[None, :]  # x16 words: 4 per weight word
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K // 8), tl.float32)
    full = K // BLOCK_K
    if PREFETCH:  # the next weight tile is loaded before the current one is used (register double buffer)
        v = tl.load(wp)
        s = tl.load(sp)
        for _ in range(0, full - 1):
            v_next = tl.load(wp + BLOCK_K // 8)
            s_next = tl.load(sp + BLOCK_K // 32)
            acc = h2_step(acc, v, s, xp, rw, False)
            v = v_next
            s = s_next
            wp += BLOCK_K // 8
            sp += BLOCK_K // 32
            xp += BLOCK_K // 2
        if full > 0:
            acc = h2_step(acc, v, s, xp, rw, False)
            wp += BLOCK_K // 8
            sp += BLOCK_K // 32
            xp += BLOCK_K // 2
        acc = h2_tiles(acc, wp, sp, xp, rw, full, K, BLOCK_K)  # only the K tail is left
    else:
        acc = h2_tiles(acc, wp, sp, xp, rw, 0, K, BLOCK_K)
    xs = tl.load(xs_ptr + rm_c)
    out = tl.sum(acc, axis=2) * (xs * (F16_TRICK * 0.5))[:, None]  # 0.5: e8m0_times_2 doubled the scales
    if HAS_BIAS:
        out += tl.load(b_ptr + rn_c).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], out.to(tl.bfloat16),
             mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def hadd2(a, b):
    """Packed half2 a + b on uint32 fp16x2 words."""
    if INTERP:
        return pack_h2(half_lo(a) + half_lo(b), half_hi(a) + half_hi(b))
    else:
        return tl.inline_asm_elementwise("add.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def block_words(t):
    """[R, 4 G] -> the four [R, G] tensors of words 4g, 4g + 1, 4g + 2, 4g + 3 (the words of each MXFP4 block,
    held by one thread, so the split moves no data)."""
    e, o = tl.split(tl.reshape(t, (t.shape[0], t.shape[1] // 4, 2, 2)))
    w0, w2 = tl.split(e)
    w1, w3 = tl.split(o)
    return w0, w1, w2, w3


@triton.jit
def block_dot2(p, xp, q, xq):
    """Per MXFP4 block, the half2 sum of p * xp + q * xq over its 4 words: [R, 4 G] words -> [R, G], one chain of
    8 packed FMAs (no separate adds)."""
    p0, p1, p2, p3 = block_words(p)
    x0, x1, x2, x3 = block_words(xp)
    q0, q1, q2, q3 = block_words(q)
    y0, y1, y2, y3 = block_words(xq)
    h = hfma2(q0, y0, hmul2(p0, x0))
    h = hfma2(q1, y1, hfma2(p1, x1, h))
    h = hfma2(q2, y2, hfma2(p2, x2, h))
    return hfma2(q3, y3, hfma2(p3, x3, h))


@triton.jit
def h2g_step(acc, v, s, xp, xm, i, PLANE, G: tl.constexpr, MASK: tl.constexpr, NIB: tl.constexpr = False):
    """One K tile of token i: weight words v [R, 4 G] and their block scale bytes s [R, G] times the token's
    plane-major x16 words at xp (plane 0), 4 packed half2 FMAs per word; the 32 products of an MXFP4 block
    are summed in half2, then one fp32 conversion and scale multiply per block into acc[:, :, i].
    NIB: v is in shuffle_nibbles' layout (nib_pairs); pairs B, D (2^8 larger) are summed in their own chain
    and scaled down by one FMA per block."""
    if MASK:  # the K tail: words past K are masked in x too (garbage times a zero weight could be NaN)
        xa = tl.load(xp, mask=xm, other=0).to(tl.uint32, bitcast=True)
        xb = tl.load(xp + PLANE, mask=xm, other=0).to(tl.uint32, bitcast=True)
        xc = tl.load(xp + 2 * PLANE, mask=xm, other=0).to(tl.uint32, bitcast=True)
        xd = tl.load(xp + 3 * PLANE, mask=xm, other=0).to(tl.uint32, bitcast=True)
    else:
        xa = tl.load(xp).to(tl.uint32, bitcast=True)
        xb = tl.load(xp + PLANE).to(tl.uint32, bitcast=True)
        xc = tl.load(xp + 2 * PLANE).to(tl.uint32, bitcast=True)
        xd = tl.load(xp + 3 * PLANE).to(tl.uint32, bitcast=True)
    if NIB:  # (x rows of a pipelined loop are [4 G], shared by the tile's rows)
        z = 0 * v
        xa, xb, xc, xd = xa + z, xb + z, xc + z, xd + z
        a, b, c, d = nib_pairs(v)
        down = tl.full((v.shape[0], G), NIB_DOWN_H2, tl.uint32)
        h = hfma2(block_dot2(b, xb, d, xd), down, block_dot2(a, xa, c, xc))
    else:
        a, b, c, d = e2m1_pairs(v)
        h = hmul2(a, xa)
        h = hfma2(b, xb, h)
        h = hfma2(c, xc, h)
        h = hfma2(d, xd, h)
        h0, h1 = tl.split(tl.reshape(h, (h.shape[0], G, 2, 2)))  # the 4 words of a block sit in one thread
        h0, h1 = tl.split(hadd2(h0, h1))
        h = hadd2(h0, h1)
    part = (half_lo(h) + half_hi(h)) * e8m0_times_2(s)
    tok = tl.arange(0, acc.shape[2])[None, None, :]
    return acc + tl.where(tok == i, part[:, :, None], 0.0)


@triton.jit
def h2g_first_loads(wp, sp, word, rg, full, TW: tl.constexpr, G: tl.constexpr, PREFETCH: tl.constexpr):
    """(v_next, s_next) before an h2g K loop: with PREFETCH (a register double buffer, the next K tile's weights in
    flight while one is used) the first full tile's words and scale bytes, else unused placeholders.
    (Issuing the K tail's loads here too, so that a 2880-long row tile is one round trip, measured ~10 us
    slower on the lm_head: results/20261123T200807-h100-80gb-hbm3-linear-early-tail, the kernel at 5f461ee.)"""
    if PREFETCH:
        n = tl.minimum(full, 1)  # tensor masks (word < n * TW): the interpreter rejects scalar ones
        v_next = tl.load(wp, mask=word < n * TW, other=0)
        s_next = tl.load(sp, mask=rg[None, :] < n * G, other=0)
    else:
        v_next = 0
        s_next = 0
    return v_next, s_next


@triton.jit
def h2g_loads(wp, sp, word, rg, t, full, v_next, s_next, TW: tl.constexpr, G: tl.constexpr, WSTEP: tl.constexpr,
              SSTEP: tl.constexpr, PREFETCH: tl.constexpr):
    """(v, s, v_next, s_next) of full K tile t at wp/sp: its words as uint32 and its scale bytes, loaded now or, with
    PREFETCH, one step earlier, in which case tile t + 1's loads are issued here (masked off past the last)."""
    if PREFETCH:
        v = v_next.to(tl.uint32, bitcast=True)
        s = s_next
        n = tl.minimum(full - 1 - t, 1)
        v_next = tl.load(wp + WSTEP, mask=word < n * TW, other=0)
        s_next = tl.load(sp + SSTEP, mask=rg[None, :] < n * G, other=0)
    else:
        v = tl.load(wp).to(tl.uint32, bitcast=True)
        s = tl.load(sp)
    return v, s, v_next, s_next


@triton.jit
def h2g_tail_loads(wp, sp, word, rg, t, K, TW: tl.constexpr, G: tl.constexpr):
    """K tile t's weight words (at wp) and scale bytes (at sp) where the tile runs past K: (the word mask
    h2g_step then puts on x, the words, the scales), words and blocks past K loaded as 0."""
    wm = t * TW + word < K // 8
    v = tl.load(wp, mask=wm, other=0).to(tl.uint32, bitcast=True)
    s = tl.load(sp, mask=(t * G + rg < K // 32)[None, :], other=0)
    return wm, v, s


@triton.jit
def h2g_pointers(w_ptr, s_ptr, rn_c, word, rg, N, K, TILED: tl.constexpr, DEINT: tl.constexpr = False):
    """Word pointers [rows, TW] and scale pointers [rows, G] of the first K tile of rows rn_c, in the row-major
    layout or in tile_mxfp4's (TILED: 16-row groups of 128-K chunks, 16 words and 4 scale bytes per row and
    chunk; DEINT: mlp1's w1, row r = gate r // 2 or linear r // 2, each half padded to whole groups). The next
    K tile (BLOCK_K a multiple of 128 when TILED) is TW words and G scale bytes on, times 16 when TILED."""
    if TILED:
        r = rn_c
        if DEINT:
            r = (r % 2) * ((N // 2 + 15) // 16 * 16) + r // 2
        row = (r // 16).to(tl.int64) * (((K + 127) // 128) * 16) + r % 16
        wp = w_ptr + (row * 16)[:, None] + (word // 16) * 256 + word % 16
        sp = s_ptr + (row * 4)[:, None] + ((rg // 4) * 64 + rg % 4)[None, :]
    else:
        wp = w_ptr + tl.multiple_of(rn_c * (K // 8), 4)[:, None] + word  # K % 32 == 0: 16-byte aligned rows
        sp = s_ptr + rn_c[:, None] * (K // 32) + rg[None, :]
    return wp, sp


@triton.jit
def _gemv_h2g_kernel(xq_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_ym, PLANE,
                     HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     PREFETCH: tl.constexpr = False, STAGES: tl.constexpr = 1, TILED: tl.constexpr = False,
                     PERSIST: tl.constexpr = False, NIB: tl.constexpr = False, EARLY: tl.constexpr = False):
    """gemv_h2 with x read plane-major straight from global memory in the weight tile's own register layout
    (no shared-memory shuffle) and half2 sums per MXFP4 block (one fp32 conversion and scale per block).
    STAGES > 1 has the compiler pipeline the K loop (cp.async ring in shared memory, STAGES tiles in flight
    without holding registers); x is then one [TW] row per plane broadcast over the tile's rows, so the ring
    holds it once, not BLOCK_N times. Rows past N and tokens past M are clamped (computed, never stored);
    only the K tail is masked. PERSIST: a grid of a few programs per SM, each striding over the row tiles
    (tile p, p + grid, ...), so the programs in flight read neighbouring tiles and none pays a launch
    (measured slower on the lm_head: the loop needs 128 registers, results/20261123T142356-...-linear-persist).
    NIB: words in shuffle_nibbles' layout, decoded by nib_pairs (9 instructions per word instead of 15).
    (Converting x inside the launch instead of in x_to_f16's, by the program with the first ticket while the
    others wait with their first weight tile in flight, measured 1.6 us slower on the lm_head at one token:
    results/20261123T201729-h100-80gb-hbm3-linear-fuse-x, the kernel at fc4c5c8.)
    EARLY (with PREFETCH, one tile per program): the first weight tile is loaded before the PDL wait, while
    x_to_f16's launch still runs (weights are written by no kernel)."""
    if not EARLY:
        pdl_enter()
    if PERSIST:
        for pid_n in range(tl.program_id(0), tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
            _gemv_h2g_tile(pid_n, xq_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_ym, PLANE, HAS_BIAS,
                           BLOCK_M, BLOCK_N, BLOCK_K, PREFETCH, STAGES, TILED, NIB)
    else:
        _gemv_h2g_tile(tl.program_id(0), xq_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_ym, PLANE,
                       HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, PREFETCH, STAGES, TILED, NIB, EARLY)


@triton.jit
def _gemv_h2g_tile(pid_n, xq_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_ym, PLANE,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PREFETCH: tl.constexpr, STAGES: tl.constexpr, TILED: tl.constexpr, NIB: tl.constexpr,
                   EARLY: tl.constexpr = False):
    """Row tile pid_n of _gemv_h2g_kernel for the BLOCK_M tokens of grid column 1 (EARLY: the PDL wait comes
    after the first weight tile's loads)."""
    pid_m = tl.program_id(1)
    KB = K // 32
    G: tl.constexpr = BLOCK_K // 32
    TW: tl.constexpr = BLOCK_K // 8
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_c = tl.minimum(rn, N - 1)
    rw = tl.arange(0, TW)
    rg = tl.arange(0, G)
    word = rw[None, :] + 0 * rn_c[:, None]  # [BLOCK_N, TW]: x words are shared by every weight row
    wp, sp = h2g_pointers(w_ptr, s_ptr, rn_c, word, rg, N, K, TILED)
    WSTEP: tl.constexpr = TW * (16 if TILED else 1)  # tiled: a K tile is TW/16 chunks of 16 rows x 16 words
    SSTEP: tl.constexpr = G * (16 if TILED else 1)
    if STAGES > 1:
        xp = xq_ptr + pid_m * BLOCK_M * (4 * PLANE) + rw
    else:
        xp = xq_ptr + pid_m * BLOCK_M * (4 * PLANE) + word
    acc = tl.zeros((BLOCK_N, G, BLOCK_M), tl.float32)
    full = KB // G
    v_next, s_next = h2g_first_loads(wp, sp, word, rg, full, TW, G, PREFETCH)
    if EARLY:
        pdl_enter()
    for t in tl.range(0, full, num_stages=STAGES):
        v, s, v_next, s_next = h2g_loads(wp, sp, word, rg, t, full, v_next, s_next, TW, G, WSTEP, SSTEP, PREFETCH)
        for i in tl.static_range(BLOCK_M):
            acc = h2g_step(acc, v, s, xp + tl.minimum(i, M - 1 - pid_m * BLOCK_M) * (4 * PLANE), word, i, PLANE, G,
                           False, NIB)
        wp += WSTEP
        sp += SSTEP
        xp += TW
    if full * G < KB:
        wm, v, s = h2g_tail_loads(wp, sp, word, rg, full, K, TW, G)
        for i in tl.static_range(BLOCK_M):
            acc = h2g_step(acc, v, s, xp + tl.minimum(i, M - 1 - pid_m * BLOCK_M) * (4 * PLANE), wm, i, PLANE, G,
                           True, NIB)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    xs = tl.load(xs_ptr + tl.minimum(rm, M - 1))
    out = tl.sum(acc, axis=1) * (xs * (F16_TRICK * 0.5))[None, :]  # [BLOCK_N, BLOCK_M]; 0.5 undoes e8m0_times_2
    if HAS_BIAS:
        out += tl.load(b_ptr + rn_c).to(tl.float32)[:, None]
    tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], out.to(tl.bfloat16),
             mask=(rm < M)[None, :] & (rn < N)[:, None])


@triton.jit(do_not_specialize=["SMAX"])
def _tc16_kernel(x16_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_ym, SMAX,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    KW = K // 8
    KB = K // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rw = tl.arange(0, BLOCK_K // 8)
    rk = tl.arange(0, BLOCK_K)
    nmask = rn < N
    mmask = rm < M
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for t in range(0, tl.cdiv(K, BLOCK_K)):
        kw = t * (BLOCK_K // 8) + rw
        wm = nmask[:, None] & (kw < KW)[None, :]
        v = tl.load(w_ptr + rn[:, None] * KW + kw[None, :], mask=wm, other=0).to(tl.uint32, bitcast=True)
        s = tl.load(s_ptr + rn[:, None] * KB + (kw // 4)[None, :], mask=wm, other=0).to(tl.int32)
        mult = scale_mult_h2(s, SMAX)
        a, b, c, d = e2m1_pairs(v)
        a0, a1 = split_h2(hmul2(a, mult))
        b0, b1 = split_h2(hmul2(b, mult))
        c0, c1 = split_h2(hmul2(c, mult))
        d0, d1 = split_h2(hmul2(d, mult))
        w = interleave8(a0, a1, b0, b1, c0, c1, d0, d1)  # [BLOCK_N, BLOCK_K] in the permuted K order
        k = t * BLOCK_K + rk
        x = tl.load(x16_ptr + rm[None, :] * K + k[:, None], mask=mmask[None, :] & (k < K)[:, None], other=0.0)
        acc = tc_dot(w, x, acc)
    xs = tl.load(xs_ptr + rm, mask=mmask, other=0.0)
    wscale = ((SMAX - 1).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(SMAX - 128)
    out = tl.trans(acc) * (xs * wscale)[:, None]
    if HAS_BIAS:
        out += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], out.to(tl.bfloat16), mask=mmask[:, None] & nmask[None, :])


def run_gemv_h2(x, p, bias, *, BLOCK_M, BLOCK_N, BLOCK_K, PREFETCH=False, num_warps=4, num_stages=1):
    M, K = x.shape
    N = p.N
    x16, xs = x_to_f16(x)
    y = torch.empty((M, N), device=x.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(M, BLOCK_M))
    _gemv_h2_kernel[grid](x16.view(torch.int32), xs, p.words, p.scales, bias if bias is not None else y, y,
                          M, N, K, y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                          BLOCK_K=BLOCK_K, PREFETCH=PREFETCH, num_warps=num_warps, num_stages=num_stages)
    return y


def run_tc16(x, p, bias, *, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M=1, num_warps=4, num_stages=3):
    M, K = x.shape
    N = p.N
    x16, xs = x_to_f16(x)
    y = torch.empty((M, N), device=x.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _tc16_kernel[grid](x16, xs, p.words, p.scales, bias if bias is not None else y, y, M, N, K, y.stride(0),
                       p.scale_max, HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                       GROUP_M=GROUP_M, num_warps=num_warps, num_stages=num_stages)
    return y


def run_gemv_h2g(x, p, bias, *, BLOCK_M, BLOCK_N, BLOCK_K, PREFETCH=False, num_warps=4, num_stages=1,
                 TILED=False, PERSIST=0, NIB=False, MAXNREG=None, EARLY=False):
    """PERSIST > 0: that many programs per SM stride over the row tiles instead of one program per tile.
    NIB: reads shuffle_nibbles' copy of the words (made once and cached). MAXNREG caps the registers per
    thread (more programs per SM; ptxas spills past it). EARLY (with PREFETCH): the first weight tile is loaded
    before the PDL wait."""
    from .prepare import shuffle_nibbles, tile_mxfp4

    M, K = x.shape
    N = p.N
    if TILED:
        p = tile_mxfp4(p)
    if NIB:
        p = shuffle_nibbles(p)
    xq, xs = x_to_f16(x, planes=True)
    y = torch.empty((M, N), device=x.device, dtype=torch.bfloat16)
    tiles = triton.cdiv(N, BLOCK_N)
    grid = (min(tiles, PERSIST * sm_count(x.device)) if PERSIST else tiles, triton.cdiv(M, BLOCK_M))
    _gemv_h2g_kernel[grid](xq.view(torch.int32), xs, p.words, p.scales, bias if bias is not None else y, y,
                           M, N, K, y.stride(0), plane_words(K), HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M,
                           BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, PREFETCH=PREFETCH, STAGES=num_stages, TILED=TILED,
                           PERSIST=PERSIST > 0, NIB=NIB, EARLY=EARLY, num_warps=num_warps,
                           **reg_cap(MAXNREG), **pdl_launch(inner=True))
    return y


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 for the interpreter: a few programs, each with several tiles)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
