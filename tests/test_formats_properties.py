"""Property tests (hypothesis) over shapes, value ranges and scale rules."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels as K
from kernels.formats import pack_nibbles

shapes = st.tuples(st.lists(st.integers(1, 3), min_size=0, max_size=2), st.integers(1, 6)).map(
    lambda t: (*t[0], t[1] * 32)
)


@st.composite
def float_tensors(draw):
    shape = draw(shapes)
    seed = draw(st.integers(0, 2**31 - 1))
    log2_range = draw(st.integers(-60, 60))
    spread = draw(st.integers(0, 12))  # binades spanned inside a tensor
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 2.0**log2_range
    x = x * torch.exp2(torch.randint(-spread, spread + 1, shape, generator=g).float())
    return x


@settings(max_examples=60, deadline=None)
@given(float_tensors(), st.sampled_from(K.ROUNDINGS), st.sampled_from(K.LAYOUTS))
def test_error_bounded_by_the_scale(x, rounding, layout):
    q = K.quantize_mxfp4(x, rounding=rounding, layout=layout)
    y = K.dequantize_mxfp4(q)
    assert y.shape == x.shape and y.dtype == torch.float32
    scale = K.e8m0_to_float(q.scales).repeat_interleave(32, dim=-1).reshape(x.shape)
    amax = x.reshape(*x.shape[:-1], -1, 32).abs().amax(-1).repeat_interleave(32, dim=-1).reshape(x.shape)
    err = (y - x).abs()
    if rounding == "floor":  # values up to 8 * scale saturate at 6 * scale
        assert torch.all(err <= 2 * scale)
    else:  # ceil/rceil never saturate; even saturates only below 7 * scale
        assert torch.all(err <= scale)
    if rounding in ("ceil", "rceil"):  # the smallest power of two with amax <= 6 * scale
        assert torch.all(amax <= 6 * scale) and torch.all((amax == 0) | (amax > 3 * scale))
    # decoding is a pure function of the bytes: repacking never changes it
    assert torch.equal(K.dequantize_mxfp4(K.repack_mxfp4(q, "openai")), y)


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(0, 2**31 - 1), st.integers(0, 252), st.sampled_from(K.ROUNDINGS))
def test_quantize_is_idempotent_on_its_own_output(shape, seed, byte, rounding):
    g = torch.Generator().manual_seed(seed)
    *lead, k = shape
    codes = torch.randint(0, 16, (*lead, k // 32, 32), generator=g, dtype=torch.uint8)
    scales = torch.full((*lead, k // 32), byte, dtype=torch.uint8)
    x = K.dequantize_mxfp4(K.MXFP4Tensor(pack_nibbles(codes, "openai"), scales, "openai", shape))
    assert torch.equal(K.dequantize_mxfp4(K.quantize_mxfp4(x, rounding=rounding)), x)


@settings(max_examples=40, deadline=None)
@given(float_tensors())
def test_mxfp8_and_nvfp4_errors_are_bounded(x):
    y8 = K.dequantize_mxfp8(K.quantize_mxfp8(x, rounding="rceil"))
    scale = K.e8m0_to_float(K.quantize_mxfp8(x, rounding="rceil").scales).repeat_interleave(32, -1).reshape(x.shape)
    # E4M3 keeps 3 mantissa bits: relative error <= 2^-4 for normals, absolute <= 2^-10 * scale below them
    assert torch.all((y8 - x).abs() <= torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10))
    if x.abs().max() < 1e30 and x.abs().max() > 1e-30:
        yn = K.dequantize_nvfp4(K.quantize_nvfp4(x))
        amax16 = x.reshape(*x.shape[:-1], -1, 16).abs().amax(-1).repeat_interleave(16, -1).reshape(x.shape)
        # half the widest E2M1 gap (2 of 6) relative to the block max, plus E4M3 scale rounding and underflow
        assert torch.all((yn - x).abs() <= amax16 * (1 / 6 + 2.0**-3) + x.abs().max() * 2.0**-17)
