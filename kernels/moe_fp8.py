"""moe_w4a8: the MoE layer's two grouped GEMMs on fp8 tensor cores (sm_90 wgmma e4m3), for prefill.

moe_tc's grid and token gather (kernels/moe.py: per-expert tiles of BLOCK_M sorted positions, spare programs
exit) with w4a8_fp8's numerics (kernels/linear_fp8.py): x to E4M3 with one power-of-two scale per token,
weights decoded to E4M3 with one per row, fp32 accumulation, each K tile in decode_e4m3's order (its even
elements, then its odd ones). mlp1's SwiGLU output is stored as E4M3 too, scaled by a fixed power of two
(act8_scale: GPT-OSS's clamps bound it by limit * (limit + 1)), in that order for mlp2. Lossy in the
activations like the w4a8 linears: two roundings to 3 mantissa bits, reported by the benchmarks.
"""

from __future__ import annotations

import math

import torch

from ._triton import tl, triton
from .decode import round_to_e4m3
from .linear_fp8 import decode_e4m3, fp8_dot, quantize_fp8_rows
from .moe import MoESlots, _source_rows, expert_span, swiglu, tile_rows, tile_slots
from .variants import Variant, register, rule_block_k_multiple_of_32, rule_dot_k, rule_mma_registers, rule_pow2


def act8_scale(limit: float) -> float:
    """Power of two mlp1's SwiGLU output is multiplied by before it is stored as E4M3: |act| <= limit * (limit
    + 1) (gate clamped above at limit, linear to +-limit), so the scaled value stays below 256 (E4M3 holds 448)."""
    if not 0 < limit < 180:
        raise ValueError(f"moe_w4a8 stores the SwiGLU output in E4M3 and needs 0 < limit < 180, got {limit}")
    return float(2.0 ** math.floor(math.log2(256.0 / (limit * (limit + 1)))))


@triton.jit
def _tile_pos(i, TILE: tl.constexpr):
    """Stored position of element i when each TILE of K holds its even elements, then its odd ones."""
    p = i % TILE
    return i - p + tl.where(p % 2 == 0, p // 2, TILE // 2 + p // 2)


@triton.jit
def _moe_fp8_kernel(a_ptr, as_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, N, K, KA, OUTW,
                    TOPK, alpha, limit, act_scale, E, PHASE: tl.constexpr, EP: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc[n, m] = sum_k W8[e, n, k] a8[src m, k] over the token tile's rows; mlp1 (PHASE 1): times the row's
    2^(R - 133) and the token's scale, + b1, SwiGLU, stored as E4M3 * act_scale; mlp2: times 2^(R - 133) /
    act_scale, + b2, times the slot's gate weight, stored in bf16 by sorted position."""
    e, m0, end, live = tile_rows(offs_ptr, tl.program_id(0), tl.arange(0, EP), E, BLOCK_M)
    if live:  # the grid is sized for the worst case; spare programs exit
        rm = m0 + tl.arange(0, BLOCK_M)
        mmask = rm < end
        slots, src = _source_rows(sorted_ptr, rm, mmask, TOPK, PHASE)
        K2 = K // 2
        KB = K // 32
        G: tl.constexpr = BLOCK_K // 32
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = rn < N
        rnc = tl.minimum(rn, N - 1)  # rows past N read row N - 1 (never stored)
        wrow = w_ptr + e.to(tl.int64) * N * K2 + rnc * K2
        srow = s_ptr + e.to(tl.int64) * N * KB + rnc * KB
        rb = tl.arange(0, G)
        rk2 = tl.arange(0, BLOCK_K // 2)
        rk = tl.arange(0, BLOCK_K)
        tiles = tl.cdiv(K, BLOCK_K)
        R = tl.zeros((BLOCK_N,), tl.int32)  # each row's largest scale byte
        for t in range(0, tiles):
            kb = t * G + rb
            s = tl.load(srow[:, None] + kb[None, :], mask=(kb < KB)[None, :], other=0)
            R = tl.maximum(R, tl.max(s.to(tl.int32), axis=1))
        arow = a_ptr + src.to(tl.int64) * KA
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
        for t in range(0, tiles):
            k2 = t * (BLOCK_K // 2) + rk2
            wb = tl.load(wrow[:, None] + k2[None, :], mask=(k2 < K2)[None, :], other=0)
            kb = t * G + rb
            s = tl.load(srow[:, None] + kb[None, :], mask=(kb < KB)[None, :], other=0)
            x = tl.load(arow[None, :] + (t * BLOCK_K + rk)[:, None])  # rows padded with zeros to whole tiles
            acc = fp8_dot(decode_e4m3(wb, s, R), x, acc)
        wsc = ((tl.maximum(R - 6, 1)).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 2^(R - 133)
        bias = tl.load(b_ptr + e * N + rnc).to(tl.float32)[None, :]
        if PHASE == 1:
            out = tl.trans(acc) * wsc[None, :] * tl.load(as_ptr + src)[:, None] + bias
            g, lin = tl.split(tl.reshape(out, (BLOCK_M, BLOCK_N // 2, 2)))
            a = swiglu(g, lin, alpha, limit, act_scale)
            ri, _ = tl.split(tl.reshape(rn // 2, (BLOCK_N // 2, 2)))
            tl.store(out_ptr + rm[:, None].to(tl.int64) * OUTW + _tile_pos(ri, BLOCK_K)[None, :],
                     round_to_e4m3(a).to(tl.float8e4nv), mask=mmask[:, None] & (ri < N // 2)[None, :])
            if tl.program_id(1) == 0:  # the rows' padding past I (mlp2 reads whole tiles): zeros
                pad = N // 2 + rk
                tl.store(out_ptr + rm[:, None].to(tl.int64) * OUTW + _tile_pos(pad, BLOCK_K)[None, :],
                         tl.zeros((BLOCK_M, BLOCK_K), tl.float8e4nv), mask=mmask[:, None] & (pad < OUTW)[None, :])
        else:
            out = tl.trans(acc) * (wsc / act_scale)[None, :] + bias
            gate = tl.load(gate_ptr + slots, mask=mmask, other=0.0)
            tl.store(out_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], (out * gate[:, None]).to(tl.bfloat16),
                     mask=mmask[:, None] & nmask[None, :])


def _launch(phase, a, a_scale, r, p, b, out, out_width, alpha, limit, act_scale, cfg):
    E, N, K = p.shape
    BM = cfg["BLOCK_M"]
    grid = (tile_slots(r, BM), triton.cdiv(N, cfg["BLOCK_N"]))
    _moe_fp8_kernel[grid](a, a_scale, r.sorted, r.offsets, p.blocks, p.scales, b, r.weights, out, N, K, a.shape[1],
                          out_width, r.top_k, float(alpha), float(limit), float(act_scale), E, PHASE=phase,
                          EP=expert_span(E), BLOCK_M=BM, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                          num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def run_moe_w4a8(x, r, p1, b1, p2, b2, alpha, limit, x16=None, combine=True, *, BLOCK_M, BLOCK_N, BLOCK_K,
                 num_warps=4, num_stages=3):
    """Launcher (moe_mxfp4's contract): x to E4M3 rows (quantize_fp8_rows), mlp1 -> E4M3 act [S, I padded to
    BLOCK_K] (padding zeroed by mlp1's first N tile), mlp2 -> gate-weighted bf16 rows, then the combine.
    x16 is not used."""
    T, H = x.shape
    S = r.sorted.numel()
    I = p1.shape[1] // 2
    if S == 0:
        return torch.empty((T, H), device=x.device, dtype=torch.bfloat16)
    cfg = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=num_warps, num_stages=num_stages)
    scale = act8_scale(limit)
    x8, xs = quantize_fp8_rows(x, tile=BLOCK_K)
    act = torch.empty((S, -(-I // BLOCK_K) * BLOCK_K), device=x.device, dtype=torch.float8_e4m3fn)
    y = torch.empty((S, H), device=x.device, dtype=torch.bfloat16)
    _launch(1, x8, xs, r, p1, b1, act, act.shape[1], alpha, limit, scale, cfg)
    _launch(2, act, xs, r, p2, b2, y, H, alpha, limit, scale, cfg)
    slots = MoESlots(y, r.inverse, r.top_k)
    return slots.combine() if combine else slots


def _rule_fp8_tiles(cfg, problem):
    """tl.dot on fp8 needs tiles of at least 16 tokens and rows; the accumulator tile (BLOCK_N x BLOCK_M fp32)
    is spread over the program's threads and spills past 128 per thread."""
    if cfg["BLOCK_M"] < 16 or cfg["BLOCK_N"] < 16:
        return f"BLOCK_M={cfg['BLOCK_M']}, BLOCK_N={cfg['BLOCK_N']}: fp8 tl.dot needs tiles of at least 16"
    return rule_dot_k(cfg, problem) or rule_mma_registers(cfg, problem)


register(Variant(
    name="moe_w4a8", kind="moe", op="moe", fn=run_moe_w4a8,
    space={"BLOCK_M": (16, 32, 64, 128, 256), "BLOCK_N": (64, 128, 256), "BLOCK_K": (64, 128), "num_warps": (4, 8),
           "num_stages": (2, 3, 4)},
    defaults={"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3},
    rules=(rule_pow2("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps"), rule_block_k_multiple_of_32, _rule_fp8_tiles),
    description="moe_tc's grouped GEMM on fp8 tensor cores (sm_90 wgmma e4m3): x to E4M3 with one scale per token, "
                "weights decoded to E4M3 with one per row, the SwiGLU output stored as E4M3; lossy in the activations",
    extra={"lossy_activations": True},
))
