"""w4a8_fp8: MXFP4 weights times 8-bit activations on fp8 tensor cores (sm_90 wgmma e4m3), for large M.

Why: Triton 3.6 lowers `tl.dot_scaled(e4m3, e2m1)` (the `w4a8` variant) on sm_90 to bf16 wgmma after
upcasting both operands (its sm_90 SASS runs HGMMA...BF16: `labkit sass w4a8` shows it), so it uses no fp8
tensor core on Hopper and pays the upcast. Hopper's fp8 wgmma has no block scales: MXFP8's and MXFP4's scales
(one per token and 32 K, one per weight row and 32 K) cannot be applied inside it, only by rescaling the
accumulator every 32 K, which costs about as many instructions as the MMA saves. So here each operand keeps
one power-of-two scale per row, applied once in the epilogue:

- activations: E4M3 with one scale per token, 2^(floor(log2 amax) - 7), so |x| / scale < 256 (quantize_fp8_rows;
  its error is the W4A8 cost this variant reports, like w4a8's MXFP8 but with one scale per 2880 values);
- weights: decoded in registers to E4M3 as E2M1 * 2^(s - R + 6), R the row's largest scale byte (prepare's
  row_scale_max, made once and cached on the weight): at most 6 * 2^6 = 384, and exact while s >= R - 14 (a
  block more than 14 binades below its row's largest rounds to E4M3's subnormals, a contribution below 2^-14
  of that block's).

The decode: each code c becomes the E4M3 bits of E2M1 * 2^-6 ((c & 7) << 2 | (c & 8) << 4: E4M3's subnormals
hold the E2M1 subnormal 0.5), which converts exactly to fp16, is multiplied by the fp16 2^(s - R + 12) and
converted back to E4M3 (exact while in range). Weight rows are the MMA's M side (the orientation linear.mma
uses, A in registers), tokens its N side; fp32 accumulation. Measured on the H100: 0.85-0.93x cuBLAS bf16 on the
lm_head at 512-8192 tokens at 2.7% error, 5-6x faster than w4a8 (results/20261127T162022-h100-80gb-hbm3-linear-
w4a8-fp8-tiles, ...154536-...-linear-w4a8-fp8); the weights as B through shared memory (one wait per K tile
instead of one per wgmma) ran 10-15% slower (...160849-...-linear-w4a8-fp8-swap).
"""

from __future__ import annotations

import torch

from ._triton import INTERP, tl, triton
from .decode import grouped_tile, round_to_e4m3, tc_dot
from .prepare import row_scale_max


@triton.jit
def _quantize_fp8_rows_kernel(x_ptr, q_ptr, s_ptr, K, KP, stride_xm, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """Row m of x (bf16) -> E4M3 q[m, :KP] (zeros past K) and its scale s[m] = 2^(floor(log2 amax) - 7); each
    TILE of K stored as its even elements, then its odd ones (decode_e4m3's order)."""
    m = tl.program_id(0)
    r = tl.arange(0, BLOCK)
    amax = tl.zeros((BLOCK,), tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(x_ptr + m * stride_xm + k0 + r, mask=k0 + r < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    e = ((tl.max(amax, axis=0).to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32)  # biased exponent
    e = tl.maximum(e, 8)  # all-zero (and subnormal) rows: any scale will do
    inv = ((261 - e).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(134 - e): amax * inv < 256
    for k0 in range(0, KP, BLOCK):
        p = (k0 + r) % TILE
        src = (k0 + r) - p + tl.where(p < TILE // 2, 2 * p, 2 * p - TILE + 1)
        x = tl.load(x_ptr + m * stride_xm + src, mask=src < K, other=0.0).to(tl.float32)
        tl.store(q_ptr + m * KP + k0 + r, round_to_e4m3(x * inv).to(tl.float8e4nv), mask=k0 + r < KP)
    tl.store(s_ptr + m, ((e - 7).to(tl.uint32) << 23).to(tl.float32, bitcast=True))


def quantize_fp8_rows(x: torch.Tensor, tile: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16 [M, K] -> (E4M3 [M, K rounded up to `tile`], zeros past K; fp32 [M] scale per row): x ~ q * scale,
    with one power-of-two scale per row so that every |q| < 256 (round to nearest even). Each `tile` of K (even,
    <= 1024) holds its even elements first, then its odd ones: the order w4a8_fp8 decodes weights in."""
    if tile % 2 or 1024 % tile:
        raise ValueError(f"tile must be an even divisor of 1024, got {tile}")
    M, K = x.shape
    KP = -(-K // tile) * tile
    q = torch.empty((M, KP), device=x.device, dtype=torch.float8_e4m3fn)
    s = torch.empty((M,), device=x.device, dtype=torch.float32)
    if M:
        _quantize_fp8_rows_kernel[(M,)](x, q, s, K, KP, x.stride(0), BLOCK=1024, TILE=tile)
    return q, s


#: bytes of 4 weight bytes' low codes (elements 2j) -> the E4M3 bits of E2M1 * 2^-6 (magnitude 2 bits up, sign to bit 7)
_LO = "shl.b32 t, $1, 2; and.b32 t, t, 0x1C1C1C1C; shl.b32 u, $1, 4; and.b32 u, u, 0x80808080; or.b32 t, t, u;"
#: ... of their high codes (elements 2j + 1): magnitude 2 bits down, sign already at bit 7
_HI = "shr.b32 t, $1, 2; and.b32 t, t, 0x1C1C1C1C; and.b32 u, $1, 0x80808080; or.b32 t, t, u;"
#: then each pair of E4M3 bytes to fp16x2 (exact), times the fp16x2 multiplier $2, back to E4M3 (exact in range)
_SCALE = ("mov.b32 {l, h}, t; cvt.rn.f16x2.e4m3x2 u, l; cvt.rn.f16x2.e4m3x2 t, h; mul.rn.f16x2 u, u, $2; "
          "mul.rn.f16x2 t, t, $2; cvt.rn.satfinite.e4m3x2.f16x2 l, u; cvt.rn.satfinite.e4m3x2.f16x2 h, t; "
          "mov.b32 $0, {l, h};")
_REGS = "{.reg .b32 t, u; .reg .b16 l, h; "
ASM_LO = tl.constexpr(_REGS + _LO + _SCALE + "}")
ASM_HI = tl.constexpr(_REGS + _HI + _SCALE + "}")


@triton.jit
def _codes_e4m3(c, mult):
    """E2M1 codes (int32) times fp16 multipliers -> E4M3, in plain arithmetic (the interpreter's path)."""
    f = (((c & 7) << 2) | ((c & 8) << 4)).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)  # E2M1/64
    return (f * mult).to(tl.float8e4nv)


@triton.jit
def decode_e4m3(wb, s, R):
    """Packed codes [BN, BK/2] (uint8, openai order), their scale bytes [BN, BK/32] and each row's largest
    scale byte R [BN] -> E4M3 weights [BN, BK]: E2M1 * 2^(s - R + 6) (exact while s >= R - 14), the tile's
    elements 0, 2, .., BK - 2 then 1, 3, .., BK - 1 (each byte's low codes, then its high codes).
    Compiled: 4 bytes at a time in one 32-bit register (_LO/_HI, then _SCALE: ~2.4 instructions a weight)."""
    BN: tl.constexpr = wb.shape[0]
    BK: tl.constexpr = wb.shape[1] * 2
    t = tl.minimum(tl.maximum(s.to(tl.int32) - R[:, None] + 27, 0), 30)  # fp16 exponent field of 2^(s - R + 12)
    if INTERP:
        mult = (t << 10).to(tl.int16).to(tl.float16, bitcast=True)
        mult = tl.reshape(tl.broadcast_to(mult[:, :, None], (BN, BK // 32, 16)), (BN, BK // 2))  # per byte
        b = wb.to(tl.int32)
        lo = _codes_e4m3(b & 0xF, mult)
        hi = _codes_e4m3(b >> 4, mult)
    else:
        m2 = t.to(tl.uint32) * 0x04000400  # fp16x2 (2^(s - R + 12), same)
        m2 = tl.reshape(tl.broadcast_to(m2[:, :, None], (BN, BK // 32, 16)), (BN, BK // 2))
        lo = tl.inline_asm_elementwise(ASM_LO, "=r,r,r,r,r,r", [wb, m2], dtype=tl.float8e4nv, is_pure=True, pack=4)
        hi = tl.inline_asm_elementwise(ASM_HI, "=r,r,r,r,r,r", [wb, m2], dtype=tl.float8e4nv, is_pure=True, pack=4)
    # the tile's K order is its even elements, then its odd ones (quantize_fp8_rows stores x so): no byte shuffle
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BN, BK))


@triton.jit
def fp8_dot(w, x, acc):
    """acc + w @ x for E4M3 operands: fp8 wgmma compiled; in the interpreter through fp16 (which holds every
    E4M3 value; its fp8 -> fp64 conversion fails on subnormals) and tc_dot."""
    if INTERP:
        return tc_dot(w.to(tl.float16), x.to(tl.float16), acc)
    else:
        return tl.dot(w, x, acc)


@triton.jit
def _w4a8_fp8_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, r_ptr, b_ptr, y_ptr, M, N, K, KP, stride_ym, HAS_BIAS: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """acc[n, m] = sum_k W8[n, k] x8[m, k] on fp8 tensor cores; y[m, n] = acc * 2^(R[n] - 133) * xs[m] (+ bias).
    Rows past N and tokens past M are clamped (computed, never stored); K past the weight reads zero codes."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    K2 = K // 2
    KB = K // 32
    G: tl.constexpr = BLOCK_K // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rnc = tl.minimum(rn, N - 1)
    rmc = tl.minimum(rm, M - 1)
    rb = tl.arange(0, G)
    rk2 = tl.arange(0, BLOCK_K // 2)
    rk = tl.arange(0, BLOCK_K)
    tiles = tl.cdiv(K, BLOCK_K)
    R = tl.load(r_ptr + rnc)  # each row's largest scale byte
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for t in range(0, tiles):
        k2 = t * (BLOCK_K // 2) + rk2
        wb = tl.load(w_ptr + rnc[:, None] * K2 + k2[None, :], mask=(k2 < K2)[None, :], other=0)
        kb = t * G + rb
        s = tl.load(s_ptr + rnc[:, None] * KB + kb[None, :], mask=(kb < KB)[None, :], other=0)
        x = tl.load(x_ptr + rmc[None, :] * KP + (t * BLOCK_K + rk)[:, None])  # [BK, BM], K-major; KP pads K
        acc = fp8_dot(decode_e4m3(wb, s, R), x, acc)
    wsc = ((tl.maximum(R - 6, 1)).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(R - 133)
    out = acc * wsc[:, None] * tl.load(xs_ptr + rmc)[None, :]
    if HAS_BIAS:
        out += tl.load(b_ptr + rnc).to(tl.float32)[:, None]
    tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], out.to(tl.bfloat16),
             mask=(rm < M)[None, :] & (rn < N)[:, None])


def run_w4a8_fp8(x, p, bias, *, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M=8, num_warps=8, num_stages=3):
    """Launcher: x bf16 [M, K] to E4M3 rows (quantize_fp8_rows, padded to whole K tiles), then one program per
    BLOCK_N weight rows and BLOCK_M tokens (GROUP_M token tiles share a band of weight tiles through L2)."""
    M, K = x.shape
    N = p.N
    xq, xs = quantize_fp8_rows(x, tile=BLOCK_K)
    y = torch.empty((M, N), device=x.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _w4a8_fp8_kernel[grid](xq, xs, p.blocks, p.scales, row_scale_max(p), bias if bias is not None else y, y, M, N, K,
                           xq.shape[1], y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                           BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, num_warps=num_warps, num_stages=num_stages)
    return y
