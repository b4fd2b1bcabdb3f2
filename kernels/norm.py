"""RMSNorm on the residual stream, GPT-OSS numerics: fp32 math on the bf16 stream, times the learned scale,
returned in bf16. Each function is one launch where torch spends several:

  rms_norm       y = norm(x)                                           (torch: eight small kernels)
  add_rms_norm   s = x + r rounded to bf16 (the residual add), y = norm(s)   -> (s, y)
  router_logits  add_rms_norm, then the router's linear on y: logits = y @ W^T + b (bf16)   -> (s, y, logits)
                 (x16=True: also the MoE's fp16 input, x_to_f16(y, planes=True), as a fourth item)

The decode step of GPT-OSS spends a launch on every one of these small steps (profiled on the H100: residual
add 1.9 us, norm 2.6 us, router linear 4.4 us plus a 1.8 us split-K reduce), so folding them matters more
than the arithmetic, and so does the number of dependent memory round trips inside each: every kernel here
loads its whole row (and router_logits its gate rows) in one round, which is why rows are limited to 32768.
router_logits gives each program a few experts and lets every program recompute the norm (H values, from L2)
instead of a second launch; program 0 stores s and y.
"""

from __future__ import annotations

import torch

from ._triton import pdl_enter, pdl_launch, tl, triton
from .formats import _check_tensor
from .linear_f16 import plane_words, store_x16_planes
from .moe import MoESlots


@triton.jit
def _summed_row(x_ptr, r_ptr, inv_ptr, w_ptr, row, H, eps, HAS_RES: tl.constexpr, GATHER: tl.constexpr,
                BLOCK_H: tl.constexpr, SETTLED: tl.constexpr, GATHER_P2: tl.constexpr = 1):
    """(rh, mask, s, y): the whole row in one load round (latency, not bandwidth, is what a decode norm costs):
    s = x (+ r, rounded to bf16 like torch's x + r) as fp32, y = RMSNorm(s) * scale as bf16. GATHER = k > 0:
    r is a MoESlots' rows, and this row's r is the fp32 sum of rows inv[row*k + j], j < k, rounded to bf16
    (what MoESlots.combine stores).

    Waits for the previous kernel (pdl_enter) after loading the scale (a weight), and with SETTLED after x
    and the slots' inverse map too (the caller guarantees they were written at least two launches back)."""
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    w = tl.load(w_ptr + rh, mask=hm, other=0.0).to(tl.float32)
    if not SETTLED:
        pdl_enter()
    s = tl.load(x_ptr + row * H + rh, mask=hm, other=0.0)
    if HAS_RES and GATHER > 0:
        rj = tl.arange(0, GATHER_P2)
        pj = tl.load(inv_ptr + row * GATHER + rj, mask=rj < GATHER, other=0).to(tl.int64)
    if SETTLED:
        pdl_enter()
    if HAS_RES:
        if GATHER > 0:
            m = tl.zeros((BLOCK_H,), tl.float32)
            for j in tl.static_range(GATHER):
                pos = tl.sum(tl.where(rj == j, pj, 0), axis=0)
                m += tl.load(r_ptr + pos * H + rh, mask=hm, other=0.0).to(tl.float32)
            r = m.to(tl.bfloat16)
        else:
            r = tl.load(r_ptr + row * H + rh, mask=hm, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(tl.bfloat16)
    s = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / H + eps)
    return rh, hm, s, (s * inv * w).to(tl.bfloat16)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, inv_ptr, w_ptr, s_ptr, y_ptr, H, eps, HAS_RES: tl.constexpr,
                     GATHER: tl.constexpr, GATHER_P2: tl.constexpr, BLOCK_H: tl.constexpr, SETTLED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    rh, hm, s, y = _summed_row(x_ptr, r_ptr, inv_ptr, w_ptr, row, H, eps, HAS_RES, GATHER, BLOCK_H, SETTLED,
                               GATHER_P2)
    if HAS_RES:
        tl.store(s_ptr + row * H + rh, s.to(tl.bfloat16), mask=hm)
    tl.store(y_ptr + row * H + rh, y, mask=hm)


@triton.jit
def _router_kernel(x_ptr, r_ptr, w_ptr, s_ptr, y_ptr, gw_ptr, gb_ptr, out_ptr, xq_ptr, xs_ptr, H, E, eps, PLANE,
                   HAS_RES: tl.constexpr, X16: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """The gate rows, biases and norm scale (weights) load before the PDL wait, which _summed_row issues;
    x and r after it."""
    row = tl.program_id(0).to(tl.int64)
    pe = tl.program_id(1)
    re = pe * BLOCK_E + tl.arange(0, BLOCK_E)
    em = re < E
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    g = tl.load(gw_ptr + re[:, None].to(tl.int64) * H + rh[None, :], mask=em[:, None] & hm[None, :], other=0.0)
    bias = tl.load(gb_ptr + re, mask=em, other=0.0).to(tl.float32)
    rh, hm, s, y = _summed_row(x_ptr, r_ptr, r_ptr, w_ptr, row, H, eps, HAS_RES, 0, BLOCK_H, False)
    if pe == 0:
        if HAS_RES:
            tl.store(s_ptr + row * H + rh, s.to(tl.bfloat16), mask=hm)
        tl.store(y_ptr + row * H + rh, y, mask=hm)
        if X16:
            store_x16_planes(xq_ptr, xs_ptr, row, y, rh, H, PLANE)
    logits = tl.sum(g.to(tl.float32) * y.to(tl.float32)[None, :], axis=1) + bias
    tl.store(out_ptr + row * E + re, logits.to(tl.bfloat16), mask=em)


def _check_norm_args(x, residual, scale):
    _check_tensor("x", x, (torch.bfloat16,))
    H = x.shape[-1]
    if tuple(scale.shape) != (H,):
        raise ValueError(f"scale must have shape ({H},), got {tuple(scale.shape)}")
    if isinstance(residual, MoESlots):
        if residual.shape != (x.numel() // H if H else 0, H):
            raise ValueError(f"residual MoESlots of shape {residual.shape} do not match x {tuple(x.shape)}")
    elif residual is not None:
        _check_tensor("residual", residual, (torch.bfloat16,))
        if residual.shape != x.shape:
            raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
        residual = residual.contiguous()
    x = x.contiguous()
    return x, residual, H, x.numel() // H if H else 0


def _row_launch(H: int, at_least: int = 1) -> dict:
    """BLOCK_H (the whole row, and at least `at_least`) and warps for the one-round row kernels."""
    block = triton.next_power_of_2(max(H, at_least, 1))
    if block > 32768:
        raise ValueError(f"rows of {H} values are wider than these one-pass norm kernels handle (32768)")
    return {"BLOCK_H": block, "num_warps": 4 if block <= 2048 else 8 if block <= 8192 else 16}


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [..., H] (bf16) with scale [H] -> bf16."""
    return add_rms_norm(x, None, scale, eps)[1]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | MoESlots | None, scale: torch.Tensor,
                 eps: float, *, settled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, norm(s)) for s = x + residual in bf16 (s is x itself when residual is None), one launch.

    x, residual [..., H] bf16, scale [H]. The same numbers as torch's `s = x + residual` then rms_norm(s).
    residual may be a MoE layer's MoESlots (moe_mxfp4(combine=False)): its combine then runs in this launch.
    settled=True promises that x (and the slots' inverse map) were written at least two launches back, so
    under PDL they are read before waiting for the previous kernel (the model's decode norms after a MoE).
    """
    x, residual, H, rows = _check_norm_args(x, residual, scale)
    slots = residual if isinstance(residual, MoESlots) else None
    s = x if residual is None else torch.empty_like(x)
    y = torch.empty_like(x)
    if rows:
        r = slots.rows if slots is not None else residual if residual is not None else x
        _rms_norm_kernel[(rows,)](x, r, slots.inverse if slots is not None else r, scale, s, y, H, float(eps),
                                  HAS_RES=residual is not None, GATHER=slots.top_k if slots is not None else 0,
                                  GATHER_P2=triton.next_power_of_2(slots.top_k) if slots is not None else 1,
                                  SETTLED=settled, **_row_launch(H), **pdl_launch())
    return s, y


def router_logits(x: torch.Tensor, residual: torch.Tensor | None, scale: torch.Tensor, eps: float,
                  gate_w: torch.Tensor, gate_b: torch.Tensor, *, block_e: int = 4,
                  x16: bool = False) -> tuple[torch.Tensor, ...]:
    """(s, y, logits): add_rms_norm(x, residual, scale, eps) and the router linear y @ gate_w^T + gate_b in
    one launch. gate_w [E, H] and gate_b [E] (bf16 or fp32); logits [..., E] bf16 like torch's F.linear in bf16.
    x16=True also returns x_to_f16(y, planes=True) as a fourth item, (xq, xs) for moe_mxfp4(x16=...): the
    MoE's fp16 input without a launch of its own.

    Every program recomputes the row's norm and dots it with block_e experts' rows, so the grid is
    rows x E / block_e: meant for decode (a few rows); prefill is better served by rms_norm + a GEMM.
    """
    if isinstance(residual, MoESlots):
        raise TypeError("router_logits takes a dense residual (the attention output), not MoESlots")
    x, residual, H, rows = _check_norm_args(x, residual, scale)
    if gate_w.dim() != 2 or gate_w.shape[1] != H:
        raise ValueError(f"gate_w must be [E, {H}], got {tuple(gate_w.shape)}")
    E = gate_w.shape[0]
    if tuple(gate_b.shape) != (E,):
        raise ValueError(f"gate_b must have shape ({E},), got {tuple(gate_b.shape)}")
    if block_e < 1 or block_e & (block_e - 1):
        raise ValueError(f"block_e must be a power of two, got {block_e}")
    s = x if residual is None else torch.empty_like(x)
    y = torch.empty_like(x)
    logits = torch.empty((*x.shape[:-1], E), device=x.device, dtype=torch.bfloat16)
    width = 8 * plane_words(H)  # fp16 per x16 row (4 planes)
    xq = torch.empty((rows, width if x16 else 0), device=x.device, dtype=torch.float16)
    xs = torch.empty((rows if x16 else 0,), device=x.device, dtype=torch.float32)
    if rows:
        _router_kernel[(rows, triton.cdiv(E, block_e))](
            x, residual if residual is not None else x, scale, s, y, gate_w.contiguous(), gate_b.contiguous(), logits,
            xq if x16 else y, xs if x16 else y, H, E, float(eps), width // 4, HAS_RES=residual is not None, X16=x16,
            BLOCK_E=block_e, **_row_launch(H, width if x16 else 1), **pdl_launch())
    return (s, y, logits, (xq, xs)) if x16 else (s, y, logits)
