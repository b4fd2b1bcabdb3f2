"""MXFP4-weight linear layers: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), bf16 in and out, fp32 accumulation.

Variants (registered in VARIANTS, kind "gemv" for small M, "gemm" for large M):
  gemv         CUDA cores. One program per BLOCK_N rows streams all of K with 16-byte loads, the tokens of a
               BLOCK_M tile looped inside; exact decode for every scale byte.
  gemv_splitk  gemv with K split over SPLIT_K programs, reduced with fp32 atomics and a small epilogue.
  gemv_tc      tensor cores for small M: W tiles decoded to bf16 in registers are the MMA's M side (tokens its
               N side), so one token still fills the MMA with weight rows; optional split-K.
  mma          the same kernel tiled for large M (big token tiles, programs grouped for L2 reuse).
  dot_scaled   tl.dot_scaled(x bf16, W e2m1 + e8m0 scales): the compiler's own MXFP4 path.
  gemv_h2      CUDA cores with packed half2 FMAs on fp16 activations (kernels/linear_f16.py).
  gemv_h2g     gemv_h2 with x plane-major, loaded in the weight tile's own register layout (no shared-memory
               shuffle), and half2 sums per MXFP4 block: ~3.0 sm_90 instructions per weight against 4.1.
  gemv_tc16    tensor cores on fp16 weights and activations (kernels/linear_f16.py).
  gemv_mma     tensor cores (mma.sync, fp16) fed by weights decoded in the MMA's own operand registers: no
               shared memory between load and MMA, ~3 sm_90 instructions per weight for up to BLOCK_M tokens
               (Gluon with explicit layouts; kernels/linear_mma.py).
  dequant_gemm W decoded to a bf16 scratch buffer by one kernel, then cuBLAS: for prefill-sized M the
               decode is paid once per call instead of once per token tile.
  w4a8         activations quantized to MXFP8 (E4M3 + E8M0) by a small kernel, then tl.dot_scaled(e4m3, e2m1).
               Trades accuracy (reported by the benchmarks) for 8-bit activation traffic. On sm_90 Triton 3.6
               upcasts both operands to bf16 for a bf16 wgmma (no fp8 tensor core; `labkit sass w4a8`).
  w4a8_fp8     fp8 tensor cores on sm_90: activations to E4M3 with one scale per token, weights decoded to
               E4M3 with one per row (kernels/linear_fp8.py); lossy in x like w4a8.

Every launcher takes (x, prepared weight, bias, **config); no launcher syncs with the host, allocates
data-dependent sizes or reads device values, so all of them run under CUDA-graph capture.
"""

from __future__ import annotations

import torch

from ._triton import INTERPRETED, tl, triton
from .decode import F16_TRICK, decode_bf16, e8m0_to_f32, gemv_products, grouped_tile, round_to_e4m3, tc_dot
from .formats import MXFP4Tensor
from .linear_f16 import run_gemv_h2, run_gemv_h2g, run_tc16
from .linear_fp8 import run_w4a8_fp8
from .linear_mma import run_gemv_mma, wgmma_reason
from .prepare import PreparedMXFP4, prepare_mxfp4, tile_mxfp4
from .variants import (
    SHARED_MEMORY_BYTES,
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
    rule_shared_memory,
    rule_tiled_k,
    shared_memory_rule,
)

# ------------------------------------------------------------------------------------------------------------
# Triton kernels


@triton.jit
def _k_range(pid_k, K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """[t0, t1) in units of BLOCK_K tiles for split pid_k of SPLIT_K."""
    n_tiles = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(n_tiles, SPLIT_K)
    t0 = pid_k * per
    return t0, tl.minimum(t0 + per, n_tiles)


@triton.jit
def _store_out(acc, rm, rn, M, N, y_ptr, stride_ym, b_ptr, ws_ptr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """acc [BM, BN] fp32 -> y (bf16, + bias) or, when split, atomically into the fp32 workspace."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(tl.bfloat16), mask=mask)
    else:
        tl.atomic_add(ws_ptr + rm[:, None] * N + rn[None, :], acc, mask=mask, sem="relaxed")


@triton.jit
def _splitk_epilogue(ws_ptr, b_ptr, y_ptr, M, N, stride_ym, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """y = bf16(workspace + bias) after a split-K reduction."""
    pid_m = tl.program_id(1)
    rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    nm = rn < N
    acc = tl.load(ws_ptr + pid_m * N + rn, mask=nm, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nm, other=0.0).to(tl.float32)
    tl.store(y_ptr + pid_m * stride_ym + rn, acc.to(tl.bfloat16), mask=nm)


@triton.jit
def _gemv_step(acc, t, x_ptr, w_ptr, s_ptr, rm, rn, rw, mmask, nmask, KW, KB, stride_xm,
               BLOCK_K: tl.constexpr, MASK_K: tl.constexpr):
    """One BLOCK_K slice: acc[m, n, word] += scale * sum_e W[n, 8 word + e] x[m, 8 word + e]."""
    kw = t * (BLOCK_K // 8) + rw
    if MASK_K:  # only the last, partial K tile pays for K masks
        wm = nmask[:, None] & (kw < KW)[None, :]
        xm = mmask[:, None] & (kw < KW)[None, :]
    else:
        wm = nmask[:, None]
        xm = mmask[:, None]
    v = tl.load(w_ptr + rn[:, None] * KW + kw[None, :], mask=wm, other=0).to(tl.uint32, bitcast=True)
    s = tl.load(s_ptr + rn[:, None] * KB + (kw // 4)[None, :], mask=wm, other=0)
    p = gemv_products(v, x_ptr + rm[:, None] * stride_xm + (kw * 8)[None, :], xm)
    return acc + p * e8m0_to_f32(s)[None]


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, stride_xm, stride_ym,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr):
    """CUDA-core GEMV: per-word partial sums accumulate in registers, reduced over words once at the end."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    KW = K // 8
    KB = K // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rw = tl.arange(0, BLOCK_K // 8)
    nmask = rn < N
    mmask = rm < M
    t0, t1 = _k_range(tl.program_id(2), K, BLOCK_K, SPLIT_K)
    full = tl.minimum(t1, K // BLOCK_K)  # tiles entirely inside K
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K // 8), tl.float32)
    for t in range(t0, full):
        acc = _gemv_step(acc, t, x_ptr, w_ptr, s_ptr, rm, rn, rw, mmask, nmask, KW, KB, stride_xm, BLOCK_K, False)
    for t in range(tl.maximum(full, t0), t1):
        acc = _gemv_step(acc, t, x_ptr, w_ptr, s_ptr, rm, rn, rw, mmask, nmask, KW, KB, stride_xm, BLOCK_K, True)
    out = tl.sum(acc, axis=2) * F16_TRICK
    _store_out(out, rm, rn, M, N, y_ptr, stride_ym, b_ptr, ws_ptr, HAS_BIAS, SPLIT_K)


@triton.jit
def _mma_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, stride_xm, stride_ym,
                HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Tensor cores on W decoded to bf16 in registers (exact for scale bytes 14..240).

    The MMA computes acc[n, m] = W x^T: weight rows are its M side (so one token still fills it) and the
    decoded W stays in registers as the A operand. (The other orientation, W^T as the B operand, crashes
    Triton 3.6's OptimizeDotOperands pass.)
    """
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    KW = K // 8
    KB = K // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rw = tl.arange(0, BLOCK_K // 8)
    rk = tl.arange(0, BLOCK_K)
    nmask = rn < N
    mmask = rm < M
    t0, t1 = _k_range(tl.program_id(2), K, BLOCK_K, SPLIT_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for t in range(t0, t1):
        kw = t * (BLOCK_K // 8) + rw
        wm = nmask[:, None] & (kw < KW)[None, :]
        v = tl.load(w_ptr + rn[:, None] * KW + kw[None, :], mask=wm, other=0).to(tl.uint32, bitcast=True)
        s = tl.load(s_ptr + rn[:, None] * KB + (kw // 4)[None, :], mask=wm, other=127)
        w = decode_bf16(v, s)  # [BLOCK_N, BLOCK_K]
        k = t * BLOCK_K + rk
        x = tl.load(x_ptr + rm[None, :] * stride_xm + k[:, None], mask=mmask[None, :] & (k < K)[:, None], other=0.0)
        acc = tc_dot(w, x, acc)
    _store_out(tl.trans(acc), rm, rn, M, N, y_ptr, stride_ym, b_ptr, ws_ptr, HAS_BIAS, SPLIT_K)


@triton.jit
def _dot_scaled_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, stride_xm, stride_ym,
                       X_FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, SWAP: tl.constexpr):
    """tl.dot_scaled with W as e2m1 + e8m0 scales; x is bf16 (X_FORMAT 'bf16') or MXFP8 ('e4m3' + xs scales)."""
    pid_m = tl.program_id(0) % tl.cdiv(M, BLOCK_M)
    pid_n = tl.program_id(0) // tl.cdiv(M, BLOCK_M)
    K2 = K // 2
    KB = K // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rk2 = tl.arange(0, BLOCK_K // 2)
    rb = tl.arange(0, BLOCK_K // 32)
    nmask = rn < N
    mmask = rm < M
    t0, t1 = _k_range(tl.program_id(2), K, BLOCK_K, SPLIT_K)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for t in range(t0, t1):
        k = t * BLOCK_K + rk
        k2 = t * (BLOCK_K // 2) + rk2
        kb = t * (BLOCK_K // 32) + rb
        w = tl.load(w_ptr + rn[:, None] * K2 + k2[None, :], mask=nmask[:, None] & (k2 < K2)[None, :], other=0)
        ws = tl.load(s_ptr + rn[:, None] * KB + kb[None, :], mask=nmask[:, None] & (kb < KB)[None, :], other=127)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=mmask[:, None] & (k < K)[None, :], other=0.0)
        if X_FORMAT == "bf16":
            xs = None
        else:
            xs = tl.load(xs_ptr + rm[:, None] * KB + kb[None, :], mask=mmask[:, None] & (kb < KB)[None, :], other=127)
        if SWAP:
            acc = tl.dot_scaled(w, ws, "e2m1", tl.trans(x), xs, X_FORMAT, acc)
        else:
            acc = tl.dot_scaled(x, xs, X_FORMAT, tl.trans(w), ws, "e2m1", acc)
    if SWAP:
        acc = tl.trans(acc)
    _store_out(acc, rm, rn, M, N, y_ptr, stride_ym, b_ptr, ws_ptr, HAS_BIAS, SPLIT_K)


@triton.jit
def _quantize_mxfp8_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, BLOCK_K: tl.constexpr):
    """Rows of x (bf16) -> MXFP8: E8M0 scale per 32 (OCP floor rule, as kernels.formats) and E4M3 elements."""
    m = tl.program_id(0)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    km = rk < K
    x = tl.load(x_ptr + m * stride_xm + rk, mask=km, other=0.0).to(tl.float32)
    xb = tl.reshape(x, (BLOCK_K // 32, 32))
    amax = tl.max(tl.abs(xb), axis=1)
    e = ((amax.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32)  # biased exponent of amax
    byte = tl.where(amax > 0, tl.maximum(e - 8, 0), 0)  # floor(log2 amax) - 8, as a biased byte
    inv = ((254 - byte).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(127 - byte), exact
    inv = tl.where(byte == 254, 5.877471754111438e-39, inv)  # byte 254 -> 2^-127 (a subnormal)
    q = round_to_e4m3(xb * inv[:, None]).to(tl.float8e4nv)
    tl.store(q_ptr + m * K + rk, tl.reshape(q, (BLOCK_K,)), mask=km)
    rb = tl.program_id(1) * (BLOCK_K // 32) + tl.arange(0, BLOCK_K // 32)
    tl.store(s_ptr + m * (K // 32) + rb, byte.to(tl.uint8), mask=rb < K // 32)


# ------------------------------------------------------------------------------------------------------------
# Launchers (x bf16 [M, K] contiguous rows, p prepared weight [N, K], bias [N] or None)


def _empty_like_out(x, N):
    return torch.empty((x.shape[0], N), device=x.device, dtype=torch.bfloat16)


def _workspace(x, N, split_k):
    return torch.zeros((x.shape[0], N), device=x.device, dtype=torch.float32) if split_k > 1 else None


def _finish_split(ws, bias, y, split_k):
    if split_k > 1:
        M, N = y.shape
        _splitk_epilogue[(triton.cdiv(N, 1024), M)](ws, bias if bias is not None else ws, y, M, N, y.stride(0),
                                                    HAS_BIAS=bias is not None, BLOCK=1024)
    return y


def _run_gemv(x, p: PreparedMXFP4, bias, *, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K=1, num_warps=4, num_stages=2):
    M, K = x.shape
    N = p.N
    y = _empty_like_out(x, N)
    ws = _workspace(x, N, SPLIT_K)
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(M, BLOCK_M), SPLIT_K)
    _gemv_kernel[grid](x, p.words, p.scales, bias if bias is not None else y, y, ws if ws is not None else y,
                       M, N, K, x.stride(0), y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M,
                       BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, SPLIT_K=SPLIT_K, num_warps=num_warps, num_stages=num_stages)
    return _finish_split(ws, bias, y, SPLIT_K)


def _run_mma(x, p: PreparedMXFP4, bias, *, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K=1, GROUP_M=8, num_warps=4,
             num_stages=3):
    M, K = x.shape
    N = p.N
    y = _empty_like_out(x, N)
    ws = _workspace(x, N, SPLIT_K)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), 1, SPLIT_K)
    _mma_kernel[grid](x, p.words, p.scales, bias if bias is not None else y, y, ws if ws is not None else y,
                      M, N, K, x.stride(0), y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M,
                      BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, SPLIT_K=SPLIT_K, GROUP_M=GROUP_M,
                      num_warps=num_warps, num_stages=num_stages)
    return _finish_split(ws, bias, y, SPLIT_K)


def quantize_mxfp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16 [M, K] -> (E4M3 [M, K], E8M0 bytes [M, K/32]) on the device, in one small kernel."""
    M, K = x.shape
    q = torch.empty((M, K), device=x.device, dtype=torch.float8_e4m3fn)
    s = torch.empty((M, K // 32), device=x.device, dtype=torch.uint8)
    if M:
        _quantize_mxfp8_kernel[(M, triton.cdiv(K, 256))](x, q, s, K, x.stride(0), BLOCK_K=256)
    return q, s


def _run_dot_scaled(x, p: PreparedMXFP4, bias, *, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K=1, SWAP=False,
                    num_warps=4, num_stages=3, _x_format="bf16"):
    M, K = x.shape
    N = p.N
    if _x_format == "e4m3":
        xq, xs = quantize_mxfp8_rows(x)
    else:
        xq, xs = x, x
    y = _empty_like_out(x, N)
    ws = _workspace(x, N, SPLIT_K)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), 1, SPLIT_K)
    _dot_scaled_kernel[grid](xq, xs, p.blocks, p.scales, bias if bias is not None else y, y,
                             ws if ws is not None else y, M, N, K, xq.stride(0), y.stride(0), X_FORMAT=_x_format,
                             HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                             SPLIT_K=SPLIT_K, SWAP=SWAP, num_warps=num_warps, num_stages=num_stages)
    return _finish_split(ws, bias, y, SPLIT_K)


def _run_w4a8(x, p, bias, **cfg):
    return _run_dot_scaled(x, p, bias, _x_format="e4m3", **cfg)


def _run_dequant_gemm(x, p: PreparedMXFP4, bias, *, CHUNK_N=0, TILED=False):
    """W to bf16 in a scratch buffer (CHUNK_N rows at a time; 0 = all), then cuBLAS: the large-M path.
    TILED reads tile_mxfp4's copy (so a weight held tiled has a large-M path too)."""
    from .dequant import mxfp4_to_dense

    if TILED:
        p = tile_mxfp4(p)
    N = p.N
    if not CHUNK_N or CHUNK_N >= N:
        return torch.nn.functional.linear(x, mxfp4_to_dense(p), bias)
    y = torch.empty((x.shape[0], N), device=x.device, dtype=torch.bfloat16)
    for n0 in range(0, N, CHUNK_N):  # CHUNK_N is a multiple of 16: whole tiles of a tiled weight
        n1 = min(n0 + CHUNK_N, N)
        g0, g1 = (n0 // 16, -(-n1 // 16)) if TILED else (n0, n1)
        part = PreparedMXFP4(p.blocks[g0:g1], p.words[g0:g1], p.scales[g0:g1], (n1 - n0, p.K), p.scale_min,
                             p.scale_max, tiled=TILED)
        y[:, n0:n1] = torch.nn.functional.linear(x, mxfp4_to_dense(part), None if bias is None else bias[n0:n1])
    return y


# ------------------------------------------------------------------------------------------------------------
# Registry

_rule_pow2 = rule_pow2("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps")


def _rule_tc_tile(cfg, problem):
    if cfg["BLOCK_N"] * cfg["BLOCK_K"] // (32 * cfg["num_warps"]) > 256:
        return "decoded W tile exceeds 256 values per thread (BLOCK_N*BLOCK_K/threads)"
    return None


def _rule_tc16_shared(cfg, problem):
    """gemv_tc16's shared memory, as Triton 3.6 builds it for sm_90 (`./lab sass gemv_tc16`): num_stages copies
    of the x tile (fp16) and of the weight words, and 1.5 bytes per decoded weight of the tile besides: 240 KB at
    BLOCK_M=128, BLOCK_N=64, BLOCK_K=256, 3 stages (out of resources in the GPU runs of linear_gptoss on the H100
    and the H200, which rule_shared_memory's estimate let through) and at 64, 128, 256, 4, both past the 227 KB
    a block may have; 184 KB at 128, 128, 128, 4 and 208 KB at 128, 128, 256, 2."""
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    need = cfg.get("num_stages", 1) * (bm * bk * 2 + bn * bk // 2) + 3 * bn * bk // 2
    if need > SHARED_MEMORY_BYTES:
        return f"needs ~{need // 1024} KB of shared memory (more than 227 KB)"
    return None


def _rule_splitk_tiles(cfg, problem):
    k, bk, sk = problem.get("k"), cfg["BLOCK_K"], cfg.get("SPLIT_K", 1)
    if k is not None and sk > 1 and -(-k // bk) < sk:
        return f"SPLIT_K={sk} exceeds the {-(-k // bk)} K tiles of BLOCK_K={bk}"
    return None


_BF16_WINDOW = rule_scale_window(14, 240)

register(Variant(
    name="gemv", kind="gemv", op="linear", fn=_run_gemv,
    space={"BLOCK_M": (1, 2, 4, 8), "BLOCK_N": (16, 32, 64, 128), "BLOCK_K": (64, 128, 256, 512),
           "num_warps": (2, 4, 8), "num_stages": (1, 2)},
    defaults={"BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2},
    rules=(_rule_pow2, rule_block_k_multiple_of_32, rule_gemv_registers),
    description="CUDA cores, one program per BLOCK_N rows over all K, tokens of a BLOCK_M tile inside",
))
register(Variant(
    name="gemv_splitk", kind="gemv", op="linear", fn=_run_gemv,
    space={"BLOCK_M": (1, 2, 4, 8), "BLOCK_N": (16, 32, 64), "BLOCK_K": (32, 64, 128, 256), "SPLIT_K": (2, 4, 8, 16),
           "num_warps": (2, 4), "num_stages": (1, 2)},
    defaults={"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 2},
    rules=(_rule_pow2, rule_block_k_multiple_of_32, rule_gemv_registers, _rule_splitk_tiles),
    description="gemv with K split across programs, fp32 atomics then a bias/cast epilogue",
))
register(Variant(
    name="gemv_tc", kind="gemv", op="linear", fn=_run_mma,
    space={"BLOCK_M": (16, 32, 64), "BLOCK_N": (64, 128), "BLOCK_K": (64, 128, 256), "SPLIT_K": (1, 2, 4),
           "num_warps": (4, 8), "num_stages": (2, 3, 4)},
    defaults={"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "GROUP_M": 1, "num_warps": 4,
              "num_stages": 3},
    rules=(_rule_pow2, rule_block_k_multiple_of_32, rule_dot_k, _rule_tc_tile, rule_mma_registers, rule_shared_memory,
           _rule_splitk_tiles, _BF16_WINDOW),
    description="tensor cores with W as the MMA's M side (tokens on N): small M still fills the MMA",
))
register(Variant(
    name="gemv_h2", kind="gemv", op="linear", fn=run_gemv_h2,
    space={"BLOCK_M": (1, 2, 4), "BLOCK_N": (32, 64, 128, 256), "BLOCK_K": (64, 128, 256, 512),
           "PREFETCH": (False, True), "num_warps": (2, 4, 8), "num_stages": (1, 2)},
    defaults={"BLOCK_M": 1, "BLOCK_N": 128, "BLOCK_K": 128, "PREFETCH": False, "num_warps": 4, "num_stages": 1},
    rules=(_rule_pow2, rule_block_k_multiple_of_32, rule_gemv_registers, rule_scale_window(0, 253)),
    description="CUDA cores with packed half2 FMAs on fp16-rescaled activations (4 FMAs per 8 weights)",
))


def _rule_h2g_early(cfg, problem):
    """EARLY moves the PDL wait after the first weight tile's loads: only PREFETCH loads a tile before its
    loop, and PERSIST's programs wait once before their first tile."""
    if cfg.get("EARLY") and (not cfg.get("PREFETCH") or cfg.get("PERSIST")):
        return "EARLY loads PREFETCH's first tile before the PDL wait: it needs PREFETCH=True and PERSIST=0"
    return None


register(Variant(
    name="gemv_h2g", kind="gemv", op="linear", fn=run_gemv_h2g,
    space={"BLOCK_M": (1, 2, 4, 8), "BLOCK_N": (4, 8, 16, 32, 64, 128), "BLOCK_K": (128, 256, 512, 1024, 2048),
           "PREFETCH": (False, True), "num_warps": (1, 2, 4, 8), "num_stages": (1, 2, 3, 4), "TILED": (False, True),
           "PERSIST": (0, 2, 4, 8), "NIB": (False, True), "MAXNREG": (None, 40, 48, 56, 64, 72, 80),
           "EARLY": (False, True)},
    defaults={"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 256, "PREFETCH": False, "num_warps": 4, "num_stages": 1,
              "TILED": False, "PERSIST": 0, "NIB": False, "MAXNREG": None, "EARLY": False},
    rules=(_rule_pow2, rule_block_k_multiple_of_32, rule_h2g_words, rule_h2g_pipeline, rule_scale_window(0, 253),
           rule_tiled_k, _rule_h2g_early),
    description="gemv_h2 with x read plane-major in the weights' own layout and half2 sums per MXFP4 block; "
                "num_stages > 1: the K loop pipelined through a cp.async ring in shared memory; TILED: reads "
                "tile_mxfp4's copy; PERSIST: programs per SM striding over the row tiles (0: one per tile); NIB: "
                "reads shuffle_nibbles' copy (decode in 9 instructions per word instead of 15); MAXNREG: registers per "
                "thread capped; EARLY: PREFETCH's first tile loaded before the PDL wait",
))


register(Variant(
    name="gemv_tc16", kind="gemv", op="linear", fn=run_tc16,
    space={"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (64, 128), "BLOCK_K": (64, 128, 256), "GROUP_M": (1, 8),
           "num_warps": (4, 8), "num_stages": (2, 3, 4)},
    defaults={"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 3},
    rules=(_rule_pow2, rule_block_k_multiple_of_32, rule_dot_k, _rule_tc_tile, rule_mma_registers, _rule_tc16_shared,
           rule_scale_span),
    description="tensor cores on fp16 weights (half2 block-scale multiply) and fp16-rescaled activations",
))


def _rule_mma_registers(cfg, problem):
    """gemv_mma (mma.sync) keeps per thread 2 * BLOCK_M * CHUNKS x registers (its B fragments of a K step),
    ROWS * BLOCK_M / 2 accumulators and 8 * ROWS * CHUNKS weight words (twice with PREFETCH). The estimate is
    rough: the sm_90 build of BLOCK_M=64, ROWS=2 (estimate 208) takes 188 registers without spilling; past ~210
    builds spill. WGMMA keeps no x in registers (kernels.linear_mma.wgmma_reason)."""
    if cfg.get("WGMMA"):
        return wgmma_reason(cfg)
    if (cfg.get("STAGES", 3) != 3 or cfg.get("RING_W") or cfg.get("TMA") or cfg.get("EARLY") or cfg.get("TAIL")
            or cfg.get("STEP_MAJOR") or cfg.get("SEQ") or cfg.get("BC") or cfg.get("NOBAR")):
        return "STAGES (the x ring), RING_W, TMA, EARLY, TAIL, STEP_MAJOR, SEQ, BC and NOBAR apply only with WGMMA"
    bm, rows, c = cfg["BLOCK_M"], cfg["ROWS"], cfg["CHUNKS"]
    regs = 2 * bm * c + rows * bm // 2 + 8 * rows * c * (2 if cfg["PREFETCH"] else 1)
    if regs > 210:
        return (f"~{regs} data registers per thread (2*BLOCK_M*CHUNKS + ROWS*BLOCK_M/2 + 8*ROWS*CHUNKS*(1+PREFETCH) "
                "> 210)")
    if cfg["BLOCK_M"] < 8:
        return f"BLOCK_M={cfg['BLOCK_M']} is below the MMA's 8 tokens"
    return None


register(Variant(
    name="gemv_mma", kind="gemv", op="linear", fn=run_gemv_mma,
    space={"BLOCK_M": (8, 16, 32, 64, 128), "ROWS": (1, 2, 4), "CHUNKS": (1, 2, 4), "PREFETCH": (False, True),
           "num_warps": (1, 2, 4, 8), "TILED": (False, True), "MAXNREG": (None, 64, 72, 80, 88, 96, 128, 168),
           "WGMMA": (False, True),
           "STAGES": (2, 3, 4, 6, 8), "RING_W": (False, True), "NIB": (False, True), "TMA": (False, True, 2),
           "EARLY": (False, True), "TAIL": (False, True), "STEP_MAJOR": (False, True), "SEQ": (False, True, 2),
           "BC": (False, True, 2), "NOBAR": (False, True)},
    defaults={"BLOCK_M": 16, "ROWS": 2, "CHUNKS": 1, "PREFETCH": False, "num_warps": 4, "TILED": False,
              "MAXNREG": None, "WGMMA": False, "STAGES": 3, "RING_W": False, "NIB": False, "TMA": False,
              "EARLY": False, "TAIL": False, "STEP_MAJOR": False, "SEQ": False, "BC": False,
              "NOBAR": False},
    rules=(rule_pow2("BLOCK_M", "ROWS", "CHUNKS", "num_warps"), _rule_mma_registers, rule_scale_span),
    description="mma.sync on fp16 weights decoded in the MMA's operand registers (no shared memory); WGMMA: "
                "sm_90 wgmma on the same registers, x through a cp.async ring of STAGES shared-memory slots "
                "(RING_W: the weights too; TMA: copied by the tensor memory accelerator, TMA=2 x too; EARLY: TMA's "
                "first copies before the PDL wait; TAIL: a half last chunk as a half step, from tail_half; "
                "STEP_MAJOR: the ring reads prepare.step_major's copy; SEQ: TMA=2's slots of CHUNKS chunks decoded "
                "one chunk at a time; BC: block scales after each chunk's wgmma, on 8 MMA columns a token; NOBAR: the "
                "TMA loop's redundant barriers dropped from the PTX); "
                "NIB: reads shuffle_nibbles' copy (9 decode instructions per word, not 15)",
))
register(Variant(
    name="mma", kind="gemm", op="linear", fn=_run_mma,
    space={"BLOCK_M": (64, 128, 256), "BLOCK_N": (64, 128, 256), "BLOCK_K": (64, 128), "GROUP_M": (8,),
           "num_warps": (4, 8), "num_stages": (2, 3, 4)},
    defaults={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8, "num_warps": 8,
              "num_stages": 3},
    rules=(_rule_pow2, rule_block_k_multiple_of_32, rule_dot_k, _rule_tc_tile, rule_mma_registers, rule_shared_memory,
           _BF16_WINDOW),
    description="tensor cores, W tiles decoded to bf16 in registers then tl.dot",
))
_DOT_SCALED = dict(
    space={"BLOCK_M": (16, 64, 128), "BLOCK_N": (64, 128, 256), "BLOCK_K": (64, 128), "SWAP": (False, True),
           "SPLIT_K": (1, 4), "num_warps": (4, 8), "num_stages": (2, 3, 4)},
    defaults={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "SWAP": False, "num_warps": 8,
              "num_stages": 3},
    rules=(_rule_pow2, rule_block_k_multiple_of_32, _rule_splitk_tiles),
)
register(Variant(name="dot_scaled", kind="gemm", op="linear", fn=_run_dot_scaled, **_DOT_SCALED,
                 description="tl.dot_scaled(x bf16, W e2m1 with e8m0 scales): the compiler's MXFP4 path"))
register(Variant(
    name="dequant_gemm", kind="gemm", op="linear", fn=_run_dequant_gemm,
    space={"CHUNK_N": (0, 16384, 65536), "TILED": (False, True)},
    defaults={"CHUNK_N": 0, "TILED": False},
    description="W decoded to bf16 in a scratch buffer (CHUNK_N rows at a time, 0 = all), then cuBLAS; "
                "TILED reads tile_mxfp4's copy",
))
register(Variant(name="w4a8", kind="gemm", op="linear", fn=_run_w4a8, **_DOT_SCALED,
                 description="activations quantized to MXFP8 on the fly, then tl.dot_scaled(e4m3, e2m1) (on sm_90 "
                             "Triton upcasts both to bf16 for a bf16 wgmma); lossy in x",
                 extra={"lossy_activations": True}))
register(Variant(
    name="w4a8_fp8", kind="gemm", op="linear", fn=run_w4a8_fp8,
    space={"BLOCK_M": (64, 128, 256), "BLOCK_N": (64, 128, 256), "BLOCK_K": (64, 128, 256), "GROUP_M": (8,),
           "num_warps": (4, 8), "num_stages": (2, 3, 4)},
    defaults={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    rules=(_rule_pow2, rule_block_k_multiple_of_32, rule_dot_k, _rule_tc_tile, rule_mma_registers,
           shared_memory_rule(1)),
    description="fp8 tensor cores (sm_90 wgmma e4m3): activations to E4M3 with one power-of-two scale per token, "
                "weights decoded to E4M3 with one per row (exact while a block's scale is within 14 binades of "
                "its row's largest); lossy in x",
    extra={"lossy_activations": True},
))


# ------------------------------------------------------------------------------------------------------------
# Public entry point


def _check_linear_args(x, w, bias):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x must have dtype bfloat16, got {str(x.dtype).replace('torch.', '')}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if isinstance(w, PreparedMXFP4):
        shape = w.shape
    elif isinstance(w, MXFP4Tensor):
        shape = w.shape
    else:
        raise TypeError(f"w must be an MXFP4Tensor, got {type(w).__name__}")
    if len(shape) != 2:
        raise ValueError(f"w must be 2-D [N, K], got shape {shape}")
    if x.shape[1] != shape[1]:
        raise ValueError(f"x has K={x.shape[1]} but w has K={shape[1]}")
    if isinstance(w, PreparedMXFP4) and w.deinterleaved:
        raise ValueError("w is tiled with deinterleave=True (mlp1's layout); a linear weight is tiled without it")
    if x.device != (w.words.device if isinstance(w, PreparedMXFP4) else w.device):
        raise ValueError("x and w must be on the same device")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dtype not in (torch.bfloat16, torch.float32, torch.float16):
            raise TypeError("bias must be a bf16, fp16 or fp32 tensor")
        if tuple(bias.shape) != (shape[0],):
            raise ValueError(f"bias must have shape ({shape[0]},), got {tuple(bias.shape)}")


def linear_problem(m: int, p: PreparedMXFP4) -> dict:
    """The problem dict variants' rules see for a call of M tokens on prepared weight p."""
    return {"m": m, "n": p.N, "k": p.K, "scale_min": p.scale_min, "scale_max": p.scale_max, "tiled": p.tiled,
            "shuffled": p.shuffled}


def mxfp4_linear(x: torch.Tensor, w, bias: torch.Tensor | None = None, *, variant: str = "auto", **config):
    """y[M, N] = x[M, K] @ W^T (+ bias) with W an MXFP4Tensor [N, K] (or its prepared form); bf16 out.

    variant="auto" picks by M from the host-side table in kernels.tables (no device sync); any other name
    runs that variant with `config` over its defaults. Raises ValueError naming the rule a config breaks.
    """
    _check_linear_args(x, w, bias)
    p = w if isinstance(w, PreparedMXFP4) else prepare_mxfp4(w)
    M = x.shape[0]
    if M == 0:
        return torch.empty((0, p.N), device=x.device, dtype=torch.bfloat16)
    if not x.is_contiguous():
        x = x.contiguous()
    problem = linear_problem(M, p)
    if variant == "auto":
        from .tables import pick_linear

        variant, picked = pick_linear(problem)
        config = {**picked, **config}
    v = get_variant(variant, "linear")
    cfg = v.check(config, problem)
    return v.fn(x, p, bias, **cfg)


__all__ = ["mxfp4_linear", "quantize_mxfp8_rows", "linear_problem", "INTERPRETED"]
