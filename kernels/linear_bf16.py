"""BF16 GEMV for a few rows: y = x @ W^T + b with bf16 x [M, K], W [N, K], fp32 accumulation, bf16 out.

GPT-OSS keeps its attention projections in bf16 (only the experts are MXFP4), so a decode step reads
qkv (5120 x 2880) and out (2880 x 4096) weights in bf16 in every layer. cuBLAS runs them at M=1 at
13.1 us (qkv, 79% of its floor) and 11.4 us plus a 2.2 us split-K reduce (out, 61%) on the H100 (decode
profile of gpt-oss-120b). This kernel is the plain streaming GEMV: one program per BLOCK_N rows reads its
rows once, 16-byte loads along K, every token of the (few) rows in registers, one launch, bias fused.
"""

from __future__ import annotations

import torch

from ._triton import pdl_enter, pdl_launch, tl, triton
from .formats import _check_tensor

#: rows (tokens) this kernel takes: every token's partial sums live in registers next to the weight tile
MAX_ROWS = 8
#: fp32 partial sums per thread above which a config would spill (BLOCK_M * block_n * block_k / threads)
MAX_ACC_PER_THREAD = 64


def fits(m: int, block_n: int = 8, block_k: int = 512, num_warps: int = 4) -> bool:
    """Whether a config keeps its fp32 partial sums for m rows in registers (see MAX_ACC_PER_THREAD)."""
    return triton.next_power_of_2(max(m, 1)) * block_n * block_k <= MAX_ACC_PER_THREAD * 32 * num_warps


@triton.jit
def gemv_rows(x_ptr, w_ptr, rn_c, M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, rows] = x[:M] @ W[rn_c]^T for row indices rn_c (all < N): each row streamed once along K
    in BLOCK_K tiles. The first K tile of W is loaded before the PDL wait: weights are never written by the
    kernels before, so that load overlaps their tail; x is read after it."""
    rm = tl.arange(0, BLOCK_M)
    mmask = rm < M
    rk = tl.arange(0, BLOCK_K)
    wp = w_ptr + rn_c[:, None].to(tl.int64) * K + rk[None, :]
    xp = x_ptr + rm[:, None] * K + rk[None, :]
    k0 = rk < K
    w = tl.load(wp, mask=k0[None, :], other=0.0).to(tl.float32)
    pdl_enter()
    x = tl.load(xp, mask=mmask[:, None] & k0[None, :], other=0.0).to(tl.float32)
    acc = x[:, None, :] * w[None, :, :]
    wp += BLOCK_K
    xp += BLOCK_K
    full = K // BLOCK_K
    for _ in range(1, full):
        w = tl.load(wp).to(tl.float32)
        x = tl.load(xp, mask=mmask[:, None], other=0.0).to(tl.float32)
        acc += x[:, None, :] * w[None, :, :]
        wp += BLOCK_K
        xp += BLOCK_K
    if full * BLOCK_K < K and full > 0:
        km = full * BLOCK_K + rk < K
        w = tl.load(wp, mask=km[None, :], other=0.0).to(tl.float32)
        x = tl.load(xp, mask=mmask[:, None] & km[None, :], other=0.0).to(tl.float32)
        acc += x[:, None, :] * w[None, :, :]
    return tl.sum(acc, axis=2)


@triton.jit
def _gemv_bf16_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_c = tl.minimum(rn, N - 1)  # rows past N read row N-1 (never stored)
    y = gemv_rows(x_ptr, w_ptr, rn_c, M, K, BLOCK_M, BLOCK_K)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn_c).to(tl.float32)[None, :]
    rm = tl.arange(0, BLOCK_M)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], y.to(tl.bfloat16), mask=(rm < M)[:, None] & (rn < N)[None, :])


#: Measured picks, (rows, N, K) -> config, or None where cuBLAS was faster; from the linear_bf16 sweep
#: PICKS_RUN, run with LAB_PDL=1 as the model runs (graph replays of PDL launches, L2-rotated copies; the
#: GEMV's first W tile loads before its PDL wait). The run without PDL (results/20261122T224336-...) had
#: picked 512-wide K tiles, 12.3 us (attn out) and 13.8 us (qkv) at one row under PDL.
PICKS_RUN = "results/20261123T005250-h100-80gb-hbm3-linear-bf16-pdl1"
PICKS: dict[tuple[int, int, int], dict | None] = {
    (1, 2880, 4096): {"block_n": 2, "block_k": 1024, "num_warps": 2},  # attn out: 10.2 us, cuBLAS 13.9
    (2, 2880, 4096): {"block_n": 2, "block_k": 512, "num_warps": 4},  # 12.4 us, cuBLAS 14.1
    (4, 2880, 4096): None, (8, 2880, 4096): None,  # cuBLAS 14.1 us, the GEMV 16.9-27.4
    (1, 5120, 2880): {"block_n": 2, "block_k": 1024, "num_warps": 2},  # qkv: 13.1 us, cuBLAS 13.6
    (2, 5120, 2880): None, (4, 5120, 2880): None, (8, 5120, 2880): None,  # cuBLAS 13.5-13.7, GEMV 15.7-29.4
}


def pick(m: int, n: int, k: int) -> dict | None:
    """The GEMV config for m rows of an [n, k] weight, or None where cuBLAS serves better: the measured pick
    for that shape, else (unmeasured shapes) the default tile for up to 2 rows, with block_k halved until
    the partial sums fit, and cuBLAS beyond (the GEMV lost to it at 4 and 8 rows on both measured shapes)."""
    if (m, n, k) in PICKS:
        return dict(PICKS[(m, n, k)]) if PICKS[(m, n, k)] else None
    if m > 2:
        return None
    cfg = {"block_n": 8, "block_k": 512, "num_warps": 4}
    while not fits(m, **cfg) and cfg["block_k"] > 32:
        cfg["block_k"] //= 2
    return cfg


def gemv_bf16(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *, block_n: int | None = None,
              block_k: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """x [..., K] bf16 (at most MAX_ROWS rows) @ w [N, K]^T (+ b [N]) -> [..., N] bf16, like F.linear in bf16.

    Tile parameters left as None come from pick(rows, N, K) (or its one-row pick where cuBLAS is preferred)."""
    _check_tensor("x", x, (torch.bfloat16,))
    _check_tensor("w", w, (torch.bfloat16,))
    K = x.shape[-1]
    if w.dim() != 2 or w.shape[1] != K:
        raise ValueError(f"w must be [N, {K}], got {tuple(w.shape)}")
    N = w.shape[0]
    if b is not None and tuple(b.shape) != (N,):
        raise ValueError(f"b must have shape ({N},), got {tuple(b.shape)}")
    M = x.numel() // K if K else 0
    if M > MAX_ROWS:
        raise ValueError(f"gemv_bf16 takes at most {MAX_ROWS} rows, got {M}: use a GEMM (F.linear)")
    auto = pick(M, N, K) or pick(1, N, K) or {"block_n": 8, "block_k": 512, "num_warps": 4}
    block_n = block_n or auto["block_n"]
    block_k = block_k or auto["block_k"]
    num_warps = num_warps or auto["num_warps"]
    for name, v in (("block_n", block_n), ("block_k", block_k), ("num_warps", num_warps)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if not fits(M, block_n, block_k, num_warps):
        raise ValueError(f"block_n={block_n} x block_k={block_k} partial sums for {M} rows do not fit "
                         f"{num_warps} warps' registers ({MAX_ACC_PER_THREAD} per thread): shrink the tile")
    y = torch.empty((*x.shape[:-1], N), device=x.device, dtype=torch.bfloat16)
    if M and N:
        _gemv_bf16_kernel[(triton.cdiv(N, block_n),)](
            x.contiguous(), w.contiguous(), b if b is not None else w, y, M, N, K, HAS_BIAS=b is not None,
            BLOCK_M=triton.next_power_of_2(M), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, **pdl_launch())
    return y
