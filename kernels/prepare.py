"""Weight preparation: the layout the kernels read, made once at load time and cached on the weight.

Every kernel reads the openai layout. `prepare_mxfp4` repacks a ggml weight (the only copy it may make),
exposes the packed bytes as 32-bit words (8 codes per word, no copy) and records the range of scale bytes,
which decides the variants whose fast decode is exact for this weight (see each variant's scale window).
Call it once after loading; `mxfp4_linear` and `moe_mxfp4` call it themselves on first use and reuse the
cached result, so no call after the first pays for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import MXFP4Tensor, repack_mxfp4

_CACHE_ATTR = "_prepared"


@dataclass(frozen=True)
class PreparedMXFP4:
    """Kernel-ready view of an MXFP4 weight of logical shape [..., N, K].

    blocks: uint8 [..., N, K/2] packed codes (openai order); words: the same bytes as int32 [..., N, K/8];
    scales: uint8 [..., N, K/32]; scale_min/scale_max: the extreme scale bytes (host ints).
    """

    blocks: torch.Tensor
    words: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, ...]
    scale_min: int
    scale_max: int

    @property
    def N(self) -> int:
        return self.shape[-2]

    @property
    def K(self) -> int:
        return self.shape[-1]


def prepare_mxfp4(w: MXFP4Tensor) -> PreparedMXFP4:
    """Kernel-ready layout of w (cached on w: the second call is free)."""
    if not isinstance(w, MXFP4Tensor):
        raise TypeError(f"w must be an MXFP4Tensor, got {type(w).__name__}")
    cached = getattr(w, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    if len(w.shape) < 2:
        raise ValueError(f"w must have at least 2 dimensions [..., N, K], got shape {w.shape}")
    o = repack_mxfp4(w, "openai")
    lead = w.shape[:-1]
    blocks = o.blocks.reshape(*lead, w.K // 2).contiguous()
    scales = o.scales.contiguous()
    if scales.numel():
        smin, smax = int(scales.min()), int(scales.max())
    else:
        smin, smax = 127, 127
    p = PreparedMXFP4(blocks, blocks.view(torch.int32), scales, w.shape, smin, smax)
    object.__setattr__(w, _CACHE_ATTR, p)
    return p
