"""Checkpoint loaders: OpenAI safetensors, Hugging Face safetensors and GGUF, into labkit Weights.

Each format is a plan mapping every OpenAI tensor name to the source tensors it is built from:
  openai  the same names; experts as `<name>.blocks` / `<name>.scales`
  hf      `model.layers.N...`; q/k/v projections concatenated into qkv; experts as
          `mlp.experts.gate_up_proj_blocks` / `_scales` (same bytes and interleaving as OpenAI's mlp1)
  gguf    llama.cpp names (`blk.N.attn_q.weight` ...); experts MXFP4 in ggml layout, gate and up stored as
          separate tensors (`ffn_gate_exps`, `ffn_up_exps`) that are interleaved back into w1, then repacked
          to openai nibble order (lossless)
Every error names the offending source tensor: a missing tensor, a `.blocks` without its `.scales` (or the
reverse), a wrong shape or dtype, and any tensor the plan does not use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kernels import MX_BLOCK, MXFP4Tensor, from_ggml, from_openai, repack_mxfp4

from .config import ModelConfig
from .weights import LAYER_NAMES, Weights, expected_shapes, synthetic_weights, weights_from_named

FORMATS = ("openai", "hf", "gguf")


@dataclass(frozen=True)
class Part:
    name: str  # source tensor name (for MXFP4 in safetensors: the blocks name; scales in `scales`)
    shape: tuple[int, ...]  # logical shape
    scales: str | None = None


@dataclass(frozen=True)
class Entry:
    kind: str  # "dense" | "mxfp4"
    parts: tuple[Part, ...]
    combine: str = "one"  # "one" | "cat" (rows concatenated) | "interleave" (rows of the parts alternate)


# --------------------------------------------------------------------------------------------------------
# Sources


class SafetensorsSource:
    """One .safetensors file or a directory of shards, read lazily by name."""

    def __init__(self, path: Path, device):
        from safetensors import safe_open

        self._open = safe_open
        self.path = path
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"no .safetensors files in {path}")
        self.device = str(torch.device(device))
        self.files: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt", device="cpu") as h:
                for k in h.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    self.files[k] = f

    @property
    def names(self) -> set[str]:
        return set(self.files)

    def get(self, name: str) -> torch.Tensor:
        if name not in self.files:
            raise ValueError(f"missing tensor {name} in {self.path}")
        with self._open(str(self.files[name]), framework="pt", device=self.device) as h:
            return h.get_tensor(name)


class GGUFSource:
    """A GGUF file through the `gguf` package: dense tensors dequantized to fp32, MXFP4 kept packed."""

    def __init__(self, path: Path, device):
        import gguf

        self._gguf = gguf
        self.path = path
        self.device = torch.device(device)
        self.reader = gguf.GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}

    @property
    def names(self) -> set[str]:
        return set(self.tensors)

    def _tensor(self, name: str):
        if name not in self.tensors:
            raise ValueError(f"missing tensor {name} in {self.path}")
        return self.tensors[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(self._tensor(name).shape.tolist()))  # ggml ne is fastest-first

    def get(self, name: str) -> torch.Tensor:
        import numpy as np

        t = self._tensor(name)
        try:
            data = self._gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        except NotImplementedError as e:
            raise TypeError(f"{name}: GGUF type {t.tensor_type.name} cannot be read ({e})") from None
        return torch.from_numpy(np.array(data, dtype=np.float32)).reshape(self.shape(name)).to(self.device)

    def get_mxfp4(self, name: str) -> MXFP4Tensor:
        t = self._tensor(name)
        if t.tensor_type != self._gguf.GGMLQuantizationType.MXFP4:
            raise TypeError(f"{name}: expected an MXFP4 tensor, got GGUF type {t.tensor_type.name}")
        import numpy as np

        raw = torch.from_numpy(np.array(t.data, dtype=np.uint8))
        return from_ggml(raw.reshape(*self.shape(name)[:-1], -1).to(self.device))


# --------------------------------------------------------------------------------------------------------
# Plans


def _layer_plan(config: ModelConfig, n: int, fmt: str) -> dict[str, Entry]:
    c = config
    H, I, E = c.hidden, c.intermediate, c.experts
    qd, kd = c.q_heads * c.head_dim, c.kv_heads * c.head_dim

    def dense(name, shape):
        return Entry("dense", (Part(name, shape),))

    if fmt == "openai":
        plan = {}
        for k, shape in _layer_shapes(c).items():
            name = f"block.{n}.{LAYER_NAMES[k]}"
            plan[k] = (Entry("mxfp4", (Part(f"{name}.blocks", shape, f"{name}.scales"),)) if k in ("w1", "w2")
                       else dense(name, shape))
        return plan
    if fmt == "hf":
        p = f"model.layers.{n}"
        return {
            "attn_norm": dense(f"{p}.input_layernorm.weight", (H,)),
            "qkv_w": Entry("dense", (Part(f"{p}.self_attn.q_proj.weight", (qd, H)),
                                     Part(f"{p}.self_attn.k_proj.weight", (kd, H)),
                                     Part(f"{p}.self_attn.v_proj.weight", (kd, H))), "cat"),
            "qkv_b": Entry("dense", (Part(f"{p}.self_attn.q_proj.bias", (qd,)),
                                     Part(f"{p}.self_attn.k_proj.bias", (kd,)),
                                     Part(f"{p}.self_attn.v_proj.bias", (kd,))), "cat"),
            "sinks": dense(f"{p}.self_attn.sinks", (c.q_heads,)),
            "out_w": dense(f"{p}.self_attn.o_proj.weight", (H, qd)),
            "out_b": dense(f"{p}.self_attn.o_proj.bias", (H,)),
            "mlp_norm": dense(f"{p}.post_attention_layernorm.weight", (H,)),
            "gate_w": dense(f"{p}.mlp.router.weight", (E, H)),
            "gate_b": dense(f"{p}.mlp.router.bias", (E,)),
            "w1": Entry("mxfp4", (Part(f"{p}.mlp.experts.gate_up_proj_blocks", (E, 2 * I, H),
                                       f"{p}.mlp.experts.gate_up_proj_scales"),)),
            "b1": dense(f"{p}.mlp.experts.gate_up_proj_bias", (E, 2 * I)),
            "w2": Entry("mxfp4", (Part(f"{p}.mlp.experts.down_proj_blocks", (E, H, I),
                                       f"{p}.mlp.experts.down_proj_scales"),)),
            "b2": dense(f"{p}.mlp.experts.down_proj_bias", (E, H)),
        }
    p = f"blk.{n}"
    return {
        "attn_norm": dense(f"{p}.attn_norm.weight", (H,)),
        "qkv_w": Entry("dense", (Part(f"{p}.attn_q.weight", (qd, H)), Part(f"{p}.attn_k.weight", (kd, H)),
                                 Part(f"{p}.attn_v.weight", (kd, H))), "cat"),
        "qkv_b": Entry("dense", (Part(f"{p}.attn_q.bias", (qd,)), Part(f"{p}.attn_k.bias", (kd,)),
                                 Part(f"{p}.attn_v.bias", (kd,))), "cat"),
        "sinks": dense(f"{p}.attn_sinks.weight", (c.q_heads,)),
        "out_w": dense(f"{p}.attn_output.weight", (H, qd)),
        "out_b": dense(f"{p}.attn_output.bias", (H,)),
        "mlp_norm": dense(f"{p}.post_attention_norm.weight", (H,)),
        "gate_w": dense(f"{p}.ffn_gate_inp.weight", (E, H)),
        "gate_b": dense(f"{p}.ffn_gate_inp.bias", (E,)),
        "w1": Entry("mxfp4", (Part(f"{p}.ffn_gate_exps.weight", (E, I, H)), Part(f"{p}.ffn_up_exps.weight", (E, I, H))),
                    "interleave"),
        "b1": Entry("dense", (Part(f"{p}.ffn_gate_exps.bias", (E, I)), Part(f"{p}.ffn_up_exps.bias", (E, I))),
                    "interleave"),
        "w2": Entry("mxfp4", (Part(f"{p}.ffn_down_exps.weight", (E, H, I)),)),
        "b2": dense(f"{p}.ffn_down_exps.bias", (E, H)),
    }


def _layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {k: expected_shapes(config.replace(layers=1))[f"block.0.{v}"] for k, v in LAYER_NAMES.items()}


_TOP = {
    "openai": {"embedding.weight": "embedding.weight", "norm.scale": "norm.scale",
               "unembedding.weight": "unembedding.weight"},
    "hf": {"embedding.weight": "model.embed_tokens.weight", "norm.scale": "model.norm.weight",
           "unembedding.weight": "lm_head.weight"},
    "gguf": {"embedding.weight": "token_embd.weight", "norm.scale": "output_norm.weight",
             "unembedding.weight": "output.weight"},
}


def plan(config: ModelConfig, fmt: str) -> dict[str, Entry]:
    """OpenAI name -> how to build it from a checkpoint in format fmt."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    shapes = expected_shapes(config)
    out = {name: Entry("dense", (Part(src, shapes[name]),)) for name, src in _TOP[fmt].items()}
    for n in range(config.layers):
        for k, entry in _layer_plan(config, n, fmt).items():
            out[f"block.{n}.{LAYER_NAMES[k]}"] = entry
    return out


# --------------------------------------------------------------------------------------------------------
# Reading


def _check_shape(name: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"{name}: shape {tuple(got)} but the config expects {tuple(want)}")


def _read_dense(src, part: Part) -> torch.Tensor:
    t = src.get(part.name)
    if not t.is_floating_point():
        raise TypeError(f"{part.name}: expected a floating-point tensor, got {t.dtype}")
    _check_shape(part.name, t.shape, part.shape)
    return t


def _read_mxfp4_safetensors(src, part: Part) -> MXFP4Tensor:
    bname, sname = part.name, part.scales
    has_b, has_s = bname in src.names, sname in src.names
    if not has_b and not has_s:
        raise ValueError(f"missing tensor {bname} (and {sname}) in {src.path}")
    if not has_s:
        raise ValueError(f"{bname} has no matching scales tensor {sname} in {src.path}")
    if not has_b:
        raise ValueError(f"{sname} has no matching blocks tensor {bname} in {src.path}")
    blocks, scales = src.get(bname), src.get(sname)
    *lead, k = part.shape
    for name, t, want in ((bname, blocks, (*lead, k // MX_BLOCK, 16)), (sname, scales, (*lead, k // MX_BLOCK))):
        if t.dtype != torch.uint8:
            raise TypeError(f"{name}: expected uint8 MXFP4 bytes, got {t.dtype}")
        _check_shape(name, t.shape, want)
    try:
        return from_openai(blocks, scales)
    except ValueError as e:
        raise ValueError(f"{sname}: {e}") from None


def _read_mxfp4_gguf(src, part: Part) -> MXFP4Tensor:
    _check_shape(part.name, src.shape(part.name), part.shape)
    try:
        return repack_mxfp4(src.get_mxfp4(part.name), "openai")
    except ValueError as e:
        raise ValueError(f"{part.name}: {e}") from None


def _combine(kind: str, combine: str, parts: list):
    if combine == "one":
        return parts[0]
    if kind == "dense":
        if combine == "cat":
            return torch.cat(parts, dim=0)
        return torch.stack(parts, dim=-1).flatten(-2)  # interleave along the last (row) axis of [E, I]
    # MXFP4 rows interleaved: [E, I, H] gate and up -> [E, 2I, H] with gate rows even, up rows odd
    g, u = parts
    blocks = torch.stack((g.blocks, u.blocks), dim=2).flatten(1, 2)
    scales = torch.stack((g.scales, u.scales), dim=2).flatten(1, 2)
    return MXFP4Tensor(blocks, scales, g.layout, (g.shape[0], 2 * g.shape[1], g.shape[2]))


def detect_format(path: str | Path) -> str:
    """'gguf' for a .gguf file; 'hf' or 'openai' for safetensors, from the tensor names."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no checkpoint at {p}")
    if p.suffix == ".gguf":
        return "gguf"
    names = SafetensorsSource(p, "cpu").names
    if any(n.startswith(("model.layers.", "model.embed_tokens")) for n in names):
        return "hf"
    if any(n.startswith(("block.", "embedding.")) for n in names):
        return "openai"
    raise ValueError(f"{p}: cannot tell the checkpoint format from its tensor names; pass format=")


def load_checkpoint(path: str | Path, config: ModelConfig, *, format: str = "auto", device="cpu") -> Weights:
    """Load a GPT-OSS checkpoint (OpenAI or HF safetensors, file or directory; or GGUF) for `config`."""
    p = Path(path)
    fmt = detect_format(p) if format == "auto" else format
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of auto, {', '.join(FORMATS)}, got {format!r}")
    src = GGUFSource(p, device) if fmt == "gguf" else SafetensorsSource(p, device)
    tensors, where, used = {}, {}, set()
    for name, entry in plan(config, fmt).items():
        if entry.kind == "mxfp4":
            read = _read_mxfp4_gguf if fmt == "gguf" else _read_mxfp4_safetensors
        else:
            read = _read_dense
        tensors[name] = _combine(entry.kind, entry.combine, [read(src, part) for part in entry.parts])
        where[name] = " + ".join(part.name for part in entry.parts)
        used.update(part.name for part in entry.parts)
        used.update(part.scales for part in entry.parts if part.scales)
    unknown = sorted(src.names - used)
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise ValueError(f"unknown tensor {unknown[0]}{more} in {p}: not part of {config.name} as the {fmt} "
                         f"loader reads it")
    return weights_from_named(config, tensors, where, device=device)



def load_weights(config: ModelConfig, source: str | Path = "synthetic", *, seed: int = 0, device="cpu") -> Weights:
    """'synthetic' (seeded random weights generated on the device) or a checkpoint path."""
    if str(source) == "synthetic":
        return synthetic_weights(config, seed=seed, device=device)
    return load_checkpoint(source, config, device=device)
