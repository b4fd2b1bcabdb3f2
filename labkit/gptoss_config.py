"""GPT-OSS model shapes (DESIGN.md "GPT-OSS facts"), shared by the roofline and, later, the model runs.

Only shapes live here, no weights: the roofline needs layer counts and matrix sizes to count bytes and
flops, and checks them against the published parameter counts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GptOssConfig:
    """Shapes of one GPT-OSS model (from the published config.json and reference code)."""

    name: str
    layers: int
    experts: int
    top_k: int = 4
    hidden: int = 2880
    intermediate: int = 2880      # per expert; mlp1 is [2I, H] (gate and linear interleaved), mlp2 [H, I]
    q_heads: int = 64
    kv_heads: int = 8
    head_dim: int = 64
    vocab: int = 201088           # embedding and lm_head are untied, BF16 in the checkpoints
    sliding_window: int = 128     # on even layers (0, 2, ...); odd layers attend to the full context
    #: OpenAI's gpt-oss model card (arXiv:2508.10925, Table 1): active and total parameters
    published_active: float = 0.0
    published_total: float = 0.0

    @property
    def qkv_out(self) -> int:
        """Output width of the fused qkv projection: q heads plus k and v heads."""
        return (self.q_heads + 2 * self.kv_heads) * self.head_dim

    @property
    def attn_width(self) -> int:
        """Width of the attention output, the input of the out projection."""
        return self.q_heads * self.head_dim

    @property
    def sliding_layers(self) -> int:
        return (self.layers + 1) // 2


MODELS: dict[str, GptOssConfig] = {
    c.name: c
    for c in (
        GptOssConfig("gpt-oss-20b", layers=24, experts=32, published_active=3.61e9, published_total=20.91e9),
        GptOssConfig("gpt-oss-120b", layers=36, experts=128, published_active=5.13e9, published_total=116.83e9),
    )
}


def get_model(name: str) -> GptOssConfig:
    """The config named `name`; ValueError listing the known models otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None


def param_counts(cfg: GptOssConfig) -> dict[str, int]:
    """Parameters per part of the model (all layers), biases and sinks included."""
    h, i = cfg.hidden, cfg.intermediate
    attn = (h * cfg.qkv_out + cfg.qkv_out) + (cfg.attn_width * h + h) + cfg.q_heads  # qkv, out, sinks
    expert = (2 * i * h + 2 * i) + (h * i + h)                                         # mlp1, mlp2 with biases
    router = h * cfg.experts + cfg.experts
    return {
        "embedding": cfg.vocab * h,
        "attention": cfg.layers * attn,
        "router": cfg.layers * router,
        "experts": cfg.layers * cfg.experts * expert,
        "experts_active": cfg.layers * cfg.top_k * expert,
        "norms": (2 * cfg.layers + 1) * h,
        "lm_head": cfg.vocab * h,
    }


def active_params(cfg: GptOssConfig) -> int:
    """Parameters used per token, counted the way the model card counts its 5.13B / 3.61B "active".

    Checked by hand: the model card's numbers come out when the lm_head (unembedding) is counted and the
    embedding table is not (a token reads one row of it). Counting both gives 5.71B / 4.19B, neither
    gives 4.55B / 3.03B. Its Table 1 lists "Embed + Unembed" as 1.16B = 2 x 201088 x 2880.
    """
    p = param_counts(cfg)
    return p["attention"] + p["router"] + p["experts_active"] + p["norms"] + p["lm_head"]


def total_params(cfg: GptOssConfig) -> int:
    """All parameters, embedding and every expert included (the model card's 116.83B / 20.91B)."""
    p = param_counts(cfg)
    return sum(v for k, v in p.items() if k != "experts_active")
