"""Static KV cache: preallocated once, written in place, position kept on the device (CUDA-graph safe).

k and v are [layers, batch, max_len, kv_heads, head_dim]; `pos` is a 1-element int64 device tensor (the
next position to write, shared by the batch) that the forward pass reads and advances without a host
sync. `length` mirrors it on the host for capacity checks; whoever advances `pos` outside the model's own
calls (a CUDA-graph replay) advances `length` too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import ModelConfig
from .rope import rope_tables


@dataclass
class KVCache:
    k: torch.Tensor
    v: torch.Tensor
    pos: torch.Tensor  # [1] int64, device
    cos: torch.Tensor  # RoPE tables [max_len, head_dim / 2] fp32
    sin: torch.Tensor
    length: int = 0  # host mirror of pos

    @classmethod
    def create(cls, config: ModelConfig, batch: int, max_len: int, device, dtype=torch.bfloat16) -> KVCache:
        if batch <= 0 or max_len <= 0:
            raise ValueError(f"batch and max_len must be positive, got batch={batch}, max_len={max_len}")
        shape = (config.layers, batch, max_len, config.kv_heads, config.head_dim)
        cos, sin = rope_tables(config, max_len, device)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(1, dtype=torch.int64, device=device), cos, sin)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def reserve(self, n: int) -> None:
        """Check (on the host) that n more positions fit, and count them."""
        if self.length + n > self.max_len:
            raise ValueError(f"KV cache full: {self.length} + {n} positions exceed max_len={self.max_len}")
        self.length += n

    def reset(self, length: int = 0) -> None:
        """Rewind to `length` positions (entries beyond it are masked, not cleared)."""
        if not 0 <= length <= self.max_len:
            raise ValueError(f"length must be in 0..{self.max_len}, got {length}")
        self.pos.fill_(length)
        self.length = length
