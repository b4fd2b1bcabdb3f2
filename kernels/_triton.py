"""Triton import point: without a CUDA GPU, kernels run through Triton's CPU interpreter.

TRITON_INTERPRET must be set before any @triton.jit function is defined, so every kernel module imports
triton from here. An explicit TRITON_INTERPRET in the environment always wins.
"""

import contextlib
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
if INTERPRETED:
    from kernels import _interp  # noqa: E402

    _interp.install()  # nested helpers no longer re-patch triton.language on every call (about 2x faster)
#: the same flag as a constexpr, for the few places kernels must work around the interpreter
INTERP = tl.constexpr(INTERPRETED)

#: Programmatic dependent launch (Hopper): a kernel launched with it has its programs resident and waiting
#: while the kernel before it drains, instead of launching after it ends (-8% on a gpt-oss decode step,
#: results/20261122T2245*-pdl1 against -pdl0). griddepcontrol exists from sm_90 on, so kernels only emit it there.
HOPPER = not INTERPRETED and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
GDC = tl.constexpr(HOPPER)
#: Which launches use PDL. LAB_PDL=1: every decode-path kernel (each op's first launch then overlaps the op
#: before it, as back-to-back layers of a model do); LAB_PDL=0: none. Unset: only launches that follow another
#: launch of the same op call (pdl_launch(inner=True): the GEMV after its x_to_f16, a MoE layer's mlp1, mlp2
#: and combine), so an op timed alone starts after the one before it has ended, as before, while its own
#: kernels overlap their launches. The model turns every launch on for its forward passes (pdl_scope).
_LAB_PDL = os.environ.get("LAB_PDL", "")
PDL = HOPPER and _LAB_PDL == "1"
INNER_PDL = HOPPER and _LAB_PDL != "0"


def reg_cap(maxnreg: int | None) -> dict:
    """Launch option capping a kernel's registers per thread (MAXNREG: more programs per SM; ptxas spills or
    reorders past what the build needs), none for None."""
    return {"maxnreg": maxnreg} if maxnreg else {}


def pdl_launch(inner: bool = False) -> dict:
    """Launch options of a kernel that starts with pdl_enter: {"launch_pdl": True} while PDL is on for it
    (inner: the kernel follows a launch of the same op call), else none."""
    return {"launch_pdl": True} if PDL or (inner and INNER_PDL) else {}


@contextlib.contextmanager
def pdl_scope(on: bool = True):
    """Every launch inside uses PDL when `on` (and the GPU has it), none when not; the settings are restored
    after."""
    global PDL, INNER_PDL
    before, PDL = (PDL, INNER_PDL), bool(on) and HOPPER
    INNER_PDL = PDL
    try:
        yield PDL
    finally:
        PDL, INNER_PDL = before


@triton.jit
def pdl_enter():
    """First statement of every decode-path kernel: wait until the previous kernel in the stream has finished
    and its writes are visible (griddepcontrol.wait), then let the next kernel's programs launch. Before the
    wait a program reads only what no kernel writes (weights) or what its caller guarantees was written at
    least two launches back (moe_h2g's mlp2: its routing; split decode attention: the position and the older
    cache rows); without PDL both are no-ops.
    (The second rule is fragile: when router_logits took over x_to_f16's launch, mlp1's early routing read
    ran before route had finished, an illegal address in the decode graph.)"""
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_release():
    """pdl_enter without the wait: let the next kernel's programs launch, for a kernel that orders itself after
    the one before by device counters instead (moe_mma's mlp2 with CHAIN)."""
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()


__all__ = ["triton", "tl", "INTERPRETED", "INTERP", "HOPPER", "reg_cap", "pdl_launch", "pdl_enter", "pdl_release",
           "pdl_scope"]
