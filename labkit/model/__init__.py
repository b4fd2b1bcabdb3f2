"""GPT-OSS model runs: the model at full size on one GPU (synthetic or real weights) and tiny on a CPU,
instrumented with NVTX ranges, with switchable MoE / lm_head backends, fault injection, a decode profile,
parity studies and a divergence finder. See labkit/model/README.md."""

from .backends import LM_HEAD_BACKENDS, MOE_BACKENDS, Backends, resolve_backends
from .cache import KVCache
from .config import PRESETS, ModelConfig, get_config
from .faults import FAULTS
from .graph import DecodeRunner
from .loaders import load_checkpoint, load_weights
from .model import GptOss
from .weights import LayerWeights, Weights, synthetic_weights

__all__ = [
    "FAULTS",
    "LM_HEAD_BACKENDS",
    "MOE_BACKENDS",
    "PRESETS",
    "Backends",
    "DecodeRunner",
    "GptOss",
    "KVCache",
    "LayerWeights",
    "ModelConfig",
    "Weights",
    "get_config",
    "load_checkpoint",
    "load_weights",
    "resolve_backends",
    "synthetic_weights",
]
