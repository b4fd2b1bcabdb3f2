"""Rotary position embedding as GPT-OSS uses it: half-split pairs (i, i + d/2), theta 150000, YaRN.

YaRN (arXiv 2309.00071) blends interpolated and original frequencies with a linear ramp between the
dimensions whose wavelength fits beta_fast and beta_slow times into the original context, and scales cos
and sin by the concentration 0.1 ln(factor) + 1 (which sharpens attention logits by its square).
Tables are built once per cache for every position it can hold and indexed by a device tensor of
positions, so a decode step reads them without a host sync (CUDA-graph safe).
"""

from __future__ import annotations

import math

import torch

from .config import ModelConfig


def yarn_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2] float32, concentration) for the config's YaRN settings."""
    d = config.head_dim
    base = config.rope_theta
    freq = base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    if config.rope_factor <= 1.0:
        return (1.0 / freq).to(torch.float32), 1.0
    half = d / 2
    ctx = config.rope_original_context

    def dim_of(beta: float) -> float:  # dimension whose wavelength fits `beta` times into the context
        return half * math.log(ctx / (beta * 2 * math.pi)) / math.log(base)

    low, high = dim_of(config.rope_beta_fast), dim_of(config.rope_beta_slow)
    if not 0 < low < high < half - 1:
        raise ValueError(f"YaRN ramp [{low:.2f}, {high:.2f}] must lie inside (0, {half - 1}) for head_dim={d}")
    ramp = ((torch.arange(half, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: keep the original frequency (high-frequency dims), 0: interpolate fully
    inv_freq = (1.0 / (config.rope_factor * freq)) * ramp + (1.0 / freq) * keep
    return inv_freq.to(torch.float32), 0.1 * math.log(config.rope_factor) + 1.0


def rope_tables(config: ModelConfig, max_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_len, head_dim / 2] float32 for positions 0..max_len-1, concentration included."""
    inv_freq, conc = yarn_frequencies(config)
    angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return (angles.cos() * conc).to(device), (angles.sin() * conc).to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, pairs: str = "half") -> torch.Tensor:
    """Rotate x [B, T, heads, d] by per-position cos/sin [T, d/2] (computed in fp32, returned in x's dtype).

    pairs="half" rotates (i, i + d/2) as GPT-OSS does; "consecutive" rotates (2i, 2i+1), the classic bug
    (fault rope_pairs).
    """
    xf = x.to(torch.float32)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    if pairs == "half":
        x1, x2 = xf.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)
    if pairs == "consecutive":
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2).to(x.dtype)
    raise ValueError(f"pairs must be 'half' or 'consecutive', got {pairs!r}")
