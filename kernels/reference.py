"""Torch fp32 reference ops every kernel is checked against: dense linear and the GPT-OSS MoE layer.

Slow and simple on purpose; the MoE reference loops over (token, slot) assignments grouped by expert so
that duplicate expert ids for one token simply add two contributions.
"""

from __future__ import annotations

import torch

from .formats import _FLOATS, MXFP4Tensor, _check_tensor, dequantize_mxfp4


def _dense(w, name: str) -> torch.Tensor:
    """fp32 dense view of a weight given as an MXFP4Tensor or a float tensor."""
    if isinstance(w, MXFP4Tensor):
        return dequantize_mxfp4(w, torch.float32)
    _check_tensor(name, w, _FLOATS)
    return w.to(torch.float32)


def reference_linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w.T + bias in fp32; x [M, K], w [N, K] (MXFP4Tensor or float), bias [N] -> [M, N] fp32."""
    _check_tensor("x", x, _FLOATS)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    shape = w.shape if isinstance(w, MXFP4Tensor) else tuple(getattr(w, "shape", ()))
    if len(shape) != 2:
        raise ValueError(f"w must be 2-D [N, K], got shape {tuple(shape)}")
    if x.shape[1] != shape[1]:
        raise ValueError(f"x has K={x.shape[1]} but w has K={shape[1]}")
    y = x.to(torch.float32) @ _dense(w, "w").T
    if bias is not None:
        _check_tensor("bias", bias, _FLOATS)
        if tuple(bias.shape) != (shape[0],):
            raise ValueError(f"bias must have shape ({shape[0]},), got {tuple(bias.shape)}")
        y = y + bias.to(torch.float32)
    return y


def topk_softmax(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-OSS router: top-k logits (descending), then softmax over the k selected -> (ids int32, weights fp32)."""
    _check_tensor("logits", logits, _FLOATS)
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [T, E], got shape {tuple(logits.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k must be between 1 and the number of experts {logits.shape[1]}, got {k}")
    vals, ids = torch.topk(logits.to(torch.float32), k, dim=-1, sorted=True)
    return ids.to(torch.int32), torch.softmax(vals, dim=-1)


def swiglu_gptoss(h: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """GPT-OSS gated activation on interleaved rows: even columns gate, odd columns linear."""
    g = h[..., 0::2].clamp(max=limit)
    lin = h[..., 1::2].clamp(-limit, limit)
    return g * torch.sigmoid(alpha * g) * (lin + 1)


def _routing_ids_weights(routing, num_tokens: int, num_experts: int, k: int | None):
    """Accept router logits [T, E], an (ids, weights) pair, or any object with .ids and .weights."""
    if isinstance(routing, torch.Tensor):
        if routing.dim() != 2 or routing.shape != (num_tokens, num_experts):
            raise ValueError(f"routing logits must have shape ({num_tokens}, {num_experts}), "
                             f"got {tuple(routing.shape)}")
        if k is None:
            raise ValueError("k is required when routing is given as router logits")
        return topk_softmax(routing, k)
    if hasattr(routing, "ids") and hasattr(routing, "weights"):
        ids, weights = routing.ids, routing.weights
    elif isinstance(routing, (tuple, list)) and len(routing) == 2:
        ids, weights = routing
    else:
        raise TypeError("routing must be router logits [T, E], a pair (ids [T, k], weights [T, k]) or a Routing")
    _check_tensor("ids", ids, (torch.int32, torch.int64, torch.int16, torch.uint8))
    _check_tensor("weights", weights, _FLOATS)
    if ids.dim() != 2 or ids.shape[0] != num_tokens or tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(
            f"ids and weights must both have shape ({num_tokens}, k), got {tuple(ids.shape)} and {tuple(weights.shape)}"
        )
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_experts):
        lo, hi = int(ids.min()), int(ids.max())
        raise ValueError(f"ids: expert id out of range 0..{num_experts - 1} (min {lo}, max {hi})")
    return ids, weights.to(torch.float32)


def reference_moe(
    x: torch.Tensor,
    routing,
    w1,
    b1: torch.Tensor,
    w2,
    b2: torch.Tensor,
    *,
    k: int | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """GPT-OSS MoE layer in fp32 (router excluded): x [T, H] -> [T, H].

    routing: router logits [T, E] (then k is required), or (ids [T, k], weights [T, k]), or a Routing.
    w1: [E, 2I, H] with gate/linear rows interleaved, b1 [E, 2I]; w2: [E, H, I], b2 [E, H].
    Per assignment: h = x W1^T + b1, a = swiglu(h), y = a W2^T + b2; output = sum of gate * y.
    """
    _check_tensor("x", x, _FLOATS)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, H], got shape {tuple(x.shape)}")
    s1 = tuple(w1.shape)
    s2 = tuple(w2.shape)
    if len(s1) != 3 or len(s2) != 3:
        raise ValueError(f"w1 must be [E, 2I, H] and w2 [E, H, I], got {s1} and {s2}")
    E, two_i, H = s1
    if H != x.shape[1]:
        raise ValueError(f"x has H={x.shape[1]} but w1 has H={H}")
    if two_i % 2:
        raise ValueError(f"w1: the 2I dimension must be even (interleaved gate/linear rows), got {two_i}")
    if s2 != (E, H, two_i // 2):
        raise ValueError(f"w2 must have shape {(E, H, two_i // 2)} to match w1 {s1}, got {s2}")
    if tuple(b1.shape) != (E, two_i):
        raise ValueError(f"b1 must have shape {(E, two_i)}, got {tuple(b1.shape)}")
    if tuple(b2.shape) != (E, H):
        raise ValueError(f"b2 must have shape {(E, H)}, got {tuple(b2.shape)}")
    ids, weights = _routing_ids_weights(routing, x.shape[0], E, k)

    xf = x.to(torch.float32)
    out = torch.zeros_like(xf)
    flat_ids = ids.reshape(-1).long()
    flat_tok = torch.arange(x.shape[0], device=x.device).repeat_interleave(ids.shape[1])
    flat_w = weights.reshape(-1)
    for e in torch.unique(flat_ids).tolist():
        sel = flat_ids == e
        tok = flat_tok[sel]
        w1e, w2e = _dense(w1[e], "w1"), _dense(w2[e], "w2")
        h = xf[tok] @ w1e.T + b1[e].to(torch.float32)
        y = swiglu_gptoss(h, alpha, limit) @ w2e.T + b2[e].to(torch.float32)
        out.index_add_(0, tok, y * flat_w[sel].unsqueeze(-1))
    return out

