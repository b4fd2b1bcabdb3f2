"""Microscaled 4/8-bit formats: MXFP4 (OCP MX v1.0), NVFP4 and MXFP8, as torch reference codecs.

These are the ground truth the Triton kernels are checked against, so they favour exactness over speed:
every scale is a power of two built bit-exactly from a table, every element is rounded to nearest E2M1
(ties to the even code) after an exact division by that power of two.

Byte layouts (see DESIGN.md "Formats"):
  openai: blocks[..., K/32, 16], byte j holds element 2j in its low nibble and 2j+1 in its high nibble.
  ggml:   the same 16 bytes per block, but byte j holds element j (low) and element j+16 (high);
          the 17-byte `block_mxfp4` on disk is the scale byte followed by those 16 bytes.
The E8M0 scale byte means the same in both layouts (ggml's doubled values with a half scale cancel out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MX_BLOCK = 32
NV_BLOCK = 16
LAYOUTS = ("openai", "ggml")
ROUNDINGS = ("floor", "ceil", "rceil", "even")

#: E2M1 code -> value (code 8 is negative zero).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# Midpoints between neighbouring E2M1 magnitudes; a tie goes up only where the upper code is even.
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_TIES_UP = (0.75, 1.75, 3.5)


def _e8m0_table() -> torch.Tensor:
    """float32 value of every E8M0 byte: 2^(b-127), byte 255 = NaN. Built in float64, exact in float32."""
    vals = [2.0 ** (b - 127) for b in range(255)] + [float("nan")]
    return torch.tensor(vals, dtype=torch.float64).to(torch.float32)


_TABLES: dict[tuple[str, torch.device], torch.Tensor] = {}


def _table(name: str, device: torch.device) -> torch.Tensor:
    key = (name, device)
    if key not in _TABLES:
        if name == "e2m1":
            t = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        elif name == "e8m0":
            t = _e8m0_table()
        elif name == "bounds":
            t = torch.tensor(_E2M1_BOUNDS, dtype=torch.float32)
        else:  # pragma: no cover - internal
            raise KeyError(name)
        _TABLES[key] = t.to(device)
    return _TABLES[key]


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 codes (any integer tensor with values 0..15) to float32."""
    return _table("e2m1", codes.device)[codes.long()]


def e8m0_to_float(scale_bytes: torch.Tensor) -> torch.Tensor:
    """Decode E8M0 scale bytes to float32: 2^(byte-127); byte 255 is NaN."""
    return _table("e8m0", scale_bytes.device)[scale_bytes.long()]


def float_to_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round float32 values (already divided by their scale) to the nearest E2M1 code.

    Ties go to the even code (IEEE round-half-even), magnitudes above 6 saturate to +-6, and the sign
    bit is kept, so -0.0 and tiny negatives become code 8 (negative zero).
    """
    a = v.abs()
    code = torch.bucketize(a, _table("bounds", v.device))  # number of midpoints strictly below |v|
    for t in _E2M1_TIES_UP:
        code = code + (a == t).to(code.dtype)
    code = torch.where(torch.isinf(a), torch.full_like(code, 7), code)
    return (code | (torch.signbit(v).to(code.dtype) << 3)).to(torch.uint8)


# --------------------------------------------------------------------------------------------------------
# Validation helpers (errors name the argument and the rule)


def _check_tensor(name: str, t, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {allowed}, got {str(t.dtype).replace('torch.', '')}")


_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_input(x, block: int, name: str = "x") -> None:
    _check_tensor(name, x, _FLOATS)
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the K axis), got a scalar")
    if x.shape[-1] % block != 0:
        raise ValueError(f"{name}: last dimension K={x.shape[-1]} must be a multiple of the block size {block}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinity; microscaled formats cannot encode them")


def _check_rounding(rounding: str) -> None:
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")


# --------------------------------------------------------------------------------------------------------
# Shared-exponent (E8M0) scale rules


def e8m0_scale_bytes(amax: torch.Tensor, *, emax: int, mbits: int, max_normal: float, rounding: str) -> torch.Tensor:
    """E8M0 scale byte per block from the block's absolute maximum.

    With e0 = floor(log2 amax) - emax (the OCP rule), the modes are:
      floor: e0.
      ceil / rceil (the same rule, two names in use): the smallest power of two with amax <= max_normal * 2^e,
             i.e. amax / max_normal rounded up to a power of two (triton_kernels' and cuBLAS's default);
             computed exactly, no element ever saturates.
      even:  e0 + 1 when amax rounded to the element's mantissa width carries into the next binade
             (amax >= (2 - 2^-(mbits+1)) * 2^(emax+e0)), else e0 (torchao's EVEN).
    An all-zero block gets byte 0; bytes are clamped to 0..254 (255 is NaN).
    """
    _check_rounding(rounding)
    m, ex = torch.frexp(amax.to(torch.float32))  # amax = m * 2^ex with m in [0.5, 1), exact
    e0 = ex.to(torch.int32) - 1 - emax
    if rounding in ("ceil", "rceil"):
        bump = m > max_normal / 2.0 ** (emax + 1)  # amax > max_normal * 2^e0
    elif rounding == "even":
        bump = m >= 1.0 - 2.0 ** -(mbits + 2)  # amax >= (2 - 2^-(mbits+1)) * 2^(emax + e0)
    else:
        bump = torch.zeros_like(m, dtype=torch.bool)
    byte = torch.clamp(e0 + bump.to(torch.int32) + 127, 0, 254)
    byte = torch.where(m == 0, torch.zeros_like(byte), byte)
    return byte.to(torch.uint8)


def _divide_by_scale(xb: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """x / 2^(byte-127), exact: multiply by 2^(127-byte), which is the E8M0 value of byte 254-byte."""
    inv = e8m0_to_float(254 - scale_bytes.to(torch.int32))
    return xb * inv.unsqueeze(-1)


# --------------------------------------------------------------------------------------------------------
# Nibble packing


def pack_nibbles(codes: torch.Tensor, layout: str) -> torch.Tensor:
    """Pack E2M1 codes [..., nblocks, 32] into bytes [..., nblocks, 16] in the given layout."""
    c = codes.to(torch.uint8)
    if layout == "openai":
        lo, hi = c[..., 0::2], c[..., 1::2]
    elif layout == "ggml":
        lo, hi = c[..., :16], c[..., 16:]
    else:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return lo | (hi << 4)


def unpack_nibbles(blocks: torch.Tensor, layout: str) -> torch.Tensor:
    """Unpack bytes [..., nblocks, 16] into E2M1 codes [..., nblocks, 32] in element order."""
    lo, hi = blocks & 0x0F, blocks >> 4
    if layout == "openai":
        return torch.stack((lo, hi), dim=-1).flatten(-2)
    if layout == "ggml":
        return torch.cat((lo, hi), dim=-1)
    raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")


# --------------------------------------------------------------------------------------------------------
# MXFP4


@dataclass(frozen=True)
class MXFP4Tensor:
    """An MXFP4 tensor of logical shape [..., K] (weights are [N, K] like nn.Linear, experts [E, N, K]).

    blocks: uint8 [..., K/32, 16] packed E2M1 codes in `layout` nibble order.
    scales: uint8 [..., K/32] E8M0 scale bytes (value 2^(byte-127)).
    """

    blocks: torch.Tensor
    scales: torch.Tensor
    layout: str
    shape: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        _check_tensor("blocks", self.blocks, (torch.uint8,))
        _check_tensor("scales", self.scales, (torch.uint8,))
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if len(self.shape) == 0 or self.shape[-1] % MX_BLOCK != 0:
            raise ValueError(f"shape: last dimension K must be a positive multiple of {MX_BLOCK}, got {self.shape}")
        lead, kb = self.shape[:-1], self.shape[-1] // MX_BLOCK
        if tuple(self.blocks.shape) != (*lead, kb, 16):
            raise ValueError(
                f"blocks must have shape {(*lead, kb, 16)} for logical shape {self.shape}, "
                f"got {tuple(self.blocks.shape)}"
            )
        if tuple(self.scales.shape) != (*lead, kb):
            raise ValueError(
                f"scales must have shape {(*lead, kb)} to pair with blocks {tuple(self.blocks.shape)}, "
                f"got {tuple(self.scales.shape)}"
            )
        if self.blocks.device != self.scales.device:
            raise ValueError(f"blocks ({self.blocks.device}) and scales ({self.scales.device}) must be on one device")

    @property
    def K(self) -> int:
        return self.shape[-1]

    @property
    def device(self) -> torch.device:
        return self.blocks.device

    @property
    def nbytes(self) -> int:
        """Bytes a kernel must read: packed elements plus scale bytes."""
        return self.blocks.numel() + self.scales.numel()

    def to(self, device) -> MXFP4Tensor:
        return MXFP4Tensor(self.blocks.to(device), self.scales.to(device), self.layout, self.shape)

    def cpu(self) -> MXFP4Tensor:
        return self.to("cpu")

    def cuda(self) -> MXFP4Tensor:
        return self.to("cuda")

    def __getitem__(self, idx) -> MXFP4Tensor:
        """Index the leading (non-K) dimensions, e.g. w[e] for one expert of a stacked [E, N, K] weight."""
        blocks, scales = self.blocks[idx], self.scales[idx]
        if blocks.dim() < 2 or blocks.shape[-2:] != self.blocks.shape[-2:]:
            raise IndexError("MXFP4Tensor indexing may only select along the leading (non-K) dimensions")
        return MXFP4Tensor(blocks, scales, self.layout, (*blocks.shape[:-2], self.K))

    def __repr__(self) -> str:
        return f"MXFP4Tensor(shape={self.shape}, layout={self.layout!r}, device={self.device})"


def _check_nan_scales(scales: torch.Tensor, allow_nan: bool) -> None:
    if not allow_nan and bool((scales == 255).any()):
        n = int((scales == 255).sum())
        raise ValueError(f"scales: {n} scale byte(s) are 255 (E8M0 NaN); pass allow_nan=True to accept them")


def from_openai(blocks: torch.Tensor, scales: torch.Tensor, *, allow_nan: bool = False) -> MXFP4Tensor:
    """Wrap gpt-oss / Hugging Face checkpoint tensors `.blocks` [..., K/32, 16] and `.scales` [..., K/32]."""
    _check_tensor("blocks", blocks, (torch.uint8,))
    _check_tensor("scales", scales, (torch.uint8,))
    if blocks.dim() < 2 or blocks.shape[-1] != 16:
        raise ValueError(f"blocks must have shape [..., K/32, 16], got {tuple(blocks.shape)}")
    if tuple(scales.shape) != tuple(blocks.shape[:-1]):
        raise ValueError(
            f"scales shape {tuple(scales.shape)} does not pair with blocks {tuple(blocks.shape)}: "
            f"expected {tuple(blocks.shape[:-1])}"
        )
    _check_nan_scales(scales, allow_nan)
    shape = (*blocks.shape[:-2], blocks.shape[-2] * MX_BLOCK)
    return MXFP4Tensor(blocks, scales, "openai", shape)


def from_ggml(raw: torch.Tensor, *, allow_nan: bool = False) -> MXFP4Tensor:
    """Wrap llama.cpp `block_mxfp4` bytes: uint8 [..., K/32, 17] (scale byte, then 16 packed bytes),
    or the flat [..., K/32 * 17] row form GGUF files store."""
    _check_tensor("raw", raw, (torch.uint8,))
    if raw.dim() >= 1 and raw.shape[-1] != 17:
        if raw.shape[-1] % 17 != 0:
            raise ValueError(f"raw: last dimension {raw.shape[-1]} is not a multiple of the 17-byte block_mxfp4")
        raw = raw.reshape(*raw.shape[:-1], raw.shape[-1] // 17, 17)
    if raw.dim() < 2:
        raise ValueError(f"raw must have shape [..., K/32, 17], got {tuple(raw.shape)}")
    scales, blocks = raw[..., 0].contiguous(), raw[..., 1:].contiguous()
    _check_nan_scales(scales, allow_nan)
    shape = (*raw.shape[:-2], raw.shape[-2] * MX_BLOCK)
    return MXFP4Tensor(blocks, scales, "ggml", shape)


def to_ggml_bytes(q: MXFP4Tensor) -> torch.Tensor:
    """The 17-byte `block_mxfp4` form [..., K/32, 17] of q (repacked to ggml order if needed)."""
    g = repack_mxfp4(q, "ggml")
    return torch.cat((g.scales.unsqueeze(-1), g.blocks), dim=-1)


def quantize_mxfp4(x: torch.Tensor, *, layout: str = "openai", rounding: str = "floor") -> MXFP4Tensor:
    """Quantize x [..., K] (K a multiple of 32) to MXFP4 with the given scale rule and byte layout."""
    _check_input(x, MX_BLOCK)
    _check_rounding(rounding)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    xb = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // MX_BLOCK, MX_BLOCK)
    scales = e8m0_scale_bytes(xb.abs().amax(-1), emax=2, mbits=1, max_normal=E2M1_MAX, rounding=rounding)
    codes = float_to_e2m1(_divide_by_scale(xb, scales))
    return MXFP4Tensor(pack_nibbles(codes, layout), scales, layout, tuple(x.shape))


def mxfp4_codes(q: MXFP4Tensor) -> torch.Tensor:
    """E2M1 codes of q in logical element order, shape [..., K] (uint8)."""
    return unpack_nibbles(q.blocks, q.layout).reshape(q.shape)


def dequantize_mxfp4(q: MXFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode q to a dense tensor of its logical shape (exact in float32 and bfloat16)."""
    if not isinstance(q, MXFP4Tensor):
        raise TypeError(f"q must be an MXFP4Tensor, got {type(q).__name__}")
    vals = e2m1_to_float(unpack_nibbles(q.blocks, q.layout)) * e8m0_to_float(q.scales).unsqueeze(-1)
    return vals.reshape(q.shape).to(dtype)


def repack_mxfp4(q: MXFP4Tensor, layout: str) -> MXFP4Tensor:
    """Same values in another nibble layout (lossless; scale bytes are shared by both layouts)."""
    if not isinstance(q, MXFP4Tensor):
        raise TypeError(f"q must be an MXFP4Tensor, got {type(q).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout == q.layout:
        return q
    codes = unpack_nibbles(q.blocks, q.layout)
    return MXFP4Tensor(pack_nibbles(codes, layout), q.scales, layout, q.shape)


# --------------------------------------------------------------------------------------------------------
# NVFP4: blocks of 16, FP8 E4M3 block scales, one FP32 tensor scale


@dataclass(frozen=True)
class NVFP4Tensor:
    """NVFP4 tensor of logical shape [..., K]: value = e2m1 * e4m3(scale) * global_scale.

    blocks: uint8 [..., K/16, 8] (low nibble element 2j, like the openai MXFP4 layout).
    scales: uint8 [..., K/16] raw E4M3 bytes.  global_scale: float32 scalar tensor.
    """

    blocks: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.blocks.numel() + self.scales.numel() + 4


def quantize_nvfp4(x: torch.Tensor, *, global_scale: float | torch.Tensor | None = None) -> NVFP4Tensor:
    """Quantize x [..., K] (K a multiple of 16) to NVFP4.

    The tensor scale defaults to amax(x) / (6 * 448), so the largest block scale lands at the top of E4M3;
    block scales are amax_block / 6 / global_scale rounded to nearest E4M3.
    """
    _check_input(x, NV_BLOCK)
    xf = x.to(torch.float32)
    if global_scale is None:
        amax = xf.abs().amax() if xf.numel() else torch.zeros((), device=x.device)
        g = torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))
    else:
        g = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(())
        if not bool(g > 0):
            raise ValueError(f"global_scale must be positive, got {float(g)}")
    xb = xf.reshape(*x.shape[:-1], x.shape[-1] // NV_BLOCK, NV_BLOCK)
    s = (xb.abs().amax(-1) / E2M1_MAX / g).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    sf = s.to(torch.float32) * g
    safe = torch.where(sf > 0, sf, torch.ones_like(sf))
    codes = float_to_e2m1(xb / safe.unsqueeze(-1))
    codes = torch.where((sf > 0).unsqueeze(-1), codes, codes & 0x08)  # zero scale: keep only the sign
    return NVFP4Tensor(pack_nibbles_pairs(codes), s.view(torch.uint8), g.to(torch.float32), tuple(x.shape))


def pack_nibbles_pairs(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes [..., n] (n even) as bytes [..., n/2] with element 2j in the low nibble."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def dequantize_nvfp4(q: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode an NVFP4 tensor to a dense tensor of its logical shape."""
    if not isinstance(q, NVFP4Tensor):
        raise TypeError(f"q must be an NVFP4Tensor, got {type(q).__name__}")
    codes = torch.stack((q.blocks & 0x0F, q.blocks >> 4), dim=-1).flatten(-2)
    s = q.scales.view(torch.float8_e4m3fn).to(torch.float32) * q.global_scale
    return (e2m1_to_float(codes) * s.unsqueeze(-1)).reshape(q.shape).to(dtype)


# --------------------------------------------------------------------------------------------------------
# MXFP8 (E4M3 elements, E8M0 scales per 32): the activation format of W4A8


@dataclass(frozen=True)
class MXFP8Tensor:
    """MXFP8 tensor of logical shape [..., K]: data float8_e4m3fn [..., K], scales uint8 [..., K/32]."""

    data: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, ...]


def quantize_mxfp8(x: torch.Tensor, *, rounding: str = "floor") -> MXFP8Tensor:
    """Quantize x [..., K] to MXFP8 (E4M3 elements, saturating at +-448, round to nearest even)."""
    _check_input(x, MX_BLOCK)
    xb = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // MX_BLOCK, MX_BLOCK)
    scales = e8m0_scale_bytes(xb.abs().amax(-1), emax=8, mbits=3, max_normal=E4M3_MAX, rounding=rounding)
    data = _divide_by_scale(xb, scales).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return MXFP8Tensor(data.reshape(x.shape), scales, tuple(x.shape))


def dequantize_mxfp8(q: MXFP8Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode an MXFP8 tensor to a dense tensor of its logical shape."""
    if not isinstance(q, MXFP8Tensor):
        raise TypeError(f"q must be an MXFP8Tensor, got {type(q).__name__}")
    d = q.data.to(torch.float32).reshape(*q.shape[:-1], q.shape[-1] // MX_BLOCK, MX_BLOCK)
    return (d * e8m0_to_float(q.scales).unsqueeze(-1)).reshape(q.shape).to(dtype)
