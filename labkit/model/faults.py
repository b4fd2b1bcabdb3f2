"""Fault injection: the classic bugs that make a new GPT-OSS implementation print gibberish.

Each fault is a named switch in `ModelConfig.faults`. Compute faults are applied at their code site (grep
for the name); weight faults reproduce what a loader with that bug hands the model and are applied to the
expert weights when the model is built, whatever their source (synthetic or a checkpoint). The divergence
finder must name `shows_in` as the first component that departs from a correct model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kernels import MXFP4Tensor, repack_mxfp4


@dataclass(frozen=True)
class Fault:
    name: str
    bug: str
    shows_in: str  # the component the divergence finder should name first


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("gqa_mod", "query head h reads kv head h % kv_heads instead of h // (q_heads / kv_heads)", "attention"),
    Fault("rope_pairs", "RoPE rotates consecutive pairs (2i, 2i+1) instead of the half split (i, i + d/2)",
          "attention"),
    Fault("sinks_dropped", "the per-head sink logit is left out of the attention softmax", "attention"),
    Fault("softmax_before_topk", "router takes softmax over all experts, then the top-k of the probabilities "
          "(gates no longer renormalized over the k)", "router"),
    Fault("swiglu_no_plus1", "SwiGLU multiplies by the clamped linear half without the +1", "moe.mlp1"),
    Fault("ggml_as_openai", "expert bytes in ggml nibble order (j, j+16) read as openai order (2j, 2j+1)",
          "moe.mlp1"),
    Fault("scale_bias_128", "E8M0 scale bytes decoded with bias 128 instead of 127 (every expert weight halved)",
          "moe.mlp1"),
)}

#: Faults that change the weights (the loader's bugs) rather than the forward code.
WEIGHT_FAULTS = frozenset({"ggml_as_openai", "scale_bias_128"})
#: Faults inside the MoE math that only the torch MoE backend can express (the kernel fuses that math).
TORCH_MOE_FAULTS = frozenset({"softmax_before_topk", "swiglu_no_plus1"})


def check_faults(faults) -> frozenset:
    """Validate fault names; returns them as a frozenset."""
    if isinstance(faults, str):
        faults = {faults}
    faults = frozenset(faults or ())
    unknown = sorted(faults - FAULTS.keys())
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known faults: {', '.join(FAULTS)}")
    return faults


def _faulty_expert(q: MXFP4Tensor, faults: frozenset) -> MXFP4Tensor:
    if "ggml_as_openai" in faults:
        g = repack_mxfp4(q, "ggml")  # the bytes a GGUF file holds ...
        q = MXFP4Tensor(g.blocks, g.scales, q.layout, q.shape)  # ... labelled with the other nibble order
    if "scale_bias_128" in faults:
        # 2^(b-128) == 2^((b-1)-127): the same numbers as decoding byte b-1 correctly (byte 0 cannot go lower).
        scales = (q.scales.to(torch.int16) - 1).clamp(min=0).to(torch.uint8)
        q = MXFP4Tensor(q.blocks, scales, q.layout, q.shape)
    return q


def apply_weight_faults(weights, faults: frozenset):
    """Weights as a loader with the given bugs would produce them (new expert tensors; input untouched)."""
    faults = check_faults(faults) & WEIGHT_FAULTS
    if not faults:
        return weights
    layers = [dataclasses.replace(lw, w1=_faulty_expert(lw.w1, faults), w2=_faulty_expert(lw.w2, faults))
              for lw in weights.layers]
    return dataclasses.replace(weights, layers=layers)


def swiglu_without_plus1(h: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """Fault swiglu_no_plus1: GPT-OSS SwiGLU missing the +1 on the linear half."""
    g = h[..., 0::2].clamp(max=limit)
    return g * torch.sigmoid(alpha * g) * h[..., 1::2].clamp(-limit, limit)


def softmax_then_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fault softmax_before_topk: probabilities over all experts, top-k of them, not renormalized."""
    probs = torch.softmax(logits.to(torch.float32), dim=-1)
    vals, ids = torch.topk(probs, k, dim=-1, sorted=True)
    return ids.to(torch.int32), vals
