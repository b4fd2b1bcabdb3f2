"""MoE routing on the device: top-k, softmax over the k selected (GPT-OSS order), and the bookkeeping the
grouped kernels need, all with fixed shapes and no host sync, so a captured graph replays any routing.

Slots are the T*k (token, choice) pairs, numbered t*k + j. Grouped kernels walk slots sorted by expert:
  counts[e]   slots routed to expert e          offsets[e] = sum of counts before e   (offsets[E] = T*k)
  sorted[i]   the slot at position i of the expert-sorted order (stable: ascending slot within an expert)
  inverse[s]  the position of slot s in that order (the combine reads each token's k rows through it)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import _check_tensor
from .reference import topk_softmax


@dataclass(frozen=True)
class Routing:
    """Device-side routing of T tokens to k of E experts (see the module docstring for the fields)."""

    ids: torch.Tensor  # [T, k] int32
    weights: torch.Tensor  # [T, k] float32
    counts: torch.Tensor  # [E] int32
    offsets: torch.Tensor  # [E + 1] int32
    sorted: torch.Tensor  # [T * k] int32
    inverse: torch.Tensor  # [T * k] int32
    num_experts: int

    @property
    def tokens(self) -> int:
        return self.ids.shape[0]

    @property
    def top_k(self) -> int:
        return self.ids.shape[1]

    @classmethod
    def from_ids(cls, ids: torch.Tensor, weights: torch.Tensor, num_experts: int, *, validate: bool = True) -> Routing:
        """Routing from explicit expert ids [T, k] and gate weights [T, k] (the same expert twice for one
        token is allowed). validate=True checks ids are in 0..E-1, which reads them on the host: pass
        False inside graph capture."""
        _check_tensor("ids", ids, (torch.int32, torch.int64, torch.int16, torch.uint8))
        _check_tensor("weights", weights, (torch.float32, torch.bfloat16, torch.float16))
        if ids.dim() != 2 or tuple(weights.shape) != tuple(ids.shape):
            raise ValueError(f"ids and weights must both be [T, k], got {tuple(ids.shape)} and {tuple(weights.shape)}")
        if not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
        if validate and ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= num_experts:
                raise ValueError(f"ids: expert id out of range 0..{num_experts - 1} (min {lo}, max {hi})")
        return _bookkeeping(ids.to(torch.int32), weights.to(torch.float32), num_experts)


def _bookkeeping(ids: torch.Tensor, weights: torch.Tensor, E: int) -> Routing:
    ids, weights = ids.contiguous(), weights.contiguous()
    flat = ids.reshape(-1)
    S = flat.numel()
    counts = torch.zeros(E, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(0, flat.long(), torch.ones_like(flat))
    offsets = torch.zeros(E + 1, dtype=torch.int32, device=ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    # stable sort by expert: key = expert * S + slot is unique, so any sort is stable on it
    key = flat.long() * max(S, 1) + torch.arange(S, device=ids.device)
    order = torch.argsort(key).to(torch.int32)
    inverse = torch.empty(S, dtype=torch.int32, device=ids.device)
    inverse[order.long()] = torch.arange(S, dtype=torch.int32, device=ids.device)
    return Routing(ids, weights, counts, offsets, order, inverse, E)


def route(logits: torch.Tensor, k: int) -> Routing:
    """GPT-OSS routing: top-k of router logits [T, E] (descending), softmax over the k, then bookkeeping.

    Fixed launch shapes and no host reads: safe to capture in a CUDA graph.
    """
    ids, weights = topk_softmax(logits, k)
    return _bookkeeping(ids, weights, logits.shape[1])
