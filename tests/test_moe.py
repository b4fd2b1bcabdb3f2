"""moe_mxfp4 and route against the fp32 references, under uniform and pathological routings.

Tolerance 2e-2 (norm-wise relative): the kernels keep two bf16 intermediates (SwiGLU output and the per-slot
mlp2 rows) besides the bf16 output, and the interpreter's bf16 casts truncate; correct kernels land near
8e-3 on CPU while a wrong expert, row, nibble or scale gives >= 1e-1.
"""

from functools import partial

import pytest
import torch

import kernels as K
from kernels._triton import tl, triton
from kernels.moe import expert_span, moe_problem, tile_count, tile_rows
from kernels.tables import MOE_TABLE, pick_moe
from labkit import routing as rgen

MOE = {n: v for n, v in K.VARIANTS.items() if v.op == "moe"}
TOL = 2e-2
E, H, I, TOPK = 8, 64, 96, 2


@pytest.fixture(scope="module")
def layer():
    g = torch.Generator().manual_seed(0)
    w1 = K.quantize_mxfp4(torch.randn(E, 2 * I, H, generator=g) * 0.2)
    w2 = K.quantize_mxfp4(torch.randn(E, H, I, generator=g) * 0.2)
    b1 = torch.randn(E, 2 * I, generator=g) * 0.1
    b2 = torch.randn(E, H, generator=g) * 0.1
    return w1, b1, w2, b2


def rel_err(y, ref):
    return ((y.float().cpu() - ref).norm() / ref.norm()).item()


ROUTINGS = ["uniform", "hot(0.6,1)", "all_to_one", "duplicates(0.5)", "zipf(1.2)", "from_logits"]
#: the parameters that shape a variant's tiles; test_variant_matches_reference draws its configs from these alone
#: (the whole product of moe_h2g's or moe_mma's options runs to millions of configs, minutes to enumerate)
TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "ROWS", "CHUNKS", "BLOCK_N2", "ROWS2",
             "STAGES", "TILED", "NIB", "PREFETCH", "F16", "WGMMA")


@pytest.mark.parametrize("name", sorted(MOE))
@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("tokens", [1, 17])
def test_variant_matches_reference(name, routing, tokens, layer, device):
    if name == "moe_fused" and tokens > 1:  # moe_h2g's bits at odd T: test_moe_fused_is_moe_h2g_in_one_launch
        pytest.skip("moe_fused is checked bit for bit against moe_h2g (itself checked here) at 3 tokens")
    w1, b1, w2, b2 = layer
    sample = rgen.generate(routing, tokens, E, TOPK, seed=tokens)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ref = K.reference_moe(x.float(), (sample.ids, sample.weights), w1, b1, w2, b2)
    r = K.Routing.from_ids(sample.ids.to(device), sample.weights.to(device), E)
    dw = [w.to(device) for w in (w1, b1, w2, b2)]
    space = {k: v for k, v in MOE[name].space.items() if k in TILE_KEYS}  # the rest at their defaults
    if device.type == "cpu":  # the interpreter runs every program: 4-row tiles only in test_moe_h2g_own_mlp2_warps
        space = {k: tuple(x for x in v if k not in ("BLOCK_N", "BLOCK_N2") or x is None or x >= 8)
                 for k, v in space.items()}
    cfgs = MOE[name].configs(moe_problem(tokens, r, K.prepare_mxfp4(dw[0]), K.prepare_mxfp4(dw[2])), space)
    extra = []
    if routing == "hot(0.6,1)":  # a pipelined K loop, where one exists (same arithmetic: one routing is enough)
        # of each kind the widest row tile: the fewest programs for the interpreter to run one after the other
        widest = partial(sorted, key=lambda c: -(c.get("BLOCK_N") or 0))
        extra += widest(c for c in cfgs if c.get("num_stages", 1) > 2)[:1]
        extra += widest(c for c in cfgs if c.get("BLOCK_N2") and c["BLOCK_N2"] != c["BLOCK_N"])[:1]  # mlp2's own tile
    # moe_fused is moe_h2g's arithmetic in one launch, checked bit for bit against it over configs by
    # test_moe_fused_is_moe_h2g_in_one_launch: its defaults at one token are enough here (the interpreter is slow)
    # on the CPU a second config runs under one routing only (configs change tiling, routings change positions)
    mid = [] if name == "moe_fused" or (device.type == "cpu" and routing != "uniform") else [cfgs[len(cfgs) // 2]]
    for cfg in [MOE[name].defaults, *mid, *extra]:
        y = K.moe_mxfp4(x.to(device), r, *dw, variant=name, **cfg)
        assert y.shape == (tokens, H) and y.dtype == torch.bfloat16
        assert rel_err(y, ref) < TOL, (routing, cfg)


def test_route_matches_torch_reference(device):
    logits = torch.randn(33, 16, generator=torch.Generator().manual_seed(1)).to(device)
    r = K.route(logits, 4)
    vals, ids = torch.topk(logits, 4)
    assert torch.equal(r.ids.long(), ids)
    assert torch.allclose(r.weights, torch.softmax(vals, -1))
    assert torch.equal(r.counts.long(), torch.bincount(ids.reshape(-1), minlength=16))
    assert r.offsets[0] == 0 and int(r.offsets[-1]) == 33 * 4
    # sorted order groups slots by expert, ascending slot within an expert; inverse undoes it
    flat = ids.reshape(-1)
    experts_in_order = flat[r.sorted.long()]
    assert torch.all(experts_in_order[1:] >= experts_in_order[:-1])
    assert torch.equal(r.sorted.long()[r.inverse.long()], torch.arange(33 * 4, device=logits.device))


def _same_routing(a, b, fields=("ids", "weights", "counts", "offsets", "sorted", "inverse")):
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields)


@pytest.mark.parametrize("T, E, k", [(65, 8, 2), (200, 128, 4), (300, 32, 4), (129, 16, 1), (70, 256, 8)])
def test_route_over_token_blocks_matches_the_one_program_form(T, E, k, device):
    """Beyond FUSED_MAX_TOKENS route runs three launches over token blocks: per token the same top-k and
    weights, bit for bit, as the one-program form gives on pieces of at most 64 tokens, and the bookkeeping
    _bookkeeping gives for those ids (a stable sort by expert). Ties (two equal columns) and one expert in
    every token's top k included."""
    from kernels.routing import FUSED_MAX_TOKENS, _bookkeeping, route_path

    g = torch.Generator().manual_seed(T + E)
    logits = torch.randn(T, E, generator=g)
    logits[:, E // 2] = logits[:, E // 3]  # ties: the lower index comes first
    logits[: T // 2, E - 1] += 50.0  # half the tokens all on the last expert
    logits = logits.to(device)
    assert route_path(T, E, k) == "blocks"
    r = K.route(logits, k)
    pieces = [K.route(logits[i:i + FUSED_MAX_TOKENS], k) for i in range(0, T, FUSED_MAX_TOKENS)]
    assert torch.equal(r.ids, torch.cat([p.ids for p in pieces]))
    assert torch.equal(r.weights, torch.cat([p.weights for p in pieces]))
    assert _same_routing(r, _bookkeeping(r.ids, r.weights, E))
    want = torch.sort(-logits.float().cpu(), dim=1, stable=True).indices[:, :k]  # lowest index first on ties
    assert torch.equal(r.ids.long().cpu(), want)


def test_route_forms_and_the_pick_by_size(device):
    """route_forms lists the forms that apply, route_path the one route() picks; form= forces one, and each
    gives the same Routing (the torch form's weights up to rounding); a form that does not apply is an error."""
    from kernels.routing import fused_route_warps, route_forms, route_path

    assert route_forms(64, 128, 4) == ["fused", "blocks", "torch"] and route_forms(65, 128, 4) == ["blocks", "torch"]
    assert route_forms(32769, 128, 4) == ["torch"] and route_forms(100, 512, 4) == ["torch"]
    assert route_forms(100, 256, 4) == ["blocks", "torch"] and route_forms(8, 128, 4, on_device=False) == ["torch"]
    assert route_forms(0, 128, 4) == route_forms(8, 4, 5) == ["torch"]
    assert [route_path(t, 128, 4) for t in (1, 16, 17, 64, 32769)] == ["fused", "fused", "blocks", "blocks", "torch"]
    assert [route_path(t, 32, 4) for t in (32, 33)] == ["fused", "blocks"]  # the sort's 128 slots
    assert [fused_route_warps(t, 128) for t in (1, 3, 8, 16)] == [2, 4, 8, 8]  # a warp per 128 padded logits
    assert [fused_route_warps(t, 32) for t in (1, 8, 32)] == [1, 2, 8]
    logits = torch.randn(40, 16, generator=torch.Generator().manual_seed(3)).to(device)
    fused, blocks, ref = (K.route(logits, 4, form=f) for f in ("fused", "blocks", "torch"))
    assert _same_routing(fused, blocks) and _same_routing(fused, ref, ("ids", "counts", "offsets", "sorted", "inverse"))
    assert torch.allclose(fused.weights, ref.weights)
    with pytest.raises(ValueError, match="route form 'fused' does not apply"):
        K.route(torch.randn(65, 16).to(device), 4, form="fused")


def test_route_with_duplicates_and_empty_experts(device):
    ids = torch.tensor([[2, 2], [2, 5]], dtype=torch.int32, device=device)
    r = K.Routing.from_ids(ids, torch.ones(2, 2, device=device), 8)
    assert r.counts.tolist() == [0, 0, 3, 0, 0, 1, 0, 0]
    assert r.offsets.tolist() == [0, 0, 0, 3, 3, 3, 4, 4, 4]
    assert r.sorted.tolist() == [0, 1, 2, 3]


@triton.jit
def _tile_rows_probe(offs_ptr, out_ptr, E, EP: tl.constexpr, BLOCK_M: tl.constexpr, EXTRA: tl.constexpr = 0):
    tile = tl.program_id(0)
    e, m0, end, live = tile_rows(offs_ptr, tile, tl.arange(0, EP), E, BLOCK_M, EXTRA)
    i = tl.arange(0, 4)
    row = tl.where(i == 0, e, tl.where(i == 1, m0, tl.where(i == 2, end, live.to(tl.int32))))
    tl.store(out_ptr + tile * 4 + i, row)


@pytest.mark.parametrize("counts,block_m,extra", [([0, 3, 0, 0, 17, 1], 8, 0), ([40], 16, 0), ([0, 0, 5], 8, 0),
                                                  ([9, 8, 7, 0, 0, 1, 16, 2, 0], 4, 0),
                                                  ([0, 3, 0, 0, 17, 1, 20, 25, 8, 16], 8, 4), ([40, 36], 16, 8)])
def test_tile_rows_enumerates_each_experts_tiles_then_spares(counts, block_m, extra, device):
    """Every program of the worst-case grid finds its expert tile from the offsets alone: expert e with c slots
    owns ceil(c / BLOCK_M) consecutive tiles of BLOCK_M positions (the last one short), empty experts none,
    and the programs past the last tile are spare. E not a power of two and one expert only included. EXTRA
    (moe_mma's ABSORB): a last tile of at most EXTRA slots after a full one is none of its own (the tile before
    it runs to the expert's end), as labkit.timeline.tile_tokens numbers them on the host."""
    from labkit.timeline import tile_tokens

    offs = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=device)
    want = []
    for e, c in enumerate(counts):
        starts = list(range(int(offs[e]), int(offs[e]) + c, block_m))
        if extra and c > block_m and (c - 1) % block_m < extra:
            starts = starts[:-1]
        want += [(e, m0, int(offs[e + 1]), 1) for m0 in starts]
    slots = len(want) + 3
    out = torch.full((slots, 4), -1, dtype=torch.int32, device=device)
    _tile_rows_probe[(slots,)](offs, out, len(counts), EP=expert_span(len(counts)), BLOCK_M=block_m, EXTRA=extra)
    got = [tuple(row) for row in out.cpu().tolist()]
    assert got[:len(want)] == want
    assert all(live == 0 for *_, live in got[len(want):])
    ends = [nxt[1] if nxt[0] == e else end for (e, m0, end, _), nxt in zip(want, want[1:] + [(-1, 0, 0, 0)])]
    assert [b - w[1] for w, b in zip(want, ends)] == tile_tokens(counts, block_m, extra).tolist()
    if extra:
        assert len(want) < sum(-(-c // block_m) for c in counts)  # some tile was absorbed


@triton.jit
def _tile_count_probe(offs_ptr, out_ptr, E, EP: tl.constexpr, BLOCK_M: tl.constexpr, EXTRA: tl.constexpr = 0):
    tl.store(out_ptr, tile_count(offs_ptr, tl.arange(0, EP), E, BLOCK_M, EXTRA))


@pytest.mark.parametrize("counts,block_m", [([0, 3, 0, 0, 17, 1], 8), ([40], 16), ([0, 0, 5], 8),
                                            ([9, 8, 7, 0, 0, 1, 16, 2, 0], 4)])
def test_tile_count_is_the_number_of_live_tiles(counts, block_m, device):
    """tile_count gives the routing's tiles, sum of ceil(count / BLOCK_M) over experts: the tiles tile_rows
    numbers as live (a persistent grid's work runs to it)."""
    offs = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=device)
    out = torch.full((1,), -1, dtype=torch.int32, device=device)
    _tile_count_probe[(1,)](offs, out, len(counts), EP=expert_span(len(counts)), BLOCK_M=block_m)
    assert out.item() == sum(-(-c // block_m) for c in counts)
    _tile_count_probe[(1,)](offs, out, len(counts), EP=expert_span(len(counts)), BLOCK_M=block_m, EXTRA=2)
    absorbed = sum(c > block_m and (c - 1) % block_m < 2 for c in counts)
    assert out.item() == sum(-(-c // block_m) for c in counts) - absorbed


@pytest.mark.parametrize("E,S,block_m", [(128, 128, 8), (32, 128, 8), (4, 37, 16), (8, 3, 8), (1, 40, 16),
                                          (128, 1024, 16), (32, 32768, 64)])
def test_tile_slots_is_the_worst_case_tile_count(E, S, block_m):
    """tile_slots bounds the tiles of every routing of S slots over E experts, and some routing reaches it: the
    grid has no spare program it could do without in the worst case (random routings, the one-slot-per-expert
    worst case, and every slot on one expert)."""
    from kernels.moe import tile_slots

    def tiles(counts):
        return int(((counts + block_m - 1) // block_m).sum())

    class R:  # what tile_slots reads of a Routing
        sorted = torch.empty(S)
        num_experts = E

    bound = tile_slots(R, block_m)
    g = torch.Generator().manual_seed(S)
    for _ in range(50):
        ids = torch.randint(0, E, (S,), generator=g)
        assert tiles(torch.bincount(ids, minlength=E)) <= bound
    nz = min(E, S)  # worst case: nz experts with 1 + a multiple of block_m slots each, the rest on one of them
    worst = torch.zeros(E, dtype=torch.long)
    worst[:nz] = 1
    rest = S - nz
    worst[:nz] += torch.full((nz,), rest // block_m // nz * block_m)
    worst[0] += S - int(worst.sum())
    assert int(worst.sum()) == S and tiles(worst) == bound
    assert tiles(torch.tensor([S] + [0] * (E - 1))) <= bound


def test_zero_tokens_layer(layer, device):
    w1, b1, w2, b2 = (t.to(device) for t in layer)
    r = K.route(torch.zeros(0, E, device=device), TOPK)
    y = K.moe_mxfp4(torch.zeros(0, H, dtype=torch.bfloat16, device=device), r, w1, b1, w2, b2)
    assert y.shape == (0, H)


@pytest.mark.parametrize("tokens", [1, 4, 8, 9, 64, 65, 4096])
def test_auto_picks_a_valid_variant(tokens, layer):
    w1, _, w2, _ = layer
    r = K.route(torch.randn(tokens, E), TOPK)
    problem = moe_problem(tokens, r, K.prepare_mxfp4(w1), K.prepare_mxfp4(w2))
    name, cfg = pick_moe(problem)
    assert MOE[name].reason({**MOE[name].defaults, **cfg}, problem) is None
    for _, n, _cfg in MOE_TABLE:
        assert n in MOE


def auto_serves_held_layout(h1, h2, layer, device, tokens, flag, routing, seed):
    """Auto on MoE weights held in another layout (h1, h2, made from the layer's row-major w1, w2): at every
    token count its pick sets `flag` and passes the variant's rules; on `tokens` tokens routed by `routing`
    the output is within the bound and bit-identical to that config on w1, w2. Returns (x, routing) on device."""
    w1, b1, w2, b2 = (t.to(device) for t in layer)
    for t in (1, 8, 64, 4096):
        problem = moe_problem(t, K.route(torch.randn(t, E), TOPK), h1, h2)
        name, cfg = pick_moe(problem)
        assert cfg.get(flag) and K.VARIANTS[name].reason({**K.VARIANTS[name].defaults, **cfg}, problem) is None
    sample = rgen.generate(routing, tokens, E, TOPK, seed=tokens)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    ref = K.reference_moe(x.float(), (sample.ids, sample.weights), *layer)
    r = K.Routing.from_ids(sample.ids.to(device), sample.weights.to(device), E)
    y = K.moe_mxfp4(x.to(device), r, h1, b1, h2, b2)
    assert rel_err(y, ref) < TOL
    name, cfg = pick_moe(moe_problem(tokens, r, h1, h2))
    assert torch.equal(y, K.moe_mxfp4(x.to(device), r, w1, b1, w2, b2, variant=name, **cfg))
    return x.to(device), r


@pytest.mark.parametrize("tokens", [1, 17])
def test_shuffled_weights_run_through_auto_with_nib(tokens, layer, device):
    """MoE weights held in shuffle_nibbles' layout: auto picks NIB configs at every token count, matches the
    reference and that config on the unshuffled weights; w1 and w2 must both be shuffled or neither."""
    w1, b1, w2, b2 = (t.to(device) for t in layer)
    s1, s2 = K.shuffle_nibbles(w1), K.shuffle_nibbles(w2)
    x, r = auto_serves_held_layout(s1, s2, layer, device, tokens, "NIB", "uniform", seed=4)
    with pytest.raises(ValueError, match="both shuffled"):
        K.moe_mxfp4(x, r, s1, b1, w2, b2)


@pytest.mark.parametrize("tokens", [1, 17])
def test_tiled_weights_run_through_auto(tokens, layer, device):
    """MoE weights held in tile_mxfp4's layout (w1 de-interleaved): auto picks TILED configs at every token
    count, matches the reference, and gives the same output as that config on the row-major weights."""
    w1, b1, w2, b2 = (t.to(device) for t in layer)
    t1, t2 = K.tile_mxfp4(w1, deinterleave=True), K.tile_mxfp4(w2)
    x, r = auto_serves_held_layout(t1, t2, layer, device, tokens, "TILED", "zipf(1.2)", seed=3)
    with pytest.raises(ValueError, match="only TILED=True configs read"):
        K.moe_mxfp4(x, r, t1, b1, t2, b2, variant="moe_h2g")
    with pytest.raises(ValueError, match="share one layout"):
        K.moe_mxfp4(x, r, t1, b1, w2, b2)
    with pytest.raises(ValueError, match="deinterleave=True"):
        K.moe_mxfp4(x, r, K.tile_mxfp4(w1), b1, t2, b2)


def test_bad_input_errors(layer, device):
    w1, b1, w2, b2 = (t.to(device) for t in layer)
    x = torch.randn(3, H).to(torch.bfloat16).to(device)
    r = K.route(torch.randn(3, E, device=device), TOPK)
    with pytest.raises(ValueError, match=r"ids: expert id out of range 0\.\.7"):
        K.Routing.from_ids(torch.tensor([[0, 8]], device=device), torch.ones(1, 2, device=device), E)
    with pytest.raises(ValueError, match="k must be between 1 and the number of experts 8"):
        K.route(torch.randn(3, E, device=device), 9)
    with pytest.raises(ValueError, match="x has H=32 but w1 has H=64"):
        K.moe_mxfp4(x[:, :32], r, w1, b1, w2, b2)
    with pytest.raises(ValueError, match="routing covers 3 tokens but x has 2"):
        K.moe_mxfp4(x[:2], r, w1, b1, w2, b2)
    with pytest.raises(ValueError, match=r"b2 must have shape \(8, 64\)"):
        K.moe_mxfp4(x, r, w1, b1, w2, b2[:, :5])
    with pytest.raises(TypeError, match="routing must be a Routing"):
        K.moe_mxfp4(x, (r.ids, r.weights), w1, b1, w2, b2)
    with pytest.raises(TypeError, match="x must have dtype bfloat16"):
        K.moe_mxfp4(x.float(), r, w1, b1, w2, b2)
    with pytest.raises(ValueError, match="routing has 8 experts but w1 has 4"):
        K.moe_mxfp4(x, r, w1[:4], b1[:4], w2[:4], b2[:4])


def test_generators_report_load_balance():
    s = rgen.generate("all_to_one", 16, 8, 2).stats()
    assert s["distinct_experts"] == 1 and s["max_per_expert"] == 32 and s["imbalance"] == 8.0
    u = rgen.generate("uniform", 64, 8, 2, seed=1)
    assert all(len(set(row)) == 2 for row in u.ids.tolist())  # distinct experts per token
    h = rgen.generate("hot(0.9,1)", 400, 8, 2, seed=2).stats()
    assert h["max_per_expert"] >= 0.35 * 800  # expert 0 takes a large share (distinct picks cap it at 1 per token)
    d = rgen.generate("duplicates(1.0)", 10, 8, 3).ids
    assert torch.all(d == d[:, :1])
    b = rgen.generate("balanced", 13, 8, 3, seed=4)
    counts = torch.bincount(b.ids.reshape(-1).long(), minlength=8)
    assert counts.max() - counts.min() == 1 and counts.sum() == 39  # 39 = 4 * 8 + 7: seven experts take 5
    assert all(len(set(row)) == 3 for row in b.ids.tolist())
    assert rgen.generate("balanced", 64, 32, 4, seed=1).stats()["imbalance"] == 1.0
    with pytest.raises(ValueError, match="routing must be one of"):
        rgen.generate("bimodal", 4, 8, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MOE))
def test_graph_capture_replays_new_routing_contents(name, layer):
    w1, b1, w2, b2 = (t.to("cuda") for t in layer)
    T = 9
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    logits = torch.randn(T, E, device="cuda")
    r = K.route(logits, TOPK)
    K.moe_mxfp4(x, r, w1, b1, w2, b2, variant=name)  # compile outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r = K.route(logits, TOPK)
        y = K.moe_mxfp4(x, r, w1, b1, w2, b2, variant=name)
    for seed in range(3):  # new routing contents (including all tokens on one expert), same buffers
        new = torch.randn(T, E, generator=torch.Generator().manual_seed(seed)).cuda()
        if seed == 2:
            new[:, 5] += 100.0
        logits.copy_(new)
        g.replay()
        torch.cuda.synchronize()
        ref = K.reference_moe(x.float().cpu(), logits.cpu(), *(t.cpu() for t in (w1, b1, w2, b2)), k=TOPK)
        assert rel_err(y, ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("T", [33, 300])
def test_route_replays_in_a_graph_with_new_logits(T):
    """route (one program, or three launches over token blocks) captured once, replayed with new logits."""
    logits = torch.randn(T, E, device="cuda")
    K.route(logits, TOPK)  # compile outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r = K.route(logits, TOPK)
    for seed in range(3):
        new = torch.randn(T, E, generator=torch.Generator().manual_seed(seed)).cuda()
        if seed == 2:
            new[:, 5] += 100.0  # all tokens on one expert
        logits.copy_(new)
        g.replay()
        torch.cuda.synchronize()
        assert _same_routing(r, K.route(logits, TOPK))


def test_precomputed_x16_gives_the_same_output(layer, device):
    """moe_mxfp4(x16=x_to_f16(x, planes=True)) skips the conversion launch and computes the same numbers;
    a wrong x16 is an error naming the expected shapes."""
    from kernels.linear_f16 import x_to_f16

    w1, b1, w2, b2 = layer
    sample = rgen.generate("uniform", 3, E, TOPK, seed=2)
    x = torch.randn(3, H, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).to(device)
    r = K.Routing.from_ids(sample.ids.to(device), sample.weights.to(device), E)
    dw = [w.to(device) for w in (w1, b1, w2, b2)]
    x16 = x_to_f16(x, planes=True)
    y = K.moe_mxfp4(x, r, *dw, variant="moe_h2g")
    assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_h2g", x16=x16), y)
    assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_tc", x16=x16), K.moe_mxfp4(x, r, *dw, variant="moe_tc"))
    with pytest.raises(ValueError, match="x16 must be"):
        K.moe_mxfp4(x, r, *dw, variant="moe_h2g", x16=(x16[0][:, :8], x16[1]))


def test_uncombined_output_sums_in_the_next_norm(layer, device):
    """moe_mxfp4(combine=False) gives MoESlots whose combine() is the usual output, and add_rms_norm with
    them as the residual matches add_rms_norm of the combined output bit for bit (the same fp32 sum and
    bf16 roundings, in one launch fewer)."""
    w1, b1, w2, b2 = layer
    sample = rgen.generate("duplicates(0.5)", 3, E, TOPK, seed=5)
    x = torch.randn(3, H, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).to(device)
    r = K.Routing.from_ids(sample.ids.to(device), sample.weights.to(device), E)
    dw = [w.to(device) for w in (w1, b1, w2, b2)]
    slots = K.moe_mxfp4(x, r, *dw, variant="moe_h2g", combine=False)
    assert isinstance(slots, K.MoESlots) and slots.shape == (3, H)
    dense = K.moe_mxfp4(x, r, *dw, variant="moe_h2g")
    assert torch.equal(slots.combine(), dense)
    stream = torch.randn(3, H, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).to(device)
    scale = (torch.rand(H, generator=torch.Generator().manual_seed(8)) + 0.5).to(device)
    s, y = K.add_rms_norm(stream, slots, scale, 1e-5)
    s_ref, y_ref = K.add_rms_norm(stream, dense, scale, 1e-5)
    assert torch.equal(s, s_ref) and torch.equal(y, y_ref)
    settled = K.add_rms_norm(stream, slots, scale, 1e-5, settled=True)  # a PDL hint: the same numbers
    assert torch.equal(settled[0], s) and torch.equal(settled[1], y)
    with pytest.raises(ValueError, match="do not match"):
        K.add_rms_norm(stream[:2], slots, scale, 1e-5)
    with pytest.raises(TypeError, match="dense residual"):
        K.router_logits(stream, slots, scale, 1e-5, torch.zeros(4, H, device=device), torch.zeros(4, device=device))


def odd_layer(seed: int, tokens: int, sample_seed: int, device):
    """A layer whose shapes leave a K tail and a partial tile in every loop: E=4, H=288, I=160, k=2 (K=288 and
    K=160 are multiples of no K tile past 32, I=160 of no BLOCK_N past 32), zipf(1.2) routing. Returns
    ((w1, b1, w2, b2), x, routing) on `device` and the fp32 reference output (CPU)."""
    e, h, i, k = 4, 288, 160, 2
    g = torch.Generator().manual_seed(seed)
    w1 = K.quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.2)
    w2 = K.quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.2)
    b1, b2 = torch.randn(e, 2 * i, generator=g) * 0.1, torch.randn(e, h, generator=g) * 0.1
    sample = rgen.generate("zipf(1.2)", tokens, e, k, seed=sample_seed)
    x = torch.randn(tokens, h, generator=g).to(torch.bfloat16)
    ref = K.reference_moe(x.float(), (sample.ids, sample.weights), w1, b1, w2, b2)
    r = K.Routing.from_ids(sample.ids.to(device), sample.weights.to(device), e)
    return tuple(w.to(device) for w in (w1, b1, w2, b2)), x.to(device), r, ref


def gpu_or_cpu(gpu: int, cpu: int, device) -> int:
    """A many-tile case's tokens: `gpu` on the GPU, `cpu` (fewer) in the interpreter, which runs every program
    one after the other, so that its time grows with the tiles (70 tokens took ~110 s a test there)."""
    return gpu if device.type == "cuda" else cpu


@pytest.mark.parametrize("cfg", [
    {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 1, "PREFETCH": False, "num_warps": 1},
    {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 2, "PREFETCH": True, "num_warps": 2},
    {"BLOCK_M": 32, "ROWS": 1, "CHUNKS": 1, "PREFETCH": True, "num_warps": 4},
    {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 4, "PREFETCH": False, "num_warps": 2, "MAXNREG": 96},  # spills on sm_90
    # the shared-memory ring: more slots than mlp2's steps, a single warp copying all of x, two rows per warp
    {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 1, "PREFETCH": False, "num_warps": 4, "STAGES": 4},
    {"BLOCK_M": 32, "ROWS": 1, "CHUNKS": 1, "PREFETCH": False, "num_warps": 1, "STAGES": 3},
    {"BLOCK_M": 8, "ROWS": 2, "CHUNKS": 2, "PREFETCH": False, "num_warps": 2, "STAGES": 2},
    # tile_mxfp4's chunk-major weights (w1 de-interleaved): register loads, prefetched, through the ring
    {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 4, "PREFETCH": False, "num_warps": 4, "TILED": True, "MAXNREG": 128},
    {"BLOCK_M": 16, "ROWS": 2, "CHUNKS": 1, "PREFETCH": True, "num_warps": 2, "TILED": True},
    {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 2, "PREFETCH": False, "num_warps": 4, "TILED": True, "STAGES": 3},
    # wgmma: x and act in logical K order, rows padded to 128 (act's padding columns zeroed by mlp1)
    {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 1, "PREFETCH": False, "num_warps": 4, "WGMMA": True, "STAGES": 2},
    {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 1, "PREFETCH": False, "num_warps": 8, "WGMMA": True, "STAGES": 3,
     "TILED": True},
    {"BLOCK_M": 32, "ROWS": 1, "CHUNKS": 2, "PREFETCH": False, "num_warps": 4, "WGMMA": True, "STAGES": 4},
    # act padded to whole steps of 512: more padding columns (352) than columns (160)
    {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 4, "PREFETCH": False, "num_warps": 4, "WGMMA": True, "STAGES": 2},
    # RING_W: tile_mxfp4's words and scales through the same ring (the compiled kernel; same arithmetic)
    {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 2, "PREFETCH": False, "num_warps": 4, "WGMMA": True, "STAGES": 3,
     "TILED": True, "RING_W": True},
    {"BLOCK_M": 32, "ROWS": 1, "CHUNKS": 1, "PREFETCH": False, "num_warps": 8, "WGMMA": True, "STAGES": 2,
     "TILED": True, "RING_W": True},
    # NIB with wgmma: shuffle_nibbles' tiled words, act padded past its columns
    {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 4, "PREFETCH": False, "num_warps": 4, "WGMMA": True, "STAGES": 2,
     "TILED": True, "NIB": True},
])
def test_moe_mma_several_k_steps_and_a_tail(cfg, device, monkeypatch):
    """moe_mma's compiled kernel splits K into unmasked full steps (optionally prefetched) and a masked tail,
    or with STAGES streams every step through a ring of zero-filled cp.async copies; H=288 and I=160 give mlp1
    2 or 1 full steps plus a 32-wide tail and mlp2 one step plus a tail. Columns past a tile's end (I=160 is
    not a multiple of BLOCK_N) and experts with more tokens than BLOCK_M too."""
    dw, x, r, ref = odd_layer(11, 21, 4, device)
    if cfg.get("WGMMA"):  # every float buffer starts as NaN: a padding column left unwritten poisons the output
        empty = torch.empty

        def nan_empty(*a, **kw):
            out = empty(*a, **kw)
            return out.fill_(float("nan")) if out.is_floating_point() else out

        monkeypatch.setattr(torch, "empty", nan_empty)
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)
    assert rel_err(y, ref) < TOL
    if cfg.get("WGMMA") and device.type == "cpu":  # the interpreter runs mma.sync's arithmetic: bit-identical
        # (run directly: sm_90's register rules reject some of these tiles for the compiled mma.sync kernel)
        from kernels.moe_mma import run_moe_mma

        same = {**K.VARIANTS["moe_mma"].defaults, **cfg, "WGMMA": False, "STAGES": 0, "RING_W": False}
        p1, p2 = K.prepare_mxfp4(dw[0]), K.prepare_mxfp4(dw[2])
        assert torch.equal(y, run_moe_mma(x, r, p1, dw[1], p2, dw[3], 1.702, 7.0, **same))
    if cfg.get("TILED"):  # the same words in the same order: bit-identical to the row-major weights
        untiled = {**cfg, "TILED": False, "RING_W": False, "NIB": False}
        assert torch.equal(y, K.moe_mxfp4(x, r, *dw, variant="moe_mma", **untiled))


@pytest.mark.parametrize("cfg", [
    {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 2},
    {"BLOCK_M": 2, "BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "BLOCK_N2": 8},
    {"BLOCK_M": 4, "BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 2, "PREFETCH": True},
])
def test_moe_h2g_tiled_weights_give_the_same_result(cfg, device):
    """moe_h2g's TILED reads tile_mxfp4's copies (w1 deinterleaved: gate and linear rows of a pair from the two
    halves) in 128-K chunks: bit-identical to the row-major weights. H=288 and I=160 leave K tails and
    partial row tiles in both layers (2 tokens on the CPU, where each position's programs run one by one: an
    expert with two positions, two with one, one with none)."""
    (w1, b1, w2, b2), x, r, ref = odd_layer(5, gpu_or_cpu(9, 2, device), 2, device)
    y = K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_h2g", **cfg)
    assert rel_err(y, ref) < TOL
    assert torch.equal(K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_h2g", TILED=True, **cfg), y)
    t1, t2 = K.tile_mxfp4(w1, deinterleave=True), K.tile_mxfp4(w2)
    assert torch.equal(K.moe_mxfp4(x, r, t1, b1, t2, b2, variant="moe_h2g", TILED=True, **cfg), y)


@pytest.mark.parametrize("cfg", [
    {"BLOCK_M": 2, "BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "BLOCK_N2": 8},
    {"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 2},
])
def test_moe_h2g_shuffled_nibbles(cfg, device):
    """NIB reads shuffle_nibbles' copies of w1 and w2 (rows, or tiled then shuffled: bit-identical), K tails and
    partial tiles included; weights held shuffled run only NIB configs (2 tokens on the CPU)."""
    (w1, b1, w2, b2), x, r, ref = odd_layer(5, gpu_or_cpu(9, 2, device), 2, device)
    y = K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_h2g", NIB=True, **cfg)
    assert rel_err(y, ref) < TOL
    assert torch.equal(K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_h2g", NIB=True, TILED=True, **cfg), y)
    s1, s2 = K.shuffle_nibbles(w1), K.shuffle_nibbles(w2)
    assert torch.equal(K.moe_mxfp4(x, r, s1, b1, s2, b2, variant="moe_h2g", NIB=True, **cfg), y)
    with pytest.raises(ValueError, match="shuffle_nibbles' layout"):
        K.moe_mxfp4(x, r, s1, b1, s2, b2, variant="moe_h2g", **cfg)


@pytest.mark.parametrize("tokens", [3, 21, 64])
def test_moe_mma_chain_is_bit_identical_and_resets_its_counters(tokens, device):
    if device.type == "cpu" and tokens != 21:
        pytest.skip("the interpreter runs the programs one after the other: one shape is enough there")
    """CHAIN orders mlp2 after its own token tile's mlp1 programs by device counters instead of the launch
    boundary (on the GPU, under PDL, while mlp1's last programs still run): the same bits as without, call after
    call on changing routings, and every counter back at zero after each call (the last reader resets it)."""
    from kernels.sync import SCRATCH

    cfg = {"BLOCK_M": 8, "ROWS": 2, "CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 2, "TILED": True,
           "RING_W": True, "NIB": True}
    for seed in range(2 if device.type == "cpu" else 20):
        dw, x, r, ref = odd_layer(13, tokens, seed, device)
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, CHAIN=True)
        assert torch.equal(y, K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)), seed
        counters = [c for k, c in SCRATCH.items() if "moe_mma_chain" in k]
        assert counters and all(int(c.abs().sum()) == 0 for c in counters), seed
    assert rel_err(y, ref) < TOL
    assert "WGMMA" in K.VARIANTS["moe_mma"].reason({**K.VARIANTS["moe_mma"].defaults, "CHAIN": True}, {})


@pytest.mark.parametrize("tokens", [1, 4, 21])
def test_moe_h2g_chain_is_bit_identical_and_resets_its_counters(tokens, device):
    """moe_h2g's CHAIN: the grid turned to (N tiles, positions) and mlp2 ordered after its own position's mlp1
    programs by device counters (on the GPU under PDL, while mlp1's last programs still run): the same bits as
    without, call after call on changing routings (BLOCK_M > 1: positions that start no chunk neither signal
    nor wait), every counter back at zero after each call; refused past grid axis 1."""
    from kernels.sync import SCRATCH

    if device.type == "cpu" and tokens == 21:
        pytest.skip("the interpreter runs the programs one after the other: two shapes are enough there")
    cfgs = ({"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 256, "NIB": True, "PREFETCH": True, "BLOCK_N2": 8},
            {"BLOCK_M": 2, "BLOCK_N": 32, "BLOCK_K": 128, "TILED": True})
    if device.type == "cpu" and tokens > 1:  # there only BLOCK_M=2 needs the positions of 4 tokens (~30 s a call)
        cfgs = cfgs[1:]
    for cfg in cfgs:
        for seed in range(1 if device.type == "cpu" else 20):
            dw, x, r, ref = odd_layer(13, tokens, seed, device)
            y = K.moe_mxfp4(x, r, *dw, variant="moe_h2g", **cfg, CHAIN=True)
            assert torch.equal(y, K.moe_mxfp4(x, r, *dw, variant="moe_h2g", **cfg)), (cfg, seed)
            counters = [c for k, c in SCRATCH.items() if "moe_h2g_chain" in k]
            assert counters and all(int(c.abs().sum()) == 0 for c in counters), (cfg, seed)
        assert rel_err(y, ref) < TOL
    v = K.VARIANTS["moe_h2g"]
    problem = {"op": "moe", "m": 4, "tokens": 4, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert "65535" in v.reason({**v.defaults, "CHAIN": True}, {**problem, "m": 40000, "tokens": 40000})
    assert v.reason({**v.defaults, "CHAIN": True}, problem) is None


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4])
def test_moe_h2g_maxnreg_is_bit_identical(tokens):
    """MAXNREG caps mlp1's registers (ptxas reschedules, the arithmetic stays): the uncapped bits, with and
    without CHAIN. Only compiled kernels have a register cap."""
    dev = torch.device("cuda")
    for chain in (False, True):
        cfg = {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 256, "NIB": True, "PREFETCH": True, "BLOCK_N2": 8,
               "CHAIN": chain}
        dw, x, r, ref = odd_layer(13, tokens, 3, dev)
        y = K.moe_mxfp4(x, r, *dw, variant="moe_h2g", **cfg)
        for cap in (64, 56):
            assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_h2g", MAXNREG=cap, **cfg), y), (chain, cap)
        assert rel_err(y, ref) < TOL


def test_moe_h2g_early_is_bit_identical(device):
    """moe_h2g's EARLY only moves the PDL waits after the routing reads and PREFETCH's first weight tile (the
    interpreter has no wait, so there it checks the arithmetic is untouched): EARLY=2 (mlp1 and mlp2) gives the
    same bits, and so does x16 given (the model's path, where mlp1's EARLY is dropped). The GPU test below races
    it, CHAIN included."""
    from kernels.linear_f16 import x_to_f16

    dw, x, r, ref = odd_layer(19, 3, 5, device)
    cfg = {"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 256, "NIB": True, "PREFETCH": True}
    y = K.moe_mxfp4(x, r, *dw, variant="moe_h2g", **cfg)
    assert rel_err(y, ref) < TOL
    assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_h2g", EARLY=2, **cfg), y)
    x16 = x_to_f16(x, planes=True)
    assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_h2g", EARLY=2, x16=x16, **cfg), y)


# the spy writes no act or y rows, so the combine adds uninitialized memory (NaN now and then)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_moe_h2g_early_reaches_mlp1_only_when_the_layer_converts_x(monkeypatch, device):
    """EARLY lets mlp1 read the routing before its PDL wait, which is safe only when the launch before it is
    the layer's own x_to_f16 (route's launch then came two back); with x16 given (router_logits' launch, which
    route follows directly) mlp1 must wait first, so the launcher drops EARLY there. mlp2 gets it with EARLY=2
    only (its launch always follows this call's mlp1), which CHAIN refuses."""
    import kernels.moe as M
    from kernels.linear_f16 import x_to_f16

    seen = []

    class Spy:
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append((kw["PHASE"], kw.get("EARLY", False)))

    dw, x, r, _ = odd_layer(19, 3, 5, device)
    cfg = {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 256, "PREFETCH": True, "EARLY": True}
    x16 = x_to_f16(x, planes=True)
    monkeypatch.setattr(M, "_moe_h2g_kernel", Spy())
    K.moe_mxfp4(x, r, *dw, variant="moe_h2g", **cfg)
    assert seen == [(1, True), (2, False)]
    seen.clear()
    K.moe_mxfp4(x, r, *dw, variant="moe_h2g", x16=x16, **cfg)
    assert seen == [(1, False), (2, False)]
    seen.clear()
    K.moe_mxfp4(x, r, *dw, variant="moe_h2g", **{**cfg, "EARLY": 2})
    K.moe_mxfp4(x, r, *dw, variant="moe_h2g", x16=x16, **{**cfg, "EARLY": 2})
    assert seen == [(1, True), (2, True), (1, False), (2, True)]
    v, problem = K.VARIANTS["moe_h2g"], {"op": "moe", "m": 4, "tokens": 4, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert "CHAIN" in v.reason({**v.defaults, "EARLY": 2, "CHAIN": True}, problem)
    assert v.reason({**v.defaults, "EARLY": True, "CHAIN": True}, problem) is None


def test_moe_h2g_own_mlp2_warps(device):
    """WARPS2 and MAXNREG2 build mlp2 with its own num_warps and register cap (with BLOCK_N2 or BLOCK_N, the
    one-token lm_head leader's program shape: 4 rows, one warp): agrees with reference_moe, with CHAIN and
    EARLY=2 too; the rules hold mlp2's build to the h2g word bounds and refuse a repeat."""
    dw, x, r, ref = odd_layer(13, 1, 2, device)  # one token, two positions: the interpreter runs every program
    cfg = {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128, "NIB": True, "PREFETCH": True, "num_warps": 2}
    gpu_only = [{"WARPS2": 4, "CHAIN": True}] if device.type == "cuda" else []  # the interpreter has no warps
    for extra in [{"BLOCK_N2": 4, "WARPS2": 1, "MAXNREG2": 64, "EARLY": 2},
                  {"BLOCK_N": 4, "num_warps": 1, "MAXNREG": 64, "BLOCK_N2": 16, "WARPS2": 2}] + gpu_only:
        y = K.moe_mxfp4(x, r, *dw, variant="moe_h2g", **{**cfg, **extra})
        assert rel_err(y, ref) < TOL, extra
    v = K.VARIANTS["moe_h2g"]
    problem = {"op": "moe", "m": 3, "tokens": 3, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    full = {**v.defaults, **cfg, "BLOCK_K": 1024, "num_warps": 4}
    assert v.reason({**full, "BLOCK_N2": 4, "WARPS2": 1, "MAXNREG2": 72}, problem) is None
    assert "spill" in v.reason({**full, "BLOCK_N2": 8, "WARPS2": 1}, problem)  # 32 words per thread
    assert "fewer weight words" in v.reason({**full, "BLOCK_K": 128, "BLOCK_N2": 4, "WARPS2": 4}, problem)
    assert "equals num_warps" in v.reason({**full, "WARPS2": 4}, problem)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4])
def test_moe_h2g_early_under_pdl_and_graphs(tokens):
    """On the GPU, under PDL and a CUDA graph of route + layer, EARLY's mlp1 reads the routing and its first
    weight tile while x_to_f16 still runs (EARLY=2: mlp2 its first tile during mlp1's tail). Fresh logits and x
    before each of 20 replays: a read of last replay's routing, x16 or act would show as bits unlike the eager
    call's without EARLY (with MAXNREG, the decode leaders' cap; CHAIN on and off)."""
    dev = torch.device("cuda")
    dw, x, _, _ = odd_layer(23, tokens, 6, dev)
    g = torch.Generator(device=dev).manual_seed(tokens)
    logits = torch.randn(tokens, 4, device=dev)
    for chain, early in ((False, True), (False, 2), (True, True)):
        cfg = {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 1024, "NIB": True, "PREFETCH": True, "BLOCK_N2": 8,
               "MAXNREG": 72, "CHAIN": chain}
        K.moe_mxfp4(x, K.route(logits, 2), *dw, variant="moe_h2g", EARLY=early, **cfg)  # compile outside
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ye = K.moe_mxfp4(x, K.route(logits, 2), *dw, variant="moe_h2g", EARLY=early, **cfg)
        for rep in range(20):
            logits.copy_(torch.randn(tokens, 4, generator=g, device=dev))
            x.copy_(torch.randn(tokens, x.shape[1], generator=g, device=dev).to(torch.bfloat16))
            graph.replay()
            y = K.moe_mxfp4(x, K.route(logits, 2), *dw, variant="moe_h2g", **cfg)
            torch.cuda.synchronize()
            assert torch.equal(ye, y), (chain, early, rep)


@pytest.mark.parametrize("tokens", [5, "many"])
def test_moe_mma_own_mlp2_rows_is_bit_identical(tokens, device):
    """ROWS2 gives mlp2 its own row tile and STAGES2 its own ring depth: each output element sums the same K
    steps in the same order, so the layer's bits do not change, with and without CHAIN (mlp2's programs per
    token tile then differ from mlp1's); a ROWS2 or STAGES2 whose mlp2 build would not fit is refused."""
    cfg = {"BLOCK_M": 8, "ROWS": 2, "CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 4, "TILED": True,
           "RING_W": True, "NIB": True}
    tokens = gpu_or_cpu(70, 24, device) if tokens == "many" else tokens  # zipf seed 4: 16-61 or 5-20 per expert
    dw, x, r, ref = odd_layer(7, tokens, 4, device)
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)
    for extra in ({"ROWS2": 1}, {"ROWS2": 1, "CHAIN": True}, {"STAGES2": 2}, {"ROWS2": 1, "STAGES2": 8, "CHAIN": True}):
        assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra), y), extra
    assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **{**cfg, "ROWS": 1}, ROWS2=2), y)
    assert rel_err(y, ref) < TOL
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason({**v.defaults, **cfg, "ROWS2": 1}, problem) is None
    assert "spill" in v.reason({**v.defaults, **cfg, "BLOCK_M": 128, "ROWS": 1, "ROWS2": 2}, problem)
    assert "equals ROWS" in v.reason({**v.defaults, **cfg, "ROWS2": 2}, problem)
    ring = {**v.defaults, "BLOCK_M": 16, "ROWS": 1, "CHUNKS": 2, "num_warps": 4, "STAGES": 6}  # mma.sync ring
    assert v.reason(ring, problem) is None
    assert "shared memory" in v.reason({**ring, "ROWS2": 2}, problem)  # mlp2's 128-row slots: 240 KiB
    assert v.reason({**v.defaults, **cfg, "STAGES2": 8}, problem) is None
    assert "equals STAGES" in v.reason({**v.defaults, **cfg, "STAGES2": 4}, problem)
    assert "only with WGMMA" in v.reason({**ring, "STAGES2": 2}, problem)
    wide = {**v.defaults, **cfg, "BLOCK_M": 64, "ROWS": 1, "CHUNKS": 2, "STAGES": 2}
    assert v.reason(wide, problem) is None
    assert "shared memory" in v.reason({**wide, "STAGES2": 8}, problem)  # mlp2's 8 slots of 2 chunks: 333 KiB


@pytest.mark.parametrize("tokens", [5, 70])
def test_moe_mma_half_width_tiles_are_bit_identical(tokens, device):
    """HALF runs token tiles holding at most BLOCK_M / 2 positions on a half-width build (wgmma N = BLOCK_M / 2):
    each token's column of the MMA is its own and sums the same K steps in the same order, so the bits do not
    change (cp.async and TMA=2 rings, with CHAIN; tiles of 16, 32 and 64 rows, the routing leaving both kinds).
    The interpreter runs the same arithmetic either way: on the CPU this checks the plumbing and the rule."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "TILED": True, "RING_W": True, "NIB": True, "ROWS": 2}
    dw, x, r, ref = odd_layer(23, tokens, 6, device)
    counts = (r.offsets[1:] - r.offsets[:-1]).cpu()
    for extra in ({"BLOCK_M": 16, "STAGES": 4, "CHAIN": True, "EPI_EARLY": 1}, {"BLOCK_M": 32, "STAGES": 4},
                  {"BLOCK_M": 64, "STAGES": 3, "TMA": 2, "CHAIN": True, "MAXNREG": 168}):
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra)
        assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra, HALF=True), y), extra
        assert rel_err(y, ref) < TOL
    if tokens == 70:  # both kinds of tile at BLOCK_M=16: a part-filled last tile of at most 8, and more
        rest = counts % 16
        assert ((rest > 0) & (rest <= 8)).any() and ((rest > 8) | (counts > 16)).any()
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason({**v.defaults, **cfg, "BLOCK_M": 16, "STAGES": 4, "HALF": True}, problem) is None
    assert "only with WGMMA" in v.reason({**v.defaults, "HALF": True}, problem)
    assert "BLOCK_M >= 16" in v.reason({**v.defaults, **cfg, "BLOCK_M": 8, "STAGES": 4, "HALF": True}, problem)


def test_moe_mma_absorbed_tiles_are_bit_identical(device):
    """ABSORB runs an expert's last tile of at most ABSORB tokens inside the full tile before it (a second x box
    and accumulator on the same decoded weights): each token's column sums the same K steps in the same order,
    so the bits do not change (with CHAIN, HALF, EPI_EARLY, WAIT_LATE; tiles of 16 and 32 tokens, experts with
    and without an absorbed tail). The interpreter runs the same arithmetic on its own tiles: on the CPU this
    checks the plumbing and the rules."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "TILED": True, "RING_W": True, "NIB": True, "ROWS": 2,
           "TMA": 2}
    dw, x, r, ref = odd_layer(23, 70, 6, device)
    counts = (r.offsets[1:] - r.offsets[:-1]).cpu().tolist()
    for extra in ({"BLOCK_M": 16, "STAGES": 3, "CHAIN": True, "ABSORB": 8},
                  {"BLOCK_M": 32, "STAGES": 3, "HALF": True, "EPI_EARLY": 2, "ABSORB": 16},
                  {"BLOCK_M": 32, "STAGES": 2, "CHAIN": True, "WAIT_LATE": 2, "EPI_EARLY": 1, "ABSORB": 8}):
        bm, a = extra["BLOCK_M"], extra["ABSORB"]
        tails = [c > bm and (c - 1) % bm < a for c in counts]
        assert any(tails) and not all(tails), (extra, counts)
        plain = {k: v for k, v in extra.items() if k != "ABSORB"}
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **plain)
        assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra), y), extra
        assert rel_err(y, ref) < TOL
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    ok = {**v.defaults, **cfg, "BLOCK_M": 32, "STAGES": 3, "ABSORB": 16}
    assert v.reason(ok, problem) is None
    assert "TMA=2" in v.reason({**ok, "TMA": True}, problem)
    assert "BLOCK_M / 2" in v.reason({**ok, "BLOCK_M": 16}, problem)
    assert "PERSIST1" in v.reason({**ok, "PERSIST1": 4}, problem)


def test_moe_mma_paired_boxes_are_bit_identical(device):
    """PAIRED reads mlp1's gate and linear rows of a program as one TMA box of each kind (4-D views of the tiled
    copy): the same rows land in the same slot halves, so the bits do not change (TMA and TMA=2, with CHAIN,
    HALF, ABSORB; I = 160 leaves the last program's halves part-filled). The interpreter runs the same
    arithmetic either way: on the CPU this checks the plumbing and the rules."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "TILED": True, "RING_W": True, "NIB": True, "ROWS": 2}
    dw, x, r, ref = odd_layer(23, 70, 6, device)
    for extra in ({"BLOCK_M": 16, "STAGES": 3, "TMA": True},
                  {"BLOCK_M": 32, "STAGES": 3, "TMA": 2, "CHAIN": True, "HALF": True, "EPI_EARLY": 2},
                  {"BLOCK_M": 16, "STAGES": 2, "TMA": 2, "CHAIN": True, "ABSORB": 8, "EPI_EARLY": 1}):
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra)
        assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra, PAIRED=True), y), extra
        assert rel_err(y, ref) < TOL
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    ok = {**v.defaults, **cfg, "BLOCK_M": 32, "STAGES": 3, "TMA": 2, "PAIRED": True}
    assert v.reason(ok, problem) is None
    assert "only with WGMMA and TMA" in v.reason({**ok, "TMA": False}, problem)
    assert "STEP_MAJOR" in v.reason({**ok, "STEP_MAJOR": True}, problem)
    assert v.reason({**ok, "NOBAR": True}, problem) is None
    assert "it needs TMA" in v.reason({**ok, "PAIRED": False, "TMA": False, "NOBAR": True}, problem)
    assert "NOBAR applies only with WGMMA" in v.reason({**v.defaults, "NOBAR": True}, problem)


@pytest.mark.parametrize("tokens", [5, "many"])
def test_moe_mma_early_epilogue_loads_are_bit_identical(tokens, device):
    """EPI_EARLY moves the epilogue's loads (1: token scales or gate weights; 2: biases too) ahead of the K loop
    in the compiled WGMMA kernel: the same values meet the same accumulators, so the bits do not change, with
    and without CHAIN and ROWS2; without WGMMA the option is refused (it would repeat a config)."""
    cfg = {"BLOCK_M": 8, "ROWS": 2, "CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 4, "TILED": True,
           "RING_W": True, "NIB": True}
    tokens = gpu_or_cpu(70, 24, device) if tokens == "many" else tokens  # zipf seed 4: 16-61 or 5-20 per expert
    dw, x, r, ref = odd_layer(11, tokens, 4, device)
    for extra in ({}, {"CHAIN": True, "ROWS2": 1}):
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra)
        for early in (1, 2):
            assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra, EPI_EARLY=early), y), early
        assert rel_err(y, ref) < TOL
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason({**v.defaults, **cfg, "EPI_EARLY": 2}, problem) is None
    assert "only with WGMMA" in v.reason({**v.defaults, "EPI_EARLY": 1}, problem)


def test_moe_mma_skipped_x_rows_are_bit_identical(device):
    """XSKIP zero-fills the x rows of a token tile past its expert's last position instead of copying the
    tile's first row into them: those rows' outputs are never stored and each token's column of the MMA is its
    own, so the bits do not change (tiles of 8, 16 and 64 rows holding fewer positions, RING_W or not, with
    CHAIN); without WGMMA the option is refused. The ring exists only in the compiled kernel: on the CPU the
    interpreter path runs the same arithmetic either way, so there this checks the plumbing and the rule."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True, "NIB": True}
    dw, x, r, ref = odd_layer(5, 21, 3, device)
    for extra in ({"BLOCK_M": 8, "ROWS": 2, "RING_W": True, "CHAIN": True, "EPI_EARLY": 1},
                  {"BLOCK_M": 16, "ROWS": 1, "RING_W": False}, {"BLOCK_M": 64, "ROWS": 2, "RING_W": True}):
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra)
        assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra, XSKIP=True), y), extra
        assert rel_err(y, ref) < TOL
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert "only with WGMMA" in v.reason({**v.defaults, "XSKIP": True}, problem)


def test_moe_mma_tma_copies_are_bit_identical(device):
    """TMA copies each K step's weight words and scale bytes by tensor-memory-accelerator boxes (mlp1: a gate and
    a linear box landing in the two halves of the slot) instead of 16-byte cp.async copies, and TMA=2 the tile's x
    rows too, from x gathered in expert-sorted order (mlp1) or act (mlp2): the same bytes reach the same slots,
    so the bits do not change (tiles of 8 and 64 rows, partial row tiles of both halves, CHAIN with TMA's words,
    ROWS2, EPI_EARLY, three programs per SM; TMA=2 with CHAIN, whose mlp2 reads act by TMA after a counter
    wait). The interpreter has no TMA: on the CPU this checks the plumbing and the rules."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True, "NIB": True, "RING_W": True}
    dw, x, r, ref = odd_layer(17, 21, 5, device)
    for extra, modes in (({"BLOCK_M": 8, "ROWS": 2, "CHAIN": True, "EPI_EARLY": 1}, (True, 2)),
                         ({"BLOCK_M": 64, "ROWS": 2, "CHAIN": True, "MAXNREG": 168}, (2,)),
                         ({"BLOCK_M": 8, "ROWS": 2, "ROWS2": 1}, (True, 2)), ({"BLOCK_M": 64, "ROWS": 2}, (True, 2)),
                         ({"BLOCK_M": 64, "ROWS": 2, "MAXNREG": 168, "EPI_EARLY": 1}, (2,)),
                         ({"BLOCK_M": 16, "ROWS": 1}, (True, 2))):
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra)
        for tma in modes:
            assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, **extra, TMA=tma), y), (extra, tma)
        assert rel_err(y, ref) < TOL
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason({**v.defaults, **cfg, "TMA": 2}, problem) is None
    assert "only with WGMMA" in v.reason({**v.defaults, "TMA": 2}, problem)
    assert "needs RING_W" in v.reason({**v.defaults, **cfg, "RING_W": False, "TMA": True}, problem)
    assert "CHUNKS=1" in v.reason({**v.defaults, **cfg, "CHUNKS": 2, "TMA": True}, problem)
    assert "XSKIP" in v.reason({**v.defaults, **cfg, "TMA": 2, "XSKIP": True}, problem)
    assert v.reason({**v.defaults, **cfg, "TMA": 2, "CHAIN": True}, problem) is None  # with proxy fences
    assert v.reason({**v.defaults, **cfg, "TMA": True, "CHAIN": True}, problem) is None


def test_moe_mma_step_major_is_bit_identical(device):
    """STEP_MAJOR: the ring's cp.async copies (or TMA's boxes) read prepare.step_major's copy of the tiled
    weights, where expert e's group g of chunk c sits at [c, e * G + g]: the same bytes reach the same slots, so
    the bits do not change (tiles of 8, 16 and 64 rows, mlp1's gate and linear halves, CHAIN, ROWS2, HALF, both
    TMA modes). The interpreter reads the tiled copy: on the CPU this checks the plumbing and the rules."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True, "NIB": True, "RING_W": True}
    dw, x, r, ref = odd_layer(17, 21, 5, device)
    for extra in ({"BLOCK_M": 8, "ROWS": 2, "CHAIN": True, "EPI_EARLY": 1}, {"BLOCK_M": 8, "ROWS": 2, "ROWS2": 1},
                  {"BLOCK_M": 16, "ROWS": 2, "CHAIN": True, "HALF": True}, {"BLOCK_M": 64, "ROWS": 2, "STAGES": 4},
                  {"BLOCK_M": 16, "ROWS": 1, "TMA": True}, {"BLOCK_M": 64, "ROWS": 2, "TMA": 2, "CHAIN": True}):
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **{**cfg, **extra})
        assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **{**cfg, **extra, "STEP_MAJOR": True}), y), extra
        assert rel_err(y, ref) < TOL
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason({**v.defaults, **cfg, "STEP_MAJOR": True}, problem) is None
    assert "only with WGMMA" in v.reason({**v.defaults, "STEP_MAJOR": True}, problem)
    assert "needs RING_W" in v.reason({**v.defaults, **cfg, "RING_W": False, "STEP_MAJOR": True}, problem)


def test_moe_mma_atomic_combine(device):
    """ATOMIC: mlp2 adds each gate-weighted bf16 row into the layer output (zeroed by x_to_f16's launch) instead
    of storing it for the combine launch. Each addition rounds to bf16, so with k > 2 the bits depend on the
    order; with this layer's k = 2 they do not (0 + a is exact, then a + b rounds once, as the combine's fp32
    sum does): the output must equal the combine's bits (tiles of 8, 16 and 64 rows, CHAIN, HALF, ROWS2,
    EPI_EARLY, both TMA modes, STEP_MAJOR). With combine=False the option is ignored (the rows are kept for
    kernels.add_rms_norm)."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True, "NIB": True, "RING_W": True}
    dw, x, r, ref = odd_layer(19, gpu_or_cpu(37, 21, device), 6, device)  # 10-32 or 5-17 per expert
    for extra in ({"BLOCK_M": 8, "ROWS": 2, "CHAIN": True, "EPI_EARLY": 2, "ROWS2": 1},
                  {"BLOCK_M": 16, "ROWS": 2, "CHAIN": True, "HALF": True, "STEP_MAJOR": True},
                  {"BLOCK_M": 16, "ROWS": 1, "TMA": True}, {"BLOCK_M": 64, "ROWS": 2, "TMA": 2, "CHAIN": True}):
        c = {**cfg, **extra}
        slots = K.moe_mxfp4(x, r, *dw, variant="moe_mma", combine=False, **c)
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **c, ATOMIC=True)
        assert torch.equal(y, slots.combine()), extra
        assert rel_err(y, ref) < TOL
        kept = K.moe_mxfp4(x, r, *dw, variant="moe_mma", combine=False, **c, ATOMIC=True)
        assert torch.equal(kept.rows, slots.rows), extra
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason({**v.defaults, **cfg, "ATOMIC": True}, problem) is None
    assert "only with WGMMA" in v.reason({**v.defaults, "ATOMIC": True}, problem)


def test_moe_mma_splitk2_adds_its_slices(device):
    """SPLITK2 (with ATOMIC): mlp2's K in slices of whole steps, each program adding its share into the output
    and slice 0 the bias. Its bits differ from the combine's by the extra bf16 roundings of the shares (about
    0.5% here), so it is held to the reference and to the combine's output within 1%; b2 is made large (~5, the
    outputs ~20) so that a slice lost, repeated or given the bias twice moves it by 10% or more. mlp2's K here is
    160, two steps: 3 slices are capped at 2. With TMA the config is refused; without ATOMIC the slices meet in
    the combine (the next test)."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True, "NIB": True, "RING_W": True,
           "ATOMIC": True}
    (w1, b1, w2, b2), x, r, ref = odd_layer(19, gpu_or_cpu(37, 21, device), 6, device)  # 10-32 or 5-17 per expert
    dw = (w1, b1, w2, b2 * 50)
    for extra in ({"BLOCK_M": 8, "ROWS": 2, "CHAIN": True, "EPI_EARLY": 2, "ROWS2": 1, "SPLITK2": 2},
                  {"BLOCK_M": 16, "ROWS": 2, "CHAIN": True, "HALF": True, "STEP_MAJOR": True, "SPLITK2": 3},
                  {"BLOCK_M": 16, "ROWS": 1, "EPI_EARLY": 1, "SPLITK2": 2}):
        c = {**cfg, **extra}
        want = K.moe_mxfp4(x, r, *dw, variant="moe_mma", combine=False, **c).combine()
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **c)
        assert not torch.equal(y, want), extra  # the shares were rounded: the slices ran
        assert rel_err(y, want.float().cpu()) < 1e-2, extra
        assert rel_err(K.moe_mxfp4(x, r, *dw[:3], b2, variant="moe_mma", **c), ref) < TOL, extra
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason({**v.defaults, **cfg, "SPLITK2": 2}, problem) is None
    assert v.reason({**v.defaults, **cfg, "ATOMIC": False, "SPLITK2": 2}, problem) is None
    assert "needs RING_W" in v.reason({**v.defaults, **cfg, "RING_W": False, "SPLITK2": 2}, problem)
    assert "TMA" in v.reason({**v.defaults, **cfg, "TMA": True, "SPLITK2": 2}, problem)


def test_moe_mma_splitk2_without_atomic_sums_its_slices_in_order(device):
    """SPLITK2 without ATOMIC: each K slice of mlp2 stores its fp32 shares in rows of its own and the combine
    adds them in slice order, so the bits repeat from call to call (no atomics) and sit within 1% of the
    unsliced layer, whose rows round to bf16 before the combine (here they do not); b2 is made large (~5, the
    outputs ~20) so that a slice lost, repeated or given the bias twice moves the output by 10% or more. Without
    the combine (MoESlots for add_rms_norm) the slices are not run: the unsliced rows come back."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True, "NIB": True, "RING_W": True}
    (w1, b1, w2, b2), x, r, ref = odd_layer(19, gpu_or_cpu(37, 21, device), 6, device)  # 10-32 or 5-17 per expert
    dw = (w1, b1, w2, b2 * 50)
    for extra in ({"BLOCK_M": 8, "ROWS": 2, "CHAIN": True, "EPI_EARLY": 2, "ROWS2": 1},
                  {"BLOCK_M": 16, "ROWS": 2, "CHAIN": True, "HALF": True, "STEP_MAJOR": True},
                  {"BLOCK_M": 16, "ROWS": 1, "EPI_EARLY": 1}):
        c = {**cfg, **extra}
        want = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **c)
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", SPLITK2=2, **c)
        assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", SPLITK2=2, **c), y), extra
        assert not torch.equal(y, want), extra  # the rows were not rounded: the slices ran
        assert rel_err(y, want.float().cpu()) < 1e-2, extra
        assert rel_err(K.moe_mxfp4(x, r, *dw[:3], b2, variant="moe_mma", SPLITK2=2, **c), ref) < TOL, extra
        slots = K.moe_mxfp4(x, r, *dw, variant="moe_mma", combine=False, SPLITK2=2, **c)
        assert slots.splits == 1 and torch.equal(slots.combine(), want), extra


def test_moe_mma_persistent_grids_do_every_program_once(device):
    """PERSIST1: a grid of that many mlp1 programs per SM (4 SMs in the interpreter), each doing every grid-th
    program's work of the routing's tiles: the same work as one program per slot, so the same bits (CHAIN's counters
    signalled, ROWS2, HALF, STEP_MAJOR, ATOMIC at k = 2; grids smaller and larger than the work); with SPLITK2 the
    shares add in another order, so within 1% of the one-program-per-slot output. The mma.sync kernels have no loop:
    refused without WGMMA. WAIT_LATE (the PDL wait after each tile's routing reads, with or without PERSIST1; 2:
    after its first weight copies too, which needs a ring of them) changes no arithmetic; its ordering is checked on
    the GPU (test_moe_mma_tma_under_graphs_with_new_routing). TICKET1 (items after the first by ticket) does the
    same work in another order, so the same bits, twice in a row: the counter is back at zero after each call (a
    counter left set would skip items)."""
    cfg = {"CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True, "NIB": True, "RING_W": True}
    dw, x, r, ref = odd_layer(19, gpu_or_cpu(37, 21, device), 6, device)  # 10-32 or 5-17 per expert
    # each (PERSIST1, WAIT_LATE, TICKET1) setting once, spread over the three builds (every pair of them took 89 s
    # in the interpreter): grids of 1, 2 and 8 programs per SM, and none
    for extra, settings in (({"BLOCK_M": 8, "ROWS": 2, "CHAIN": True, "EPI_EARLY": 2, "ROWS2": 1},
                             ((2, False, False), (8, 2, False))),
                            ({"BLOCK_M": 16, "ROWS": 2, "CHAIN": True, "HALF": True, "STEP_MAJOR": True,
                              "ATOMIC": True}, ((1, True, True), (0, 2, False))),
                            ({"BLOCK_M": 16, "ROWS": 1, "EPI_EARLY": 1}, ((2, 2, True),))):
        c = {**cfg, **extra}
        y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **c)
        for persist, late, ticket in settings:
            for _ in range(2 if ticket else 1):
                got = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **c, PERSIST1=persist, WAIT_LATE=late,
                                  TICKET1=ticket)
                assert torch.equal(got, y), (extra, persist, ticket)
        assert rel_err(y, ref) < TOL
    c = {**cfg, "BLOCK_M": 8, "ROWS": 2, "CHAIN": True, "ATOMIC": True, "SPLITK2": 2}
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **c)
    assert rel_err(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **c, PERSIST1=2), y.float().cpu()) < 1e-2
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason({**v.defaults, **cfg, "PERSIST1": 4}, problem) is None
    assert "only with WGMMA" in v.reason({**v.defaults, "PERSIST1": 4}, problem)
    assert v.reason({**v.defaults, **cfg, "WAIT_LATE": True}, problem) is None  # one program per slot too
    assert "only with WGMMA" in v.reason({**v.defaults, "WAIT_LATE": True}, problem)
    assert v.reason({**v.defaults, **cfg, "PERSIST1": 4, "WAIT_LATE": 2}, problem) is None
    assert "RING_W" in v.reason({**v.defaults, **cfg, "RING_W": False, "PERSIST1": 4, "WAIT_LATE": 2}, problem)
    assert "needs PERSIST1" in v.reason({**v.defaults, **cfg, "TICKET1": True}, problem)
    assert v.reason({**v.defaults, **cfg, "PERSIST1": 4, "TICKET1": True}, problem) is None


def test_moe_mma_maxnreg2_caps_mlp2_only(device, monkeypatch):
    """MAXNREG2 is mlp2's own register cap: mlp1's launch is built with MAXNREG, mlp2's with MAXNREG2 (caps change
    no arithmetic, so the bits stay those of the config without it); a value equal to MAXNREG repeats that config."""
    import inspect

    import kernels.moe_mma as mm

    caps, launch = [], mm._launch
    cfg_of = lambda *a, **k: inspect.signature(launch).bind(*a, **k).arguments["cfg"]  # noqa: E731
    monkeypatch.setattr(mm, "_launch", lambda *a, **k: caps.append(cfg_of(*a, **k)["MAXNREG"]) or launch(*a, **k))
    cfg = {"BLOCK_M": 8, "ROWS": 2, "CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True,
           "RING_W": True, "NIB": True, "CHAIN": True, "ATOMIC": True, "MAXNREG": 128}
    dw, x, r, _ = odd_layer(23, 21, 5, device)
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)
    caps.clear()
    got = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, MAXNREG2=80)
    assert caps == [128, 80]
    assert torch.equal(got, y)
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    base = {**v.defaults, **cfg, "EPI_EARLY": 2}
    assert v.reason({**base, "MAXNREG2": 80}, problem) is None
    assert "equals MAXNREG" in v.reason({**base, "MAXNREG2": 128}, problem)


def tail_layer(h: int, i: int, tokens: int, device, seed: int = 5):
    """A small layer whose K ends in half a chunk where h or i % 128 == 64 (E=4, k=2, uniform routing):
    ((w1, b1, w2, b2), x, routing, fp32 reference on the CPU)."""
    e = 4
    g = torch.Generator().manual_seed(seed)
    w1 = K.quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.2)
    w2 = K.quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.2)
    b1, b2 = torch.randn(e, 2 * i, generator=g) * 0.1, torch.randn(e, h, generator=g) * 0.1
    sample = rgen.generate("uniform", tokens, e, 2, seed=seed)
    x = torch.randn(tokens, h, generator=g).to(torch.bfloat16)
    ref = K.reference_moe(x.float(), (sample.ids, sample.weights), w1, b1, w2, b2)
    r = K.Routing.from_ids(sample.ids.to(device), sample.weights.to(device), e)
    return tuple(w.to(device) for w in (w1, b1, w2, b2)), x.to(device), r, ref


#: moe_mma configs TAIL is checked with: the 20b 16-token leader's (persistent, ticket, SPLITK2 slices of which
#: only the last holds the tail), a plain ring, and HALF's half-width build beside CHAIN
TAIL_CONFIGS = [
    {"BLOCK_M": 8, "ROWS": 2, "ROWS2": 1, "CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 4, "TILED": True,
     "RING_W": True, "NIB": True, "CHAIN": True, "EPI_EARLY": 2, "STEP_MAJOR": True, "ATOMIC": True, "SPLITK2": 2,
     "PERSIST1": 4, "MAXNREG": 128, "WAIT_LATE": 2, "TICKET1": True, "MAXNREG2": 80},
    {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True,
     "RING_W": True},
    {"BLOCK_M": 32, "ROWS": 2, "CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 2, "TILED": True,
     "RING_W": True, "NIB": True, "CHAIN": True, "HALF": True, "STEP_MAJOR": True},
]


def test_moe_mma_tail_rules_and_interpreter(device):
    """moe_mma's TAIL is the cp.async ring's half step (WGMMA, RING_W, CHUNKS=1, no TMA). Without a GPU it changes
    nothing: the interpreter's twin reads the zero-padded chunk in the 128-K order, so neither x nor act may be
    given in half_tail's order there (the bits of the config without it, within the bound)."""
    v, problem = K.VARIANTS["moe_mma"], {"op": "moe", "m": 64, "experts": 8, "top_k": 2, "n": 384, "k": 192}
    base = {**v.defaults, **TAIL_CONFIGS[1], "TAIL": True}
    assert v.reason(base, problem) is None
    assert "not with TMA" in v.reason({**base, "TMA": 2}, problem)
    assert "CHUNKS=1" in v.reason({**base, "CHUNKS": 2}, problem)
    assert "RING_W" in v.reason({**base, "RING_W": False}, problem)
    assert "only with WGMMA" in v.reason({**base, "WGMMA": False, "STAGES": 0, "RING_W": False}, problem)
    if device != "cpu":
        return  # compiled, TAIL runs: test_moe_mma_tail_matches_the_padded_chunk
    dw, x, r, ref = tail_layer(192, 192, 9, device)
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **TAIL_CONFIGS[1], TAIL=True)
    assert torch.equal(y, K.moe_mxfp4(x, r, *dw, variant="moe_mma", **TAIL_CONFIGS[1]))
    assert rel_err(y, ref) < TOL


def test_tail_half_of_an_expert_stack_is_each_experts(device):
    """tail_half over an expert stack [E, N, K]: expert e's groups follow expert e - 1's, each as tail_half of that
    expert's own 2-D weight (moe_mma's TAIL steps e * G groups into it)."""
    from kernels.prepare import tail_half

    w = K.quantize_mxfp4(torch.randn(3, 40, 192, generator=torch.Generator().manual_seed(4))).to(device)
    tw, ts = tail_half(K.tile_mxfp4(w))
    G = -(-40 // 16)
    assert tw.shape == (3 * G, 1, 128) and ts.shape == (1, 3 * G, 64)
    for e in range(3):
        one = K.MXFP4Tensor(w.blocks[e], w.scales[e], w.layout, w.shape[1:])
        ew, es = tail_half(K.tile_mxfp4(one))
        assert torch.equal(tw[e * G:(e + 1) * G], ew) and torch.equal(ts[:, e * G:(e + 1) * G], es)


def test_paired_descriptors_view_each_experts_gate_and_linear_halves(device):
    """tma_descriptors(paired=True) over mlp1's deinterleaved expert stack: 4-D views [2 E, G / 2, KC, 256] and
    [KC, 2 E, G / 2, 64] of the same memory, half 2 e + h of expert e being its gate (h = 0) or linear (h = 1)
    groups, with [2, NG / 2] boxes; anything but mlp1's deinterleaved copy at one chunk a step is refused. The
    views are checked with torch.as_strided on the descriptors' shapes and strides (no GPU needed for that)."""
    from kernels.linear_mma import gluon, tma_descriptors

    if gluon is None:
        pytest.skip("this Triton has no Gluon TensorDescriptor")
    w = K.quantize_mxfp4(torch.randn(3, 2 * 40, 384, generator=torch.Generator().manual_seed(5))).to(device)
    t = K.tile_mxfp4(w, deinterleave=True)
    G, KC = t.words.shape[-4], t.words.shape[-3]
    wd, sd = tma_descriptors(t, 4, 1, paired=True)
    assert list(wd.shape) == [6, G // 2, KC, 256] and list(wd.block_shape) == [2, 2, 1, 256]
    assert list(sd.shape) == [KC, 6, G // 2, 64] and list(sd.block_shape) == [1, 2, 2, 64]
    words = torch.as_strided(t.words, wd.shape, wd.strides)
    scales = torch.as_strided(t.scales, sd.shape, sd.strides)
    flat_w, flat_s = t.words.reshape(3, G, KC, 256), t.scales.reshape(3, G, KC, 64)
    for e in range(3):
        for h in range(2):
            for g in range(G // 2):
                assert torch.equal(words[2 * e + h, g], flat_w[e, h * (G // 2) + g])
                assert torch.equal(scales[:, 2 * e + h, g], flat_s[e, h * (G // 2) + g])
    with pytest.raises(ValueError, match="deinterleaved"):
        tma_descriptors(K.tile_mxfp4(w), 4, 1, paired=True)


@pytest.mark.gpu
@pytest.mark.parametrize("h,i", [(320, 192), (320, 256), (256, 192), (2880, 2880)])
@pytest.mark.parametrize("cfg", range(len(TAIL_CONFIGS)))
def test_moe_mma_tail_matches_the_padded_chunk(h, i, cfg):
    """TAIL runs each launch's half last chunk (mlp1's where H % 128 == 64, mlp2's where I % 128 == 64) as a half
    step where the config without it runs a whole padded step: the same products summed in another order (act
    rounded to fp16 in between), so the layers agree within 1% and both meet the reference bound. Under a CUDA
    graph replayed with fresh routing and x, so the tail's copies follow the replay's tiles."""
    dev = torch.device("cuda")
    dw, x, r, ref = tail_layer(h, i, 37, dev, seed=h + i)
    cfg = TAIL_CONFIGS[cfg]
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)
    assert rel_err(K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, TAIL=True), ref) < TOL
    logits = torch.randn(37, 4, device=dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yt = K.moe_mxfp4(x, K.route(logits, 2), *dw, variant="moe_mma", **cfg, TAIL=True)
    g = torch.Generator(device=dev).manual_seed(h)
    for rep in range(4):
        logits.copy_(torch.randn(37, 4, generator=g, device=dev))
        x.copy_(torch.randn(37, h, generator=g, device=dev).to(torch.bfloat16))
        graph.replay()
        y = K.moe_mxfp4(x, K.route(logits, 2), *dw, variant="moe_mma", **cfg)
        torch.cuda.synchronize()
        assert rel_err(yt, y.float().cpu()) < 1e-2, rep


def test_x_to_f16_zeroes_the_rows_it_is_given(device):
    """x_to_f16(zero=z) clears z [M, K] in its own launch, in each of its program shapes (one program a row, a
    row over several programs, rows gathered per sorted slot), and leaves its outputs as they were; a z of the
    wrong shape or type is refused."""
    from kernels.linear_f16 import x_to_f16

    g = torch.Generator().manual_seed(2)
    for M, K_ in ((3, 288), (5, 2880), (40, 160)):
        x = torch.randn(M, K_, generator=g).to(torch.bfloat16).to(device)
        want = x_to_f16(x, pad=128, logical=True)
        z = torch.full((M, K_), 7.0, dtype=torch.bfloat16, device=device)
        got = x_to_f16(x, pad=128, logical=True, zero=z)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert not z.any(), (M, K_)
        rows = torch.randperm(M * 2, generator=g).to(torch.int32).to(device)
        z.fill_(7.0)
        got = x_to_f16(x, pad=128, logical=True, rows=rows, top_k=2, zero=z)
        assert torch.equal(got[0], x_to_f16(x, pad=128, logical=True, rows=rows, top_k=2)[0])
        assert not z.any(), (M, K_, "rows")
    with pytest.raises(ValueError, match="zero must be"):
        x_to_f16(x, zero=torch.zeros(M, K_, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("opts", [{"TMA": 2}, {"CHAIN": True}, {"TMA": 2, "CHAIN": True},
                                  {"TMA": 2, "CHAIN": True, "HALF": True}, {"CHAIN": True, "STEP_MAJOR": True},
                                  {"TMA": 2, "CHAIN": True, "STEP_MAJOR": True},
                                  {"CHAIN": True, "ATOMIC": True}, {"TMA": 2, "CHAIN": True, "ATOMIC": True},
                                  {"CHAIN": True, "ATOMIC": True, "SPLITK2": 2},
                                  {"CHAIN": True, "PERSIST1": 4, "MAXNREG": 128},
                                  {"CHAIN": True, "PERSIST1": 4, "WAIT_LATE": True},
                                  {"CHAIN": True, "PERSIST1": 4, "WAIT_LATE": 2, "ATOMIC": True},
                                  {"TMA": 2, "CHAIN": True, "PERSIST1": 4, "WAIT_LATE": 2},
                                  {"TMA": 2, "CHAIN": True, "HALF": True, "PERSIST1": 3},
                                  {"CHAIN": True, "ATOMIC": True, "SPLITK2": 2, "PERSIST1": 4, "MAXNREG": 168},
                                  {"CHAIN": True, "PERSIST1": 4, "WAIT_LATE": 2, "TICKET1": True},
                                  {"CHAIN": True, "PERSIST1": 2, "TICKET1": True},
                                  {"CHAIN": True, "ATOMIC": True, "SPLITK2": 2, "PERSIST1": 4, "MAXNREG": 128,
                                   "MAXNREG2": 64, "WAIT_LATE": 2},
                                  {"CHAIN": True, "ATOMIC": True, "SPLITK2": 2, "PERSIST1": 4, "MAXNREG": 128,
                                   "WAIT_LATE": 2, "TICKET1": True},
                                  {"CHAIN": True, "HALF": True, "WAIT_LATE": 2},
                                  {"TMA": 2, "CHAIN": True, "WAIT_LATE": 2},
                                  {"CHAIN": True, "ATOMIC": True, "SPLITK2": 2, "WAIT_LATE": True},
                                  {"CHAIN": True, "SPLITK2": 2}, {"CHAIN": True, "HALF": True, "SPLITK2": 3},
                                  {"TMA": 2, "CHAIN": True, "HALF": True, "ABSORB": 8},
                                  {"TMA": 2, "CHAIN": True, "ABSORB": 8, "BLOCK_M": 32, "STAGES": 2},
                                  {"TMA": 2, "HALF": True, "BLOCK_M": 32, "MAXNREG": 128},
                                  {"TMA": 2, "CHAIN": True, "HALF": True, "ABSORB": 8, "BLOCK_M": 32, "STAGES": 2,
                                   "MAXNREG": 128},
                                  {"TMA": 2, "CHAIN": True, "HALF": True, "PAIRED": True},
                                  {"TMA": 2, "CHAIN": True, "HALF": True, "PAIRED": True, "NOBAR": True},
                                  {"TMA": 2, "CHAIN": True, "HALF": True, "ABSORB": 8, "BLOCK_M": 32, "STAGES": 2,
                                   "NOBAR": True},
                                  {"TMA": 2, "CHAIN": True, "PERSIST1": 4, "NOBAR": True},
                                  {"TMA": True, "NOBAR": True}])
def test_moe_mma_tma_under_graphs_with_new_routing(opts):
    """TMA=2 gathers mlp1's x rows per call (x_to_f16's rows=) and encodes its descriptors on the host; CHAIN's
    counters are sized by tile_slots: under a CUDA graph of route + layer, fresh logits and x before each of 10
    replays must give the eager call's bits (without the options), so the captured descriptors point at buffers
    the replays refill and every replay's tiles fit the grid, and PERSIST1's programs run each replay's tiles
    and no more (WAIT_LATE: and read x and its scales only after x_to_f16 wrote them; TICKET1: its counter back
    at zero for each replay; SPLITK2's output, whose shares round in bf16 in any order (ATOMIC) or are summed in
    fp32 (without it), within 1%; ABSORB: which tails are absorbed follows each replay's routing; NOBAR: the
    ring's barriers kernels.ring_sync drops were not needed, PERSIST1's item loop included)."""
    dev = torch.device("cuda")
    dw, x, _, _ = odd_layer(29, 37, 6, dev)
    g = torch.Generator(device=dev).manual_seed(3)
    logits = torch.randn(37, 4, device=dev)
    cfg = {"BLOCK_M": 16, "ROWS": 2, "CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True,
           "NIB": True, "RING_W": True, "EPI_EARLY": 1}
    K.moe_mxfp4(x, K.route(logits, 2), *dw, variant="moe_mma", **{**cfg, **opts})  # compile outside
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yt = K.moe_mxfp4(x, K.route(logits, 2), *dw, variant="moe_mma", **{**cfg, **opts})
    for rep in range(10):
        logits.copy_(torch.randn(37, 4, generator=g, device=dev))
        x.copy_(torch.randn(37, x.shape[1], generator=g, device=dev).to(torch.bfloat16))
        graph.replay()
        y = K.moe_mxfp4(x, K.route(logits, 2), *dw, variant="moe_mma", **cfg)
        torch.cuda.synchronize()
        if opts.get("SPLITK2"):
            assert rel_err(yt, y.float().cpu()) < 1e-2, rep
        else:
            assert torch.equal(yt, y), rep


@pytest.mark.parametrize("cfg", [
    {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 2, "PREFETCH": True, "num_warps": 2},
    {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 2, "num_warps": 4, "TILED": True, "STAGES": 3},
    {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 2, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True,
     "RING_W": True},
])
def test_moe_mma_shuffled_nibbles_is_bit_identical(cfg, device):
    """NIB decodes shuffle_nibbles' copies of w1 and w2 into the same fp16 weights the plain decode gives:
    the layer's output is bit-identical, K tails and partial tiles included; shuffled weights run only NIB."""
    dw, x, r, ref = odd_layer(7, 13, 3, device)
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)
    assert torch.equal(K.moe_mxfp4(x, r, *dw, variant="moe_mma", NIB=True, **cfg), y)
    assert rel_err(y, ref) < TOL
    if not cfg.get("TILED"):
        b1, b2, s1, s2 = dw[1], dw[3], K.shuffle_nibbles(dw[0]), K.shuffle_nibbles(dw[2])
        assert torch.equal(K.moe_mxfp4(x, r, s1, b1, s2, b2, variant="moe_mma", NIB=True, **cfg), y)
        with pytest.raises(ValueError, match="shuffle_nibbles' layout"):
            K.moe_mxfp4(x, r, s1, b1, s2, b2, variant="moe_mma", **cfg)


def test_moe_mma_register_rule():
    """Configs whose sm_90 builds spilled are refused with the reason; the default is admitted."""
    v = K.VARIANTS["moe_mma"]
    problem = {"op": "moe", "m": 64, "tokens": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason(v.defaults, problem) is None
    for spilled in ({"BLOCK_M": 64, "CHUNKS": 1}, {"BLOCK_M": 8, "ROWS": 2, "CHUNKS": 2, "PREFETCH": True},
                    {"BLOCK_M": 32, "ROWS": 2, "CHUNKS": 1, "PREFETCH": True}):
        assert "registers" in v.reason({**v.defaults, **spilled}, problem)


def test_moe_mma_wgmma_rule():
    """WGMMA needs whole warpgroups, 2 ring slots and builds that do not spill."""
    v = K.VARIANTS["moe_mma"]
    problem = {"op": "moe", "m": 64, "tokens": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    wg = {**v.defaults, "WGMMA": True, "STAGES": 3, "BLOCK_M": 128, "CHUNKS": 1, "num_warps": 8}
    assert v.reason(wg, problem) is None
    assert "warpgroups" in v.reason({**wg, "num_warps": 2}, problem)
    assert "2 slots" in v.reason({**wg, "STAGES": 1}, problem)
    assert "spill" in v.reason({**wg, "BLOCK_M": 256}, problem)  # 128 accumulators spilled on sm_90
    assert "needs TILED" in v.reason({**wg, "RING_W": True}, problem)
    assert v.reason({**wg, "RING_W": True, "TILED": True}, problem) is None
    assert "shared memory" in v.reason({**wg, "RING_W": True, "TILED": True, "STAGES": 7}, problem)
    assert "only with WGMMA" in v.reason({**v.defaults, "RING_W": True}, problem)


def test_moe_mma_ring_rule():
    """The shared-memory ring needs 2+ slots, excludes PREFETCH and must fit in an sm_90 program's 227 KiB."""
    v = K.VARIANTS["moe_mma"]
    problem = {"op": "moe", "m": 64, "tokens": 64, "experts": 8, "top_k": 2, "n": 192, "k": 64}
    assert v.reason({**v.defaults, "STAGES": 4}, problem) is None
    assert "at least 2" in v.reason({**v.defaults, "STAGES": 1}, problem)
    assert "exclude" in v.reason({**v.defaults, "STAGES": 2, "PREFETCH": True}, problem)
    # CHUNKS=2: 6 slots of (2 * 128 rows * 128 B + 16 tokens * 512 B) = 240 KiB
    big = {**v.defaults, "BLOCK_M": 32, "ROWS": 2, "CHUNKS": 1, "num_warps": 4, "STAGES": 6}
    assert "shared memory" in v.reason({**big, "CHUNKS": 2, "BLOCK_M": 16}, problem)
    assert v.reason({**big, "STAGES": 3}, problem) is None


@pytest.mark.parametrize("cfg", [
    {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "F16": True},
    {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "F16": True, "num_stages": 2},
    {"BLOCK_M": 256, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 8, "F16": True},
])
def test_moe_tc_f16_several_k_steps_a_tail_and_tiles_past_the_tokens(cfg, device):
    """moe_tc's F16 path: fp16 weights decoded in x_to_f16's word-major order against x_to_f16 rows and mlp1's
    fp16 act. H=288 and I=160 give K loops of whole steps plus a masked tail (mlp2's K=160 too), I=160 is not a
    multiple of BLOCK_N, and a 256-token tile holds far more rows than any expert has. It must agree with the
    reference and with the bf16 path."""
    dw, x, r, ref = odd_layer(12, 21, 5, device)
    y = K.moe_mxfp4(x, r, *dw, variant="moe_tc", **cfg)
    assert rel_err(y, ref) < TOL
    bf16 = K.moe_mxfp4(x, r, *dw, variant="moe_tc", **{**cfg, "F16": False})
    assert rel_err(y, bf16.float().cpu()) < TOL


def test_moe_tc_numerics_rules():
    """bf16 weights are exact for scale bytes 14..240, F16's fp16 weights for any 24-binade span."""
    v = K.VARIANTS["moe_tc"]
    base = {"op": "moe", "m": 4096, "tokens": 4096, "experts": 8, "top_k": 2, "n": 192, "k": 64, "tiled": False}
    wide = {**base, "scale_min": 100, "scale_max": 130}  # 30 binades
    low = {**base, "scale_min": 2, "scale_max": 20}  # below the bf16 window, within 24 binades
    bf16, f16 = {**v.defaults, "F16": False}, {**v.defaults, "F16": True}
    assert v.reason(f16, wide) and not v.reason(bf16, wide)
    assert v.reason(bf16, low) and not v.reason(f16, low)


@pytest.mark.parametrize("cfg", [
    {"BLOCK_M": 2, "BLOCK_N": 32, "BLOCK_N2": 16, "BLOCK_K": 64, "num_warps": 1, "TILED": False,
     "PREFETCH": True},  # mlp2 K tail
    {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_N2": None, "BLOCK_K": 128, "num_warps": 2, "TILED": True},  # K < BLOCK_K
    {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_N2": 8, "BLOCK_K": 64, "num_warps": 1, "TILED": False, "PREFETCH": True,
     "NIB": True},  # on shuffle_nibbles' copies (4-row tiles on the GPU test: the interpreter takes minutes)
])
@pytest.mark.parametrize("x16_given", [False, True])
def test_moe_fused_is_moe_h2g_in_one_launch(cfg, x16_given, layer, device):
    """moe_fused runs moe_h2g's arithmetic as stages of one grid: the same bits, combined or not. Its counters
    go up by exactly one launch's share per call (every item signals, with work or without: BLOCK_M=2 under
    duplicate ids leaves positions idle), which is what lets the next call wait for (launch + 1) * share
    without any reset. The interpreter runs programs in ticket order, so this checks the arithmetic and the
    counting, not the waiting (the GPU tests and every benchmark's correctness check do that)."""
    from kernels import sync
    from kernels.linear_f16 import x_to_f16

    if device.type == "cpu" and cfg.get("NIB") and x16_given:
        pytest.skip("the interpreter takes a minute over NIB's 8-row tiles: x16 given is the other configs' case")
    w1, b1, w2, b2 = (w.to(device) for w in layer)
    t = 3
    sample = rgen.generate("duplicates(0.5)", t, E, TOPK, seed=9)
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16).to(device)
    r = K.Routing.from_ids(sample.ids.to(device), sample.weights.to(device), E)
    x16 = x_to_f16(x, planes=True) if x16_given else None
    h2g = {k: v for k, v in cfg.items() if k != "TILED"} | {"TILED": cfg["TILED"]}
    want = K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_h2g", **h2g)
    want_rows = K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_h2g", combine=False, **h2g).rows
    sync.SCRATCH.clear()
    calls = 2
    for _ in range(calls):
        assert torch.equal(K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_fused", x16=x16, **cfg), want)
    slots = K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_fused", x16=x16, combine=False, **cfg)
    assert isinstance(slots, K.MoESlots) and torch.equal(slots.rows, want_rows)
    assert torch.equal(slots.combine(), want)
    S = t * TOPK
    tiles1, tiles2 = -(-2 * I // cfg["BLOCK_N"]), -(-H // (cfg["BLOCK_N2"] or cfg["BLOCK_N"]))
    n_x = 0 if x16_given else t
    counters = sorted(sync.SCRATCH.values(), key=lambda c: -int(c[0]))
    assert len(counters) == 2  # combined and uncombined calls count on separate counters
    for c, n, combine in ((counters[0], calls, True), (counters[1], 1, False)):
        items = n_x + S * (tiles1 + tiles2) + (t * -(-H // 1024) if combine else 0)
        assert int(c[0]) == n * items
        assert int(c[1]) == n * n_x
        assert c[2:2 + S].tolist() == [n * tiles1] * S
        assert c[2 + S:].tolist() == [n * tiles2] * S


def test_moe_fused_counters_are_not_shared_by_calls_that_signal_differently():
    """Two calls with the same number of work items but different stages (x converted in the launch and no
    combine, or x16 given and the combine on) must not share counters: the x counter's share per launch differs."""
    from kernels.moe_fused import launch_shape

    a = launch_shape(4, 16, 2048, 1024, 16, 8, 1024, convert=True, combine=False)
    b = launch_shape(4, 16, 2048, 1024, 16, 8, 1024, convert=False, combine=True)
    assert a[0] == b[0] and a[1] != b[1]


@pytest.mark.gpu
def test_moe_fused_many_calls_in_a_row_on_the_gpu():
    """On the GPU moe_fused's stages do run at the same time and wait on each other: 60 calls queued without a
    sync (1 to 16 tokens, x16 given or not, combined or not), their counters counting on across calls, each
    give moe_h2g's bits. Thousands of programs per call, so mlp2 programs start while mlp1's still run; every
    other call in moe_h2g's one-token leader shape (4-row one-warp tiles, NIB, registers capped)."""
    from kernels.linear_f16 import x_to_f16

    e, h, i, k = 16, 1024, 1024, 4
    g = torch.Generator(device="cuda").manual_seed(11)
    w1 = K.quantize_mxfp4(torch.randn(e, 2 * i, h, device="cuda", generator=g) * 0.05)
    w2 = K.quantize_mxfp4(torch.randn(e, h, i, device="cuda", generator=g) * 0.05)
    b1, b2 = torch.randn(e, 2 * i, device="cuda") * 0.1, torch.randn(e, h, device="cuda") * 0.1
    cfgs = ({"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_N2": 8, "BLOCK_K": 512, "num_warps": 4},
            {"BLOCK_M": 1, "BLOCK_N": 4, "BLOCK_N2": 4, "BLOCK_K": 1024, "num_warps": 1, "PREFETCH": True,
             "NIB": True, "MAXNREG": 64})  # moe_h2g's one-token leader shape
    runs = []
    for n in range(60):
        cfg = cfgs[n % 2]
        t = 1 + n % 16
        x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        r = K.route(torch.randn(t, e, device="cuda"), k)
        x16 = x_to_f16(x, planes=True) if n % 3 == 0 else None
        combine = n % 5 != 0
        got = K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_fused", x16=x16, combine=combine, **cfg)
        runs.append((x, r, got if combine else got.rows, combine, cfg))
    for x, r, got, combine, cfg in runs:
        h2g = {k: v for k, v in cfg.items() if k != "MAXNREG"}  # a cap changes no bits (gemv_h2g's test)
        want = K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_h2g", combine=combine, **h2g)
        assert torch.equal(got, want if combine else want.rows)


def test_moe_split_k_slices_sum_to_moe_h2g_and_leave_the_scratch_clean(device):
    """moe_split adds each K slice's partial sums atomically (K=288 and K=160 in three and two 128-wide
    slices, K tails included) and the last slice of a tile runs moe_h2g's epilogue: within rounding of
    moe_h2g's result, and after each call its sums scratch is back to zeros and every tile's counter a
    multiple of its slices (what the next call relies on)."""
    from kernels import sync

    dw, x, r, ref = odd_layer(5, 3, 2, device)
    cfg = {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_N2": 32, "BLOCK_K": 128, "num_warps": 2}
    sync.SCRATCH.clear()
    want = K.moe_mxfp4(x, r, *dw, variant="moe_h2g", **cfg)
    for _ in range(2):
        y = K.moe_mxfp4(x, r, *dw, variant="moe_split", **cfg)
        assert rel_err(y, ref) < TOL
        assert (y.float() - want.float()).abs().max() <= 2e-2 * want.float().abs().max()
    sums = [b for k, b in sync.SCRATCH.items() if b.dtype == torch.float32]
    counts = [(k, b) for k, b in sync.SCRATCH.items() if b.dtype == torch.int64]
    assert len(sums) == 2 and all(not b.any() for b in sums)
    for key, c in counts:  # key: (device, n, dtype, "split", phase, S, N, K, grid (splits first), BLOCK_M, BLOCK_K)
        splits = key[8]
        assert c.any() and not (c % splits).any() and int(c.max()) == 2 * splits
    with pytest.raises(ValueError, match="tile_mxfp4's layout"):  # row-major weights only
        K.moe_mxfp4(x, r, K.tile_mxfp4(dw[0], deinterleave=True), dw[1], K.tile_mxfp4(dw[2]), dw[3],
                    variant="moe_split", **cfg)


@pytest.mark.gpu
def test_moe_split_many_calls_in_a_row_on_the_gpu():
    """On the GPU moe_split's K slices really do race to the counter: 40 calls queued without a sync (1 to 8
    tokens, 2880-wide layers, three 1024-wide slices per tile) each match moe_h2g to rounding, and the scratch
    sums are zeros again afterwards."""
    from kernels import sync

    e, h, i, k = 16, 2880, 2880, 4
    g = torch.Generator(device="cuda").manual_seed(13)
    w1 = K.quantize_mxfp4(torch.randn(e, 2 * i, h, device="cuda", generator=g) * 0.05)
    w2 = K.quantize_mxfp4(torch.randn(e, h, i, device="cuda", generator=g) * 0.05)
    b1, b2 = torch.randn(e, 2 * i, device="cuda") * 0.1, torch.randn(e, h, device="cuda") * 0.1
    runs = []
    for n in range(40):
        t = 1 + n % 8
        cfg = {"BLOCK_M": 1 + (n % 3 == 2), "BLOCK_N": 16, "BLOCK_K": 1024, "num_warps": 4}
        x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        r = K.route(torch.randn(t, e, device="cuda"), k)
        runs.append((x, r, cfg, K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_split", **cfg)))
    for x, r, cfg, got in runs:
        want = K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_h2g", **cfg).float()
        assert (got.float() - want).abs().max() <= 2e-2 * want.abs().max(), cfg
    torch.cuda.synchronize()
    assert all(not b.any() for b in sync.SCRATCH.values() if b.dtype == torch.float32)


@pytest.mark.parametrize("routing", ["uniform", "all_to_one", "duplicates(0.5)"])
@pytest.mark.parametrize("grouped", [True, False])
def test_torch_bf16_baseline_matches_reference(routing, grouped, layer, device):
    """The sweeps' bf16 baseline (labkit.bench_moe.TorchBf16MoE: biases as GEMM columns, gates folded into mlp2's
    rows, SwiGLU in one pass, the lab's combine) is the same layer, through torch._grouped_mm and the per-expert
    loop alike, including experts with no tokens and a token sent to one expert twice."""
    from labkit.bench_moe import TorchBf16MoE

    base = TorchBf16MoE(*[w.to(device) for w in layer])
    if not grouped:
        base.grouped = False
    elif not base.grouped:
        pytest.skip("this torch build has no working torch._grouped_mm (the loop is tested)")
    for tokens in (1, 17):
        sample = rgen.generate(routing, tokens, E, TOPK, seed=tokens)
        x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
        ref = K.reference_moe(x.float(), (sample.ids, sample.weights), *layer)
        r = K.Routing.from_ids(sample.ids.to(device), sample.weights.to(device), E)
        y = base(x.to(device), r)
        assert y.shape == (tokens, H) and y.dtype == torch.bfloat16
        assert rel_err(y, ref) < TOL, (routing, tokens)


def test_swiglu_rows_scales_by_the_gate_and_appends_it(device):
    """kernels.moe.swiglu_rows: gate * GPT-OSS SwiGLU of the interleaved columns (clamps included), the gate in
    column I, zeros after it."""
    from kernels.moe import swiglu_rows

    g = torch.Generator().manual_seed(1)
    h = (torch.randn(5, 2 * I, generator=g) * 6).to(torch.bfloat16)  # past the +-7 clamps
    gates = torch.rand(5, generator=g)
    a = swiglu_rows(h.to(device), gates.to(device), I + 8).float().cpu()
    want = K.swiglu_gptoss(h.float()) * gates[:, None]
    assert torch.allclose(a[:, :I], want, rtol=1e-2, atol=1e-3)
    assert torch.allclose(a[:, I], gates, rtol=2**-7, atol=0)  # one bf16 step (the interpreter truncates)
    assert not a[:, I + 1:].any()
    with pytest.raises(ValueError, match="kp must exceed"):
        swiglu_rows(h.to(device), gates.to(device), I)
