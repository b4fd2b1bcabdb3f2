"""A fast MXFP4 -> bf16 dequantize kernel: the "dequantize then cuBLAS" baseline and a helper for torch paths.

Exact for every scale byte (fp32 scale multiply, then a cast that is exact for E2M1 * 2^k); one pass that
reads the packed weight once and writes the dense bf16 copy once.
"""

from __future__ import annotations

import math

import torch

from ._triton import tl, triton
from .decode import F16_TRICK, e2m1_pairs, e8m0_to_f32, half_hi, half_lo, interleave8
from .formats import MXFP4Tensor
from .prepare import PreparedMXFP4, prepare_mxfp4


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, y_ptr, R, KW, N, G, KC, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
                    TILED: tl.constexpr):
    """Rows R (all matrices' rows stacked) x KW words; TILED: tile_mxfp4's layout, N rows per matrix held in
    G 16-row groups of KC 128-K chunks."""
    rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rw = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = (rr < R)[:, None] & (rw < KW)[None, :]
    if TILED:  # row n of matrix e: group e * G + n // 16, row n % 16 of each of its chunks (16 words, 4 scales)
        tile = ((rr // N) * G + (rr % N) // 16).to(tl.int64) * KC
        row = (tile[:, None] + (rw // 16)[None, :]) * 16 + (rr % N % 16)[:, None]  # a row of one chunk
        w_off = row * 16 + (rw % 16)[None, :]
        s_off = row * 4 + (rw // 4 % 4)[None, :]
    else:
        w_off = rr[:, None] * KW + rw[None, :]
        s_off = rr[:, None] * (KW // 4) + (rw // 4)[None, :]
    v = tl.load(w_ptr + w_off, mask=m, other=0).to(tl.uint32, bitcast=True)
    sc = e8m0_to_f32(tl.load(s_ptr + s_off, mask=m, other=127)) * F16_TRICK
    a, b, c, d = e2m1_pairs(v)
    out = interleave8(half_lo(a) * sc, half_lo(b) * sc, half_lo(c) * sc, half_lo(d) * sc,
                      half_hi(a) * sc, half_hi(b) * sc, half_hi(c) * sc, half_hi(d) * sc)
    rk = tl.program_id(1) * BLOCK_W * 8 + tl.arange(0, BLOCK_W * 8)
    mk = (rr < R)[:, None] & (rk < KW * 8)[None, :]
    tl.store(y_ptr + rr[:, None] * (KW * 8) + rk[None, :], out.to(y_ptr.dtype.element_ty), mask=mk)


def mxfp4_to_dense(w: MXFP4Tensor | PreparedMXFP4, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dense copy of w in bf16 (or fp16/fp32) made by one Triton kernel; same values as dequantize_mxfp4.
    w may be held in tile_mxfp4's layout (not mlp1's deinterleaved one: its rows are reordered)."""
    p = w if isinstance(w, PreparedMXFP4) else prepare_mxfp4(w)
    if p.deinterleaved:
        raise ValueError("mxfp4_to_dense reads row-major or tile_mxfp4 weights, not deinterleaved ones")
    rows = math.prod(p.shape[:-1])
    y = torch.empty(p.shape, device=p.words.device, dtype=dtype)
    if rows:
        groups, chunks = (p.words.shape[-4], p.words.shape[-3]) if p.tiled else (1, 1)
        grid = (triton.cdiv(rows, 32), triton.cdiv(p.K // 8, 32))
        _dequant_kernel[grid](p.words, p.scales, y, rows, p.K // 8, p.N, groups, chunks, BLOCK_R=32, BLOCK_W=32,
                              TILED=p.tiled)
    return y
