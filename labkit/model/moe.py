"""The GPT-OSS MoE in torch reference math: router top-k then softmax, experts dequantized on demand.

Only the experts a batch touches are dequantized (one at a time, so a 512-token prefill of gpt-oss-120b
never holds more than one dense expert). Math is fp32 (dequantized weights are exact in fp32, activations
upcast from bf16) and the output is cast to bf16; the same numbers as `kernels.reference_moe`, but the
per-assignment intermediates are kept for the divergence finder. Eager only: the expert loop reads the
routed ids on the host. Experts held tiled (a kernel model's layout "tiled", shared with its reference) are
read one expert at a time through weights.expert_rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels import dequantize_mxfp4, dequantize_mxfp8, quantize_mxfp8, swiglu_gptoss, topk_softmax

from .config import ModelConfig
from .faults import softmax_then_topk, swiglu_without_plus1
from .nvtx_ranges import rng
from .weights import LayerWeights, expert_rows

Emit = Callable[[str, torch.Tensor], None]


@dataclass
class TorchRouting:
    """Routing in torch: ids [T, k] int32 and gate weights [T, k] fp32, like kernels.route's .ids/.weights."""

    ids: torch.Tensor
    weights: torch.Tensor


def route_torch(logits: torch.Tensor, config: ModelConfig) -> TorchRouting:
    """Top-k of the router logits, then softmax over the k (or the softmax_before_topk fault)."""
    if "softmax_before_topk" in config.faults:
        return TorchRouting(*softmax_then_topk(logits, config.top_k))
    return TorchRouting(*topk_softmax(logits, config.top_k))


def dense_gates(routing, experts: int) -> torch.Tensor:
    """Routing as a dense [T, E] fp32 matrix of gate weights (zero where an expert is not selected)."""
    ids, w = routing.ids.long(), routing.weights.to(torch.float32)
    return torch.zeros(ids.shape[0], experts, device=w.device).scatter_add_(1, ids, w)


def _mxfp8_roundtrip(a: torch.Tensor) -> torch.Tensor:
    return dequantize_mxfp8(quantize_mxfp8(a))


def moe_torch(x: torch.Tensor, routing, lw: LayerWeights, config: ModelConfig, *, act_format: str = "bf16",
              emit: Emit | None = None) -> torch.Tensor:
    """MoE experts for x [T, H] (router excluded) -> [T, H] in x's dtype.

    act_format "mxfp8" rounds the activations entering each matmul through MXFP8 (W4A8); "bf16" keeps them
    as they are (W4A16). emit, when given, receives "moe.mlp1" (SwiGLU output [T, k, I], what a fused mlp1
    kernel produces) and "moe.mlp2" (expert outputs before gating [T, k, H]).
    """
    if act_format not in ("bf16", "mxfp8"):
        raise ValueError(f"act_format must be 'bf16' or 'mxfp8', got {act_format!r}")
    c = config
    T, H = x.shape
    ids, gates = routing.ids, routing.weights.to(torch.float32)
    k = ids.shape[1]
    act = (lambda h: swiglu_without_plus1(h, c.swiglu_alpha, c.swiglu_limit)) if "swiglu_no_plus1" in c.faults \
        else (lambda h: swiglu_gptoss(h, c.swiglu_alpha, c.swiglu_limit))
    xf = x.to(torch.float32)
    if act_format == "mxfp8":
        xf = _mxfp8_roundtrip(xf)
    flat = ids.reshape(-1).long()
    token = torch.arange(T, device=x.device).repeat_interleave(k)
    mlp1 = xf.new_zeros(T * k, c.intermediate)
    mlp2 = xf.new_zeros(T * k, H)
    for e in torch.unique(flat).tolist():
        sel = (flat == e).nonzero().squeeze(1)
        with rng("moe.mlp1"):
            a = act(xf[token[sel]] @ dequantize_mxfp4(expert_rows(lw.w1, e)).T + lw.b1[e])
            mlp1[sel] = a
        with rng("moe.mlp2"):
            if act_format == "mxfp8":
                a = _mxfp8_roundtrip(a)
            mlp2[sel] = a @ dequantize_mxfp4(expert_rows(lw.w2, e)).T + lw.b2[e]
    if emit is not None:
        emit("moe.mlp1", mlp1.view(T, k, -1))
        emit("moe.mlp2", mlp2.view(T, k, H))
    return (mlp2.view(T, k, H) * gates[..., None]).sum(1).to(x.dtype)
