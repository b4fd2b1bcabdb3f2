"""kernels._interp: under the CPU interpreter, nested @triton.jit helpers no longer re-patch triton.language on
every call; results stay the same and each grid's patch is still undone when the grid ends."""

import pytest
import torch

from kernels import _interp
from kernels._triton import INTERPRETED, tl, triton

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="only Triton's CPU interpreter is patched")


@triton.jit
def _step(v):
    return v * 2 + tl.full(v.shape, 1, v.dtype)


@triton.jit
def _nested_kernel(x_ptr, o_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    v = tl.load(x_ptr + i)
    for _ in range(3):
        v = _step(v)
    tl.store(o_ptr + i, v)


@triton.jit
def _flat_kernel(x_ptr, o_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, tl.load(x_ptr + i) * 2)


def test_helpers_patch_nothing_more_and_the_language_is_restored(monkeypatch):
    import triton.runtime.interpreter as it

    assert _interp.install()  # kernels._triton installed it; a second call is a no-op
    scans = []
    real = it._patch_builtin
    monkeypatch.setattr(it, "_patch_builtin", lambda *a: scans.append(a[0]) or real(*a))
    load = tl.load
    x = torch.arange(8, dtype=torch.float32)
    o = torch.empty_like(x)
    _flat_kernel[(2,)](x, o, N=8)
    flat = len(scans)
    assert torch.equal(o, x * 2) and flat > 0
    _nested_kernel[(2,)](x, o, N=8)
    assert torch.equal(o, ((x * 2 + 1) * 2 + 1) * 2 + 1)
    assert len(scans) == 2 * flat  # six helper calls, no scans beyond the grid's own
    assert tl.load is load  # each grid's patch is undone when it ends


def test_numpy_dtypes_are_triton_s_own():
    """The once-per-type lookup gives what Triton's interpreter gives for every scalar, block and pointer type."""
    import triton.runtime.interpreter as it

    assert _interp.install() and it._get_np_dtype is not it._lab_np_dtype
    scalars = [tl.int1, tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16,
               tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float8e5, tl.float8e4nv]
    types = scalars + [tl.block_type(t, [4, 2]) for t in scalars] + [tl.pointer_type(tl.float16),
                                                                      tl.block_type(tl.pointer_type(tl.int32), [8])]
    for t in types * 2:  # the second pass is answered from the cache
        assert it._get_np_dtype(t) == it._lab_np_dtype(t), t
