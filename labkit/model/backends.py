"""The backend seam: where the model chooses between the lab's kernels and their torch references.

Three switchable components, each built once per model:

  attention "torch"      torch ops (RMSNorm, RoPE, masked softmax over the cache): the readable reference
            "triton"     the residual stream's kernels too (model.py: kernels.add_rms_norm, and up to 16 rows
                         kernels.router_logits), kernels.qkv_rope_kv_write (the qkv GEMV with RoPE and the
                         cache writes), kernels.attention_sinks and the out projection through
                         kernels.linear_bf16 (attention.py): 5 launches for attention and router together at
                         decode, where the torch ops take ~50

  MoE      "torch"       router top-k/softmax in torch, experts by reference math (labkit.model.moe), eager only
           "torch-w4a8"  the same with activations rounded through MXFP8 (W4A8 numerics study)
           "triton"      kernels.route(logits, k) then kernels.moe_mxfp4(x, routing, w1, b1, w2, b2,
                         alpha=, limit=): graph-capturable
  lm_head  "bf16"        torch linear on the BF16 weight
           "mxfp4-torch" weight quantized to MXFP4 at load, dequantized once, torch linear (reference math)
           "mxfp4"       weight quantized to MXFP4 at load, kernels.mxfp4_linear(h, w)

Weight layout of the MXFP4 kernels, chosen once when the model is built (kernels/prepare.py):
  layout   "rows"        row-major (prepare_mxfp4), what every kernel config reads
           "tiled"       tile_mxfp4: the triton MoE's w1 (deinterleave=True) and w2 and the mxfp4 lm_head's weight
                         are held tiled, and moe_mxfp4 / mxfp4_linear pick from the TILED configs' auto tables.
                         The model holds one copy: its layers get the tiled experts, not the row-major ones
                         (weights.experts_in_layout; in place when the model owns its weights, GptOss(own_weights=True)
                         as profile.load_model builds it, on a GPU through host memory).
                         Only the kernel backends read it: with moe="torch"/"torch-w4a8" or a bf16/mxfp4-torch
                         lm_head those parts stay as they are (the torch MoE reads tiled experts that a kernel
                         model shares with it, one expert untiled at a time: weights.expert_rows).
           "rows+nib",   either, held as shuffle_nibbles' copy (kernels.in_layout): the NIB configs' auto tables
           "tiled+nib"   (9 instead of 15 decode instructions per weight word); the same rules otherwise.

Kernel functions are imported when a backend is built, so the model imports (and runs its torch backends)
before the kernels exist.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import HELD_LAYOUTS, ROUNDINGS, MXFP4Tensor, dequantize_mxfp4, in_layout, quantize_mxfp4

from .config import ModelConfig
from .faults import TORCH_MOE_FAULTS
from .moe import TorchRouting, moe_torch, route_torch

ATTENTION_BACKENDS = ("torch", "triton")
MOE_BACKENDS = ("torch", "torch-w4a8", "triton")
LM_HEAD_BACKENDS = ("bf16", "mxfp4-torch", "mxfp4")


@dataclass(frozen=True)
class Backends:
    moe: str = "torch"
    lm_head: str = "bf16"
    lm_head_rounding: str = "floor"  # scale rule when the lm_head is quantized to MXFP4 at load
    attention: str = "torch"
    layout: str = "rows"  # weight layout of the MXFP4 kernels (see the module docstring)
    lm_head_layout: str = ""  # the mxfp4 lm_head's own layout; "" follows `layout`

    def __post_init__(self):
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention!r}")
        if self.moe not in MOE_BACKENDS:
            raise ValueError(f"moe backend must be one of {', '.join(MOE_BACKENDS)}, got {self.moe!r}")
        if self.lm_head not in LM_HEAD_BACKENDS:
            raise ValueError(f"lm_head backend must be one of {', '.join(LM_HEAD_BACKENDS)}, got {self.lm_head!r}")
        if self.lm_head_rounding not in ROUNDINGS:
            raise ValueError(f"lm_head_rounding must be one of {', '.join(ROUNDINGS)}, got {self.lm_head_rounding!r}")
        if self.layout not in HELD_LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(HELD_LAYOUTS)}, got {self.layout!r}")
        if self.lm_head_layout not in ("", *HELD_LAYOUTS):
            raise ValueError(f"lm_head_layout must be one of {', '.join(HELD_LAYOUTS)} (or empty: layout's), "
                             f"got {self.lm_head_layout!r}")

    @property
    def head_layout(self) -> str:
        """The layout the mxfp4 lm_head's weight is held in."""
        return self.lm_head_layout or self.layout

    @property
    def graph_safe(self) -> bool:
        """True when a decode step can be captured in a CUDA graph (the torch MoE reads ids on the host)."""
        return self.moe == "triton"

    def label(self) -> str:
        rounding = f"/{self.lm_head_rounding}" if self.lm_head != "bf16" else ""
        attention = "attention=triton," if self.attention == "triton" else ""  # runs before it had torch attention
        layout = f",layout={self.layout}" if self.layout != "rows" else ""  # row-major runs keep their old labels
        if self.lm_head == "mxfp4" and self.head_layout != self.layout:
            layout += f",lm_head_layout={self.head_layout}"
        return f"{attention}moe={self.moe},lm_head={self.lm_head}{rounding}{layout}"

    def reference(self) -> Backends:
        """The torch backends computing the same numbers (what parity checks compare against); they read
        row-major weights (the layout changes where bytes sit, not the numbers)."""
        return Backends(moe="torch-w4a8" if self.moe == "torch-w4a8" else "torch",
                        lm_head="bf16" if self.lm_head == "bf16" else "mxfp4-torch",
                        lm_head_rounding=self.lm_head_rounding, attention="torch", layout="rows")


def resolve_backends(moe: str = "auto", lm_head: str = "auto", rounding: str = "floor", device=None,
                     attention: str = "auto", layout: str = "rows", lm_head_layout: str = "") -> Backends:
    """'auto': the lab's kernels on a GPU (attention=triton, moe=triton, lm_head=mxfp4), their torch reference
    on a CPU (attention=torch, moe=torch, lm_head=mxfp4-torch). layout is taken as given (no 'auto')."""
    gpu = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")).type == "cuda"
    if attention == "auto":
        attention = "triton" if gpu else "torch"
    if moe == "auto":
        moe = "triton" if gpu else "torch"
    if lm_head == "auto":
        lm_head = "mxfp4" if gpu else "mxfp4-torch"
    return Backends(moe=moe, lm_head=lm_head, lm_head_rounding=rounding, attention=attention, layout=layout,
                    lm_head_layout=lm_head_layout)


def _import_kernel(name: str, backend: str):
    import kernels

    fn = getattr(kernels, name, None)
    if fn is None:
        raise ImportError(f"backend {backend!r} needs kernels.{name}, which this checkout does not have yet; "
                          f"use the torch backends")
    return fn


# --------------------------------------------------------------------------------------------------------
# MoE


class TorchMoE:
    """Reference MoE: torch routing, experts dequantized on demand (eager only)."""

    def __init__(self, act_format: str = "bf16"):
        self.act_format = act_format

    def route(self, logits: torch.Tensor, config: ModelConfig) -> TorchRouting:
        return route_torch(logits, config)

    def experts(self, x, routing, lw, config, emit=None, x16=None, combine=True) -> torch.Tensor:
        return moe_torch(x, routing, lw, config, act_format=self.act_format, emit=emit)


class TritonMoE:
    """The lab's kernels: kernels.route then kernels.moe_mxfp4 (fused; no per-assignment intermediates)."""

    def __init__(self):
        self._route = _import_kernel("route", "triton")
        self._moe = _import_kernel("moe_mxfp4", "triton")

    def route(self, logits: torch.Tensor, config: ModelConfig):
        return self._route(logits, config.top_k)

    def experts(self, x, routing, lw, config, emit=None, x16=None, combine=True):
        """x16: x already in fp16 (router_logits(x16=True)), saving the MoE kernels' conversion launch;
        combine=False: kernels.MoESlots for kernels.add_rms_norm to combine in its own launch."""
        return self._moe(x, routing, lw.w1, lw.b1, lw.w2, lw.b2, alpha=config.swiglu_alpha, limit=config.swiglu_limit,
                         x16=x16, combine=combine)


def make_moe(backends: Backends, config: ModelConfig):
    torch_only = sorted(config.faults & TORCH_MOE_FAULTS)
    if backends.moe == "triton":
        if torch_only:
            raise ValueError(f"fault(s) {', '.join(torch_only)} live inside the fused MoE kernel; "
                             f"inject them with moe='torch'")
        return TritonMoE()
    return TorchMoE("mxfp8" if backends.moe == "torch-w4a8" else "bf16")


# --------------------------------------------------------------------------------------------------------
# lm_head


def quantize_rows(w: torch.Tensor, rounding: str, chunk: int = 8192) -> MXFP4Tensor:
    """quantize_mxfp4 over row chunks, so a 201088-row lm_head never needs a full fp32 copy."""
    parts = [quantize_mxfp4(w[i:i + chunk], rounding=rounding) for i in range(0, w.shape[0], chunk)]
    return MXFP4Tensor(torch.cat([p.blocks for p in parts]), torch.cat([p.scales for p in parts]), "openai",
                       tuple(w.shape))


def dequantize_rows(q: MXFP4Tensor, dtype=torch.bfloat16, chunk: int = 8192) -> torch.Tensor:
    return torch.cat([dequantize_mxfp4(q[i:i + chunk], dtype) for i in range(0, q.shape[0], chunk)])


class Bf16LmHead:
    def __init__(self, w: torch.Tensor):
        self.weight = w

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.weight)


class TorchMXFP4LmHead:
    """MXFP4 numbers, torch math: the MXFP4 weight dequantized once (exact in bf16)."""

    def __init__(self, w: torch.Tensor, rounding: str):
        self.q = quantize_rows(w, rounding)
        self.weight = dequantize_rows(self.q, w.dtype)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.weight)


class TritonMXFP4LmHead:
    """kernels.mxfp4_linear on the MXFP4 weight; in another layout only that copy is kept (the row-major one,
    and the prepare/tile caches on it, go with the temporary quantize_rows result)."""

    def __init__(self, w: torch.Tensor, rounding: str, layout: str = "rows"):
        self._linear = _import_kernel("mxfp4_linear", "mxfp4")
        self.q = in_layout(quantize_rows(w, rounding), layout)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return self._linear(h, self.q)


def make_lm_head(backends: Backends, weight: torch.Tensor):
    if backends.lm_head == "bf16":
        return Bf16LmHead(weight)
    if backends.lm_head == "mxfp4-torch":
        return TorchMXFP4LmHead(weight, backends.lm_head_rounding)
    return TritonMXFP4LmHead(weight, backends.lm_head_rounding, layout=backends.head_layout)
