"""Triton import point: without a CUDA GPU, kernels run through Triton's CPU interpreter.

TRITON_INTERPRET must be set before any @triton.jit function is defined, so every kernel module imports
triton from here. An explicit TRITON_INTERPRET in the environment always wins.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
# FMA contraction on (Triton's default so far; 3.9 warns that the default will change): keep numerics stable
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
#: the same flag as a constexpr, for the few places kernels must work around the interpreter
INTERP = tl.constexpr(INTERPRETED)

__all__ = ["triton", "tl", "INTERPRETED", "INTERP"]
