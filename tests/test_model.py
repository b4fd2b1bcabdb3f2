"""The GPT-OSS model on the tiny preset (CPU, torch backends): math, cache, weights, backend seam."""

import dataclasses
import gc
import math
import weakref

import fake_kernels
import pytest
import torch

import kernels
from kernels import PreparedMXFP4, dequantize_mxfp4, prepare_mxfp4, reference_moe, tile_mxfp4
from labkit.model import Backends, DecodeRunner, GptOss, get_config, resolve_backends, synthetic_weights
from labkit.model.attention import kv_head_map
from labkit.model.moe import moe_torch, route_torch
from labkit.model.rope import apply_rope, yarn_frequencies
from labkit.model.weights import _tile_through_host, expert_rows, random_mxfp4, synthetic_scale_byte

CFG = get_config("tiny")


@pytest.fixture(scope="module")
def weights():
    return synthetic_weights(CFG, seed=0)


#: two layers (one sliding-window, one full): enough for the tests that run a whole model through the
#: interpreter's MoE and lm_head kernels, each layer of which costs seconds there
CFG2 = dataclasses.replace(CFG, layers=2)


@pytest.fixture(scope="module")
def weights2():
    return synthetic_weights(CFG2, seed=0)


@pytest.fixture(scope="module")
def model(weights):
    return GptOss(CFG, weights)


def tokens(b=2, t=12, seed=0):
    return torch.randint(0, CFG.vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------- config


def test_presets_match_published_shapes():
    for name, layers, experts in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)):
        c = get_config(name)
        assert (c.layers, c.experts, c.top_k, c.hidden, c.intermediate) == (layers, experts, 4, 2880, 2880)
        assert (c.q_heads, c.kv_heads, c.head_dim, c.vocab, c.sliding_window) == (64, 8, 64, 201088, 128)
        assert c.group == 8 and c.window(0) == 128 and c.window(1) == 0


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="model must be one of gpt-oss-20b, gpt-oss-120b, tiny"):
        get_config("gpt-oss-7b")
    with pytest.raises(ValueError, match="hidden=48 must be a multiple of 32"):
        get_config("tiny", hidden=48)
    with pytest.raises(ValueError, match="q_heads=8 must be a multiple of kv_heads=3"):
        get_config("tiny", kv_heads=3)
    with pytest.raises(ValueError, match="unknown fault.*nope.*known faults: gqa_mod"):
        get_config("tiny", faults={"nope"})
    with pytest.raises(ValueError, match="moe backend must be one of torch, torch-w4a8, triton"):
        Backends(moe="cuda")


# ---------------------------------------------------------------------------------------------------- weights


def test_synthetic_weights_are_deterministic_by_seed():
    a, b, c = (synthetic_weights(CFG.replace(layers=1), seed=s) for s in (1, 1, 2))
    assert torch.equal(a.layers[0].w1.blocks, b.layers[0].w1.blocks) and torch.equal(a.embedding, b.embedding)
    assert not torch.equal(a.layers[0].w1.blocks, c.layers[0].w1.blocks)


def test_synthetic_experts_have_unit_gain_at_full_size():
    assert synthetic_scale_byte(2880) == 119  # |w| ~ 0.02: 2^-8 * E2M1 values
    q = random_mxfp4((2, 64, 2880), seed=0, name="w", device="cpu")  # a slice of a full-size expert
    rms = dequantize_mxfp4(q).pow(2).mean().sqrt().item()
    assert 0.6 / math.sqrt(2880) < rms < 1.4 / math.sqrt(2880)
    assert set(q.scales.unique().tolist()) == {118, 119, 120}


def test_activations_stay_bounded_through_36_layers():
    cfg = CFG.replace(layers=36)
    m = GptOss(cfg, synthetic_weights(cfg, seed=1))
    rms = {}
    with m.add_hook(lambda layer, name, t: rms.__setitem__((layer, name), t.float().pow(2).mean().sqrt().item())):
        logits = m.forward(tokens(1, 16), m.new_cache(1, 16), all_logits=True)
    assert torch.isfinite(logits).all()
    resid = [rms[(i, "residual")] for i in range(36)]
    assert 0.5 < resid[0] and resid[-1] < 20, resid  # grows like sqrt(depth), no explosion
    assert all(0.05 < rms[(i, "moe")] < 5 for i in range(36))


# ---------------------------------------------------------------------------------------------------- math


def test_yarn_frequencies_follow_the_published_rule():
    inv, conc = yarn_frequencies(get_config("gpt-oss-120b"))
    assert conc == pytest.approx(0.1 * math.log(32) + 1)
    assert inv[0].item() == pytest.approx(1.0)  # highest frequency kept (extrapolated)
    assert inv[-1].item() == pytest.approx(1 / (32 * 150000 ** (62 / 64)), rel=1e-5)  # lowest interpolated
    assert torch.all(inv[1:] < inv[:-1])


def test_rope_half_split_is_relative():
    """q.k after RoPE depends only on the distance between positions; pairs are (i, i + d/2)."""
    cfg = CFG
    from labkit.model.rope import rope_tables

    cos, sin = rope_tables(cfg, 64, "cpu")
    q, k = torch.randn(2, 1, 1, cfg.head_dim, dtype=torch.float64).float().unbind(0)

    def dot(pq, pk):
        rq = apply_rope(q[None], cos[pq:pq + 1], sin[pq:pq + 1])
        rk = apply_rope(k[None], cos[pk:pk + 1], sin[pk:pk + 1])
        return (rq * rk).sum().item()

    assert dot(10, 3) == pytest.approx(dot(40, 33), rel=1e-4)
    x = torch.zeros(1, 1, 1, cfg.head_dim)
    x[..., 0] = 1.0  # dimension 0 rotates into dimension d/2 under the half split
    y = apply_rope(x, cos[5:6], sin[5:6])
    assert y[..., cfg.head_dim // 2].abs().item() > 0 and y[..., 1].item() == 0
    y = apply_rope(x, cos[5:6], sin[5:6], pairs="consecutive")
    assert y[..., 1].abs().item() > 0 and y[..., cfg.head_dim // 2].item() == 0


def test_gqa_maps_query_head_to_kv_head_by_division():
    assert kv_head_map(CFG).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert kv_head_map(CFG.with_faults("gqa_mod")).tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert kv_head_map(get_config("gpt-oss-20b")).tolist()[7:9] == [0, 1]


def test_torch_moe_equals_the_kernels_reference(weights):
    lw = weights.layers[1]
    x = torch.randn(7, CFG.hidden).bfloat16()
    logits = torch.randn(7, CFG.experts)
    r = route_torch(logits, CFG)
    ours = moe_torch(x, r, lw, CFG)
    ref = reference_moe(x, (r.ids, r.weights), lw.w1, lw.b1, lw.w2, lw.b2)
    assert torch.equal(ours, ref.bfloat16())


def test_sliding_window_and_full_layers():
    """Layer 0 (window 8) at position 12 cannot see token 0; layer 1 (full) can."""
    cfg = CFG.replace(layers=2)
    m = GptOss(cfg, synthetic_weights(cfg, seed=2))
    a, b = {}, {}
    for first, cap in ((3, a), (200, b)):
        t = tokens(1, 13)
        t[0, 0] = first
        with m.add_hook(lambda layer, name, v, cap=cap: cap.__setitem__((layer, name), v.clone())):
            m.forward(t, m.new_cache(1, 13), all_logits=True)
    assert torch.equal(a[(0, "attention")][0, 12], b[(0, "attention")][0, 12])
    assert not torch.equal(a[(0, "attention")][0, 7], b[(0, "attention")][0, 7])
    assert not torch.equal(a[(1, "attention")][0, 12], b[(1, "attention")][0, 12])


def test_sinks_take_attention_mass(weights):
    """Raising every sink logit shrinks every head's attention output toward zero."""
    import dataclasses

    big = dataclasses.replace(weights, layers=[dataclasses.replace(lw, sinks=lw.sinks + 20) for lw in weights.layers])
    cap = {}
    for name, w in (("base", weights), ("big", big)):
        m = GptOss(CFG, w)
        with m.add_hook(lambda layer, comp, v, name=name: cap.__setitem__((name, layer, comp), v.clone())):
            m.forward(tokens(1, 6), m.new_cache(1, 6), all_logits=True)
    out_b = big.layers[0].out_b.float()
    assert (cap[("big", 0, "attention")].float() - out_b).abs().max() < 1e-3
    assert (cap[("base", 0, "attention")].float() - out_b).abs().max() > 1e-2


# ---------------------------------------------------------------------------------------------------- cache


def test_incremental_decode_matches_full_prefill(model):
    t = tokens(2, 12)
    full = model.forward(t, model.new_cache(2, 16), all_logits=True)
    cache = model.new_cache(2, 16)
    model.prefill(t[:, :5], cache)
    steps = torch.stack([model.forward(t[:, i:i + 1], cache) for i in range(5, 12)], dim=1)
    torch.testing.assert_close(steps, full[:, 5:], atol=2e-2, rtol=0)
    assert cache.length == 12 and cache.pos.item() == 12


def test_batch_rows_are_independent(model):
    t = tokens(2, 10)
    both = model.generate(t, 5)
    one = model.generate(t[1:], 5)
    assert torch.equal(both[1:], one)


def test_cache_capacity_is_checked_on_the_host(model):
    cache = model.new_cache(1, 8)
    model.prefill(tokens(1, 6), cache)
    with pytest.raises(ValueError, match="KV cache full: 6 \\+ 3 positions exceed max_len=8"):
        model.prefill(tokens(1, 3), cache)


def test_decode_runner_eager_matches_generate(model):
    t = tokens(2, 8)
    expect = model.generate(t, 6)
    cache = model.new_cache(2, 16)
    first = model.prefill(t, cache).argmax(-1)
    runner = DecodeRunner(model, cache)
    assert not runner.use_graph
    got = runner.run(first, 5)
    assert torch.equal(torch.cat([first[:, None], got], 1), expect)


# ---------------------------------------------------------------------------------------------------- backends


def test_mxfp4_lm_head_torch_backend_is_close_to_bf16(weights):
    t = tokens(1, 8)
    ref = GptOss(CFG, weights).forward(t, GptOss(CFG, weights).new_cache(1, 8), all_logits=True)
    m = GptOss(CFG, weights, Backends(lm_head="mxfp4-torch", lm_head_rounding="even"))
    got = m.forward(t, m.new_cache(1, 8), all_logits=True)
    assert not torch.equal(got, ref)
    assert ((got - ref).norm() / ref.norm()).item() < 0.2


def test_w4a8_moe_backend_runs_and_differs_slightly(weights, device):
    weights = weights.to(device)  # the MXFP8 rounding is a Triton kernel: compiled ones need device tensors
    t = tokens(1, 8).to(device)
    ref = GptOss(CFG, weights).forward(t, GptOss(CFG, weights).new_cache(1, 8), all_logits=True)
    m = GptOss(CFG, weights, Backends(moe="torch-w4a8"))
    got = m.forward(t, m.new_cache(1, 8), all_logits=True)
    assert 0 < ((got - ref).norm() / ref.norm()).item() < 0.2  # 0.117 on the H100, less on the CPU


def test_torch_only_faults_are_refused_with_the_triton_moe(weights):
    with pytest.raises(ValueError, match="swiglu_no_plus1 live inside the fused MoE kernel"):
        GptOss(CFG.with_faults("swiglu_no_plus1"), weights, Backends(moe="triton"))


def test_triton_seam_calls_the_kernel_contract(weights, monkeypatch):
    """Stand-in kernels with the contract's signatures (reference math) receive exactly the model's tensors."""
    calls = fake_kernels.install(monkeypatch)
    t = tokens(1, 6)
    ref_model = GptOss(CFG, weights, Backends(moe="torch", lm_head="mxfp4-torch"))
    ref = ref_model.forward(t, ref_model.new_cache(1, 6))
    m = GptOss(CFG, weights, Backends(moe="triton", lm_head="mxfp4"))
    got = m.forward(t, m.new_cache(1, 6))
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    assert ("route", (6, CFG.experts), CFG.top_k) in calls
    assert ("moe_mxfp4", (6, CFG.hidden), (8, 128, 64), (8, 64, 64), 1.702, 7.0) in calls
    assert ("mxfp4_linear", (1, CFG.hidden), (CFG.vocab, CFG.hidden)) in calls
    assert len([c for c in calls if c[0] == "moe_mxfp4"]) == CFG.layers


@pytest.mark.parametrize("fused_rows", [16, 0])  # router_logits for every call, or for none
def test_triton_attention_backend_matches_torch_prefill_and_decode(weights, fused_rows, monkeypatch, device):
    """The fused residual kernels (add_rms_norm, router_logits) and the split-keys decode attention, through
    the interpreter, against the torch backend: prefill then two decode steps, layer 0's attention output,
    residual stream and router gates. Layer 0 only: deeper layers and the logits can differ by a top-k flip
    on a near tie (bf16 roundings in other places, and the interpreter truncates its casts: the decode
    steps' attention outputs land at 1.8-2.1% here, a dropped router bias at > 5%)."""
    monkeypatch.setattr("labkit.model.model.ROUTER_FUSED_MAX_ROWS", fused_rows)
    weights = weights.to(device)
    t = tokens(2, 8, seed=3).to(device)
    outs = []
    for attention in ("torch", "triton"):
        m = GptOss(CFG, weights, Backends(attention=attention))
        got = []
        m.add_hook(lambda layer, name, v, got=got: got.append(v.float()) if layer == 0 and name in (
            "attention", "router", "residual") else None)
        cache = m.new_cache(2, 12)
        m.prefill(t[:, :6], cache)
        m.forward(t[:, 6:7], cache)
        m.forward(t[:, 7:8], cache)
        outs.append(got)
    assert len(outs[1]) == 9
    errs = [((got - ref).norm() / ref.norm()).item() for ref, got in zip(*outs)]
    assert max(errs) < 3e-2, errs


def test_router_hands_the_moe_its_fp16_input(weights2, device):
    """With the triton attention and MoE backends, router_logits converts the MoE input to fp16 in its own
    launch (x16) and moe_mxfp4 uses it: the same output as the MoE converting it itself, at every layer."""
    m = GptOss(CFG2, weights2.to(device), Backends(attention="triton", moe="triton"))
    real, seen = m.moe._moe, []

    def checked(x, *args, x16=None, **kw):
        y = real(x, *args, x16=x16, **kw)
        seen.append(x16 is not None)
        assert torch.equal(y, real(x, *args, **kw))
        return y

    m.moe._moe = checked
    cache = m.new_cache(1, 6)
    m.prefill(tokens(1, 4, seed=5).to(device), cache)
    assert seen == [True] * CFG2.layers


def test_decode_step_combines_the_moe_inside_the_next_norm(weights2, device):
    """Decode with the triton attention and MoE backends leaves each MoE output uncombined (MoESlots) for
    the next norm to sum; with a hook on, every component output is materialised instead. Same logits."""
    m = GptOss(CFG2, weights2.to(device), Backends(attention="triton", moe="triton"))
    real, kinds = m.moe._moe, []
    m.moe._moe = lambda *a, **kw: kinds.append(type(y := real(*a, **kw)).__name__) or y
    prompt = tokens(1, 4, seed=6).to(device)
    outs = []
    for hooked in (False, True):
        cache = m.new_cache(1, 6)
        nxt = m.prefill(prompt, cache).argmax(-1)
        handle = m.add_hook(lambda *a: None) if hooked else None
        outs.append(m.decode_step(nxt, cache)[1])
        if handle:
            handle.remove()
    L = CFG2.layers
    assert kinds == ["Tensor"] * L + ["MoESlots"] * L + ["Tensor"] * 2 * L  # prefill, decode, hooked pair
    assert torch.equal(outs[0], outs[1])


def test_weights_move_between_devices(weights):
    moved = weights.to("cpu")
    assert moved is not weights and torch.equal(moved.layers[0].w1.blocks, weights.layers[0].w1.blocks)
    assert moved.nbytes() == weights.nbytes()


# ---------------------------------------------------------------------------------------------------- layout


def test_backends_layout_is_checked_and_labelled_only_when_tiled():
    with pytest.raises(ValueError, match="layout must be one of rows, tiled, rows\\+nib, tiled\\+nib, got 'cols'"):
        Backends(layout="cols")
    nib = Backends(moe="triton", lm_head="mxfp4", layout="tiled+nib")
    assert nib.label() == "moe=triton,lm_head=mxfp4/floor,layout=tiled+nib" and nib.reference().layout == "rows"
    rows, tiled = (Backends(moe="triton", lm_head="mxfp4", layout=v) for v in ("rows", "tiled"))
    assert rows == Backends(moe="triton", lm_head="mxfp4")  # rows is the default
    assert rows.label() == "moe=triton,lm_head=mxfp4/floor"  # existing run labels unchanged
    assert tiled.label() == "moe=triton,lm_head=mxfp4/floor,layout=tiled"
    assert tiled.reference() == rows.reference() and tiled.reference().layout == "rows"
    assert resolve_backends("triton", "mxfp4", device="cpu", layout="tiled") == tiled
    assert resolve_backends(device="cpu").layout == "rows"


def test_lm_head_layout_is_the_heads_own(weights2, device):
    """lm_head_layout holds the mxfp4 lm_head in a layout of its own (the fastest one-token lm_head config and
    the fastest one-token experts need not share one): checked, labelled only where it differs and a kernel
    reads it, the experts left in `layout`, and the head's logits those of the one-layout model's within the 1%
    accumulation-order allowance of the tiled test below."""
    from labkit.model.diverge import parse_variant

    with pytest.raises(ValueError, match="lm_head_layout must be one of rows, tiled, rows\\+nib, tiled\\+nib"):
        Backends(lm_head_layout="cols")
    both = Backends(moe="triton", lm_head="mxfp4", layout="rows+nib", lm_head_layout="tiled+nib")
    one = Backends(moe="triton", lm_head="mxfp4", layout="rows+nib")
    assert both.label() == "moe=triton,lm_head=mxfp4/floor,layout=rows+nib,lm_head_layout=tiled+nib"
    assert (both.head_layout, one.head_layout) == ("tiled+nib", "rows+nib") and both.reference() == one.reference()
    assert dataclasses.replace(one, lm_head_layout="rows+nib").label() == one.label()
    assert "lm_head_layout" not in Backends(lm_head="mxfp4-torch", lm_head_layout="tiled").label()
    assert resolve_backends("triton", "mxfp4", device="cpu", layout="rows+nib", lm_head_layout="tiled+nib") == both
    assert parse_variant("kernels,layout=rows+nib,lm_head_layout=tiled+nib").backends.head_layout == "tiled+nib"

    w = weights2.to(device)
    h = torch.randn(3, CFG2.hidden, generator=torch.Generator().manual_seed(7)).to(device, w.embedding.dtype)
    ref, m = (GptOss(CFG2, w, b) for b in (one, both))
    assert m.lm_head.q.tiled and m.lm_head.q.shuffled and not ref.lm_head.q.tiled
    assert all(not lw.w1.tiled and lw.w1.shuffled for lw in m.weights.layers)
    want, got = ref.lm_head(h).float(), m.lm_head(h).float()
    assert ((got - want).norm() / want.norm()).item() < 1e-2


def test_expert_rows_undoes_tile_mxfp4():
    """The torch MoE reads tiled experts through expert_rows: the exact row-major bytes back, with rows (40
    gate/linear pairs) and K (96) that both need tile_mxfp4's padding."""
    w = random_mxfp4((3, 80, 96), seed=0, name="w", device="cpu")
    for held in (tile_mxfp4(w, deinterleave=True), tile_mxfp4(w), prepare_mxfp4(w), w,
                 *(kernels.in_layout(w, f"{base}+nib", deinterleave=d) for base, d in
                   (("rows", False), ("tiled", True), ("tiled", False)))):
        for e in range(3):
            got = expert_rows(held, e)
            assert got.layout == "openai" and got.shape == (80, 96)
            assert torch.equal(got.blocks, w[e].blocks) and torch.equal(got.scales, w[e].scales)


def test_owned_weights_are_tiled_in_place_and_the_row_major_copy_freed(device):
    """A model that owns its weights (profile.load_model) ends up holding one copy of each expert weight: the
    row-major MXFP4Tensors (and the prepare/tile caches hanging off them) are unreferenced once it is built."""
    w = synthetic_weights(CFG, seed=0, device=device)
    old = [weakref.ref(getattr(lw, n)) for lw in w.layers for n in ("w1", "w2")]
    m = GptOss(CFG, w, Backends(moe="triton", lm_head="mxfp4", layout="tiled"), own_weights=True)
    gc.collect()
    assert m.weights is w and all(r() is None for r in old)
    assert all(lw.w1.tiled and lw.w1.deinterleaved and lw.w2.tiled for lw in m.weights.layers)
    assert m.lm_head.q.tiled and not hasattr(m.lm_head.q, "_prepared")
    assert m.weights.nbytes() > 0
    # the GPU's in-place route (through host memory), run here on the CPU: the same tiled bytes
    v, ref = synthetic_weights(CFG, seed=0), synthetic_weights(CFG, seed=0)
    _tile_through_host(v)
    for lv, lr in zip(v.layers, ref.layers):
        for got, want in ((lv.w1, tile_mxfp4(lr.w1, deinterleave=True)), (lv.w2, tile_mxfp4(lr.w2))):
            assert got.tiled and got.deinterleaved == want.deinterleaved
            assert torch.equal(got.words, want.words) and torch.equal(got.scales, want.scales)
    assert torch.equal(v.embedding, ref.embedding) and torch.equal(v.layers[1].b2, ref.layers[1].b2)


def test_owned_weights_take_the_nib_layouts(device):
    """Layouts rows+nib and tiled+nib hold shuffle_nibbles' copies of the (tiled) experts and lm_head weight; on
    a GPU (this test on the device) the model converts its own experts in place, shuffling one weight at a time,
    and the bytes read back through expert_rows are the row-major ones."""
    ref = synthetic_weights(CFG, seed=0, device=device)  # (a seed draws other bytes on a GPU than on a CPU)
    for layout in ("rows+nib", "tiled+nib"):
        m = GptOss(CFG, synthetic_weights(CFG, seed=0, device=device),
                   Backends(moe="triton", lm_head="mxfp4", layout=layout), own_weights=True)
        tiled = layout.startswith("tiled")
        assert all(lw.w1.shuffled and lw.w2.shuffled and lw.w1.tiled == tiled == lw.w1.deinterleaved
                   for lw in m.weights.layers)
        assert m.lm_head.q.shuffled and m.lm_head.q.tiled == tiled
        got = expert_rows(m.weights.layers[1].w1, 2)
        assert torch.equal(got.blocks, ref.layers[1].w1[2].blocks)


def test_tiled_layout_matches_rows_and_its_torch_reference(weights2, device):
    """layout tiled: the triton MoE's w1 (deinterleaved), w2 and the mxfp4 lm_head are held tiled, in the
    model's own layer objects (the shared weights keep their row-major experts for other models), and prefill
    and decode logits match the row-major model. The tiled model runs other kernel configs (the TILED auto
    tables) over the same bytes: only the fp32 accumulation order may differ, whose effect on bf16 outputs is
    a rounding step (~0.4%) here and there, so 1% relative error is allowed (bit-identical in the interpreter,
    but a GPU may pick split-K or other tile shapes). The profile's parity check against the torch reference,
    which shares the tiled experts, passes as it does for rows."""
    from labkit.model.profile import PARITY_LAYER0_TOL, _parity_check

    w = weights2.to(device)
    t = tokens(1, 3, seed=7).to(device)
    out = {}
    for layout in ("rows+nib", "rows", "tiled"):
        m = GptOss(CFG2, w, Backends(moe="triton", lm_head="mxfp4", layout=layout))
        cache = m.new_cache(1, 4)
        first = m.prefill(t, cache)
        out[layout] = (first, m.decode_step(first.argmax(-1), cache)[1])
        if layout == "rows+nib":  # NIB configs (auto's rows+nib tables), checked against the torch reference
            parity = _parity_check(m, m.backends.reference(), t)
            assert parity["layer0_max_rel_err"] <= PARITY_LAYER0_TOL and parity["top1_agree"] == 1.0
    assert all(isinstance(lw.w1, PreparedMXFP4) and lw.w1.tiled and lw.w1.deinterleaved and lw.w2.tiled
               and not lw.w2.deinterleaved for lw in m.weights.layers)
    assert isinstance(m.lm_head.q, PreparedMXFP4) and m.lm_head.q.tiled
    assert isinstance(w.layers[0].w1, kernels.MXFP4Tensor)  # the caller's weights are left row-major
    for layout in ("tiled", "rows+nib"):
        for ref, got in zip(out["rows"], out[layout]):
            assert ((got - ref).norm() / ref.norm()).item() < 1e-2, layout
    parity = _parity_check(m, m.backends.reference(), t)
    assert parity["layer0_max_rel_err"] <= PARITY_LAYER0_TOL and parity["top1_agree"] == 1.0
