"""Greedy decode loop, replayed as a CUDA graph where the backends allow it.

The captured step reads the static token buffer, runs the model over the static KV cache (position on the
device), takes the argmax and writes it back into the token buffer, so consecutive replays decode
autoregressively with no host work between them. Without a GPU, or with eager-only backends (the torch
MoE), the same step runs eagerly.
"""

from __future__ import annotations

import torch

from .cache import KVCache
from .model import GptOss


class DecodeRunner:
    def __init__(self, model: GptOss, cache: KVCache, *, use_graph: bool | None = None, warmup: int = 2):
        self.model, self.cache = model, cache
        gpu = model.device.type == "cuda"
        if use_graph is None:
            use_graph = gpu and model.backends.graph_safe
        if use_graph and not gpu:
            raise ValueError("use_graph=True needs the model on a CUDA device")
        if use_graph and not model.backends.graph_safe:
            raise ValueError(f"backends {model.backends.label()} cannot be captured in a CUDA graph "
                             "(the torch MoE reads routed ids on the host); use moe='triton'")
        self.use_graph = use_graph
        self.tokens = torch.zeros(cache.batch, dtype=torch.int64, device=model.device)
        self.graph = None
        self._warmup = warmup

    def _step(self) -> torch.Tensor:
        nxt, _ = self.model.decode_step(self.tokens, self.cache)
        self.tokens.copy_(nxt)
        return nxt

    def capture(self) -> None:
        """Warm up (compiles kernels) and capture one step; the cache position is restored afterwards."""
        if not self.use_graph or self.graph is not None:
            return
        start, start_len = self.cache.pos.clone(), self.cache.length
        saved = self.tokens.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(self._warmup):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.inference_mode():
            self._step()
        self.cache.pos.copy_(start)
        self.cache.length = start_len
        self.tokens.copy_(saved)

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        """Decode one token per sequence; returns the (static) buffer holding the new ids [B]."""
        if self.use_graph:
            self.capture()
            self.cache.reserve(1)
            self.graph.replay()
        else:
            self._step()
        return self.tokens

    @torch.inference_mode()
    def run(self, first: torch.Tensor, steps: int) -> torch.Tensor:
        """Decode `steps` tokens after `first` [B] (the last sampled ids) -> ids [B, steps]."""
        self.tokens.copy_(first.view(-1))
        out = torch.empty(steps, self.cache.batch, dtype=torch.int64, device=self.model.device)
        for i in range(steps):
            out[i].copy_(self.step())
        return out.T
