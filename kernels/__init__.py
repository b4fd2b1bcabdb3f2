"""MXFP4 kernels and the torch reference codecs/ops they are checked against.

Pure functions over torch tensors: no I/O, no pandas, no plotting (DESIGN.md "Layout").
"""

from .formats import (
    E2M1_VALUES,
    LAYOUTS,
    MX_BLOCK,
    NV_BLOCK,
    ROUNDINGS,
    MXFP4Tensor,
    MXFP8Tensor,
    NVFP4Tensor,
    dequantize_mxfp4,
    dequantize_mxfp8,
    dequantize_nvfp4,
    e2m1_to_float,
    e8m0_to_float,
    from_ggml,
    from_openai,
    mxfp4_codes,
    quantize_mxfp4,
    quantize_mxfp8,
    quantize_nvfp4,
    repack_mxfp4,
    to_ggml_bytes,
)
from .reference import reference_linear, reference_moe, swiglu_gptoss, topk_softmax

__all__ = [
    "E2M1_VALUES",
    "LAYOUTS",
    "MX_BLOCK",
    "NV_BLOCK",
    "ROUNDINGS",
    "MXFP4Tensor",
    "MXFP8Tensor",
    "NVFP4Tensor",
    "dequantize_mxfp4",
    "dequantize_mxfp8",
    "dequantize_nvfp4",
    "e2m1_to_float",
    "e8m0_to_float",
    "from_ggml",
    "from_openai",
    "mxfp4_codes",
    "quantize_mxfp4",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "reference_linear",
    "reference_moe",
    "repack_mxfp4",
    "swiglu_gptoss",
    "to_ggml_bytes",
    "topk_softmax",
]

from .linear import mxfp4_linear, quantize_mxfp8_rows  # noqa: E402
from .prepare import (  # noqa: E402
    HELD_LAYOUTS,
    WEIGHT_LAYOUTS,
    PreparedMXFP4,
    in_layout,
    prepare_mxfp4,
    shuffle_nibbles,
    tile_mxfp4,
)
from .variants import VARIANTS, Variant  # noqa: E402

__all__ += ["mxfp4_linear", "quantize_mxfp8_rows", "PreparedMXFP4", "prepare_mxfp4", "shuffle_nibbles", "tile_mxfp4",
            "WEIGHT_LAYOUTS", "HELD_LAYOUTS", "in_layout", "VARIANTS", "Variant"]

from .dequant import mxfp4_to_dense  # noqa: E402

__all__ += ["mxfp4_to_dense"]

from . import moe_fused, moe_mma, moe_split  # noqa: E402,F401  (register these MoE variants)
from .moe import MoESlots, moe_mxfp4  # noqa: E402
from .routing import Routing, route  # noqa: E402

__all__ += ["moe_mxfp4", "MoESlots", "Routing", "route"]

from .attention import attention_sinks, qkv_rope_kv_write, rope_kv_write  # noqa: E402
from .norm import add_rms_norm, rms_norm, router_logits  # noqa: E402

__all__ += ["attention_sinks", "qkv_rope_kv_write", "rope_kv_write", "rms_norm", "add_rms_norm", "router_logits"]
