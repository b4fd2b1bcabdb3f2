"""mxfp4_linear: every registered variant against reference_linear through the Triton interpreter (or the GPU).

Tolerance: outputs are bf16, whose rounding alone gives a norm-wise relative error near 2^-9 (~2e-3); the
fp32 accumulation order adds far less. 1e-2 therefore passes every correct kernel and fails any wrong
element pattern (a dropped block, a swapped nibble, a wrong scale all give errors >= 1e-1). The W4A8 variant
quantizes activations to MXFP8 (3 mantissa bits), which costs ~3% and gets 8e-2.
"""

import pytest
import torch

import kernels as K
from kernels._triton import tl, triton
from kernels.decode import e2m1_pairs, nib_pairs
from kernels.linear import linear_problem
from kernels.tables import LINEAR_TABLE, pick_linear

LINEAR = {n: v for n, v in K.VARIANTS.items() if v.op == "linear"}


def tol(name):
    return 8e-2 if LINEAR[name].extra.get("lossy_activations") else 1e-2


def rel_err(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def make(m, n, k, seed, dev, layout="openai", bias=True):
    g = torch.Generator().manual_seed(seed)
    w = K.quantize_mxfp4(torch.randn(n, k, generator=g) * 0.05, layout=layout).to(dev)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(dev)
    b = (torch.randn(n, generator=g) * 0.1).to(torch.bfloat16).to(dev) if bias else None
    ref = K.reference_linear(x.float().cpu(), w.to("cpu"), b.float().cpu() if bias else None).to(dev)
    return x, w, b, ref


SHAPES = [(1, 200, 160), (3, 72, 96), (17, 40, 288)]  # N, K multiples of no tile; M in {1, 3, 17}


@pytest.mark.parametrize("name", sorted(LINEAR))
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_variant_matches_reference(name, m, n, k, device):
    x, w, b, ref = make(m, n, k, seed=m * 7 + n, dev=device)
    p = K.prepare_mxfp4(w)
    v, seed = LINEAR[name], f"{name}{m}{n}{k}"
    cfgs = v.sample(linear_problem(m, p), 2, seed)  # two allowed configs drawn from the whole space
    assert cfgs, f"{name} has no config for m={m}, n={n}, k={k}"
    staged = v.sample(linear_problem(m, p), 1, seed,  # a pipelined K loop, where one exists
                      where=lambda c: c.get("num_stages", 1) > 2 and c not in cfgs)
    for cfg in [v.defaults] + cfgs + staged:
        if LINEAR[name].reason(cfg, linear_problem(m, p)):
            continue
        y = K.mxfp4_linear(x, w, b, variant=name, **cfg)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        assert rel_err(y, ref) < tol(name), cfg


@pytest.mark.parametrize("name", sorted(LINEAR))
def test_ggml_layout_and_no_bias(name, device):
    x, w, _, ref = make(3, 72, 96, seed=5, dev=device, layout="ggml", bias=False)
    assert w.layout == "ggml"
    cfg = LINEAR[name].first(linear_problem(3, K.prepare_mxfp4(w)))
    y = K.mxfp4_linear(x, w, variant=name, **cfg)
    assert rel_err(y, ref) < tol(name)
    # repacking to openai gives the identical result
    y2 = K.mxfp4_linear(x, K.repack_mxfp4(w, "openai"), variant=name, **cfg)
    assert torch.equal(y, y2)


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemv_mma_tiled_weight_gives_the_same_result(m, n, k, device):
    """TILED reads tile_mxfp4's chunk-major copy (rows padded to 16, K to 128): the same words meet the same x
    in the same order, so the output is bit-identical to the row-major weight's, K tails included."""
    x, w, b, ref = make(m, n, k, seed=m + n, dev=device)
    for cfg in ({"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 1, "PREFETCH": True, "num_warps": 2},
                {"BLOCK_M": 16, "ROWS": 2, "CHUNKS": 2, "PREFETCH": False, "num_warps": 1, "MAXNREG": 168}):
        y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)
        assert torch.equal(K.mxfp4_linear(x, w, b, variant="gemv_mma", TILED=True, **cfg), y)
        assert rel_err(y, ref) < tol("gemv_mma")


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemv_mma_wgmma_path_matches_mma_sync(m, n, k, device):
    """WGMMA stores x in logical K order (x_to_f16(logical=True)) and multiplies the same decoded weights: on
    the interpreter (the same arithmetic as the Gluon kernel) the result is bit-identical to mma.sync's, K
    tails included; on a GPU the tensor cores may sum in another order, so there it is held to the bound."""
    x, w, b, ref = make(m, n, k, seed=m + 2 * n, dev=device)
    for cfg, ring in (({"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 1, "num_warps": 4}, {"STAGES": 2}),
                      ({"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 2, "num_warps": 8, "TILED": True}, {"STAGES": 4}),
                      ({"BLOCK_M": 32, "ROWS": 2, "CHUNKS": 1, "num_warps": 4, "TILED": True},
                       {"STAGES": 3, "RING_W": True})):
        y = K.mxfp4_linear(x, w, b, variant="gemv_mma", WGMMA=True, **ring, **cfg)
        assert rel_err(y, ref) < tol("gemv_mma")
        if device.type == "cpu":
            assert torch.equal(y, K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg))


def wide_span_weight(n, k, seed, dev):
    """An MXFP4 weight whose scale bytes span exactly 24 binades (the most the fp16-weight decodes hold
    exactly): block j of row r is random with its largest magnitude 4 * 2^-((j + r) % 25)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k // 32, 32, generator=g)
    e = (torch.arange(k // 32)[None, :] + torch.arange(n)[:, None]) % 25
    w = w / w.abs().amax(-1, keepdim=True) * torch.exp2(2.0 - e.float())[..., None]
    w = K.quantize_mxfp4(w.reshape(n, k), layout="openai")
    p = K.prepare_mxfp4(w)
    assert p.scale_max - p.scale_min == 24, (p.scale_min, p.scale_max)
    return w.to(dev)


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemv_mma_shuffled_nibbles_is_bit_identical(m, n, k, device):
    """NIB decodes shuffle_nibbles' words into the same fp16 weights (pairs B, D come 2^8 larger and meet a
    multiplier 2^8 smaller, exact even where that multiplier is an fp16 subnormal at a 24-binade scale span):
    bit-identical to the plain decode for mma.sync, TILED and WGMMA with RING_W. Shuffled weights run only NIB."""
    x, _, b, _ = make(m, n, k, seed=m + 3 * n, dev=device)
    w = wide_span_weight(n, k, seed=n, dev=device)
    for cfg in ({"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 2, "PREFETCH": True, "num_warps": 2},
                {"BLOCK_M": 16, "ROWS": 2, "CHUNKS": 1, "num_warps": 1, "TILED": True},
                {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 1, "num_warps": 4, "TILED": True, "WGMMA": True,
                 "STAGES": 3, "RING_W": True}):
        y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)
        assert torch.equal(K.mxfp4_linear(x, w, b, variant="gemv_mma", NIB=True, **cfg), y), cfg
    s, rows = K.shuffle_nibbles(w), {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 1, "num_warps": 4}
    assert torch.equal(K.mxfp4_linear(x, s, b, variant="gemv_mma", NIB=True, **rows),
                       K.mxfp4_linear(x, w, b, variant="gemv_mma", **rows))
    with pytest.raises(ValueError, match="shuffle_nibbles' layout"):
        K.mxfp4_linear(x, s, b, variant="gemv_mma", **rows)


@pytest.mark.parametrize("m,n,k", SHAPES + [(2, 56, 192)])
def test_gemv_mma_block_columns_match_the_scaled_decode(m, n, k, device):
    """BC multiplies unscaled weights into 8 MMA columns a token (x_to_f16's bc rows: column 2t + h holds lane
    t's block, pair half h) and scales the columns after each chunk: at a 24-binade scale span, with and without
    NIB, at 1-8 tokens a program and K tails, it agrees with the pre-scaled decode to within bf16 rounding
    (another fp32 summation order, so not bit for bit) and with the reference. K = 192 (K % 128 == 64) takes
    TAIL's half step on the GPU (the interpreter twin reads the zero-padded chunk)."""
    x, _, b, _ = make(m, n, k, seed=m + 5 * n, dev=device)
    w = wide_span_weight(n, k, seed=n + 1, dev=device)
    ref = K.reference_linear(x.float().cpu(), w.to("cpu"), b.float().cpu()).to(device)
    base = {"ROWS": 1, "num_warps": 4, "TILED": True, "WGMMA": True, "STAGES": 2, "RING_W": True, "TMA": 2}
    for bc, cfg in ((True, {"BLOCK_M": 8, "CHUNKS": 1, "NIB": True}),
                    (True, {"BLOCK_M": 16, "CHUNKS": 2, "SEQ": 2, "NIB": True}),
                    (True, {"BLOCK_M": 32, "CHUNKS": 1, "TAIL": True}),
                    (True, {"BLOCK_M": 64, "CHUNKS": 2, "SEQ": True}),
                    (2, {"BLOCK_M": 8, "CHUNKS": 2, "SEQ": 2, "NIB": True}),
                    (2, {"BLOCK_M": 16, "CHUNKS": 1, "NIB": True, "TAIL": True})):
        cfg = {**base, **cfg}
        y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)
        yb = K.mxfp4_linear(x, w, b, variant="gemv_mma", BC=bc, **cfg)
        assert rel_err(yb, y.float()) < 2e-3, (bc, cfg)
        assert rel_err(yb, ref) < tol("gemv_mma"), (bc, cfg)
    v = LINEAR["gemv_mma"]
    problem = linear_problem(m, K.prepare_mxfp4(w))
    assert "BC scales each chunk" in v.reason({**v.defaults, **base, "CHUNKS": 2, "BC": True}, problem)
    assert "apply only with WGMMA" in v.reason({**v.defaults, "BC": True}, problem)
    assert "it needs NIB" in v.reason({**v.defaults, **base, "BC": 2}, problem)
    assert "it needs TMA" in v.reason({**v.defaults, **base, "TMA": False, "NOBAR": True}, problem)
    assert "apply only with WGMMA" in v.reason({**v.defaults, "NOBAR": True}, problem)


def test_x_to_f16_block_column_rows(device):
    """x_to_f16(bc=True): row 8m + c is token m's logical row with only column c's positions (bc_keep) kept, so
    a token's 8 rows add up to its plain row; half_tail's positions too; xs is the plain call's."""
    from kernels.linear_f16 import x_to_f16
    g = torch.Generator().manual_seed(3)
    for m, k, half in ((1, 2880, True), (3, 320, False), (2, 192, True)):
        x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
        o, xs = x_to_f16(x, pad=128, logical=True, half_tail=half)
        ob, xsb = x_to_f16(x, pad=128, logical=True, half_tail=half, bc=1)
        assert ob.shape == (8 * m, o.shape[1]) and torch.equal(xs, xsb)
        q = torch.arange(o.shape[1], device=device)
        t, h = (q // 2) % 4, (q // 8) % 2
        for c in range(8):
            assert torch.equal(ob[c::8], torch.where(2 * t + h == c, o, torch.zeros_like(o)))
        # bc=2: row 8 g + c holds block t = c // 2 of token 2 g + c % 2 (the last token where that is past m),
        # pair half h = 1 taken down 2^8
        o2, xs2 = x_to_f16(x, pad=128, logical=True, half_tail=half, bc=2)
        assert o2.shape == (8 * -(-m // 2), o.shape[1]) and torch.equal(xs, xs2)
        down = torch.where(h == 1, o.float() / 256, o.float()).half()
        for r in range(o2.shape[0]):
            tok = min(2 * (r // 8) + r % 2, m - 1)
            assert torch.equal(o2[r], torch.where(t == (r % 8) // 2, down[tok], torch.zeros_like(o[0]))), r
    with pytest.raises(ValueError, match="bc needs logical order"):
        x_to_f16(x, bc=True)
    with pytest.raises(ValueError, match="bc is 0"):
        x_to_f16(x, logical=True, bc=4)


def test_tile_layout_places_each_row_chunk(device):
    """Word j of row r, chunk c sits at [r // 16, c, r % 16, j]; deinterleaved, gate row 2i and linear row
    2i + 1 land at group rows i and half + i; the tiled copy is cached, is its own tiling (a weight already
    held tiled passes through) and cannot be tiled the other way."""
    from kernels.prepare import tile_mxfp4

    p = K.prepare_mxfp4(K.quantize_mxfp4(torch.randn(2, 40, 288)).to(device))
    q = tile_mxfp4(p)
    assert q.words.shape == (2, 3, 3, 16, 16) and q.scales.shape == (2, 3, 3, 16, 4) and q.tiled
    assert tile_mxfp4(p) is q
    assert torch.equal(q.words[1, 2, 1, 5], p.words[1, 37, 16:32])
    assert torch.equal(q.scales[1, 2, 1, 5], p.scales[1, 37, 4:8])
    assert torch.equal(q.words[1, 2, 2, 5, :4], p.words[1, 37, 32:36]) and not q.words[1, 2, 2, 5, 4:].any()
    assert not q.words[:, 2, :, 8:].any()  # rows 40..47: padding
    d = tile_mxfp4(p, deinterleave=True)  # 20 gate rows -> groups 0-1, 20 linear rows -> groups 2-3
    assert d.words.shape == (2, 4, 3, 16, 16)
    assert torch.equal(d.words[0, 1, 0, 3], p.words[0, 2 * 19, :16])
    assert torch.equal(d.words[0, 2, 0, 3], p.words[0, 2 * 3 + 1, :16])
    assert tile_mxfp4(q) is q and tile_mxfp4(d, deinterleave=True) is d and d.deinterleaved and not q.deinterleaved
    with pytest.raises(ValueError, match="already tiled"):
        tile_mxfp4(q, deinterleave=True)
    with pytest.raises(ValueError, match=r"already tiled \(deinterleaved\)"):
        tile_mxfp4(d)
    with pytest.raises(ValueError, match="even number"):
        tile_mxfp4(K.prepare_mxfp4(K.quantize_mxfp4(torch.randn(3, 64)).to(device)), deinterleave=True)


def test_m_zero_gives_empty_output(device):
    x, w, b, _ = make(1, 40, 64, seed=1, dev=device)
    y = K.mxfp4_linear(x[:0], w, b)
    assert y.shape == (0, 40) and y.dtype == torch.bfloat16


@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 17, 64, 65, 512, 8192])
def test_auto_picks_a_valid_variant(m):
    w = K.quantize_mxfp4(torch.randn(64, 64))
    problem = linear_problem(m, K.prepare_mxfp4(w))
    name, cfg = pick_linear(problem)
    v = K.VARIANTS[name]
    assert v.reason({**v.defaults, **cfg}, problem) is None


def auto_serves_held_layout(x, held, w, b, ref, flag):
    """Auto on a weight held in another layout (`held`, made from the row-major `w`): at every token count its
    pick sets `flag` and passes the variant's rules; the output is within the bound and bit-identical to that
    config on `w`."""
    for mm in (1, 2, 8, 17, 64, 65, 512, 8192):
        problem = linear_problem(mm, held)
        name, cfg = pick_linear(problem)
        assert cfg.get(flag) and K.VARIANTS[name].reason({**K.VARIANTS[name].defaults, **cfg}, problem) is None
    y = K.mxfp4_linear(x, held, b)
    assert rel_err(y, ref) < tol("gemv_mma")
    name, cfg = pick_linear(linear_problem(x.shape[0], held))
    assert torch.equal(y, K.mxfp4_linear(x, w, b, variant=name, **cfg))


@pytest.mark.parametrize("m", [1, 3, 17])
def test_a_tiled_weight_runs_through_auto_and_only_tiled_configs(m, device):
    """A weight held in tile_mxfp4's layout (the row-major copy dropped): auto picks from the tiled tables,
    every pick is a TILED config, and the result is bit-identical to the same config on the row-major weight.
    Configs that read row-major weights refuse it with the layout named."""
    x, w, b, ref = make(m, 72, 160, seed=m, dev=device)
    t = K.tile_mxfp4(w)
    auto_serves_held_layout(x, t, w, b, ref, "TILED")
    with pytest.raises(ValueError, match="tile_mxfp4's layout, which only TILED=True configs read"):
        K.mxfp4_linear(x, t, b, variant="gemv")
    with pytest.raises(ValueError, match="deinterleave=True"):
        K.mxfp4_linear(x, K.tile_mxfp4(w, deinterleave=True), b)


@pytest.mark.parametrize("m", [1, 17])
def test_a_shuffled_weight_runs_through_auto_with_nib(m, device):
    """A weight held in shuffle_nibbles' layout (rows, or tiled then shuffled): auto sets NIB on its layout's
    table rows that have it and skips the others (to the mma.sync fallback with NIB), at every token count;
    the result is bit-identical to that config on the unshuffled weight. Configs without NIB refuse it."""
    x, w, b, ref = make(m, 72, 160, seed=m + 1, dev=device)
    for s in (K.shuffle_nibbles(w), K.shuffle_nibbles(K.tile_mxfp4(w))):
        auto_serves_held_layout(x, s, w, b, ref, "NIB")
        with pytest.raises(ValueError, match="shuffle_nibbles' layout, which only NIB=True configs read"):
            K.mxfp4_linear(x, s, b, variant="gemv_mma", TILED=s.tiled)


def test_auto_falls_back_when_scales_leave_the_fast_window(device):
    # scale bytes 3..130: outside the bf16 decode's exact window (14..240), so auto must avoid gemv_tc/mma
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (64, 2, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(3, 131, (64, 2), generator=g, dtype=torch.uint8)
    w = K.from_openai(blocks, scales).to(device)
    x = torch.randn(32, 64, generator=g).to(torch.bfloat16).to(device)
    name, _ = pick_linear(linear_problem(32, K.prepare_mxfp4(w)))
    assert name not in ("gemv_tc", "mma")
    ref = K.reference_linear(x.float().cpu(), w.to("cpu")).to(device)
    assert rel_err(K.mxfp4_linear(x, w), ref) < 1e-2
    with pytest.raises(ValueError, match=r"scale bytes 3\.\.130 fall outside this variant's exact range 14\.\.240"):
        K.mxfp4_linear(x, w, variant="gemv_tc")
    # tiled, only the tensor-core variants read it, and none is exact on these scales: a clear error
    with pytest.raises(ValueError, match="keep this weight row-major"):
        K.mxfp4_linear(x, K.tile_mxfp4(w))


def test_sample_draws_allowed_configs_without_listing_the_space():
    """`sample` draws from spaces too large to list (gemv_mma: 11M points): every config it returns is allowed and
    distinct, the same seed gives the same list, `where` filters; on a space it lists whole (gemv: 384 points) it
    returns allowed configs only, and all of them when asked for more. `first` is the defaults where allowed."""
    problem = {"m": 3, "n": 72, "k": 96, "scale_min": 120, "scale_max": 124}
    v = LINEAR["gemv_mma"]
    got = v.sample(problem, 5, seed="a")
    keys = [tuple(sorted(c.items(), key=str)) for c in got]
    assert len(got) == 5 and len(set(keys)) == 5 and all(v.reason(c, problem) is None for c in got)
    assert got == v.sample(problem, 5, seed="a") and got != v.sample(problem, 5, seed="b")
    tiled = v.sample(problem, 3, seed="a", where=lambda c: c["TILED"])
    assert len(tiled) == 3 and all(c["TILED"] for c in tiled)
    assert v.first(problem) == dict(v.defaults) and v.sample(problem, 0) == []
    small = LINEAR["gemv"]
    allowed = small.configs(problem)
    assert 0 < len(allowed) < 384
    assert sorted(map(str, small.sample(problem, 10_000))) == sorted(map(str, allowed))
    # a problem no config can run: nothing, not an error
    assert v.sample({**problem, "scale_min": 0, "scale_max": 250}, 2, tries=2000) == []
    assert v.first({**problem, "tiled": True, "shuffled": True}) is not None


def test_shared_memory_rule_rules_out_configs_that_cannot_launch():
    # this gemv_tc16 config needed 368 KB of shared memory and failed to launch on the H100 (227 KB per block)
    problem = {"m": 1, "n": 200, "k": 160, "scale_min": 120, "scale_max": 124}
    big = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 256, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}
    assert "shared memory" in K.VARIANTS["gemv_tc16"].reason(big, problem)
    assert K.VARIANTS["gemv_tc16"].reason({**big, "num_stages": 2}, problem) is None
    # Triton 3.6 builds for sm_90 (./lab sass gemv_tc16): 240 KB for these two (the first out of resources on an
    # H200 in results/20261130T023406-h200-quickstart), 184 KB for the third, within the 227 KB
    v = K.VARIANTS["gemv_tc16"]
    for bm, bn, bk, st in ((128, 64, 256, 3), (64, 128, 256, 4)):
        cfg = {**big, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": st}
        assert "shared memory" in v.reason(cfg, problem), cfg
    assert v.reason({**big, "BLOCK_K": 128}, problem) is None


def test_x_to_f16_logical_order_is_the_mma_fragments_k_order(device):
    """logical=True rows are the word-major rows permuted within each 128-K chunk exactly as gemv_mma's B
    fragments read them (stored position 32 t + 8 i + 4 s + 2 h + e -> logical 32 i + 16 s + 8 h + 2 t + e),
    zero past K, and logical_pos inverts logical_elem."""
    from kernels.linear_f16 import x_to_f16

    x = torch.randn(3, 160).to(torch.bfloat16).to(device)
    words, xs = x_to_f16(x, pad=128)
    logical, xs2 = x_to_f16(x, logical=True)
    assert torch.equal(xs, xs2) and logical.shape == (3, 256) and words.shape == (3, 256)
    w = words.view(3, 2, 4, 4, 2, 2, 2)  # [M, chunk, t, i, s, h, e]
    assert torch.equal(logical, w.permute(0, 1, 3, 4, 5, 2, 6).reshape(3, 256))
    q = torch.arange(128)
    el = (q // 2 % 4) * 32 + (q // 32) * 8 + (q % 2) * 4 + (q // 16 % 2) * 2 + q // 8 % 2
    assert sorted(el.tolist()) == list(range(128))


@pytest.mark.parametrize("logical", [False, True])
def test_x_to_f16_gathers_rows_per_sorted_slot(logical, device):
    """rows=: output row p is token rows[p] // top_k's row (moe_mma TMA=2's expert-sorted x), bit for bit the
    per-token rows, with xs per token; a rows tensor that is not every slot once is refused."""
    from kernels.linear_f16 import x_to_f16

    x = (torch.randn(5, 200) * torch.tensor([1e-3, 1.0, 30.0, 0.5, 7.0])[:, None]).to(torch.bfloat16).to(device)
    rows = torch.randperm(10).to(device)
    plain, xs = x_to_f16(x, pad=128, logical=logical)
    got, xs2 = x_to_f16(x, pad=128, logical=logical, rows=rows, top_k=2)
    assert got.shape == (10, plain.shape[1])
    assert torch.equal(got, plain.index_select(0, rows // 2)) and torch.equal(xs2, xs)
    with pytest.raises(ValueError, match="slots once"):
        x_to_f16(x, rows=rows[:7], top_k=2)


def test_x_to_f16_planes_hold_the_pairs_of_each_weight_word(device):
    from kernels.linear_f16 import plane_words, x_to_f16

    x = torch.randn(2, 96).to(torch.bfloat16).to(device)
    words, xs = x_to_f16(x)
    planes, xs2 = x_to_f16(x, planes=True)
    assert torch.equal(xs, xs2)
    pw = plane_words(96)
    assert pw % 16 == 0 and planes.shape == (2, 8 * pw)
    # word-major [K/8, 4 pairs, 2 halves] -> plane-major [4 planes, K/8 (padded with zeros), 2 halves]
    wm = words.view(2, 12, 4, 2).permute(0, 2, 1, 3)
    pm = planes.view(2, 4, pw, 2)
    assert torch.equal(pm[:, :, :12], wm) and not pm[:, :, 12:].any()
    # pair j of word w is (x[8w + j], x[8w + j + 4]) times the per-token power of two
    up = 1 / xs.cpu()
    ref = x.float().cpu().view(2, 12, 2, 4).permute(0, 3, 1, 2) * up[:, None, None, None]
    assert torch.equal(pm[:, :, :12].float().cpu(), ref.to(torch.float16).float())


def test_table_rows_are_registered_variants():
    for _, name, cfg in LINEAR_TABLE:
        v = K.VARIANTS[name]
        assert set(cfg) <= set(v.space) | set(v.defaults)


def test_bad_input_errors(device):
    x, w, b, _ = make(2, 40, 64, seed=2, dev=device)
    with pytest.raises(TypeError, match="x must have dtype bfloat16"):
        K.mxfp4_linear(x.float(), w)
    with pytest.raises(ValueError, match="x has K=32 but w has K=64"):
        K.mxfp4_linear(x[:, :32], w)
    with pytest.raises(ValueError, match=r"bias must have shape \(40,\)"):
        K.mxfp4_linear(x, w, b[:5])
    with pytest.raises(TypeError, match="w must be an MXFP4Tensor"):
        K.mxfp4_linear(x, torch.randn(40, 64))
    with pytest.raises(ValueError, match="variant must be 'auto' or one of"):
        K.mxfp4_linear(x, w, variant="fastest")
    with pytest.raises(ValueError, match=r"BLOCK_K=48 must be a power of two"):
        K.mxfp4_linear(x, w, variant="gemv", BLOCK_K=48)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) BLOCK_Q"):
        K.mxfp4_linear(x, w, variant="gemv", BLOCK_Q=4)
    with pytest.raises(ValueError, match=r"w must be 2-D \[N, K\]"):
        K.mxfp4_linear(x, K.quantize_mxfp4(torch.randn(2, 40, 64)).to(device))


def test_prepare_is_cached_and_mxfp8_rows_match_reference(device):
    w = K.quantize_mxfp4(torch.randn(40, 64)).to(device)
    assert K.prepare_mxfp4(w) is K.prepare_mxfp4(w)
    x = (torch.randn(5, 320) * torch.logspace(-6, 3, 320)).to(torch.bfloat16).to(device)
    q, s = K.quantize_mxfp8_rows(x)
    r = K.quantize_mxfp8(x.float().cpu())
    assert torch.equal(s.cpu(), r.scales) and torch.equal(q.float().cpu(), r.data.float())


def test_dense_dequant_kernel_matches_codec(device):
    """Row-major and tiled (3 matrices of 50 rows: 4 groups each, the last padded; K=288: 3 chunks, the last
    a quarter full) give the codec's values; mlp1's deinterleaved tiling is refused (its rows are reordered)."""
    w = K.quantize_mxfp4(torch.randn(3, 50, 288)).to(device)
    ref = K.dequantize_mxfp4(w.to("cpu"))
    assert torch.equal(K.mxfp4_to_dense(w, torch.float32).cpu(), ref)
    assert torch.equal(K.mxfp4_to_dense(K.tile_mxfp4(w), torch.float32).cpu(), ref)
    with pytest.raises(ValueError, match="not deinterleaved"):
        K.mxfp4_to_dense(K.tile_mxfp4(w, deinterleave=True))


# ---- GPU only ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(LINEAR))
def test_variants_under_cuda_graph_capture(name):
    x, w, b, ref = make(3, 200, 160, seed=9, dev="cuda")
    cfg = LINEAR[name].first(linear_problem(3, K.prepare_mxfp4(w)))
    K.mxfp4_linear(x, w, b, variant=name, **cfg)  # compile and prepare outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = K.mxfp4_linear(x, w, b, variant=name, **cfg)
    x.copy_(torch.randn_like(x))  # new contents, same buffers: the replay must see them
    g.replay()
    torch.cuda.synchronize()
    ref2 = K.reference_linear(x.float().cpu(), w.to("cpu"), b.float().cpu()).cuda()
    assert rel_err(y, ref2) < tol(name)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", SHAPES + [(5, 300, 320), (33, 520, 2880)])
def test_gemv_mma_nobar_is_bit_identical(m, n, k):
    """NOBAR (kernels.ring_sync: the TMA loop's barriers Triton adds around a step's copies, its expect's proxy
    fence and the barrier before its first wgmma dropped from the PTX) gives the same bits as the same build
    with them, in SEQ and one-chunk rings, BC and TAIL builds, eagerly and under a CUDA graph replayed with
    new x; many programs per SM (N = 520, K = 2880) so steps of different programs interleave."""
    x, _, b, _ = make(m, n, k, seed=m + 7 * n, dev="cuda")
    w = wide_span_weight(n, k, seed=n + 3, dev="cuda")
    base = {"ROWS": 2, "num_warps": 4, "TILED": True, "WGMMA": True, "RING_W": True, "TMA": 2, "EARLY": True,
            "TAIL": True, "NIB": True}
    for cfg in ({"BLOCK_M": 8, "CHUNKS": 2, "SEQ": 2, "STAGES": 2, "STEP_MAJOR": True},
                {"BLOCK_M": 8, "CHUNKS": 2, "SEQ": 2, "STAGES": 2, "STEP_MAJOR": True, "BC": 2},
                {"BLOCK_M": 16, "CHUNKS": 2, "SEQ": True, "STAGES": 3, "BC": True},
                {"BLOCK_M": 32, "CHUNKS": 1, "STAGES": 3}):
        cfg = {**base, **cfg}
        y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)
        for _ in range(3):
            assert torch.equal(K.mxfp4_linear(x, w, b, variant="gemv_mma", NOBAR=True, **cfg), y), cfg
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = K.mxfp4_linear(x, w, b, variant="gemv_mma", NOBAR=True, **cfg)
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(yg, K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gemv_mma_tma_is_bit_identical(m, n, k):
    """TMA copies the same words and scale bytes into the same ring slots as RING_W's cp.async copies (a box
    per step; groups past the weight read as zeros): bit-identical, under a CUDA graph too (the descriptors
    are kernel parameters, made once per weight; there with EARLY, the first copies before the PDL wait);
    TMA=2 copies x's rows by TMA too (rows past M read as zeros).
    Only compiled kernels have it (the interpreter's twin ignores it), hence GPU only."""
    x, _, b, _ = make(m, n, k, seed=m + 5 * n, dev="cuda")
    w = wide_span_weight(n, k, seed=n + 1, dev="cuda")
    for cfg in ({"BLOCK_M": 16, "ROWS": 2, "CHUNKS": 1, "STAGES": 3},
                {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 2, "STAGES": 4, "NIB": True},
                {"BLOCK_M": 8, "ROWS": 2, "CHUNKS": 1, "STAGES": 3, "NIB": True, "MAXNREG": 64}):
        cfg = {**cfg, "num_warps": 4, "TILED": True, "WGMMA": True, "RING_W": True}
        y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)
        assert torch.equal(K.mxfp4_linear(x, w, b, variant="gemv_mma", TMA=True, **cfg), y), cfg
        assert torch.equal(K.mxfp4_linear(x, w, b, variant="gemv_mma", TMA=2, **cfg), y), cfg
        for tma in (True, 2):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                yg = K.mxfp4_linear(x, w, b, variant="gemv_mma", TMA=tma, EARLY=True, **cfg)
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(yg, y), (cfg, tma)


TAIL_SHAPES = [(1, 200, 64), (3, 300, 192), (17, 72, 2880)]  # K % 128 == 64: a half last chunk; N past a tile


def test_tail_half_is_each_rows_real_half_chunk(device):
    """tail_half: each 16-row group's last chunk cut to its real half (words 0-7 of every row, as tiled: lane t's
    words 2t, 2t + 1), and the rows' two block scales twice (s0 s0 s1 s1: lane t's at byte t); the cut-off half
    is all padding. Refused where K does not end in half a chunk, and on a row-major weight."""
    from kernels.prepare import tail_half

    _, w, _, _ = make(1, 200, 192, seed=3, dev=device)
    t = K.shuffle_nibbles(K.tile_mxfp4(w))
    tw, ts = tail_half(t)
    G = t.words.shape[0]
    assert tw.shape == (G, 1, 128) and ts.shape == (1, G, 64)
    last_w, last_s = t.words[:, -1], t.scales[:, -1]  # [G, 16 rows, 16 words], [G, 16 rows, 4 blocks]
    assert not last_w[..., 8:].any() and not last_s[..., 2:].any()
    assert torch.equal(tw.view(G, 16, 8), last_w[..., :8])
    assert torch.equal(ts.view(G, 16, 4), last_s[..., [0, 0, 1, 1]])
    assert tail_half(t)[0] is tw  # cached
    with pytest.raises(ValueError, match="K % 128 == 64"):
        tail_half(K.tile_mxfp4(make(1, 40, 160, seed=1, dev=device)[1]))
    with pytest.raises(ValueError, match="tile_mxfp4"):
        tail_half(K.prepare_mxfp4(w))


@pytest.mark.parametrize("order", ["words", "logical", "half_tail", "gather"])
def test_x_to_f16_splits_few_rows_over_programs_bit_for_bit(order, device):
    """With at most SPLIT_ROWS rows each row is split over programs of SLICE positions (x16_slice: each takes the
    row's max itself); rows are independent, so the first rows of a 20-row call (one program a row) must be the
    split call's bits, in every order and with the gather of sorted slots."""
    from kernels.linear_f16 import SLICE, SPLIT_ROWS, x_to_f16

    K = 2880  # width 2944 > SLICE: several programs a row
    x = (torch.randn(20, K) * torch.linspace(0.01, 50.0, 20)[:, None]).to(torch.bfloat16).to(device)
    kw = {"words": dict(pad=128), "logical": dict(logical=True), "half_tail": dict(logical=True, half_tail=True),
          "gather": dict(logical=True)}[order]
    n = 3
    assert n <= SPLIT_ROWS < 20 and 2944 > SLICE
    if order == "gather":
        rows = torch.tensor([5, 0, 3, 1, 2, 4], device=device)  # 3 tokens, top_k 2
        few, xs_few = x_to_f16(x[:n], rows=rows, top_k=2, **kw)
        many, xs_many = x_to_f16(x, **kw)
        assert torch.equal(few, many.index_select(0, rows // 2)) and torch.equal(xs_few, xs_many[:n])
    else:
        few, xs_few = x_to_f16(x[:n], **kw)
        many, xs_many = x_to_f16(x, **kw)
        assert torch.equal(few, many[:n]) and torch.equal(xs_few, xs_many[:n])


def test_x_to_f16_half_tail_is_a_64_k_steps_order(device):
    """half_tail: the last chunk, half padding, holds its 64 elements in the logical order of a 64-K step
    (position 32 i + 16 s + 8 h + 2 t + e: element 16 t + 8 i + 4 e + 2 s + h), then zeros; everything before it
    is x_to_f16(logical=True)'s. Refused where K does not end in half a chunk."""
    from kernels.linear_f16 import x_to_f16

    x = torch.randn(3, 192).to(torch.bfloat16).to(device)
    plain, xs = x_to_f16(x, logical=True)
    half, xs2 = x_to_f16(x, logical=True, half_tail=True)
    assert torch.equal(xs, xs2) and half.shape == plain.shape == (3, 256)
    assert torch.equal(half[:, :128], plain[:, :128])
    q = torch.arange(64)
    el = (q // 2 % 4) * 16 + (q // 32) * 8 + (q % 2) * 4 + (q // 16 % 2) * 2 + q // 8 % 2
    assert sorted(el.tolist()) == list(range(64))
    up = (1 / xs.cpu())[:, None]
    ref = (x.float().cpu()[:, 128 + el] * up).to(torch.float16)
    assert torch.equal(half[:, 128:192].cpu(), ref) and not half[:, 192:].any()
    with pytest.raises(ValueError, match="half_tail"):
        x_to_f16(torch.randn(2, 160).to(torch.bfloat16).to(device), logical=True, half_tail=True)


def test_gemv_mma_tail_rule_and_twin(device):
    """TAIL runs the half last chunk beside a ring of one-chunk steps, TMA=2's or the cp.async RING_W ring's:
    refused with TMA=1, without either ring, or with CHUNKS > 1.
    Without a GPU it changes nothing (the interpreter's twin reads the zero-padded chunk in the 128-K order, so x
    must not be given in half_tail's order): the bits of the config without it, within the bound."""
    v = LINEAR["gemv_mma"]
    prob = {"m": 3, "n": 300, "k": 192}
    cfg = {**v.defaults, "BLOCK_M": 8, "TILED": True, "WGMMA": True, "RING_W": True, "TMA": 2, "NIB": True,
           "TAIL": True}
    assert v.reason(cfg, prob) is None
    assert "TMA=2" in v.reason({**cfg, "TMA": True}, prob)
    assert "CHUNKS=1" in v.reason({**cfg, "CHUNKS": 2}, prob)
    assert v.reason({**cfg, "TMA": False}, prob) is None  # the cp.async ring's form
    assert "RING_W" in v.reason({**cfg, "TMA": False, "RING_W": False}, prob)
    if device != "cpu":
        return  # compiled, TAIL runs: test_gemv_mma_tail_matches_the_padded_chunk
    x, w, b, ref = make(3, 300, 192, seed=4, dev=device)
    y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)
    assert torch.equal(y, K.mxfp4_linear(x, w, b, variant="gemv_mma", **{**cfg, "TAIL": False}))
    assert rel_err(y, ref) < tol("gemv_mma")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", TAIL_SHAPES)
def test_gemv_mma_tail_matches_the_padded_chunk(m, n, k):
    """TAIL runs the half last chunk as a half step (tail_half's words, 4 wgmma k-steps against half_tail's x)
    where the config without it runs a whole padded step: the same products, summed in another order, so the
    outputs agree to a bf16 rounding (and both meet the reference bound). Under a CUDA graph too, with EARLY, with
    2-4 slots (the tail's slot and mbarrier phase move) and with K of one half chunk (K = 64); and in the cp.async
    RING_W ring (no TMA, step-major or tiled copies), whose half step reads buffers filled with its first copies."""
    x, _, b, ref = make(m, n, k, seed=m + n, dev="cuda")
    w = wide_span_weight(n, k, seed=n + 2, dev="cuda")
    ref = K.reference_linear(x.float().cpu(), w.to("cpu"), b.float().cpu()).cuda()
    for cfg in ({"BLOCK_M": 8, "ROWS": 2, "STAGES": 3, "NIB": True},
                {"BLOCK_M": 16, "ROWS": 1, "STAGES": 4},
                {"BLOCK_M": 64, "ROWS": 2, "STAGES": 3, "NIB": True}):
        cfg = {**cfg, "CHUNKS": 1, "num_warps": 4, "TILED": True, "WGMMA": True, "RING_W": True, "TMA": 2}
        y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg).float()
        ulp = y.abs().clamp_min(2.0 ** -100) * 2.0 ** -7  # one bf16 rounding step
        for stages in (2, 3, 4):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                yg = K.mxfp4_linear(x, w, b, variant="gemv_mma", **{**cfg, "STAGES": stages, "TAIL": True,
                                                                    "EARLY": True})
            g.replay()
            torch.cuda.synchronize()
            diff = (yg.float() - y).abs()
            assert (diff <= ulp).all(), (cfg, stages, float(diff.max()))
            assert rel_err(yg, ref) < tol("gemv_mma"), (cfg, stages)
        for stages, sm in ((2, False), (4, True)):  # the cp.async ring's TAIL
            ring = {**cfg, "TMA": False, "STAGES": stages, "STEP_MAJOR": sm}
            yr = K.mxfp4_linear(x, w, b, variant="gemv_mma", **ring, TAIL=True)
            torch.cuda.synchronize()
            diff = (yr.float() - K.mxfp4_linear(x, w, b, variant="gemv_mma", **ring).float()).abs()
            assert (diff <= ulp).all(), (cfg, stages, "ring", float(diff.max()))


def test_step_major_is_the_tiled_copy_chunks_outermost(device):
    """step_major: chunk c of group g sits at [c, g] (words and scale bytes, unchanged), for the whole expert
    stack's groups too; cached; refused on a row-major weight."""
    from kernels.prepare import step_major

    _, w, _, _ = make(1, 200, 320, seed=5, dev=device)
    t = K.shuffle_nibbles(K.tile_mxfp4(w))
    sw, ss = step_major(t)
    G, KC = t.words.shape[:2]
    assert sw.shape == (KC, G, 16, 16) and ss.shape == (KC, G, 16, 4) and sw.is_contiguous()
    for c in range(KC):
        for g in range(G):
            assert torch.equal(sw[c, g], t.words[g, c]) and torch.equal(ss[c, g], t.scales[g, c])
    assert step_major(t)[0] is sw  # cached
    stack = K.tile_mxfp4(K.quantize_mxfp4(torch.randn(3, 40, 256, generator=torch.Generator().manual_seed(6)))
                         .to(device))
    sw3, _ = step_major(stack)
    assert torch.equal(sw3, stack.words.reshape(-1, *stack.words.shape[-3:]).transpose(0, 1))
    with pytest.raises(ValueError, match="tile"):
        step_major(K.prepare_mxfp4(w))


def test_gemv_mma_step_major_rule_and_twin(device):
    """STEP_MAJOR sets where the ring's copies (or TMA's boxes) read from: refused without RING_W (and without
    WGMMA). Without a GPU the twin reads the tiled copy: the same bits as the config without it."""
    v = LINEAR["gemv_mma"]
    prob = {"m": 3, "n": 300, "k": 192}
    cfg = {**v.defaults, "BLOCK_M": 8, "TILED": True, "WGMMA": True, "RING_W": True, "TMA": 2, "NIB": True,
           "STEP_MAJOR": True}
    assert v.reason(cfg, prob) is None
    assert v.reason({**cfg, "TMA": False}, prob) is None
    assert "needs RING_W" in v.reason({**cfg, "TMA": False, "RING_W": False}, prob)
    assert "only with WGMMA" in v.reason({**v.defaults, "STEP_MAJOR": True}, prob)
    if device != "cpu":
        return  # compiled, STEP_MAJOR reads the step-major copy: test_gemv_mma_step_major_is_bit_identical
    x, w, b, ref = make(3, 300, 192, seed=4, dev=device)
    y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)
    assert torch.equal(y, K.mxfp4_linear(x, w, b, variant="gemv_mma", **{**cfg, "STEP_MAJOR": False}))
    assert rel_err(y, ref) < tol("gemv_mma")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 200, 64), (3, 300, 192), (17, 72, 2880), (9, 1000, 512)])
def test_gemv_mma_step_major_is_bit_identical(m, n, k):
    """The step-major copy lands in the ring slots exactly as the tiled copy: the same bits, by TMA boxes (with
    TAIL and EARLY, 2-4 slots, two chunks a step, TMA=1) and by cp.async copies, under a CUDA graph."""
    x, _, b, _ = make(m, n, k, seed=m + n, dev="cuda")
    w = wide_span_weight(n, k, seed=n + 3, dev="cuda")
    for cfg in ({"BLOCK_M": 8, "ROWS": 2, "STAGES": 3, "NIB": True, "TMA": 2, "TAIL": True, "EARLY": True},
                {"BLOCK_M": 16, "ROWS": 1, "STAGES": 4, "TMA": 2},
                {"BLOCK_M": 8, "ROWS": 2, "STAGES": 2, "TMA": True, "CHUNKS": 2, "NIB": True},
                {"BLOCK_M": 64, "ROWS": 2, "STAGES": 3, "NIB": True, "TMA": 2, "MAXNREG": 168},
                {"BLOCK_M": 8, "ROWS": 2, "STAGES": 3, "NIB": True},
                {"BLOCK_M": 16, "ROWS": 1, "STAGES": 4, "CHUNKS": 2}):
        cfg = {"CHUNKS": 1, "num_warps": 4, "TILED": True, "WGMMA": True, "RING_W": True, **cfg}
        y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = K.mxfp4_linear(x, w, b, variant="gemv_mma", **{**cfg, "STEP_MAJOR": True})
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(yg, y), cfg


def test_gemv_mma_seq_rule_and_twin(device):
    """SEQ takes TMA=2's slots of CHUNKS > 1 chunks one chunk at a time: refused with one chunk, without TMA=2
    and without WGMMA; with it TAIL is allowed beside CHUNKS=2. Without a GPU the twin runs the plain CHUNKS=2
    steps: the same bits as the config without SEQ."""
    v = LINEAR["gemv_mma"]
    prob = {"m": 3, "n": 300, "k": 192}
    cfg = {**v.defaults, "BLOCK_M": 8, "TILED": True, "WGMMA": True, "RING_W": True, "TMA": 2, "NIB": True,
           "CHUNKS": 2, "STAGES": 2, "SEQ": True, "TAIL": True}
    assert v.reason(cfg, prob) is None
    assert "CHUNKS=1" in v.reason({**cfg, "SEQ": False}, prob)  # TAIL without SEQ still needs one chunk a step
    assert "SEQ" in v.reason({**cfg, "CHUNKS": 1}, prob)
    assert "SEQ" in v.reason({**cfg, "TMA": True, "TAIL": False}, prob)
    assert "only with WGMMA" in v.reason({**v.defaults, "SEQ": True}, prob)
    if device != "cpu":
        return  # compiled, SEQ runs: test_gemv_mma_seq_is_bit_identical
    x, w, b, ref = make(3, 300, 192, seed=4, dev=device)
    y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **cfg)
    assert torch.equal(y, K.mxfp4_linear(x, w, b, variant="gemv_mma", **{**cfg, "SEQ": False, "TAIL": False}))
    assert rel_err(y, ref) < tol("gemv_mma")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 200, 64), (3, 300, 192), (17, 72, 2880), (9, 1000, 512), (5, 4000, 2880)])
def test_gemv_mma_seq_is_bit_identical(m, n, k):
    """SEQ multiplies the chunks of a slot in the order one-chunk steps do, each chunk's wgmma on the accumulator
    in turn: the bits of the CHUNKS=1 config (with TAIL where K's whole chunks are a multiple of CHUNKS, as SEQ
    then runs it), with 2-3 slots, EARLY, the step-major copy and BLOCK_M 8-64, under a CUDA graph; SEQ=2 (x's
    chunks as one box) too."""
    x, _, b, _ = make(m, n, k, seed=m + n, dev="cuda")
    w = wide_span_weight(n, k, seed=n + 5, dev="cuda")
    tail_runs = (k // 128) % 2 == 0
    for cfg in ({"BLOCK_M": 8, "ROWS": 2, "STAGES": 2, "NIB": True, "TAIL": True, "EARLY": True},
                {"BLOCK_M": 8, "ROWS": 2, "STAGES": 3, "NIB": True, "TAIL": True, "STEP_MAJOR": True},
                {"BLOCK_M": 16, "ROWS": 1, "STAGES": 2},
                {"BLOCK_M": 64, "ROWS": 2, "STAGES": 2, "NIB": True, "TAIL": True, "EARLY": True}):
        cfg = {"num_warps": 4, "TILED": True, "WGMMA": True, "RING_W": True, "TMA": 2, **cfg}
        one = {**cfg, "CHUNKS": 1, "TAIL": cfg.get("TAIL", False) and tail_runs}
        y = K.mxfp4_linear(x, w, b, variant="gemv_mma", **one)
        for seq in (True, 2):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                ys = K.mxfp4_linear(x, w, b, variant="gemv_mma", **{**cfg, "CHUNKS": 2, "SEQ": seq})
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(ys, y), (cfg, seq)


@pytest.mark.gpu
def test_gemv_h2g_maxnreg_and_early_are_bit_identical():
    """MAXNREG only caps the registers ptxas may use (it reschedules, the arithmetic stays): capped builds give
    the uncapped build's bits, with and without PREFETCH; so does EARLY (the first weight tile loaded before
    the PDL wait), under a CUDA graph too. Only compiled kernels have a register cap and a PDL wait."""
    m, n, k = 1, 4000, 2880
    x, _, b, _ = make(m, n, k, seed=7, dev="cuda")
    w = wide_span_weight(n, k, seed=8, dev="cuda")
    for pre in (False, True):
        cfg = {"BLOCK_M": 1, "BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 1, "NIB": True, "PREFETCH": pre}
        y = K.mxfp4_linear(x, w, b, variant="gemv_h2g", **cfg)
        for cap in (64, 48):
            assert torch.equal(K.mxfp4_linear(x, w, b, variant="gemv_h2g", MAXNREG=cap, **cfg), y), (pre, cap)
    early = {**cfg, "MAXNREG": 64, "EARLY": True}
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ye = K.mxfp4_linear(x, w, b, variant="gemv_h2g", **early)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(ye, y)


def test_gemv_h2g_early_rule():
    """EARLY moves the PDL wait after PREFETCH's first tile: refused without PREFETCH and with PERSIST."""
    v = LINEAR["gemv_h2g"]
    prob = {"m": 1, "n": 256, "k": 512}
    cfg = {**v.defaults, "BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 1, "PREFETCH": True, "EARLY": True}
    assert v.reason(cfg, prob) is None
    assert "PREFETCH" in v.reason({**cfg, "PREFETCH": False}, prob)
    assert "PERSIST" in v.reason({**cfg, "PERSIST": 2}, prob)


def test_gemv_mma_tma_rule():
    """TMA fills RING_W's ring: refused without it and off wgmma; EARLY needs TMA."""
    v = LINEAR["gemv_mma"]
    prob = {"m": 16, "n": 256, "k": 512}
    ring = {**v.defaults, "TILED": True, "WGMMA": True, "RING_W": True, "STAGES": 3}
    assert v.reason({**ring, "TMA": True}, prob) is None
    assert "RING_W" in v.reason({**ring, "RING_W": False, "TMA": True}, prob)
    assert "WGMMA" in v.reason({**v.defaults, "TMA": True}, prob)
    assert "TMA" in v.reason({**ring, "EARLY": True}, prob)
    assert v.reason({**ring, "TMA": True, "EARLY": True}, prob) is None


@pytest.mark.gpu
def test_timing_sanity_bigger_is_slower():
    from labkit.bench import time_calls

    small = torch.randn(1 << 20, device="cuda")
    big = torch.randn(1 << 26, device="cuda")
    ts = time_calls([lambda: small.sum()], reps=20)
    tb = time_calls([lambda: big.sum()], reps=20)
    assert ts["timing"] == "cuda_graph" and ts["us_graph_p10"] <= ts["us_graph"] <= ts["us_graph_p90"]
    assert tb["us_graph"] > 2 * ts["us_graph"]  # 64x the bytes; the small sum is mostly fixed cost


def test_h2g_pipeline_rule():
    """num_stages > 1 pipelines the h2g K loop; the register double buffer has no such loop."""
    v = LINEAR["gemv_h2g"]
    prob = {"m": 1, "n": 256, "k": 512}
    assert v.reason({**v.defaults, "num_stages": 3}, prob) is None
    assert "PREFETCH" in v.reason({**v.defaults, "num_stages": 3, "PREFETCH": True}, prob)
    assert "shared memory" in v.reason({**v.defaults, "BLOCK_M": 8, "BLOCK_N": 32, "BLOCK_K": 1024,
                                        "num_warps": 8, "num_stages": 16}, prob)


@pytest.mark.parametrize("tiled", [False, True])
def test_dequant_gemm_chunks_cover_every_row(tiled, device):
    """CHUNK_N slices the weight in whole 16-row tiles (tiled: whole groups); 40 rows in chunks of 16 leave a
    partial last chunk (a padded group when tiled)."""
    from kernels.linear import _run_dequant_gemm

    x, w, b, ref = make(3, 40, 160, seed=9, dev=device)
    y = _run_dequant_gemm(x, K.prepare_mxfp4(w), b, CHUNK_N=16, TILED=tiled)
    assert rel_err(y, ref) < tol("dequant_gemm")
    if device.type == "cpu":  # cuBLAS may pick another kernel for 16 columns than for 40
        assert torch.equal(y, _run_dequant_gemm(x, K.prepare_mxfp4(w), b))


@pytest.mark.parametrize("m,n,k", SHAPES + [(2, 40, 640)])
def test_gemv_h2g_tiled_weight_gives_the_same_result(m, n, k, device):
    """gemv_h2g's TILED reads tile_mxfp4's copy in 128-K chunks (the row-major K order within a chunk): the same
    words meet the same x, so the output is bit-identical, K tails and rows past N included; so does PERSIST
    (the same tiles, taken by a smaller grid in strides)."""
    x, w, b, ref = make(m, n, k, seed=m + 3 * n, dev=device)
    for cfg in ({"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 2},
                {"BLOCK_M": 2, "BLOCK_N": 16, "BLOCK_K": 256, "PREFETCH": True, "num_warps": 4},
                {"BLOCK_M": 4, "BLOCK_N": 32, "BLOCK_K": 512, "num_stages": 3, "num_warps": 4}):
        y = K.mxfp4_linear(x, w, b, variant="gemv_h2g", **cfg)
        assert torch.equal(K.mxfp4_linear(x, w, b, variant="gemv_h2g", TILED=True, **cfg), y), cfg
        assert rel_err(y, ref) < tol("gemv_h2g")
        # PERSIST: fewer programs than row tiles (4 per SM stand-in on the CPU), each striding over several
        assert torch.equal(K.mxfp4_linear(x, w, b, variant="gemv_h2g", PERSIST=2, **cfg), y), cfg
    with pytest.raises(ValueError, match="must be a multiple of 128"):
        K.mxfp4_linear(x, w, b, variant="gemv_h2g", TILED=True, BLOCK_K=64 * 1, BLOCK_N=8, num_warps=2)


@triton.jit
def _pairs_kernel(w_ptr, u_ptr, out_ptr, BLOCK: tl.constexpr):
    """e2m1_pairs of words w and nib_pairs of their shuffled copies u, stored as 8 uint32 planes."""
    i = tl.arange(0, BLOCK)
    a, b, c, d = e2m1_pairs(tl.load(w_ptr + i).to(tl.uint32, bitcast=True))
    tl.store(out_ptr + i, a)
    tl.store(out_ptr + BLOCK + i, b)
    tl.store(out_ptr + 2 * BLOCK + i, c)
    tl.store(out_ptr + 3 * BLOCK + i, d)
    a, b, c, d = nib_pairs(tl.load(u_ptr + i).to(tl.uint32, bitcast=True))
    tl.store(out_ptr + 4 * BLOCK + i, a)
    tl.store(out_ptr + 5 * BLOCK + i, b)
    tl.store(out_ptr + 6 * BLOCK + i, c)
    tl.store(out_ptr + 7 * BLOCK + i, d)


def test_shuffled_words_decode_to_the_same_values(device):
    """Every code at every position of a word, and random words: shuffle_words is undone by its inverse, and
    nib_pairs of the shuffled word gives e2m1_pairs' pairs A, C bit for bit and B, D times 2^8 exactly (on the
    GPU through the hardware e4m3 conversion)."""
    from kernels.prepare import shuffle_words

    codes = torch.arange(16, dtype=torch.int64)
    one_hot = torch.stack([codes << (4 * e) for e in range(8)]).reshape(-1)  # 128 words
    rand = torch.randint(0, 2**32, (128,), generator=torch.Generator().manual_seed(1), dtype=torch.int64)
    w = torch.cat([one_hot, rand])
    w = torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)
    u = shuffle_words(w)
    assert torch.equal(shuffle_words(u, inverse=True), w)
    assert not torch.equal(u, w)
    out = torch.empty(8 * 256, dtype=torch.uint32, device=device)
    _pairs_kernel[(1,)](w.to(device), u.to(device), out, BLOCK=256)
    p = out.cpu().view(torch.int32).view(8, 256)
    halves = p.view(torch.float16).view(8, 256, 2).float()
    assert torch.equal(p[4], p[0]) and torch.equal(p[6], p[2])
    assert torch.equal(halves[5], halves[1] * 256) and torch.equal(halves[7], halves[3] * 256)


@pytest.mark.parametrize("m,n,k", SHAPES + [(2, 40, 640)])
def test_gemv_h2g_shuffled_nibbles(m, n, k, device):
    """NIB reads shuffle_nibbles' copy (rows or tiled; the same shuffled words either way, so bit-identical)
    and sums B, D in their own chain: within the reference's bound. A shuffled weight runs only NIB configs."""
    x, w, b, ref = make(m, n, k, seed=m + 5 * n, dev=device)
    for cfg in ({"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 2},
                {"BLOCK_M": 2, "BLOCK_N": 16, "BLOCK_K": 256, "PREFETCH": True, "num_warps": 4},
                {"BLOCK_M": 4, "BLOCK_N": 32, "BLOCK_K": 512, "num_stages": 3, "num_warps": 4}):
        y = K.mxfp4_linear(x, w, b, variant="gemv_h2g", NIB=True, **cfg)
        assert rel_err(y, ref) < tol("gemv_h2g"), cfg
        assert torch.equal(K.mxfp4_linear(x, w, b, variant="gemv_h2g", NIB=True, TILED=True, **cfg), y), cfg
    s = K.shuffle_nibbles(w)
    assert s.shuffled and K.shuffle_nibbles(w) is s  # made once
    assert torch.equal(K.mxfp4_linear(x, s, b, variant="gemv_h2g", NIB=True, **cfg), y)
    with pytest.raises(ValueError, match="shuffle_nibbles' layout"):
        K.mxfp4_linear(x, s, b, variant="gemv_h2g", **cfg)
    with pytest.raises(ValueError, match="tile the unshuffled weight"):
        K.tile_mxfp4(s)



def test_quantize_fp8_rows_scales_and_orders_each_tile(device):
    """One power-of-two scale per row with every |q| < 256 (E4M3's rounding: <= 2^-4 relative for normals), and
    each tile of K stored as its even elements, then its odd ones (w4a8_fp8's weight order)."""
    from kernels.linear_fp8 import quantize_fp8_rows

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 200, generator=g) * torch.tensor([[1e-3], [1.0], [300.0]])).to(torch.bfloat16)
    x[1, 7] = 0
    q, s = quantize_fp8_rows(x.to(device), tile=64)
    q, s = q.float().cpu(), s.cpu()
    assert q.shape == (3, 256) and torch.all(q.abs() < 256)
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)  # powers of two
    assert torch.all(q.abs().amax(1) >= 128)  # amax lands in [128, 256): the range is used
    order = torch.cat([torch.arange(0, 64, 2), torch.arange(1, 64, 2)])
    back = q.reshape(3, 4, 64)[:, :, order.argsort()].reshape(3, 256)
    assert torch.all(back[:, 200:] == 0)
    back = back[:, :200] * s[:, None]
    xf = x.float()
    normal = xf.abs() >= s[:, None] * 2 ** -6
    assert torch.all(((back - xf).abs() <= xf.abs() * 2 ** -4)[normal])
    assert torch.all((back - xf).abs()[~normal] <= (s[:, None] * 2 ** -10).expand_as(xf)[~normal])
    with pytest.raises(ValueError, match="tile"):
        quantize_fp8_rows(x.to(device), tile=48)


def test_row_scale_max_is_made_once_per_weight(device):
    from kernels.prepare import row_scale_max

    w = K.quantize_mxfp4(torch.randn(3, 40, 96) * torch.logspace(-3, 2, 96)).to(device)
    p = K.prepare_mxfp4(w)
    r = row_scale_max(p)
    assert r.dtype == torch.int32 and torch.equal(r.cpu(), w.scales.cpu().amax(-1).to(torch.int32))
    assert row_scale_max(p) is r and row_scale_max(w) is r
    with pytest.raises(ValueError, match="row-major"):
        row_scale_max(K.tile_mxfp4(p))


@pytest.mark.parametrize("block_k", [64, 128, 256])
def test_w4a8_fp8_decodes_weights_exactly(block_k, device):
    """With activations E4M3 holds exactly (each row's values in {0, +-0.5, +-1, +-2}) the only errors left are
    the bf16 output's rounding and fp32 sums (~2e-3), so a wrong weight code, scale or K order (>= 1e-1) fails.
    The weight's rows span 14 binades of scale bytes (the exact limit); K = 288 ends in a partial tile."""
    g = torch.Generator().manual_seed(block_k)
    n, k = 40, 288
    w = K.quantize_mxfp4(torch.randn(n, k, generator=g) * 0.05)
    scales = w.scales.clone()
    scales[:, ::2] = 120
    scales[:, 1::2] = 120 - torch.randint(0, 15, scales[:, 1::2].shape, generator=g, dtype=torch.uint8)
    w = K.MXFP4Tensor(w.blocks, scales, w.layout, w.shape).to(device)
    x = (torch.randint(-2, 3, (5, k), generator=g).float() * 0.5).to(torch.bfloat16).to(device)
    b = (torch.randn(n, generator=g) * 0.01).to(torch.bfloat16).to(device)
    ref = K.reference_linear(x.float().cpu(), w.to("cpu"), b.float().cpu()).to(device)
    y = K.mxfp4_linear(x, w, b, variant="w4a8_fp8", BLOCK_M=64, BLOCK_N=64, BLOCK_K=block_k, num_warps=4)
    assert rel_err(y, ref) < 5e-3
