"""moe_fused: a decode MoE layer in one launch (x to fp16, mlp1, mlp2 and the combine), moe_h2g's arithmetic.

Why: at one token a gpt-oss-120b layer is 53 MB of weights, 17 us at the H100's read rate, yet moe_h2g's
four launches took 35.6 us. Under Nsight Compute its mlp1 streamed at 1.65 TB/s and its mlp2 at 1.4 TB/s, with
4.8 + 3.0 us of conversion and combine around them (results/20261122T235500-h100-80gb-hbm3-ncu-moe-h2g): each
launch pays its own ramp-up and its own tail, and nothing of mlp2 starts until the last program of mlp1 ends.
Here the stages share one grid: mlp2's programs start while mlp1's tail runs, load their first weight tile,
and only then wait for the activation rows they need.

Work items, in ticket order (kernels/sync.py): T rows of x to fp16 (when no x16 is given), then mlp1's
(sorted position, N tile) items, then mlp2's, then the combine's (token, H tile) items. Items wait on
counters: mlp1 on all of x, an mlp2 item on its chunk's mlp1 tiles, a combine item on the mlp2 tiles of its
token's k chunks. Positions that do not start a BLOCK_M chunk of their expert (see moe._program_rows) do no
work but still signal, so every counter's share per launch is fixed whatever the routing.

The counters live in a small int64 buffer per launch shape (sync.scratch), kept between calls and never
reset: calls with the same shape must run one after the other on one stream (a CUDA graph's replays do).
"""

from __future__ import annotations

import torch

from ._triton import pdl_enter, pdl_launch, reg_cap, tl, triton
from .linear_f16 import plane_words, x16_row
from .moe import MoESlots, _nibbles, _program_rows, act16_scale, h2g_tile
from .prepare import tile_mxfp4
from .sync import scratch, signal_count, take_ticket, wait_count
from .variants import (
    Variant,
    register,
    rule_h2g_words,
    rule_pow2,
    rule_scale_window,
    rule_tiled_k,
)


@triton.jit
def _moe_fused_kernel(x_ptr, x16_ptr, xq_ptr, xs_ptr, ids_ptr, sorted_ptr, offs_ptr, inv_ptr, gate_ptr,
                      w1_ptr, s1_ptr, b1_ptr, w2_ptr, s2_ptr, b2_ptr, act16_ptr, actq_ptr, y_ptr, out_ptr, ctr_ptr,
                      T, S, H, N1, TOPK, alpha, limit, act_scale, PLANE_X, PLANE_A, w1_stride_e, s1_stride_e,
                      w2_stride_e, s2_stride_e, X16: tl.constexpr, COMBINE: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_X: tl.constexpr,
                      BLOCK_H: tl.constexpr, TILED: tl.constexpr, PREFETCH: tl.constexpr, NIB: tl.constexpr = False):
    """One work item per program (module docstring). ctr_ptr: [ticket, x rows done, mlp1 tiles done per sorted
    position (S), mlp2 tiles done per sorted position (S)]. x16_ptr/xq_ptr and act16_ptr/actq_ptr are fp16 and
    int32 views of the same buffers (stores in fp16, h2g_step reads words)."""
    pdl_enter()
    ticket = take_ticket(ctr_ptr)
    tiles1 = tl.cdiv(N1, BLOCK_N)
    tiles2 = tl.cdiv(H, BLOCK_N2)
    n_x = T if X16 else 0
    n1 = n_x + S * tiles1
    n2 = n1 + S * tiles2
    total = n2 + (T * tl.cdiv(H, BLOCK_H) if COMBINE else 0)
    launch = ticket // total
    j = ticket - launch * total
    cnt_x = ctr_ptr + 1
    cnt1 = ctr_ptr + 2
    cnt2 = ctr_ptr + 2 + S
    if j < n_x:  # x row j to plane-major fp16 (as x_to_f16(planes=True))
        x16_row(x_ptr, x16_ptr, xs_ptr, j, H, H, 8 * PLANE_X, 2 * PLANE_X, BLOCK_X, True)
        signal_count(cnt_x)
    elif j < n1:  # mlp1: N tile of sorted position i
        i = (j - n_x) // tiles1
        e, rm, mmask, active = _program_rows(i, ids_ptr, sorted_ptr, offs_ptr, BLOCK_M)
        if active:
            h2g_tile(e, i, rm, mmask, (j - n_x) % tiles1, xq_ptr, xs_ptr, sorted_ptr, offs_ptr, w1_ptr, s1_ptr,
                     b1_ptr, gate_ptr, act16_ptr, N1, H, TOPK, alpha, limit, act_scale, PLANE_X, PLANE_A,
                     w1_stride_e, s1_stride_e, 1, BLOCK_M, BLOCK_N, BLOCK_K, 1, TILED, TILED, PREFETCH, cnt_x,
                     (launch + 1) * T, X16, NIB)
        signal_count(cnt1 + i)
    elif j < n2:  # mlp2: N tile of sorted position i, once its chunk's act rows are all written
        i = (j - n1) // tiles2
        e, rm, mmask, active = _program_rows(i, ids_ptr, sorted_ptr, offs_ptr, BLOCK_M)
        if active:
            h2g_tile(e, i, rm, mmask, (j - n1) % tiles2, actq_ptr, xs_ptr, sorted_ptr, offs_ptr, w2_ptr, s2_ptr,
                     b2_ptr, gate_ptr, y_ptr, H, N1 // 2, TOPK, alpha, limit, act_scale, PLANE_A, 0,
                     w2_stride_e, s2_stride_e, 2, BLOCK_M, BLOCK_N2, BLOCK_K, 1, TILED, False, PREFETCH, cnt1 + i,
                     (launch + 1) * tiles1, True, NIB)
        signal_count(cnt2 + i)
    else:  # combine: H tile of token t, the sum of its k gate-weighted mlp2 rows
        q = j - n2
        t = q // tl.cdiv(H, BLOCK_H)
        rh = (q % tl.cdiv(H, BLOCK_H)) * BLOCK_H + tl.arange(0, BLOCK_H)
        acc = tl.zeros((BLOCK_H,), tl.float32)
        for k in range(0, TOPK):
            p = tl.load(inv_ptr + t * TOPK + k)
            first = tl.load(offs_ptr + tl.load(ids_ptr + t * TOPK + k))
            wait_count(cnt2 + first + (p - first) // BLOCK_M * BLOCK_M, (launch + 1) * tiles2)
            acc += tl.load(y_ptr + p.to(tl.int64) * H + rh, mask=rh < H, other=0.0).to(tl.float32)
        tl.store(out_ptr + t * H + rh, acc.to(tl.bfloat16), mask=rh < H)


def launch_shape(T: int, S: int, N1: int, H: int, bn: int, bn2: int, bh: int, convert: bool, combine: bool):
    """(work items, counters key) of a call: the key holds every number a wait's share depends on. Item counts
    alone collide: with H = 1024, x16 given and the combine on have as many items as x converted in the launch
    and no combine, yet only the second signals the x counter (a shared counter, caught on the H100)."""
    tiles1, tiles2 = triton.cdiv(N1, bn), triton.cdiv(H, bn2)
    items = (T if convert else 0) + S * (tiles1 + tiles2) + (T * triton.cdiv(H, bh) if combine else 0)
    return items, (items, T, S, tiles1, tiles2, convert, combine)


def _run_moe_fused(x, r, p1, b1, p2, b2, alpha, limit, x16=None, combine=True, **cfg):
    T, H = x.shape
    S = r.sorted.numel()
    N1 = p1.shape[1]
    out = torch.empty((T, H), device=x.device, dtype=torch.bfloat16)
    if S == 0:
        return out
    if cfg["TILED"]:
        p1, p2 = tile_mxfp4(p1, deinterleave=True), tile_mxfp4(p2)
    p1, p2 = _nibbles(p1, cfg), _nibbles(p2, cfg)
    if x16 is None:
        xq = torch.empty((T, 8 * plane_words(H)), device=x.device, dtype=torch.float16)
        xs = torch.empty((T,), device=x.device, dtype=torch.float32)
    else:
        xq, xs = x16
    act = torch.empty((S, 8 * plane_words(N1 // 2)), device=x.device, dtype=torch.float16)
    y = torch.empty((S, H), device=x.device, dtype=torch.bfloat16)
    bn, bn2, bh = cfg["BLOCK_N"], cfg["BLOCK_N2"] or cfg["BLOCK_N"], 1024
    items, shape = launch_shape(T, S, N1, H, bn, bn2, bh, x16 is None, combine)
    ctr = scratch(x.device, ("fused", *shape), 2 + 2 * S)
    _moe_fused_kernel[(items,)](
        x, xq, xq.view(torch.int32), xs, r.ids, r.sorted, r.offsets, r.inverse, r.weights, p1.words, p1.scales, b1,
        p2.words, p2.scales, b2, act, act.view(torch.int32), y, out, ctr, T, S, H, N1, r.top_k, float(alpha),
        float(limit), act16_scale(limit), plane_words(H), plane_words(N1 // 2), p1.words.stride(0),
        p1.scales.stride(0), p2.words.stride(0), p2.scales.stride(0), X16=x16 is None, COMBINE=combine,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=bn, BLOCK_N2=bn2, BLOCK_K=cfg["BLOCK_K"],
        BLOCK_X=min(1024, triton.next_power_of_2(H)), BLOCK_H=bh, TILED=p1.tiled, PREFETCH=cfg["PREFETCH"],
        NIB=p1.shuffled,
        num_warps=cfg["num_warps"],
        num_stages=1, **reg_cap(cfg["MAXNREG"]), **pdl_launch())
    return out if combine else MoESlots(y, r.inverse, r.top_k)


register(Variant(
    name="moe_fused", kind="moe", op="moe", fn=_run_moe_fused,
    space={"BLOCK_M": (1, 2, 4, 8), "BLOCK_N": (8, 16, 32, 64), "BLOCK_N2": (None, 8, 16, 32),
           "BLOCK_K": (256, 512, 1024, 2048), "num_warps": (2, 4, 8), "TILED": (False, True),
           "MAXNREG": (None, 80), "PREFETCH": (False, True), "NIB": (False, True)},
    defaults={"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_N2": 8, "BLOCK_K": 1024, "num_warps": 4, "TILED": False,
              "MAXNREG": None, "PREFETCH": False, "NIB": False},
    rules=(rule_pow2("BLOCK_M", "BLOCK_N", "BLOCK_N2", "BLOCK_K", "num_warps"), rule_h2g_words,
           rule_scale_window(0, 253), rule_tiled_k),
    description="decode in one launch: moe_h2g's mlp1 and mlp2 plus the fp16 conversion and the combine as "
                "stages of one grid chained by device counters, so mlp2 streams its weights during mlp1's tail; "
                "MAXNREG caps registers per thread (waiting with a weight tile loaded costs ~16 more than moe_h2g); "
                "NIB: reads shuffle_nibbles' copies (as moe_h2g). moe_h2g's 4-row one-warp programs measured 41-88 "
                "us here against 35.6-37.0 for 16-row four-warp ones at 1 token "
                "(results/20261127T012630-h100-80gb-hbm3-moe-fused-nib)",
))
