"""Weight preparation: the layout the kernels read, made once at load time and cached on the weight.

Every kernel reads the openai layout. `prepare_mxfp4` repacks a ggml weight (the only copy it may make),
exposes the packed bytes as 32-bit words (8 codes per word, no copy) and records the range of scale bytes,
which decides the variants whose fast decode is exact for this weight (see each variant's scale window).
Call it once after loading; `mxfp4_linear` and `moe_mxfp4` call it themselves on first use and reuse the
cached result, so no call after the first pays for it.

`tile_mxfp4` makes the one other layout, for the tensor-core kernels' TILED option: each 16-row group's words
and scale bytes stored chunk by chunk (128 K per chunk) so that a warp streams one contiguous run of memory.
Why: read in 64-256-byte pieces of rows 1440 bytes apart, the lm_head weight streams at 1.7-2.2 TB/s on an
H100; stored tile-contiguous the same bytes stream at 2.5-2.6 TB/s (`.device/pattern.py`,
results/20261123T040401-h100-80gb-hbm3-pattern).

The layout is chosen once, at load time, and one copy is kept:
- rows: `prepare_mxfp4(w)` (free for an openai-layout weight). Every variant reads it.
- tiled: `tile_mxfp4(prepare_mxfp4(w))` (mlp1's w1: `deinterleave=True`), then drop w. Only TILED configs read
  it; `mxfp4_linear` / `moe_mxfp4` given a tiled weight pick from the tiled auto tables.
`shuffle_nibbles` permutes the bits inside each 32-bit word (rows or tiled) for the NIB option of the h2g and
mma kernels, whose decode then costs 9 instructions per word instead of 15 (kernels/decode.py: nib_pairs); scales and
word order are unchanged.
Passing a row-major weight to a TILED (or NIB) config still works (the copy is made on first use and cached):
that is how sweeps measure both layouts from one weight, holding both copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import MXFP4Tensor, repack_mxfp4

_CACHE_ATTR = "_prepared"

#: The two weight layouts a kernel reads: "rows" (prepare_mxfp4) and "tiled" (tile_mxfp4).
WEIGHT_LAYOUTS = ("rows", "tiled")
#: ... and the four ways to hold a weight: each layout as is or as shuffle_nibbles' copy ("+nib", NIB configs).
HELD_LAYOUTS = (*WEIGHT_LAYOUTS, *(f"{w}+nib" for w in WEIGHT_LAYOUTS))


@dataclass(frozen=True)
class PreparedMXFP4:
    """Kernel-ready view of an MXFP4 weight of logical shape [..., N, K].

    blocks: uint8 [..., N, K/2] packed codes (openai order); words: the same bytes as int32 [..., N, K/8];
    scales: uint8 [..., N, K/32]; scale_min/scale_max: the extreme scale bytes (host ints).
    tiled: words and scales are tile_mxfp4's chunk-major layout (blocks then views the same bytes);
    deinterleaved: tiled with mlp1's gate rows first, then its linear rows (tile_mxfp4(deinterleave=True)).
    shuffled: each word's bits are in shuffle_nibbles' order (blocks then views those bytes).
    """

    blocks: torch.Tensor
    words: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, ...]
    scale_min: int
    scale_max: int
    tiled: bool = False
    deinterleaved: bool = False
    shuffled: bool = False

    @property
    def N(self) -> int:
        return self.shape[-2]

    @property
    def K(self) -> int:
        return self.shape[-1]


def prepare_mxfp4(w: MXFP4Tensor) -> PreparedMXFP4:
    """Kernel-ready layout of w (cached on w: the second call is free)."""
    if not isinstance(w, MXFP4Tensor):
        raise TypeError(f"w must be an MXFP4Tensor, got {type(w).__name__}")
    cached = getattr(w, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    if len(w.shape) < 2:
        raise ValueError(f"w must have at least 2 dimensions [..., N, K], got shape {w.shape}")
    o = repack_mxfp4(w, "openai")
    lead = w.shape[:-1]
    blocks = o.blocks.reshape(*lead, w.K // 2).contiguous()
    scales = o.scales.contiguous()
    if scales.numel():
        smin, smax = int(scales.min()), int(scales.max())
    else:
        smin, smax = 127, 127
    p = PreparedMXFP4(blocks, blocks.view(torch.int32), scales, w.shape, smin, smax)
    object.__setattr__(w, _CACHE_ATTR, p)
    return p


TILE_ROWS = 16  # rows per tile: one mma.sync A tile
TILE_K = 128  # K per chunk: 16 words and 4 scale bytes per row


def tile_mxfp4(p, deinterleave: bool = False) -> PreparedMXFP4:
    """The chunk-major layout of p (cached on p): words [..., G, KC, 16, 16] and scales [..., G, KC, 16, 4],
    G = ceil(rows / 16) groups of 16 rows, KC = ceil(K / 128) chunks; rows and K padded with zero bytes.

    deinterleave (mlp1's w1, gate rows 2j and linear rows 2j + 1): gate rows first, then linear rows, each half
    padded to whole groups, so a 16-row tile holds 16 gate (or 16 linear) rows and gate j and linear j sit in
    tiles G/2 apart. Costs a copy of the weight; made once, like prepare_mxfp4. p may be the MXFP4Tensor itself.
    """
    if not isinstance(p, PreparedMXFP4):
        p = prepare_mxfp4(p)
    attr = "_tiled_deinterleaved" if deinterleave else "_tiled"
    cached = getattr(p, attr, None)
    if cached is not None:
        return cached
    if p.tiled:
        if p.deinterleaved == deinterleave:
            return p
        how = " (deinterleaved)" if p.deinterleaved else ""
        raise ValueError(f"p is already tiled{how}: tile the row-major weight (prepare_mxfp4) instead")
    if p.shuffled:
        raise ValueError("p is shuffled (shuffle_nibbles): tile the unshuffled weight, then shuffle the tiles")
    if deinterleave and p.N % 2:
        raise ValueError(f"deinterleave needs an even number of rows (gate, linear pairs), got {p.N}")
    lead, K = p.shape[:-2], p.K
    kc = -(-K // TILE_K)

    def tiles(t: torch.Tensor, per_chunk: int) -> torch.Tensor:
        halves = (t[..., 0::2, :], t[..., 1::2, :]) if deinterleave else (t,)
        padded = []
        for h in halves:
            rows = -(-h.shape[-2] // TILE_ROWS) * TILE_ROWS
            padded.append(torch.nn.functional.pad(h, (0, kc * per_chunk - h.shape[-1], 0, rows - h.shape[-2])))
        t = torch.cat(padded, dim=-2)
        g = t.shape[-2] // TILE_ROWS
        return t.reshape(*lead, g, TILE_ROWS, kc, per_chunk).transpose(-3, -2).contiguous()

    words = tiles(p.words, TILE_K // 8)
    q = PreparedMXFP4(words.view(torch.uint8), words, tiles(p.scales, TILE_K // 32), p.shape, p.scale_min,
                      p.scale_max, tiled=True, deinterleaved=deinterleave)
    object.__setattr__(p, attr, q)
    return q


def tail_half(p) -> tuple[torch.Tensor, torch.Tensor]:
    """The real half of the last chunk of tile_mxfp4's copy p (tiled, K % 128 == 64), for gemv_mma's and
    moe_mma's TAIL (cached on p): words int32 [G, 1, 128] (each 16-row group's 8 words per row, as tiled) and
    scale bytes uint8 [1, G, 64] (each row's two block scales twice, s0 s0 s1 s1: byte t is lane t's), G counting
    the groups of every leading dimension (an expert stack's expert e holds groups e * G_e ..).

    Why: with K = 2880 the last of 23 chunks is half padding, which the TMA ring read whole and decoded and
    multiplied as a whole step: the 2-8-token lm_head times K = 2880 like K = 2944 and 4.3 us slower than K = 2816
    (results/20261127T173156-h100-80gb-hbm3-linear-k-tail). TAIL runs the half chunk as a half step: lane t of a
    row decodes its words 2t and 2t + 1 (elements 16 t .. 16 t + 15, block t // 2), four wgmma k-steps instead of
    eight. p may be shuffle_nibbles' copy of the tiled weight (the words are taken as they are)."""
    if not p.tiled:
        raise ValueError("tail_half reads tile_mxfp4's copy (words [..., G, KC, 16, 16]): tile the weight first")
    if p.K % TILE_K != TILE_K // 2:
        raise ValueError(f"tail_half needs K % {TILE_K} == {TILE_K // 2} (a half last chunk), got K={p.K}")
    cached = getattr(p, "_tail_half", None)
    if cached is None:
        kc = p.words.shape[-3]
        w, sc = p.words.reshape(-1, kc, 16, 16), p.scales.reshape(-1, kc, 16, 4)
        G = w.shape[0]
        words = w[:, -1, :, :TILE_K // 16].reshape(G, 1, 128).contiguous()
        scales = sc[:, -1, :, :TILE_K // 64].repeat_interleave(2, dim=-1).reshape(1, G, 64).contiguous()
        cached = (words, scales)
        object.__setattr__(p, "_tail_half", cached)
    return cached


def step_major(p) -> tuple[torch.Tensor, torch.Tensor]:
    """tile_mxfp4's copy p with its chunks outermost, for gemv_mma's STEP_MAJOR (cached on p): words int32
    [KC, G, 16, 16] and scale bytes uint8 [KC, G, 16, 4], G counting the groups of every leading dimension.

    Why: gemv_mma's TMA ring reads, per K step, one chunk of a program's 8 consecutive 16-row groups. In
    tile_mxfp4's order those are 8 pieces of 1 KB (and 8 of 64 scale bytes) a group's K apart, and the programs
    running together read 184 KB apart; chunks outermost, a step's words are one 8 KB piece and neighbouring
    programs read neighbouring pieces. A plain read of the lm_head's words in that program pattern took 97.8 us
    against 98.5 (results/20261127T202714-h100-80gb-hbm3-step-major). p may be shuffle_nibbles' copy of the
    tiled weight (the words are taken as they are). Costs a copy of the weight."""
    if not p.tiled:
        raise ValueError("step_major reorders tile_mxfp4's copy (words [..., G, KC, 16, 16]): tile the weight first")
    cached = getattr(p, "_step_major", None)
    if cached is None:
        kc = p.words.shape[-3]
        words = p.words.reshape(-1, kc, 16, 16).transpose(0, 1).contiguous()
        scales = p.scales.reshape(-1, kc, 16, 4).transpose(0, 1).contiguous()
        cached = (words, scales)
        object.__setattr__(p, "_step_major", cached)
    return cached


def shuffle_words(words: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """int32 words of 8 E2M1 codes (openai order: code e at bits 4e..4e+3) -> the same codes with bit b of
    code e moved to bit NIB_BITS[e][b] (kernels/decode.py), or back with inverse=True."""
    from .decode import NIB_BITS

    v = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros_like(v)
    for e, bits in enumerate(NIB_BITS):
        for b, pos in enumerate(bits):
            src, dst = (pos, 4 * e + b) if inverse else (4 * e + b, pos)
            out |= ((v >> src) & 1) << dst
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def shuffle_nibbles(p) -> PreparedMXFP4:
    """p with every word's bits in shuffle_nibbles' order (cached on p), for the h2g and mma kernels' NIB option:
    a copy of the words (rows or tiled, as p is), scales shared. Made once, like tile_mxfp4: 32 elementwise torch
    passes (one per bit) over chunks of ~16M words, 61 ms for the lm_head and 220 ms for a gpt-oss-120b mlp1
    weight on an H100 (results/20261123T220930-h100-80gb-hbm3-shuffle-cost)."""
    if not isinstance(p, PreparedMXFP4):
        p = prepare_mxfp4(p)
    if p.shuffled:
        return p
    cached = getattr(p, "_shuffled", None)
    if cached is not None:
        return cached
    words = torch.empty_like(p.words)
    rows = p.words.reshape(-1, p.words.shape[-1])
    out = words.reshape(rows.shape)
    step = max(1, (1 << 24) // max(1, rows.shape[-1]))  # ~16M words at a time: bounded int64 temporaries
    for r0 in range(0, rows.shape[0], step):
        out[r0:r0 + step] = shuffle_words(rows[r0:r0 + step])
    q = PreparedMXFP4(words.view(torch.uint8).reshape(p.blocks.shape), words, p.scales, p.shape, p.scale_min,
                      p.scale_max, tiled=p.tiled, deinterleaved=p.deinterleaved, shuffled=True)
    object.__setattr__(p, "_shuffled", q)
    return q


def row_scale_max(p) -> torch.Tensor:
    """Each row's largest scale byte, int32 [..., N] (cached on p): w4a8_fp8 decodes a row's weights to E4M3
    relative to it. Made once, like the layouts, instead of a pass over the row's scale bytes in every program
    (at 2048 lm_head tokens ~25k programs would reread 145 MB of scale bytes)."""
    if not isinstance(p, PreparedMXFP4):
        p = prepare_mxfp4(p)
    if p.tiled:
        raise ValueError("row_scale_max reads the row-major scales (prepare_mxfp4), not tile_mxfp4's copy")
    cached = getattr(p, "_row_scale_max", None)
    if cached is None:
        cached = p.scales.amax(dim=-1).to(torch.int32)
        object.__setattr__(p, "_row_scale_max", cached)
    return cached


def in_layout(w, layout: str, deinterleave: bool = False):
    """w held in one of HELD_LAYOUTS: "rows" leaves it as it is, "tiled" is tile_mxfp4(w, deinterleave) and "+nib"
    shuffle_nibbles of either (made once and cached on w, like both). deinterleave: mlp1's w1, tiled only."""
    if layout not in HELD_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(HELD_LAYOUTS)}, got {layout!r}")
    if layout.startswith("tiled"):
        w = tile_mxfp4(w, deinterleave=deinterleave)
    return shuffle_nibbles(w) if layout.endswith("+nib") else w
