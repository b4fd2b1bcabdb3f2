"""Triton helpers that decode MXFP4 in registers (shared by the linear and MoE kernels).

Weights are read as 32-bit words, 8 E2M1 codes each (openai nibble order: element e of the word sits at bit
4e). Nibbles 16 bits apart are turned into fp16x2 bit patterns with shifts and masks only: the E2M1 code
placed at fp16 bits 15 (sign) and 11..9 (exponent and mantissa) is exactly the E2M1 value times 2^-14,
because fp16's subnormals cover the E2M1 subnormal 0.5. So a word gives four pairs:

    pair A = elements (0, 4), B = (1, 5), C = (2, 6), D = (3, 7)   (low half, high half)

Weights in shuffle_nibbles' layout (kernels/prepare.py) decode in 9 instructions per word instead of 15
(`nib_pairs`): A and C sit at their fp16 bit positions already (one mask; one shift and a mask), B and D are
built as four E4M3 bytes (two shifts, two masks) that two hardware conversions (cvt.rn.f16x2.e4m3x2, one
F2FP instruction each in the sm_90 SASS) turn into fp16x2. No bit layout gives all four pairs one shift and
one mask: the 8 positions an fp16x2 pair needs, {9,10,11,15,25,26,27,31}, admit at most two disjoint
translates.

All arithmetic is plain Triton (inline PTX only where the interpreter has an fp32 emulation), so the same
source runs compiled and in the interpreter.
"""

from ._triton import INTERP, tl, triton

#: 2^14: undoes the 2^-14 the fp16 bit trick leaves in every decoded value.
F16_TRICK = tl.constexpr(16384.0)
#: float32 value of the E8M0 byte 0 (2^-127, a float32 subnormal that `byte << 23` cannot express).
E8M0_BYTE0 = tl.constexpr(5.877471754111438e-39)


@triton.jit
def e2m1_pairs(v):
    """uint32 words [..] of 8 E2M1 codes -> four uint32 words of fp16x2 bits: (e0,e4), (e1,e5), (e2,e6), (e3,e7)."""
    a = ((v << 9) & 0x0E000E00) | ((v << 12) & 0x80008000)
    b = ((v << 5) & 0x0E000E00) | ((v << 8) & 0x80008000)
    c = ((v << 1) & 0x0E000E00) | ((v << 4) & 0x80008000)
    d = ((v >> 3) & 0x0E000E00) | (v & 0x80008000)
    return a, b, c, d


#: shuffle_nibbles' bit position of each (element, bit) of a word, bit 0 = mantissa, 1-2 = exponent, 3 = sign:
#: elements 0/4 at pair A's fp16 bits, 2/6 at pair C's moved down 8, 1/5/3/7 as E4M3 bytes 0-3 whose
#: magnitude sits 2 bits up and whose sign is the lowest bit of the next byte (rotated).
NIB_BITS = ((9, 10, 11, 15), (4, 5, 6, 8), (1, 2, 3, 7), (20, 21, 22, 24),
            (25, 26, 27, 31), (12, 13, 14, 16), (17, 18, 19, 23), (28, 29, 30, 0))
#: fp16x2 (2^-8, 2^-8): takes pairs B, D of nib_pairs (E2M1 * 2^-6) to the scale of A, C (E2M1 * 2^-14).
NIB_DOWN_H2 = tl.constexpr(0x1C001C00)


@triton.jit
def pack_h2(lo, hi):
    """Two float32 tensors -> uint32 fp16x2 words (each rounded to fp16)."""
    lo16 = lo.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
    hi16 = hi.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
    return lo16 | (hi16 << 16)


@triton.jit
def _e4m3_byte(w, k):
    """Byte k of w, an E4M3 code with only sign, two low exponent bits and the top mantissa bit set (an E2M1
    code times 2^-6), as float32: the interpreter's stand-in for the hardware conversion."""
    t = (w >> (8 * k)) & 0xFF
    bits = ((t & 0x1C) << 7) | ((t & 0x80) << 8)  # the same code at fp16 bits 15, 11..9: E2M1 * 2^-14
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0


@triton.jit
def e4m3x4_to_h2(w):
    """uint32 words of four E4M3 bytes -> (fp16x2 of bytes 0, 1; fp16x2 of bytes 2, 3), exact."""
    if INTERP:
        return (pack_h2(_e4m3_byte(w, 0), _e4m3_byte(w, 1)), pack_h2(_e4m3_byte(w, 2), _e4m3_byte(w, 3)))
    else:
        return tl.inline_asm_elementwise(
            "{.reg .b16 l, h; mov.b32 {l, h}, $2; cvt.rn.f16x2.e4m3x2 $0, l; cvt.rn.f16x2.e4m3x2 $1, h;}",
            "=r,=r,r", [w], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)


@triton.jit
def nib_pairs(u):
    """uint32 words in shuffle_nibbles' layout -> fp16x2 pairs (e0,e4), (e1,e5), (e2,e6), (e3,e7) like
    e2m1_pairs, except that B = (e1,e5) and D = (e3,e7) are E2M1 * 2^-6 (A and C: E2M1 * 2^-14)."""
    a = u & 0x8E008E00
    c = (u << 8) & 0x8E008E00
    b, d = e4m3x4_to_h2(((u >> 2) & 0x1C1C1C1C) | (((u >> 1) | (u << 31)) & 0x80808080))
    return a, b, c, d


@triton.jit
def half_lo(p):
    """Low fp16 of an fp16x2 word as float32 (the E2M1 value times 2^-14)."""
    return (p & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def half_hi(p):
    """High fp16 of an fp16x2 word as float32 (the E2M1 value times 2^-14)."""
    return (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e8m0_to_f32(s):
    """E8M0 bytes -> float32 2^(s-127), exact for every byte: 0 is the subnormal 2^-127, 255 is NaN."""
    s32 = s.to(tl.uint32)
    f = ((s32 << 23) | ((s32 == 255).to(tl.uint32) << 22)).to(tl.float32, bitcast=True)
    return tl.where(s32 == 0, E8M0_BYTE0, f)


@triton.jit
def e8m0_times_2(s):
    """E8M0 bytes -> float32 2^(s-126) (twice the scale), exact for bytes 0..253 with no special cases."""
    return ((s.to(tl.uint32) + 1) << 23).to(tl.float32, bitcast=True)


@triton.jit
def e8m0_times_2p14(s):
    """E8M0 bytes -> float32 2^(s-127+14), exact for bytes 14..240 (a variant's documented scale window)."""
    return ((s.to(tl.uint32) + 14) << 23).to(tl.float32, bitcast=True)


@triton.jit
def interleave8(e0, e1, e2, e3, e4, e5, e6, e7):
    """Eight [R, W] tensors (element e of every word) -> [R, 8 W] in natural K order (index 8 w + e)."""
    t = tl.join(tl.join(tl.join(e0, e4), tl.join(e2, e6)), tl.join(tl.join(e1, e5), tl.join(e3, e7)))
    return tl.reshape(t, (t.shape[0], t.shape[1] * 8))


@triton.jit
def decode_bf16(v, s):
    """uint32 words [R, W] and their scale bytes [R, W] (one per word) -> bf16 weights [R, 8 W] in K order.

    Exact for scale bytes 14..240: (E2M1 * 2^-14 in fp32) * 2^(s-113) has at most two significant bits.
    """
    a, b, c, d = e2m1_pairs(v)
    sc = e8m0_times_2p14(s)
    return interleave8(
        (half_lo(a) * sc).to(tl.bfloat16), (half_lo(b) * sc).to(tl.bfloat16),
        (half_lo(c) * sc).to(tl.bfloat16), (half_lo(d) * sc).to(tl.bfloat16),
        (half_hi(a) * sc).to(tl.bfloat16), (half_hi(b) * sc).to(tl.bfloat16),
        (half_hi(c) * sc).to(tl.bfloat16), (half_hi(d) * sc).to(tl.bfloat16),
    )


@triton.jit
def tc_dot(a, b, acc):
    """tl.dot on tensor cores. The interpreter gets fp64 copies (Triton 3.9's mis-multiplies bf16) and adds the
    step's dot rounded to fp32: numpy's fp32 matmul sums in an order that depends on its operands' memory
    layout (numpy 2.4.6 with OpenBLAS 0.3.31: the same values in the same K order gave other bits until the
    operands were made contiguous), while these fp16-exact products sum exactly in fp64 at the tests' exponent
    ranges, so the twins that feed one step's operands in different layouts stay bit-identical."""
    if INTERP:
        return acc + tl.dot(a.to(tl.float64), b.to(tl.float64), out_dtype=tl.float64).to(tl.float32)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def round_to_e4m3(x):
    """Round float32 to the nearest E4M3 value (ties to even, saturating at +-448), still as float32.

    Casting the result to float8 is then exact everywhere; Triton's interpreter rounds some casts wrongly
    (e.g. -127.5 -> -64), so the rounding is done here in plain arithmetic.
    """
    a = tl.minimum(tl.abs(x), 448.0)
    bits = a.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = (a + 16384.0) - 16384.0  # multiples of 2^-9 below 2^-6 (E4M3 subnormals)
    r = tl.minimum(tl.where(a < 0.015625, sub, normal), 448.0)
    return tl.where(x < 0, -r, r)


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program `pid`, with GROUP_M consecutive programs sharing a band of W tiles through L2."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit
def gemv_products(v, xp, xm):
    """CUDA-core partial sums: for weight words v [R, W] and activation pointers xp [M, W] (element 8w of each
    word; masked by xm), sum_e W[r, 8w + e] * x[m, 8w + e] as fp32 [M, R, W], still times 2^-14 (F16_TRICK)."""
    a, b, c, d = e2m1_pairs(v)
    p = half_lo(a)[None] * tl.load(xp + 0, mask=xm, other=0.0).to(tl.float32)[:, None, :]
    p += half_lo(b)[None] * tl.load(xp + 1, mask=xm, other=0.0).to(tl.float32)[:, None, :]
    p += half_lo(c)[None] * tl.load(xp + 2, mask=xm, other=0.0).to(tl.float32)[:, None, :]
    p += half_lo(d)[None] * tl.load(xp + 3, mask=xm, other=0.0).to(tl.float32)[:, None, :]
    p += half_hi(a)[None] * tl.load(xp + 4, mask=xm, other=0.0).to(tl.float32)[:, None, :]
    p += half_hi(b)[None] * tl.load(xp + 5, mask=xm, other=0.0).to(tl.float32)[:, None, :]
    p += half_hi(c)[None] * tl.load(xp + 6, mask=xm, other=0.0).to(tl.float32)[:, None, :]
    p += half_hi(d)[None] * tl.load(xp + 7, mask=xm, other=0.0).to(tl.float32)[:, None, :]
    return p
