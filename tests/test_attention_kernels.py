"""kernels.rms_norm, rope_kv_write and attention_sinks against the model's torch attention (tiny preset).

Tolerances: the interpreter's bf16 casts truncate instead of rounding (DESIGN deviations), so every bf16
intermediate (rotated q and k, P before the PV dot, the output) may be off by one bf16 ulp (2^-8 relative);
correct kernels land near 7e-3 norm-wise here, while a wrong head, position, window or sink gives > 5e-2.
"""

import pytest
import torch

import kernels as K
from kernels._triton import INTERPRETED
from labkit.model import get_config, synthetic_weights
from labkit.model.attention import attention, attention_kernels, kv_head_map
from labkit.model.cache import KVCache
from labkit.model.model import rms_norm as rms_norm_torch
from labkit.model.rope import apply_rope

CFG = get_config("tiny")
TOL = 2e-2


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def weights():
    return synthetic_weights(CFG, seed=0)


@pytest.fixture
def layer(weights, device):
    return weights.to(device).layers[0]


def test_rms_norm_matches_torch(device):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 5, 80, generator=g) * 4).to(torch.bfloat16).to(device)
    w = (torch.rand(80, generator=g) + 0.5).to(device)
    got = K.rms_norm(x, w, 1e-5)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    assert rel(got, rms_norm_torch(x, w, 1e-5)) < 1e-2
    with pytest.raises(ValueError, match=r"scale must have shape \(80,\)"):
        K.rms_norm(x, w[:10], 1e-5)


def test_add_rms_norm_is_the_residual_add_then_the_norm(device):
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(2, 3, 1500, generator=g) * 4).to(torch.bfloat16).to(device)  # H > one 1024 chunk
    r = (torch.randn(2, 3, 1500, generator=g) * 4).to(torch.bfloat16).to(device)
    w = (torch.rand(1500, generator=g) + 0.5).to(device)
    s, y = K.add_rms_norm(x, r, w, 1e-5)
    ref = x + r  # one bf16 rounding of the fp32 sum: exact compiled; within an ulp (truncation) interpreted
    ulp = ref.float().abs() / 128
    assert torch.equal(s, ref) if not INTERPRETED else ((s.float() - ref.float()).abs() <= ulp).all()
    assert rel(y, rms_norm_torch(x + r, w, 1e-5)) < 1e-2
    s0, y0 = K.add_rms_norm(x, None, w, 1e-5)
    assert s0 is x and rel(y0, rms_norm_torch(x, w, 1e-5)) < 1e-2 and rel(y0, y) > 0.1
    with pytest.raises(ValueError, match="residual must have x's shape"):
        K.add_rms_norm(x, r[:, :2], w, 1e-5)


@pytest.mark.parametrize("block_e", [1, 4, 16])
def test_router_logits_fuses_add_norm_and_router_linear(block_e, device):
    g = torch.Generator().manual_seed(5)
    H, E = 1500, 20  # E not a multiple of block_e
    x = (torch.randn(3, H, generator=g) * 4).to(torch.bfloat16).to(device)
    r = (torch.randn(3, H, generator=g) * 4).to(torch.bfloat16).to(device)
    w = (torch.rand(H, generator=g) + 0.5).to(device)
    gw = (torch.randn(E, H, generator=g) / 40).to(torch.bfloat16).to(device)
    gb = torch.randn(E, generator=g).to(torch.bfloat16).to(device)
    s, y, logits = K.router_logits(x, r, w, 1e-5, gw, gb, block_e=block_e)
    s_ref, y_ref = K.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(s, s_ref) and torch.equal(y, y_ref)
    ref = y_ref.float() @ gw.float().T + gb.float()
    assert logits.dtype == torch.bfloat16 and logits.shape == (3, E)
    assert rel(logits, ref) < 1e-2
    _, _, no_res = K.router_logits(x, None, w, 1e-5, gw, gb, block_e=block_e)
    assert rel(no_res, K.rms_norm(x, w, 1e-5).float() @ gw.float().T + gb.float()) < 1e-2
    with pytest.raises(ValueError, match=r"gate_w must be \[E, 1500\]"):
        K.router_logits(x, r, w, 1e-5, gw[:, :10], gb)
    with pytest.raises(ValueError, match="gate_b must have shape"):
        K.router_logits(x, r, w, 1e-5, gw, gb[:3])


@pytest.mark.parametrize("H", [64, 1504])  # planes wider than the row (64: 128 fp16), K/4 not a plane width
def test_router_logits_x16_matches_x_to_f16(H, device):
    """router_logits(x16=True) stores the normed rows exactly as x_to_f16(planes=True) would, padding
    included (the buffer starts as garbage, so a missed padding zero shows)."""
    from kernels.linear_f16 import x_to_f16

    g = torch.Generator().manual_seed(6)
    x = (torch.randn(2, H, generator=g) * 4).to(torch.bfloat16).to(device)
    x[1] = 0  # an all-zero row: scale 1
    r = (torch.randn(2, H, generator=g)).to(torch.bfloat16).to(device)
    w = (torch.rand(H, generator=g) + 0.5).to(device)
    gw = (torch.randn(8, H, generator=g) / 40).to(torch.bfloat16).to(device)
    gb = torch.randn(8, generator=g).to(torch.bfloat16).to(device)
    torch.empty(1 << 16, device=device).fill_(float("nan"))  # leave garbage where the next buffers may land
    s, y, logits, (xq, xs) = K.router_logits(x, r, w, 1e-5, gw, gb, x16=True)
    ref_q, ref_s = x_to_f16(y, planes=True)
    assert xq.shape == ref_q.shape and torch.equal(xq, ref_q) and torch.equal(xs, ref_s)
    assert torch.equal(logits, K.router_logits(x, r, w, 1e-5, gw, gb)[2])


@pytest.mark.parametrize("pairs", ["half", "consecutive"])
def test_rope_kv_write_rotates_and_fills_the_cache_at_positions(pairs, device):
    g = torch.Generator().manual_seed(1)
    B, T, HQ, HKV, D, S = 2, 5, 4, 2, 16, 12
    qkv = torch.randn(B, T, (HQ + 2 * HKV) * D, generator=g).to(torch.bfloat16).to(device)
    pos = torch.arange(3, 3 + T, device=device)
    cos, sin = torch.rand(S, D // 2, generator=g).to(device), torch.rand(S, D // 2, generator=g).to(device)
    kc = torch.zeros(B, S, HKV, D, dtype=torch.bfloat16, device=device)
    vc = torch.zeros_like(kc)
    q = K.rope_kv_write(qkv, pos, cos, sin, kc, vc, HQ, pairs=pairs)
    q_ref, k_ref, v_ref = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
    c, s = cos[pos], sin[pos]
    assert rel(q, apply_rope(q_ref.reshape(B, T, HQ, D), c, s, pairs=pairs)) < 1e-2
    assert rel(kc[:, 3:8], apply_rope(k_ref.reshape(B, T, HKV, D), c, s, pairs=pairs)) < 1e-2
    assert torch.equal(vc[:, 3:8], v_ref.reshape(B, T, HKV, D))
    assert not kc[:, :3].any() and not kc[:, 8:].any() and not vc[:, 8:].any()  # other slots untouched


@pytest.mark.parametrize("faults", [(), ("gqa_mod",), ("sinks_dropped",), ("rope_pairs",)])
@pytest.mark.parametrize("layer_index", [0, 1])  # sliding window (8) and full causal
def test_attention_kernels_match_torch_prefill_then_decode(layer, faults, layer_index, device):
    cfg = CFG.with_faults(*faults) if faults else CFG
    kv_map = kv_head_map(cfg).to(device)
    g = torch.Generator().manual_seed(2)
    caches = [KVCache.create(cfg, 2, 16, device) for _ in range(2)]
    for c in caches[1:]:  # stale garbage beyond the written positions must never be read
        c.k.fill_(float("nan"))
        c.v.fill_(float("nan"))
    for pos in (torch.arange(12), torch.tensor([12]), torch.tensor([13])):
        pos = pos.to(device)
        x = torch.randn(2, pos.numel(), CFG.hidden, generator=g).to(torch.bfloat16).to(device)
        ref = attention(x, layer, cfg, layer_index, caches[0], pos, kv_map)
        got = attention_kernels(x, layer, cfg, layer_index, caches[1], pos, kv_map)
        assert torch.isfinite(got).all()
        assert rel(got, ref) < TOL, (faults, layer_index, pos)


def test_window_and_sinks_change_the_output(device):
    """The tolerance above is tight enough to see the features the kernel implements."""
    g = torch.Generator().manual_seed(3)
    B, T, HQ, HKV, D, S = 1, 1, 4, 2, 16, 64
    q = torch.randn(B, T, HQ, D, generator=g).to(torch.bfloat16).to(device)
    kc = torch.randn(B, S, HKV, D, generator=g).to(torch.bfloat16).to(device)
    vc = torch.randn(B, S, HKV, D, generator=g).to(torch.bfloat16).to(device)
    pos, sinks = torch.tensor([40], device=device), torch.full((HQ,), 2.0, device=device)
    kv_map = torch.tensor([0, 0, 1, 1], device=device)
    base = K.attention_sinks(q, kc, vc, pos, kv_map, sinks)
    assert rel(K.attention_sinks(q, kc, vc, pos, kv_map, sinks, window=8), base) > 5e-2
    assert rel(K.attention_sinks(q, kc, vc, pos, kv_map, None), base) > 5e-2
    assert rel(K.attention_sinks(q, kc, vc, pos, torch.tensor([0, 1, 0, 1], device=device), sinks), base) > 5e-2


def _attention_torch(q, kc, vc, pos, kv_map, sinks, window):
    """fp32 reference of one query per sequence at position pos (attention_sinks' contract)."""
    S, D = kc.shape[1], q.shape[-1]
    k, v = kc[:, :, kv_map].float(), vc[:, :, kv_map].float()  # [B, S, HQ, D]
    sc = torch.einsum("bhd,bshd->bhs", q[:, 0].float(), k) / D ** 0.5
    key = torch.arange(S, device=q.device)
    ok = (key <= pos) & ((key > pos - window) if window else True)
    sc = sc.masked_fill(~ok, float("-inf"))
    if sinks is not None:
        sc = torch.cat((sc, sinks.float().view(1, -1, 1).expand(sc.shape[0], -1, 1)), dim=-1)
    p = torch.softmax(sc, dim=-1)[..., :S]
    return torch.einsum("bhs,bshd->bhd", p, v)[:, None]


@pytest.mark.parametrize("window", [0, 100])
@pytest.mark.parametrize("S,pos", [(300, 0), (300, 63), (300, 64), (300, 200), (300, 299), (4200, 130), (4200, 4100)])
def test_decode_attention_splits_keys_and_merges(S, pos, window, device):
    """One query per sequence runs the split-keys path: 300 slots give 5 splits of 64 (one block each), 4200
    give 33 of 128 (a loop of two blocks each); positions at split edges, windows that start inside a split,
    and splits wholly in the future or before the window."""
    assert K.attention.decode_split(300) == 64 and K.attention.decode_split(4200) == 128
    g = torch.Generator().manual_seed(6)
    B, HQ, HKV, D = 2, 4, 2, 16
    q = torch.randn(B, 1, HQ, D, generator=g).to(torch.bfloat16).to(device)
    kc = (torch.randn(B, S, HKV, D, generator=g) * 2).to(torch.bfloat16).to(device)
    vc = torch.randn(B, S, HKV, D, generator=g).to(torch.bfloat16).to(device)
    kc[:, pos + 1:] = float("nan")  # slots past the position are never read
    vc[:, pos + 1:] = float("nan")
    kv_map = torch.tensor([0, 0, 1, 1], device=device)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], device=device)
    p = torch.tensor([pos], device=device)
    for sk in (sinks, None):
        got = K.attention_sinks(q, kc, vc, p, kv_map, sk, window=window)
        ref = _attention_torch(q, kc.nan_to_num(), vc.nan_to_num(), pos, kv_map, sk, window)
        assert torch.isfinite(got).all() and rel(got, ref) < 1e-2


def test_attention_input_errors():
    q = torch.zeros(1, 1, 4, 16, dtype=torch.bfloat16)
    kc = torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)
    pos = torch.tensor([0])
    with pytest.raises(ValueError, match="kv_map must have one entry per query head"):
        K.attention_sinks(q, kc, kc, pos, torch.tensor([0, 1]), None)
    with pytest.raises(ValueError, match="sinks must have one entry per query head"):
        K.attention_sinks(q, kc, kc, pos, torch.tensor([0, 0, 1, 1]), torch.zeros(3))
    with pytest.raises(ValueError, match="do not match q"):
        K.attention_sinks(q, kc[..., :8], kc[..., :8], pos, torch.tensor([0, 0, 1, 1]), None)
    with pytest.raises(ValueError, match="pairs must be one of"):
        K.rope_kv_write(torch.zeros(1, 1, 128, dtype=torch.bfloat16), pos, torch.zeros(8, 8), torch.zeros(8, 8),
                        kc, kc, 4, pairs="interleaved")


@pytest.mark.parametrize("B,HQ,HKV,D,cases", [
    (2, 4, 2, 16, ((300, 250), (200, 150), (300, 64), (300, 299))),
    pytest.param(1, 64, 8, 64, ((576, 530), (576, 100)), marks=pytest.mark.gpu),  # gpt-oss at decode, 9 splits
])
def test_decode_merge_in_split_matches_the_merge_launch(B, HQ, HKV, D, cases, device, monkeypatch):
    """Each head's last split merging it gives the merge launch's output bit for bit, call after call, while
    calls of other split counts share the counters' scratch in between."""
    g = torch.Generator().manual_seed(7)
    kv_map = torch.arange(HQ, device=device) // (HQ // HKV)
    sinks = torch.randn(HQ, generator=g).to(device)
    for S, pos in cases:
        q = torch.randn(B, 1, HQ, D, generator=g).to(torch.bfloat16).to(device)
        kc = torch.randn(B, S, HKV, D, generator=g).to(torch.bfloat16).to(device)
        vc = torch.randn(B, S, HKV, D, generator=g).to(torch.bfloat16).to(device)
        p = torch.tensor([pos], device=device)
        got = {}
        for fused in (True, False):
            monkeypatch.setattr(K.attention, "MERGE_MAX_PROGRAMS", 1 << 30 if fused else 0)
            got[fused] = K.attention_sinks(q, kc, vc, p, kv_map, sinks)
        assert torch.equal(got[True], got[False]), (S, pos)


@pytest.mark.parametrize("pairs", ["half", "consecutive"])
@pytest.mark.parametrize("B,T,bias", [(1, 1, True), (3, 1, False), (1, 3, True)])
def test_qkv_rope_kv_write_is_the_gemv_then_rope_kv_write(pairs, B, T, bias, device):
    """The fused launch gives the same bits as gemv_bf16 (block_n=2, same K tile and warps) then rope_kv_write:
    q, and k and v in the cache at the positions, other slots untouched. K = 80 ends in a partial K tile."""
    from kernels.linear_bf16 import gemv_bf16
    g = torch.Generator().manual_seed(8)
    HQ, HKV, D, S, H = 4, 2, 16, 12, 80
    x = torch.randn(B, T, H, generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn((HQ + 2 * HKV) * D, H, generator=g) / 8).to(torch.bfloat16).to(device)
    b = torch.randn((HQ + 2 * HKV) * D, generator=g).to(torch.bfloat16).to(device) if bias else None
    pos = torch.arange(5, 5 + T, device=device)
    cos, sin = torch.rand(S, D // 2, generator=g).to(device), torch.rand(S, D // 2, generator=g).to(device)
    caches = [torch.full((B, S, HKV, D), 7.0, dtype=torch.bfloat16, device=device) for _ in range(4)]
    q = K.qkv_rope_kv_write(x, w, b, pos, cos, sin, caches[0], caches[1], HQ, pairs=pairs, block_k=32, num_warps=2)
    qkv = gemv_bf16(x, w, b, block_n=2, block_k=32, num_warps=2)
    q_ref = K.rope_kv_write(qkv, pos, cos, sin, caches[2], caches[3], HQ, pairs=pairs)
    assert torch.equal(q, q_ref)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert (caches[0][:, :5] == 7).all() and (caches[1][:, 5 + T:] == 7).all()


def test_qkv_rope_kv_write_errors(device):
    x = torch.zeros(1, 1, 32, dtype=torch.bfloat16, device=device)
    kc = torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16, device=device)
    pos, tab = torch.tensor([0], device=device), torch.zeros(8, 8, device=device)
    w = torch.zeros(128, 32, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"w must be \[128, 32\]"):
        K.qkv_rope_kv_write(x, w[:96], None, pos, tab, tab, kc, kc.clone(), 4)
    with pytest.raises(ValueError, match="at most 8 rows"):
        K.qkv_rope_kv_write(torch.zeros(3, 3, 32, dtype=torch.bfloat16, device=device), w, None, pos, tab, tab,
                            torch.zeros(3, 8, 2, 16, dtype=torch.bfloat16, device=device),
                            torch.zeros(3, 8, 2, 16, dtype=torch.bfloat16, device=device), 4)
    with pytest.raises(ValueError, match="pairs must be one of"):
        K.qkv_rope_kv_write(x, w, None, pos, tab, tab, kc, kc.clone(), 4, pairs="odd")
