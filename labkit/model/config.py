"""GPT-OSS model configuration: the published shapes (DESIGN.md "GPT-OSS facts") and a tiny CPU preset.

One frozen dataclass carries everything a forward pass depends on, including the injected faults, so two
model variants differ only by their config and backends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kernels import MX_BLOCK

from .faults import check_faults


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of one GPT-OSS model (names follow OpenAI's reference config)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    sliding_window: int = 128  # on even layers (layer % 2 == 0); odd layers attend to the whole context
    rope_theta: float = 150000.0
    rope_factor: float = 32.0  # YaRN scaling factor
    rope_original_context: int = 4096
    rope_beta_fast: float = 32.0  # YaRN ramp ends (OpenAI's rope_ntk_beta / rope_ntk_alpha)
    rope_beta_slow: float = 1.0
    norm_eps: float = 1e-5
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    faults: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        for name in ("layers", "hidden", "intermediate", "experts", "top_k", "q_heads", "kv_heads", "head_dim",
                     "vocab"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("hidden", "intermediate"):
            if getattr(self, name) % MX_BLOCK:
                raise ValueError(f"{name}={getattr(self, name)} must be a multiple of {MX_BLOCK} (MXFP4 blocks)")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads={self.q_heads} must be a multiple of kv_heads={self.kv_heads} (GQA)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k={self.top_k} must be between 1 and experts={self.experts}")
        if self.sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0, got {self.sliding_window}")
        object.__setattr__(self, "faults", check_faults(self.faults))

    @property
    def group(self) -> int:
        """Query heads per kv head: query head h reads kv head h // group."""
        return self.q_heads // self.kv_heads

    @property
    def qkv_dim(self) -> int:
        return self.head_dim * (self.q_heads + 2 * self.kv_heads)

    def window(self, layer: int) -> int:
        """Sliding window of a layer in tokens (0: full causal attention)."""
        return self.sliding_window if layer % 2 == 0 else 0

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def with_faults(self, *faults: str) -> ModelConfig:
        return self.replace(faults=frozenset(faults))


_GPT_OSS = {"hidden": 2880, "intermediate": 2880, "top_k": 4, "q_heads": 64, "kv_heads": 8, "head_dim": 64,
            "vocab": 201088}

PRESETS: dict[str, ModelConfig] = {
    "gpt-oss-20b": ModelConfig("gpt-oss-20b", layers=24, experts=32, **_GPT_OSS),
    "gpt-oss-120b": ModelConfig("gpt-oss-120b", layers=36, experts=128, **_GPT_OSS),
    # CPU-sized: every mechanism of the real model (GQA 4:1, sinks, sliding window on even layers, YaRN
    # RoPE, top-k routing, MXFP4 experts), small enough for the test suite.
    "tiny": ModelConfig("tiny", layers=4, hidden=64, intermediate=64, experts=8, top_k=2, q_heads=8, kv_heads=2,
                        head_dim=16, vocab=256, sliding_window=8),
}


def get_config(name: str | ModelConfig, **overrides) -> ModelConfig:
    """A preset by name (gpt-oss-20b, gpt-oss-120b, tiny), optionally with fields replaced."""
    if isinstance(name, ModelConfig):
        cfg = name
    elif name in PRESETS:
        cfg = PRESETS[name]
    else:
        raise ValueError(f"model must be one of {', '.join(PRESETS)}, got {name!r}")
    if "faults" in overrides:
        overrides["faults"] = frozenset([overrides["faults"]] if isinstance(overrides["faults"], str)
                                        else overrides["faults"])
    return cfg.replace(**overrides) if overrides else cfg
