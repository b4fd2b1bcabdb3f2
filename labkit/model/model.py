"""GPT-OSS forward pass: prefill and decode over a static KV cache, greedy sampling, instrumented.

Pre-norm blocks: x += attention(norm(x)); x += moe(norm(x)). The residual stream is bf16 (as in OpenAI's
reference), norms and softmaxes fp32. Each residual add runs in the launch of the norm after it (the MoE
output's in the next layer's attention norm, or the final norm; the attention output's in the router's), so
the attention range holds the previous MoE's add and the router range the attention's. Every layer and
component runs inside a named range (labkit.model.nvtx_ranges) and reports its output to hooks, which is how
the divergence finder captures per-component outputs. A decode step has static shapes and no host sync, so
with graph-safe backends it can be captured as a CUDA graph (labkit.model.graph).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

import kernels

from .attention import attention, attention_kernels, kv_head_map
from .backends import Backends, make_lm_head, make_moe
from .cache import KVCache
from .config import ModelConfig
from .faults import apply_weight_faults
from .moe import dense_gates
from .nvtx_ranges import rng
from .weights import Weights, experts_in_layout

#: A hook receives (layer or None for model-level outputs, component name, tensor).
Hook = Callable[[int | None, str, torch.Tensor], None]


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32 with a learned scale, returned in x's dtype."""
    xf = x.to(torch.float32)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * scale).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, scale: torch.Tensor,
                 eps: float, *, settled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, its RMSNorm) in torch ops (x itself when residual is None); see kernels.add_rms_norm
    (settled is its PDL hint and means nothing here)."""
    s = x if residual is None else x + residual
    return s, rms_norm(s, scale, eps)


#: up to this many rows the triton backend runs norm + router linear as one kernels.router_logits launch;
#: beyond it (prefill) a norm launch and a cuBLAS GEMM serve better than every program redoing the norm.
ROUTER_FUSED_MAX_ROWS = 16


class _HookHandle:
    def __init__(self, hooks: list, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class GptOss:
    """A GPT-OSS model over given weights with switchable MoE and lm_head backends.

    Weight faults in config.faults are applied here (as a buggy loader would have); the caller's weights are
    not modified, so one Weights object can serve a correct and a faulty model side by side.

    A layout other than "rows" with the triton MoE: the experts are tiled and/or shuffled here, once
    (weights.experts_in_layout), into the model's own LayerWeights, so the caller's (and any reference model
    built over them) keep row-major experts; own_weights=True says the caller hands its weights over and holds
    no other reference, and then they are converted in place, so only one copy of the experts is ever held on
    the GPU (profile.load_model; tiling on a GPU goes through host memory, see weights._tile_through_host).
    A reference built over this model's weights (GptOss(m.config, m.weights, ...), profile's parity check)
    shares the tiled experts; the torch MoE reads them one expert at a time (weights.expert_rows).
    """

    def __init__(self, config: ModelConfig, weights: Weights, backends: Backends | None = None, *,
                 own_weights: bool = False):
        self.config = config
        self.backends = backends or Backends()
        self.weights = apply_weight_faults(weights, config.faults)
        if self.backends.layout != "rows" and self.backends.moe == "triton":
            # new layer objects already when faults were applied: those are this model's own
            self.weights = experts_in_layout(self.weights, self.backends.layout,
                                             in_place=own_weights or self.weights is not weights)
        self.device = weights.device
        self.moe = make_moe(self.backends, config)
        self.lm_head = make_lm_head(self.backends, self.weights.unembedding)
        self.kv_map = kv_head_map(config).to(self.device)
        if self.backends.attention == "triton":
            self._attention, self._add_norm = attention_kernels, kernels.add_rms_norm
        else:
            self._attention, self._add_norm = attention, add_rms_norm
        self._hooks: list[Hook] = []
        #: launch the lab's kernels with programmatic dependent launch (Hopper; LAB_PDL=0 turns it off)
        self.pdl = kernels._triton.HOPPER and os.environ.get("LAB_PDL", "") != "0"

    # ----------------------------------------------------------------------------------------------------
    # hooks

    def add_hook(self, fn: Hook) -> _HookHandle:
        """Call fn(layer, component, tensor) for every component output; usable as a context manager."""
        self._hooks.append(fn)
        return _HookHandle(self._hooks, fn)

    def _emit(self, layer: int | None, name: str, t: torch.Tensor) -> None:
        for fn in self._hooks:
            fn(layer, name, t)

    # ----------------------------------------------------------------------------------------------------
    # forward

    def _router(self, x: torch.Tensor, a: torch.Tensor, lw, c: ModelConfig):
        """(x + a, its mlp norm t, router logits, t for the MoE kernels or None): the attention residual add,
        the norm and the router linear; with the triton MoE the fused launch also converts t to fp16
        (x_to_f16's plane-major rows), which the decode MoE kernels would otherwise launch for."""
        rows = x.numel() // c.hidden
        if self.backends.attention == "triton" and rows <= ROUTER_FUSED_MAX_ROWS:
            if self.backends.moe == "triton":
                return kernels.router_logits(x, a, lw.mlp_norm, c.norm_eps, lw.gate_w, lw.gate_b, x16=True)
            return (*kernels.router_logits(x, a, lw.mlp_norm, c.norm_eps, lw.gate_w, lw.gate_b), None)
        x, t = self._add_norm(x, a, lw.mlp_norm, c.norm_eps)
        return x, t, F.linear(t, lw.gate_w, lw.gate_b), None

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache.create(self.config, batch, max_len, self.device)

    def forward(self, tokens: torch.Tensor, cache: KVCache, *, all_logits: bool = False) -> torch.Tensor:
        """Run tokens [B, T] at the cache's position and advance it by T.

        Returns fp32 logits for the last position [B, V], or for every position [B, T, V] with all_logits.
        """
        with kernels._triton.pdl_scope(self.pdl):
            return self._forward(tokens, cache, all_logits)

    def _forward(self, tokens: torch.Tensor, cache: KVCache, all_logits: bool) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, seq], got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if B != cache.batch:
            raise ValueError(f"tokens have batch {B} but the cache was made for batch {cache.batch}")
        cache.reserve(T)
        c, w = self.config, self.weights
        emit = self._emit if self._hooks else None
        positions = cache.pos + torch.arange(T, device=tokens.device)
        with rng("embedding"):
            x = F.embedding(tokens, w.embedding)
        if emit:
            emit(None, "embedding", x)
        pending = None  # the last MoE output: its residual add runs fused with the next norm
        # decode with the lab's kernels throughout: the MoE combine too runs inside the next norm's launch
        slots = T == 1 and not emit and self.backends.attention == "triton" and self.backends.moe == "triton"
        for i, lw in enumerate(w.layers):
            with rng(f"layer.{i}"):
                with rng("attention"):
                    # after a MoE, x is router_logits' output from four launches back (see add_rms_norm)
                    x, h = self._add_norm(x, pending, lw.attn_norm, c.norm_eps,
                                          settled=isinstance(pending, kernels.MoESlots))
                    a = self._attention(h, lw, c, i, cache, positions, self.kv_map)
                if emit:
                    emit(i, "attention", a)
                with rng("router"):
                    x, t, logits, t16 = self._router(x, a, lw, c)
                    routing = self.moe.route(logits.reshape(B * T, -1), c)
                if emit:
                    emit(i, "router", dense_gates(routing, c.experts))
                with rng("moe"):
                    m = self.moe.experts(t.reshape(B * T, -1), routing, lw, c,
                                         emit=(lambda n, v, i=i: emit(i, n, v)) if emit else None, x16=t16,
                                         combine=not slots)
                pending = m if isinstance(m, kernels.MoESlots) else m.view(B, T, -1)
                if emit:
                    emit(i, "moe", pending)
                    emit(i, "residual", x + pending)
        cache.pos.add_(T)
        if not all_logits and T > 1:
            x, pending = x[:, -1:], pending[:, -1:] if pending is not None else None
        with rng("final_norm"):
            _, h = self._add_norm(x, pending, w.norm, c.norm_eps, settled=isinstance(pending, kernels.MoESlots))
        if emit:
            emit(None, "final_norm", h)
        with rng("lm_head"):
            logits = self.lm_head(h.reshape(-1, c.hidden)).to(torch.float32)
        logits = logits.view(B, -1, c.vocab)
        if emit:
            emit(None, "logits", logits)
        return logits if all_logits else logits[:, 0]

    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits [B, V] after the prompt tokens [B, T]."""
        return self.forward(tokens, cache)

    def decode_step(self, tokens: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """One greedy step for tokens [B]: (next token ids [B] int64, logits [B, V]). No host sync inside."""
        logits = self.forward(tokens.view(-1, 1), cache)
        with rng("sampling"):
            nxt = logits.argmax(-1)
        return nxt, logits

    @torch.inference_mode()
    def generate(self, prompt: torch.Tensor, steps: int, *, cache: KVCache | None = None) -> torch.Tensor:
        """Greedy continuation of prompt [B, T] by `steps` tokens (eager) -> ids [B, steps]."""
        prompt = prompt.to(self.device)
        if prompt.dim() == 1:
            prompt = prompt[None]
        cache = cache or self.new_cache(prompt.shape[0], prompt.shape[1] + steps)
        nxt = self.prefill(prompt, cache).argmax(-1)
        out = [nxt]
        for _ in range(steps - 1):
            nxt, _ = self.decode_step(nxt, cache)
            out.append(nxt)
        return torch.stack(out, dim=1)[:, :steps]
