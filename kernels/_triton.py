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
import triton.language.extra.cuda  # noqa: E402, F401  (tl.extra.cuda: the griddepcontrol wrappers)

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
#: the same flag as a constexpr, for the few places kernels must work around the interpreter
INTERP = tl.constexpr(INTERPRETED)

#: Programmatic dependent launch (Hopper): LAB_PDL=1 launches the decode-path kernels with it, so each one's
#: programs are resident and waiting while the kernel before it drains, instead of launching after it ends.
PDL = os.environ.get("LAB_PDL", "0") == "1" and not INTERPRETED


def pdl_launch() -> dict:
    """Launch options of a decode-path kernel: {"launch_pdl": True} under LAB_PDL=1, else none."""
    return {"launch_pdl": True} if PDL else {}


@triton.jit
def pdl_enter():
    """First statement of every decode-path kernel: wait until the previous kernel in the stream has finished
    and its writes are visible (griddepcontrol.wait), then let the next kernel's programs launch. Before the
    wait the program touches no memory, so it is correct under any launch; without PDL both are no-ops."""
    if not INTERP:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


__all__ = ["triton", "tl", "INTERPRETED", "INTERP", "PDL", "pdl_launch", "pdl_enter"]
