"""RMSNorm in one launch (torch spends eight small ones on it), GPT-OSS numerics: fp32 math on the bf16
residual stream, times the learned scale, returned in bf16."""

from __future__ import annotations

import torch

from ._triton import tl, triton
from .formats import _check_tensor


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, H, eps, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    rh = tl.arange(0, BLOCK_H)
    hm = rh < H
    x = tl.load(x_ptr + row * H + rh, mask=hm, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(w_ptr + rh, mask=hm, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * H + rh, (x * r * w).to(tl.bfloat16), mask=hm)


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [..., H] (bf16) with scale [H] -> bf16."""
    _check_tensor("x", x, (torch.bfloat16,))
    H = x.shape[-1]
    if tuple(scale.shape) != (H,):
        raise ValueError(f"scale must have shape ({H},), got {tuple(scale.shape)}")
    x = x.contiguous()
    y = torch.empty_like(x)
    rows = x.numel() // H if H else 0
    if rows:
        _rms_norm_kernel[(rows,)](x, scale, y, H, float(eps), BLOCK_H=triton.next_power_of_2(H), num_warps=4)
    return y
