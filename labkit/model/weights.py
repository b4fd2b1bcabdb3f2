"""GPT-OSS weights: the in-memory form every loader produces, its checks, and seeded synthetic weights.

Canonical tensor names are OpenAI's checkpoint names (`block.N.mlp.mlp1_weight` ...); loaders for other
formats translate to them. Dtypes: embedding, attention, router and lm_head BF16; norm scales, sinks and
expert biases FP32 (lossless from BF16 checkpoints, exact for GGUF's F32); expert weights `MXFP4Tensor`
in openai layout, w1 [E, 2I, H] with gate/linear rows interleaved, w2 [E, H, I].
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass, fields

import torch

from kernels import E2M1_VALUES, MX_BLOCK, MXFP4Tensor, PreparedMXFP4, in_layout, shuffle_nibbles, tile_mxfp4
from kernels.prepare import shuffle_words

from .config import ModelConfig

#: LayerWeights field -> OpenAI checkpoint name under `block.{n}.`
LAYER_NAMES = {
    "attn_norm": "attn.norm.scale",
    "qkv_w": "attn.qkv.weight",
    "qkv_b": "attn.qkv.bias",
    "sinks": "attn.sinks",
    "out_w": "attn.out.weight",
    "out_b": "attn.out.bias",
    "mlp_norm": "mlp.norm.scale",
    "gate_w": "mlp.gate.weight",
    "gate_b": "mlp.gate.bias",
    "w1": "mlp.mlp1_weight",
    "b1": "mlp.mlp1_bias",
    "w2": "mlp.mlp2_weight",
    "b2": "mlp.mlp2_bias",
}
#: Weights field -> OpenAI checkpoint name
TOP_NAMES = {"embedding": "embedding.weight", "norm": "norm.scale", "unembedding": "unembedding.weight"}
_FP32 = {"attn_norm", "sinks", "mlp_norm", "b1", "b2", "norm"}


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [H] fp32
    qkv_w: torch.Tensor  # [(Hq + 2 Hkv) d, H] bf16: q rows, then k, then v
    qkv_b: torch.Tensor  # [(Hq + 2 Hkv) d] bf16
    sinks: torch.Tensor  # [Hq] fp32
    out_w: torch.Tensor  # [H, Hq d] bf16
    out_b: torch.Tensor  # [H] bf16
    mlp_norm: torch.Tensor  # [H] fp32
    gate_w: torch.Tensor  # [E, H] bf16 (router)
    gate_b: torch.Tensor  # [E] bf16
    w1: MXFP4Tensor  # [E, 2I, H] (a PreparedMXFP4 in a model built with another layout: experts_in_layout)
    b1: torch.Tensor  # [E, 2I] fp32
    w2: MXFP4Tensor  # [E, H, I] (likewise)
    b2: torch.Tensor  # [E, H] fp32


@dataclass
class Weights:
    embedding: torch.Tensor  # [V, H] bf16
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H] fp32
    unembedding: torch.Tensor  # [V, H] bf16 (untied lm_head)

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    def to(self, device) -> Weights:
        """A copy on another device."""
        layers = [LayerWeights(**{f.name: getattr(lw, f.name).to(device) for f in fields(LayerWeights)})
                  for lw in self.layers]
        return Weights(self.embedding.to(device), layers, self.norm.to(device), self.unembedding.to(device))

    def nbytes(self) -> int:
        """Bytes held (MXFP4 experts counted packed; tiled ones with their padding)."""
        total = 0
        for t in self.named().values():
            if isinstance(t, PreparedMXFP4):
                total += t.words.nbytes + t.scales.nbytes  # blocks views the words' bytes
            else:
                total += t.nbytes if isinstance(t, MXFP4Tensor) else t.numel() * t.element_size()
        return total

    def named(self) -> dict:
        """Every tensor under its OpenAI checkpoint name (MXFP4 experts as MXFP4Tensor)."""
        out = {TOP_NAMES[k]: getattr(self, k) for k in TOP_NAMES}
        for n, lw in enumerate(self.layers):
            out.update({f"block.{n}.{LAYER_NAMES[f.name]}": getattr(lw, f.name) for f in fields(LayerWeights)})
        return out


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """OpenAI name -> logical shape of every tensor of `config` (MXFP4 tensors: logical [..., K])."""
    c = config
    H, I, E, V = c.hidden, c.intermediate, c.experts, c.vocab
    layer = {
        "attn_norm": (H,), "qkv_w": (c.qkv_dim, H), "qkv_b": (c.qkv_dim,), "sinks": (c.q_heads,),
        "out_w": (H, c.q_heads * c.head_dim), "out_b": (H,), "mlp_norm": (H,), "gate_w": (E, H), "gate_b": (E,),
        "w1": (E, 2 * I, H), "b1": (E, 2 * I), "w2": (E, H, I), "b2": (E, H),
    }
    out = {"embedding.weight": (V, H), "norm.scale": (H,), "unembedding.weight": (V, H)}
    for n in range(c.layers):
        out.update({f"block.{n}.{LAYER_NAMES[k]}": s for k, s in layer.items()})
    return out


def is_mxfp4_name(name: str) -> bool:
    return name.endswith((".mlp1_weight", ".mlp2_weight"))


_FIELD_OF = {v: k for k, v in {**LAYER_NAMES, **TOP_NAMES}.items()}


def field_of(name: str) -> str | None:
    """The Weights/LayerWeights field an OpenAI name stands for (None for names GPT-OSS does not have)."""
    if name.startswith("block."):
        parts = name.split(".", 2)
        return _FIELD_OF.get(parts[2]) if len(parts) == 3 and parts[1].isdigit() else None
    return _FIELD_OF.get(name)


def target_dtype(name: str) -> torch.dtype:
    return torch.float32 if field_of(name) in _FP32 else torch.bfloat16


def weights_from_named(config: ModelConfig, tensors: dict, source: dict[str, str] | None = None,
                       device: torch.device | str | None = None) -> Weights:
    """Build Weights from {OpenAI name: tensor or MXFP4Tensor}, checking names and shapes.

    source maps a name to where it came from (a checkpoint tensor name) so errors name what the user has.
    """
    source = source or {}
    want = expected_shapes(config)
    missing = [n for n in want if n not in tensors]
    if missing:
        raise ValueError(f"missing tensor {source.get(missing[0], missing[0])}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unknown = [n for n in tensors if n not in want]
    if unknown:
        raise ValueError(f"unknown tensor {source.get(unknown[0], unknown[0])} for {config.name}")
    conv = {}
    for name, shape in want.items():
        t, where = tensors[name], source.get(name, name)
        if is_mxfp4_name(name):
            if not isinstance(t, MXFP4Tensor):
                raise TypeError(f"{where}: expected MXFP4 blocks and scales, got a dense {type(t).__name__}")
            if t.shape != shape:
                raise ValueError(f"{where}: shape {t.shape} but {config.name} expects {shape}")
            if t.layout != "openai":
                raise ValueError(f"{where}: expected openai nibble layout, got {t.layout!r} (repack it first)")
            conv[name] = t.to(device) if device is not None else t
            continue
        if isinstance(t, MXFP4Tensor) or not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: expected a dense tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{where}: shape {tuple(t.shape)} but {config.name} expects {shape}")
        if not t.is_floating_point():
            raise TypeError(f"{where}: expected a floating-point tensor, got {t.dtype}")
        conv[name] = t.to(device=device, dtype=target_dtype(name))
    layers = [LayerWeights(**{k: conv[f"block.{n}.{v}"] for k, v in LAYER_NAMES.items()})
              for n in range(config.layers)]
    return Weights(**{k: conv[v] for k, v in TOP_NAMES.items()}, layers=layers)


# --------------------------------------------------------------------------------------------------------
# Experts held tiled and/or shuffled (Backends.layout other than "rows")


def experts_in_layout(weights: Weights, layout: str, *, in_place: bool = False) -> Weights:
    """Weights whose experts are held in `layout` (kernels.in_layout; "tiled": tile_mxfp4's layout, w1
    deinterleaved for mlp1, w2 as is; "+nib": shuffle_nibbles' copy of that or of the rows).

    in_place: the given Weights and LayerWeights get the tiled experts, so once the caller holds no other
    reference the row-major ones are freed (gpt-oss-120b's experts do not fit twice on an 80 GB GPU); on a
    GPU tiling goes through host memory (_tile_through_host) and "+nib" shuffles there one weight at a time
    (a copy the size of the weight it frees). Otherwise new LayerWeights are made and the
    caller's keep their row-major experts (which then also reach the tiled copies through the prepare_mxfp4 /
    tile_mxfp4 caches: both are held for as long as the caller keeps its weights). Already tiled experts are
    kept as they are.
    """
    if in_place and weights.device.type == "cuda":
        if layout.startswith("tiled"):
            _tile_through_host(weights)
        if layout.endswith("+nib"):  # on the GPU, one weight at a time: each copy the size of the one it frees
            for lw in weights.layers:
                lw.w1, lw.w2 = shuffle_nibbles(lw.w1), shuffle_nibbles(lw.w2)
        return weights
    if not in_place:
        weights = dataclasses.replace(weights, layers=[dataclasses.replace(lw) for lw in weights.layers])
    for lw in weights.layers:
        lw.w1 = in_layout(lw.w1, layout, deinterleave=True)
        lw.w2 = in_layout(lw.w2, layout)
    return weights


def _tile_through_host(weights: Weights) -> None:
    """In-place tiling on a GPU: every tensor to host memory (GPU copies dropped, the allocator's cache
    emptied), the experts tiled on the host one at a time, everything uploaded again.

    Why not tile on the GPU layer by layer: small tensors (biases) share the allocator's segments with the
    row-major experts, so a freed expert's memory stays cached, and kept tiled tensors (a little larger, and
    placed into those blocks and among tile_mxfp4's temporaries) leave holes: gpt-oss-120b ran out of memory
    on the H100 at layer 30 of 36 with 13.9 GB reserved but unallocated. Uploading into an emptied pool with no
    frees in between leaves none. Costs host memory for the weights and a CPU pass over the experts at load.
    """
    device = weights.device
    owners = [weights, *weights.layers]
    names = [[f.name for f in fields(o) if f.name != "layers"] for o in owners]
    for o, ns in zip(owners, names):
        for n in ns:
            t = getattr(o, n)
            setattr(o, n, t.to("cpu") if isinstance(t, (torch.Tensor, MXFP4Tensor)) else t)
    torch.cuda.empty_cache()
    for o, ns in zip(owners, names):
        for n in ns:
            t = getattr(o, n)
            if isinstance(o, LayerWeights) and n in ("w1", "w2"):
                q = tile_mxfp4(t, deinterleave=n == "w1")
                words = q.words.to(device)
                t = dataclasses.replace(q, words=words, blocks=words.view(torch.uint8), scales=q.scales.to(device))
            setattr(o, n, t.to(device) if isinstance(t, (torch.Tensor, MXFP4Tensor)) else t)


def expert_rows(w: MXFP4Tensor | PreparedMXFP4, e: int) -> MXFP4Tensor:
    """Expert e of a stacked [E, N, K] weight as a row-major MXFP4Tensor, whatever layout it is held in.

    Why: a kernel model with layout "tiled" holds only tiled experts, and the torch reference built over the
    same weights (profile's parity check) reads them through this exact inverse of tile_mxfp4, one expert
    at a time, instead of a second full row-major copy.
    """
    if isinstance(w, MXFP4Tensor):
        return w[e]
    N, K = w.shape[-2:]
    blocks, scales = w.blocks[e], w.scales[e]
    if w.shuffled:  # shuffle_nibbles moved bits inside each word (shuffle_words): move them back first
        words = w.words[e]
        blocks = shuffle_words(words.reshape(-1, words.shape[-1]), inverse=True).view(torch.uint8)
        blocks = blocks.reshape(w.blocks[e].shape)
    if w.tiled:  # [G, KC, 16, bytes per chunk] -> [G * 16, KC * bytes per chunk], then drop the padding
        blocks, scales = (t.transpose(-3, -2).reshape(t.shape[0] * t.shape[2], -1) for t in (blocks, scales))
        blocks, scales = blocks[:, :K // 2], scales[:, :K // MX_BLOCK]
        if w.deinterleaved:  # gate rows, padded to whole 16-row groups, then linear rows: interleave again
            half, padded = N // 2, blocks.shape[0] // 2
            blocks, scales = (torch.stack((t[:half], t[padded:padded + half]), 1).reshape(N, -1)
                              for t in (blocks, scales))
        blocks, scales = blocks[:N], scales[:N]
    return MXFP4Tensor(blocks.reshape(N, K // MX_BLOCK, 16).contiguous(), scales.contiguous(), "openai", (N, K))


# --------------------------------------------------------------------------------------------------------
# Synthetic weights


#: RMS of an E2M1 code drawn uniformly from all 16 codes.
_E2M1_RMS = math.sqrt(sum(v * v for v in E2M1_VALUES) / 16)
#: RMS gain of a scale byte drawn uniformly from {c-1, c, c+1} relative to byte c.
_JITTER_RMS = math.sqrt((0.25 + 1 + 4) / 3)


def synthetic_scale_byte(k: int) -> int:
    """Centre E8M0 byte so random MXFP4 rows of length k have RMS ~ 1/sqrt(k) (unit gain per matmul)."""
    return 127 + round(-math.log2(_E2M1_RMS * _JITTER_RMS * math.sqrt(k)))


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    return g


def random_mxfp4(shape: tuple[int, ...], *, seed: int, name: str, device) -> MXFP4Tensor:
    """Random packed bytes and scale bytes drawn directly at full size (no dense copy ever exists)."""
    device = torch.device(device)
    g = _generator(seed, name, device)
    *lead, k = shape
    kb = k // MX_BLOCK
    blocks = torch.randint(0, 256, (*lead, kb, 16), dtype=torch.uint8, generator=g, device=device)
    scales = torch.randint(-1, 2, (*lead, kb), dtype=torch.int16, generator=g, device=device)
    scales = (scales + synthetic_scale_byte(k)).to(torch.uint8)
    return MXFP4Tensor(blocks, scales, "openai", tuple(shape))


def _random_dense(name: str, shape, *, seed: int, device, std: float, mean: float = 0.0) -> torch.Tensor:
    """Checkpoints store everything but the norm scales in BF16, so values are drawn BF16-representable."""
    device = torch.device(device)
    dtype = torch.float32 if name.endswith(".scale") else torch.bfloat16
    t = torch.randn(shape, dtype=dtype, device=device, generator=_generator(seed, name, device))
    return t.mul_(std).add_(mean).to(target_dtype(name))


def _std(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(std, mean) of a synthetic dense tensor: unit-gain linears, small biases, unit-ish norm scales."""
    if name.endswith(".scale"):
        return 0.05, 1.0
    if name.endswith("sinks"):
        return 1.0, 0.0
    if name == "embedding.weight":
        return 1.0, 0.0
    if name.endswith("bias"):
        return 0.02, 0.0
    return 1.0 / math.sqrt(shape[-1]), 0.0


def synthetic_weights(config: ModelConfig, *, seed: int = 0, device="cpu") -> Weights:
    """Deterministic random weights generated on `device` (same seed and device -> same bytes).

    Each tensor has its own generator seeded from (seed, name), so the result does not depend on the order
    of generation. Expert weights are random E2M1 bytes with scale bytes around `synthetic_scale_byte(K)`:
    each matmul keeps activations at about unit RMS, so 36 layers neither explode nor vanish.
    """
    tensors = {}
    for name, shape in expected_shapes(config).items():
        if is_mxfp4_name(name):
            tensors[name] = random_mxfp4(shape, seed=seed, name=name, device=device)
        else:
            std, mean = _std(name, shape)
            tensors[name] = _random_dense(name, shape, seed=seed, device=device, std=std, mean=mean)
    return weights_from_named(config, tensors, device=device)
