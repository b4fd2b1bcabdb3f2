"""Reference codecs against hand-computed values, round trips, layouts and error messages."""

import math

import pytest
import torch

import kernels as K
from kernels.formats import float_to_e2m1, mxfp4_codes, pack_nibbles


def block_of(code: int, scale_byte: int, nblocks: int = 1, layout: str = "openai") -> K.MXFP4Tensor:
    """An MXFP4 row whose every element is `code` and every scale byte `scale_byte`."""
    codes = torch.full((1, nblocks, 32), code, dtype=torch.uint8)
    scales = torch.full((1, nblocks), scale_byte, dtype=torch.uint8)
    return K.MXFP4Tensor(pack_nibbles(codes, layout), scales, layout, (1, nblocks * 32))


# ---- hand-computed values -------------------------------------------------------------------------------

E2M1_BY_HAND = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


@pytest.mark.parametrize("code", range(16))
@pytest.mark.parametrize("layout", K.LAYOUTS)
def test_every_e2m1_code_decodes(code, layout):
    d = K.dequantize_mxfp4(block_of(code, 127, layout=layout))
    assert torch.all(d == E2M1_BY_HAND[code])
    assert torch.all(torch.signbit(d)) == (code >= 8)


@pytest.mark.parametrize("byte", [0, 1, 126, 127, 128, 254])
def test_scale_bytes(byte):
    # code 2 is 1.0, so every element equals the scale itself: 2^(byte - 127), exactly
    d = K.dequantize_mxfp4(block_of(2, byte))
    assert torch.all(d == 2.0 ** (byte - 127))
    assert K.e8m0_to_float(torch.tensor([byte], dtype=torch.uint8)).item() == 2.0 ** (byte - 127)


def test_scale_byte_255_is_nan_and_rejected_unless_allowed():
    assert math.isnan(K.e8m0_to_float(torch.tensor([255], dtype=torch.uint8)).item())
    blocks = torch.zeros(2, 1, 16, dtype=torch.uint8)
    scales = torch.tensor([[127], [255]], dtype=torch.uint8)
    with pytest.raises(ValueError, match="scales.*255.*allow_nan"):
        K.from_openai(blocks, scales)
    q = K.from_openai(blocks, scales, allow_nan=True)
    d = K.dequantize_mxfp4(q)
    assert torch.all(d[0] == 0) and torch.all(torch.isnan(d[1]))


@pytest.mark.parametrize("layout", K.LAYOUTS)
def test_uniform_block_dot_is_exact(layout):
    # all 1.5 with scale byte 127 over K = 2880, times all ones: exactly 1.5 * 2880 = 4320
    w = block_of(3, 127, nblocks=2880 // 32, layout=layout)
    y = K.reference_linear(torch.ones(1, 2880), w)
    assert y.item() == 4320.0


def test_negative_zero():
    q = K.quantize_mxfp4(torch.full((1, 32), -0.0))
    assert torch.all(mxfp4_codes(q) == 8)
    d = K.dequantize_mxfp4(q)
    assert torch.all(d == 0) and torch.all(torch.signbit(d))
    # a tiny negative value rounds to negative zero next to a large positive one
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 6.0, -0.01
    assert mxfp4_codes(K.quantize_mxfp4(x))[0, 1] == 8


def test_round_to_nearest_ties_to_even_code():
    # with a 6 in the block the scale is 1 (byte 127) under every rule, so these are the raw midpoints
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    expect = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    x = torch.zeros(1, 32)
    x[0, 0] = 6.0
    x[0, 1 : 1 + len(mids)] = torch.tensor(mids)
    x[0, 10 : 10 + len(mids)] = -torch.tensor(mids)
    x[0, 20] = 100.0 / 17  # 5.88 -> 6
    for rounding in K.ROUNDINGS:
        q = K.quantize_mxfp4(x, rounding=rounding)
        assert q.scales.item() == 127, rounding
        d = K.dequantize_mxfp4(q)[0]
        assert d[1 : 1 + len(mids)].tolist() == expect
        assert d[10 : 10 + len(mids)].tolist() == [-v for v in expect]
        assert d[20].item() == 6.0


@pytest.mark.parametrize(
    "amax, rounding, byte, decoded",
    [
        (7.0, "floor", 127, 6.0),  # OCP floor: 2^(floor(log2 7) - 2) = 1, 7 saturates to 6
        (7.0, "rceil", 128, 8.0),  # 7/6 rounded up to a power of two = 2; 3.5 ties to 4 -> 8
        (7.0, "ceil", 128, 8.0),
        (7.0, "even", 128, 8.0),  # 7 = 1.75 * 4 carries into the next binade
        (6.5, "floor", 127, 6.0),
        (6.5, "rceil", 128, 6.0),  # scale 2: 3.25 -> 3 -> 6
        (6.5, "even", 127, 6.0),  # 1.625 * 4 does not carry
        (6.0, "rceil", 127, 6.0),
        (0.75, "floor", 124, 0.75),  # 2^(floor(log2 .75) - 2) = 1/8; .75 * 8 = 6
        (0.75, "rceil", 124, 0.75),
        (1e-3, "floor", 115, 0.0009765625),  # 2^(-10 - 2); 1e-3 * 4096 = 4.096 -> 4 -> 2^-10
    ],
)
def test_scale_rules_by_hand(amax, rounding, byte, decoded):
    x = torch.zeros(1, 32)
    x[0, 5] = amax
    q = K.quantize_mxfp4(x, rounding=rounding)
    assert q.scales.item() == byte
    assert K.dequantize_mxfp4(q)[0, 5].item() == decoded


def test_all_zero_block_and_tiny_values():
    q = K.quantize_mxfp4(torch.zeros(2, 64))
    assert torch.all(q.scales == 0) and torch.all(K.dequantize_mxfp4(q) == 0)
    x = torch.full((1, 32), 2.0**-140)  # below 2^-127 * 0.25: the scale clamps to byte 0, values flush to 0
    q = K.quantize_mxfp4(x)
    assert q.scales.item() == 0 and torch.all(K.dequantize_mxfp4(q) == 0)


def test_float_to_e2m1_saturates_and_keeps_sign():
    v = torch.tensor([7.0, 100.0, float("inf"), -7.0, -float("inf"), 0.1, -0.1])
    assert float_to_e2m1(v).tolist() == [7, 7, 7, 15, 15, 0, 8]


# ---- round trips and layouts ----------------------------------------------------------------------------


def random_representable(shape, seed, byte_lo=0, byte_hi=252):
    """Random codes with random scale bytes: an exactly representable MXFP4 tensor (as floats).

    Scale bytes stop at 252: 6 * 2^(253-127) already exceeds the float32 range.
    """
    g = torch.Generator().manual_seed(seed)
    *lead, k = shape
    codes = torch.randint(0, 16, (*lead, k // 32, 32), generator=g, dtype=torch.uint8)
    scales = torch.randint(byte_lo, byte_hi + 1, (*lead, k // 32), generator=g, dtype=torch.uint8)
    q = K.MXFP4Tensor(pack_nibbles(codes, "openai"), scales, "openai", tuple(shape))
    return q, K.dequantize_mxfp4(q)


@pytest.mark.parametrize("rounding", K.ROUNDINGS)
@pytest.mark.parametrize("seed", range(4))
def test_representable_tensors_survive_every_rounding(rounding, seed):
    _, x = random_representable((3, 5, 256), seed)
    y = K.dequantize_mxfp4(K.quantize_mxfp4(x, rounding=rounding))
    assert torch.equal(y, x)
    assert torch.equal(torch.signbit(y), torch.signbit(x))


@pytest.mark.parametrize("seed", range(3))
def test_repack_is_lossless(seed):
    q, x = random_representable((4, 3, 96), seed, byte_lo=100, byte_hi=150)
    g = K.repack_mxfp4(q, "ggml")
    assert g.layout == "ggml" and torch.equal(g.scales, q.scales)
    assert torch.equal(K.dequantize_mxfp4(g), x)
    back = K.repack_mxfp4(g, "openai")
    assert torch.equal(back.blocks, q.blocks)
    # quantizing straight into ggml gives the same bytes as repacking
    assert torch.equal(K.quantize_mxfp4(x, layout="ggml").blocks, g.blocks)


def test_ggml_17_byte_blocks_roundtrip():
    q, x = random_representable((2, 128), 7, byte_lo=110, byte_hi=140)
    raw = K.to_ggml_bytes(q)
    assert raw.shape == (2, 4, 17) and torch.equal(raw[..., 0], q.scales)
    g = K.from_ggml(raw.reshape(2, 4 * 17))  # GGUF's flat row form
    assert torch.equal(K.dequantize_mxfp4(g), x)


def test_ggml_nibble_order_by_hand():
    # element i = code (i % 8) + 1 in 1..8: ggml byte j holds elements j and j+16, openai holds 2j and 2j+1
    codes = torch.tensor([(i % 8) + 1 for i in range(32)], dtype=torch.uint8).reshape(1, 1, 32)
    o, g = pack_nibbles(codes, "openai")[0, 0], pack_nibbles(codes, "ggml")[0, 0]
    assert o[0].item() == 1 | (2 << 4) and o[1].item() == 3 | (4 << 4)
    assert g[0].item() == 1 | (1 << 4) and g[1].item() == 2 | (2 << 4)  # element 16 has code 1 too


def test_indexing_selects_experts():
    q, x = random_representable((3, 4, 64), 1, byte_lo=120, byte_hi=130)
    assert torch.equal(K.dequantize_mxfp4(q[1]), x[1])
    assert q[1].shape == (4, 64)
    with pytest.raises(IndexError):
        q[..., 0]


# ---- an implementation nobody here wrote: gguf-py ---------------------------------------------------------

gguf = pytest.importorskip("gguf")
from gguf import quants as gq


def _clear_negative_zero(raw: torch.Tensor) -> torch.Tensor:
    """gguf picks code 0 where we keep the sign (code 8) for values that round to zero; both decode to 0."""
    data = raw[..., 1:]
    lo, hi = data & 0x0F, data >> 4
    lo = torch.where(lo == 8, torch.zeros_like(lo), lo)
    hi = torch.where(hi == 8, torch.zeros_like(hi), hi)
    return torch.cat((raw[..., :1], lo | (hi << 4)), dim=-1)


@pytest.mark.parametrize("dist", ["normal", "wide"])
def test_mxfp4_matches_gguf(dist):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(64, 512, generator=g)
    if dist == "wide":  # blocks spanning many binades
        binade = torch.exp2(torch.randint(-20, 20, (64, 16, 1), generator=g).float())
        x = x * binade.repeat_interleave(32, -1).reshape(64, 512)
    ours = K.to_ggml_bytes(K.quantize_mxfp4(x, layout="ggml", rounding="floor")).reshape(64, -1)
    theirs = torch.from_numpy(gq.quantize(x.numpy(), gguf.GGMLQuantizationType.MXFP4))
    assert torch.equal(_clear_negative_zero(ours.reshape(64, 16, 17)), _clear_negative_zero(theirs.reshape(64, 16, 17)))
    ours_dec = K.dequantize_mxfp4(K.from_ggml(ours))
    theirs_dec = torch.from_numpy(gq.dequantize(ours.numpy(), gguf.GGMLQuantizationType.MXFP4))
    assert torch.equal(ours_dec, theirs_dec)


def _nvfp4_to_gguf(q: K.NVFP4Tensor) -> torch.Tensor:
    """Our NVFP4 (low nibble = element 2j, one E4M3 byte per 16) as gguf's 64-value super-blocks:
    4 scale bytes, then per 16-block 8 bytes with elements 0..7 low and 8..15 high."""
    codes = torch.stack((q.blocks & 0x0F, q.blocks >> 4), dim=-1).flatten(-2)  # [..., K/16, 16]
    qs = codes[..., :8] | (codes[..., 8:] << 4)  # [..., K/16, 8]
    rows = q.shape[0]
    sup = q.shape[-1] // 64
    return torch.cat((q.scales.reshape(rows, sup, 4), qs.reshape(rows, sup, 32)), dim=-1).reshape(rows, sup * 36)


def test_nvfp4_matches_gguf():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(32, 256, generator=g) * 3
    q = K.quantize_nvfp4(x, global_scale=1.0)  # gguf's NVFP4 has no tensor scale
    theirs = torch.from_numpy(gq.dequantize(_nvfp4_to_gguf(q).numpy(), gguf.GGMLQuantizationType.NVFP4))
    assert torch.equal(K.dequantize_nvfp4(q), theirs)
    # block-scale bytes agree with gguf's float -> UE4M3 conversion of amax / 6
    amax = x.reshape(32, 16, 16).abs().amax(-1) / 6
    assert torch.equal(q.scales, torch.from_numpy(gq.NVFP4.fp32_to_ue4m3(amax.numpy())))


# ---- NVFP4 and MXFP8 ------------------------------------------------------------------------------------


def test_nvfp4_representable_roundtrip_and_global_scale():
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (4, 8, 16), generator=g)
    codes[..., 0] = 7  # every block holds a 6, so amax / 6 is the scale itself
    s = torch.tensor([0.5, 1.0, 2.0, 0.25]).repeat(4, 2).reshape(4, 8, 1)
    x = (torch.tensor(E2M1_BY_HAND)[codes] * s).reshape(4, 128)
    q = K.quantize_nvfp4(x, global_scale=1.0)
    assert torch.equal(K.dequantize_nvfp4(q), x)
    q2 = K.quantize_nvfp4(x * 1000.0)  # default tensor scale: amax / (6 * 448)
    assert q2.global_scale.item() == pytest.approx(6000.0 * 2 / (6 * 448))
    rel = (K.dequantize_nvfp4(q2) - x * 1000).norm() / (x * 1000).norm()
    assert rel < 0.02


def test_mxfp8_by_hand_and_roundtrip():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 2] = 448.0, 1.0, -3.5
    q = K.quantize_mxfp8(x)
    assert q.scales.item() == 127  # floor(log2 448) - 8 = 0
    assert torch.equal(K.dequantize_mxfp8(q), x)
    y = x * 2.0**-20
    q = K.quantize_mxfp8(y)
    assert q.scales.item() == 107 and torch.equal(K.dequantize_mxfp8(q), y)
    # floor saturates 500 -> 448 (scale 1); rceil picks scale 2: 250 rounds to 256 (E4M3 step 16 in 128..256) -> 512
    z = torch.zeros(1, 32)
    z[0, 0] = 500.0
    assert K.dequantize_mxfp8(K.quantize_mxfp8(z))[0, 0].item() == 448.0
    assert K.dequantize_mxfp8(K.quantize_mxfp8(z, rounding="rceil"))[0, 0].item() == 512.0


# ---- bad input ------------------------------------------------------------------------------------------


def test_errors_name_the_argument_and_rule():
    with pytest.raises(ValueError, match=r"x: last dimension K=48 must be a multiple of the block size 32"):
        K.quantize_mxfp4(torch.randn(2, 48))
    with pytest.raises(ValueError, match=r"multiple of the block size 16"):
        K.quantize_nvfp4(torch.randn(2, 40))
    with pytest.raises(TypeError, match=r"x must have dtype"):
        K.quantize_mxfp4(torch.ones(2, 32, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        K.quantize_mxfp4([[1.0] * 32])
    with pytest.raises(ValueError, match=r"NaN or infinity"):
        K.quantize_mxfp4(torch.full((1, 32), float("nan")))
    with pytest.raises(ValueError, match=r"rounding must be one of floor, ceil, rceil, even"):
        K.quantize_mxfp4(torch.randn(1, 32), rounding="nearest")
    with pytest.raises(ValueError, match=r"layout must be one of openai, ggml"):
        K.quantize_mxfp4(torch.randn(1, 32), layout="gguf")
    with pytest.raises(TypeError, match=r"blocks must have dtype uint8"):
        K.from_openai(torch.zeros(1, 16, dtype=torch.int8), torch.zeros(1, dtype=torch.uint8))
    with pytest.raises(TypeError, match=r"scales must have dtype uint8"):
        K.from_openai(torch.zeros(1, 16, dtype=torch.uint8), torch.zeros(1, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"scales shape \(3,\) does not pair with blocks \(2, 16\)"):
        K.from_openai(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"blocks must have shape \[\.\.\., K/32, 16\]"):
        K.from_openai(torch.zeros(2, 17, dtype=torch.uint8), torch.zeros(2, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"not a multiple of the 17-byte block_mxfp4"):
        K.from_ggml(torch.zeros(2, 20, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"shape: last dimension K must be a positive multiple of 32"):
        K.MXFP4Tensor(torch.zeros(1, 1, 16, dtype=torch.uint8), torch.zeros(1, 1, dtype=torch.uint8), "openai", (1, 33))
    with pytest.raises(ValueError, match=r"blocks must have shape \(4, 1, 16\)"):
        K.MXFP4Tensor(torch.zeros(1, 1, 16, dtype=torch.uint8), torch.zeros(1, 1, dtype=torch.uint8), "openai", (4, 32))
    with pytest.raises(TypeError, match=r"q must be an MXFP4Tensor"):
        K.dequantize_mxfp4(torch.zeros(1, 32))
    with pytest.raises(ValueError, match=r"global_scale must be positive"):
        K.quantize_nvfp4(torch.randn(1, 16), global_scale=0.0)
