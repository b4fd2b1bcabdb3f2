"""kernels.linear_bf16.gemv_bf16 (the bf16 GEMV of the attention projections) against fp32 math, interpreter.

Tolerance: fp32 accumulation of bf16 products, one bf16 rounding of the output (2^-8 relative, truncated in
the interpreter): ~3e-3 norm-wise; a wrong row, column, bias or token gives O(1).
"""

import pytest
import torch

from kernels.linear_bf16 import MAX_ROWS, PICKS, fits, gemv_bf16, pick


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(37, 100), (64, 512), (5, 1030)])  # N, K not multiples of the tiles
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_bf16_matches_fp32(m, n, k, bias, device):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16).to(device)
    b = torch.randn(n, generator=g).to(torch.bfloat16).to(device) if bias else None
    ref = x.float() @ w.float().T + (b.float() if bias else 0)
    cfg = {"block_n": 4, "block_k": 128, "num_warps": 4}
    y = gemv_bf16(x, w, b, **cfg)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    assert rel(y, ref) < 1e-2
    assert rel(gemv_bf16(x[None], w, b, **cfg)[0], ref) < 1e-2  # leading dims kept


def test_gemv_bf16_errors_and_empty(device):
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=device)
    w = torch.zeros(16, 64, dtype=torch.bfloat16, device=device)
    assert gemv_bf16(x[:0], w).shape == (0, 16)
    with pytest.raises(ValueError, match=r"w must be \[N, 64\]"):
        gemv_bf16(x, w[:, :32])
    with pytest.raises(ValueError, match=r"b must have shape \(16,\)"):
        gemv_bf16(x, w, torch.zeros(3, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="at most 8 rows"):
        gemv_bf16(torch.zeros(MAX_ROWS + 1, 64, dtype=torch.bfloat16, device=device), w)
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        gemv_bf16(x, w, block_k=100)
    assert fits(1, 8, 1024, 4) and not fits(8, 16, 1024, 4)
    with pytest.raises(ValueError, match="do not fit"):
        gemv_bf16(torch.zeros(8, 64, dtype=torch.bfloat16, device=device), w, block_n=16, block_k=1024)


def test_pick_prefers_cublas_where_measured_faster():
    assert pick(1, 2880, 4096) == PICKS[(1, 2880, 4096)] is not None  # the GEMV where it was measured faster
    assert pick(8, 2880, 4096) is None and pick(4, 5120, 2880) is None
    assert pick(1, 37, 100) == {"block_n": 8, "block_k": 512, "num_warps": 4}  # unmeasured: the default
    assert pick(3, 37, 100) is None
    for (m, _, _), cfg in PICKS.items():
        assert cfg is None or fits(m, **cfg)
