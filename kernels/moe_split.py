"""moe_split: a decode MoE layer whose programs each stream a single K tile (split-K), moe_h2g's arithmetic.

Why: the read rate a launch reaches depends on how long its programs live. Over one token's mlp1 weights of
gpt-oss-120b (35 MB), one program per 8 KB block reads at 2.6 TB/s, while gemv_h2g's programs, each looping
over a 16-row tile's three K tiles, reach 1.65 TB/s, which is moe_h2g's rate (.device/stream_size.py,
results/20261123T162422-h100-80gb-hbm3-stream-size). The idea: short programs that hold little keep more loads
in flight per SM through the whole launch, ramp and tail included. Measured, it is slower than moe_h2g (40.1
against 35.7 us at one token, results/20261123T165415-h100-80gb-hbm3-moe-split): its mlp1 reads at 1.60 TB/s
with the schedulers half busy issuing the h2g arithmetic (results/20261123T165700-h100-80gb-hbm3-ncu-stalls-
moe-split), so the per-byte work, not the programs' length, holds these kernels below the read rate.

Program (K split, sorted position i, N tile) of each GEMM computes its BLOCK_N rows' products for the
BLOCK_M tokens of an expert's chunk (moe._program_rows) over one BLOCK_K slice of K, scaled as moe_h2g does,
and adds them with fp32 atomics into a scratch [positions, N] (sync.scratch: zeroed once, kept). Then it
counts itself on the tile's counter (a barrier, one acq_rel atomic: sync's release pattern); the program that
completes the count of K splits reads the sums back while zeroing them (atomic exchange, so the scratch is
clean for the next call) and runs moe_h2g's epilogue: bias and SwiGLU into plane-major fp16 act (mlp1), bias
and gate into y (mlp2), then the usual combine. Counters are never reset: a tile is complete when its count
reaches a multiple of the splits.

The sums arrive in any order, so results are not bit-reproducible from call to call (fp32 rounding of the
partial sums; within moe_h2g's tolerance). Calls sharing a scratch (same device and shape) must run one
after the other on one stream, as CUDA-graph replays do.
"""

from __future__ import annotations

import torch

from ._triton import pdl_enter, pdl_launch, tl, triton
from .decode import F16_TRICK
from .linear_f16 import h2g_pointers, h2g_tail_loads, plane_words, x_to_f16
from .moe import MoESlots, _epilogue, _program_rows, _source_rows, act16_scale, h2g_tokens
from .sync import add_partial, scratch
from .variants import Variant, register, rule_block_k_multiple_of_32, rule_h2g_words, rule_pow2, rule_scale_window


@triton.jit
def _moe_split_kernel(xq_ptr, xs_ptr, ids_ptr, sorted_ptr, offs_ptr, w_ptr, s_ptr, b_ptr, gate_ptr, out_ptr, sum_ptr,
                      ctr_ptr, N, K, TOPK, alpha, limit, act_scale, PLANE, OUT_PLANE, w_stride_e, s_stride_e,
                      PHASE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One K slice of one (position chunk, N tile); the last of the tile's slices runs the epilogue. mlp2 reads
    its routing before the PDL wait, as moe_h2g's does."""
    if PHASE == 1:
        pdl_enter()
    split = tl.program_id(0)  # slices fastest: a row tile's slices are read together, whole rows in turn
    i = tl.program_id(1)
    pid_n = tl.program_id(2)
    if BLOCK_M == 1:  # every position is its own chunk: no offsets to load before the weights' address
        e = tl.load(ids_ptr + tl.load(sorted_ptr + i))
        rm = i + tl.arange(0, 1)
        mmask = rm >= 0
        active = True
    else:
        e, rm, mmask, active = _program_rows(i, ids_ptr, sorted_ptr, offs_ptr, BLOCK_M)
    if PHASE == 2:
        pdl_enter()
    if active:
        G: tl.constexpr = BLOCK_K // 32
        TW: tl.constexpr = BLOCK_K // 8
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rn_c = tl.minimum(rn, N - 1)
        KW = K // 8
        word = tl.arange(0, TW)[None, :] + 0 * rn_c[:, None]
        rg = tl.arange(0, G)
        wp, sp = h2g_pointers(w_ptr + e.to(tl.int64) * w_stride_e, s_ptr + e.to(tl.int64) * s_stride_e, rn_c, word,
                              rg, N, K, False)
        k0 = split * TW  # this slice's first word
        if BLOCK_M == 1:
            last = i
        else:
            last = tl.load(offs_ptr + e + 1) - 1
        acc = tl.zeros((BLOCK_N, G, BLOCK_M), tl.float32)
        if k0 + TW <= KW:
            v = tl.load(wp + k0).to(tl.uint32, bitcast=True)
            s = tl.load(sp + split * G)
            acc = h2g_tokens(acc, v, s, xq_ptr, k0, word, word, sorted_ptr, i, last, TOPK, PLANE, PHASE, BLOCK_M, G,
                             False)
        else:  # the K tail
            wm, v, s = h2g_tail_loads(wp + k0, sp + split * G, word, rg, split, K, TW, G)
            acc = h2g_tokens(acc, v, s, xq_ptr, k0, word, wm, sorted_ptr, i, last, TOPK, PLANE, PHASE, BLOCK_M, G,
                             True)
        slots, src = _source_rows(sorted_ptr, rm, mmask, TOPK, PHASE)
        if PHASE == 1:
            xs = tl.load(xs_ptr + src)
        else:
            xs = tl.zeros((BLOCK_M,), tl.float32) + 1.0 / act_scale
        part = tl.trans(tl.sum(acc, axis=1)) * (xs * (F16_TRICK * 0.5))[:, None]  # 0.5: h2g_step doubles scales
        amask = mmask[:, None] & (rn < N)[None, :]
        sums = sum_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]
        last, total = add_partial(sums, part, amask, ctr_ptr + i.to(tl.int64) * tl.num_programs(2) + pid_n,
                                  tl.num_programs(0))
        if last:  # the tile's last slice: the complete sums, the scratch left zeroed
            _epilogue(total, rm, rn, mmask, rn < N, e, slots, b_ptr, gate_ptr, out_ptr, N, alpha, limit, PHASE,
                      BLOCK_N, PHASE == 1, act_scale, OUT_PLANE)


def _launch(phase, xq, xs, r, p, b, out, alpha, limit, act_scale, block_n, cfg):
    E, N, K = p.shape
    S = r.sorted.numel()
    grid = (triton.cdiv(K, cfg["BLOCK_K"]), S, triton.cdiv(N, block_n))
    key = ("split", phase, S, N, K, *grid, cfg["BLOCK_M"], cfg["BLOCK_K"])
    sums = scratch(xq.device, key, S * N, torch.float32)
    ctr = scratch(xq.device, key, S * grid[2])
    _moe_split_kernel[grid](xq.view(torch.int32), xs, r.ids, r.sorted, r.offsets, p.words, p.scales, b, r.weights,
                            out, sums, ctr, N, K, r.top_k, float(alpha), float(limit), act_scale, plane_words(K),
                            plane_words(N // 2), p.words.stride(0), p.scales.stride(0), PHASE=phase,
                            BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, BLOCK_K=cfg["BLOCK_K"],
                            num_warps=cfg["num_warps"], **pdl_launch())


def run_moe_split(x, r, p1, b1, p2, b2, alpha, limit, x16=None, combine=True, *, BLOCK_M, BLOCK_N, BLOCK_K,
                  num_warps=4, BLOCK_N2=None):
    """Launcher (moe_mxfp4's contract): x to plane-major fp16 (or the x16 given), mlp1 and mlp2 as split-K
    launches over BLOCK_K slices (BLOCK_N2: mlp2's row tile, None: BLOCK_N), then the combine."""
    T, H = x.shape
    S = r.sorted.numel()
    I2 = p1.shape[1]
    if S == 0:
        return torch.empty((T, H), device=x.device, dtype=torch.bfloat16)
    scale = act16_scale(limit)
    xq, xs = x16 if x16 is not None else x_to_f16(x, planes=True)
    act = torch.empty((S, 8 * plane_words(I2 // 2)), device=x.device, dtype=torch.float16)
    y = torch.empty((S, H), device=x.device, dtype=torch.bfloat16)
    cfg = {"BLOCK_M": BLOCK_M, "BLOCK_K": BLOCK_K, "num_warps": num_warps}
    _launch(1, xq, xs, r, p1, b1, act, alpha, limit, scale, BLOCK_N, cfg)
    _launch(2, act, xs, r, p2, b2, y, alpha, limit, scale, BLOCK_N2 or BLOCK_N, cfg)
    slots = MoESlots(y, r.inverse, r.top_k)
    return slots.combine() if combine else slots


def _rule_rows(cfg, problem):
    """mlp1's SwiGLU pairs interleaved gate/linear rows inside one program's tile."""
    if cfg["BLOCK_N"] < 2:
        return "BLOCK_N must hold a gate/linear row pair (>= 2)"
    return None


register(Variant(
    name="moe_split", kind="moe", op="moe", fn=run_moe_split,
    space={"BLOCK_M": (1, 2, 4), "BLOCK_N": (8, 16, 32), "BLOCK_N2": (None, 8, 16, 32),
           "BLOCK_K": (256, 512, 1024, 2048), "num_warps": (1, 2, 4)},
    defaults={"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_N2": None, "BLOCK_K": 1024, "num_warps": 4},
    rules=(rule_pow2("BLOCK_M", "BLOCK_N", "BLOCK_N2", "BLOCK_K", "num_warps"), rule_block_k_multiple_of_32,
           rule_h2g_words, rule_scale_window(0, 253), _rule_rows),
    description="decode: moe_h2g's arithmetic split over K, one K tile per program (short programs keep more "
                "loads in flight), fp32 atomic partial sums; the last slice of a tile runs the epilogue",
))
