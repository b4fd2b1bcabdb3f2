"""Bytes, flops and floors: small cases counted by hand, DESIGN.md's sanity values, whole-model steps."""

import math

import numpy as np
import pytest
import torch

from labkit import gptoss_config as gc
from labkit import roofline as rl
from labkit.hardware import Ceilings, datasheet_ceilings, get_gpu

#: DESIGN.md "Where numbers stand": H100 measured ceilings
H100 = Ceilings(read_gbps=3000.0, bf16_tflops=679.0, source="measured")
GB10 = datasheet_ceilings(get_gpu("gb10"))
TINY = gc.GptOssConfig("tiny", layers=2, experts=4, top_k=2, hidden=32, intermediate=32, q_heads=4, kv_heads=2,
                       head_dim=8, vocab=64, sliding_window=4)


# ---- counted by hand ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, expected", [
    ("bf16", 4 * 64 * 2),            # 512
    ("fp8", 4 * 64),                 # 256
    ("mxfp4", 4 * 64 / 2 + 4 * 2),   # 128 nibble bytes + 2 scale bytes per row: 136
    ("nvfp4", 128 + 4 * 4 + 4),      # + 4 E4M3 scales per row + one fp32: 148
])
def test_weight_bytes_by_hand(fmt, expected):
    assert rl.weight_bytes(4, 64, fmt) == expected


def test_weight_bytes_rejects_bad_input():
    with pytest.raises(ValueError, match="k must be a multiple of 32 for mxfp4"):
        rl.weight_bytes(4, 48, "mxfp4")
    with pytest.raises(ValueError, match="k must be a multiple of 16 for nvfp4"):
        rl.weight_bytes(4, 40, "nvfp4")
    with pytest.raises(ValueError, match="weight format must be one of bf16, fp8, mxfp4, nvfp4"):
        rl.weight_bytes(4, 64, "int4")
    with pytest.raises(ValueError, match="n must be a non-negative integer"):
        rl.weight_bytes(-1, 64, "bf16")


def test_linear_cost_by_hand():
    # mxfp4 weights 136 + x 2x64 bf16 (256) + y 2x4 bf16 (16) + bias 4 bf16 (8)
    c = rl.linear_cost(2, 4, 64, weight="mxfp4", bias=True)
    assert (c.bytes, c.flops) == (136 + 256 + 16 + 8, 2 * 2 * 4 * 64)
    assert rl.linear_cost(2, 4, 64, weight="mxfp4", act="fp8").bytes == 136 + 128 + 16
    assert rl.linear_cost(2, 4, 64, weight="bf16", out="fp32").bytes == 512 + 256 + 32
    with pytest.raises(ValueError, match="act must be one of bf16, fp8"):
        rl.linear_cost(2, 4, 64, act="fp32")


def test_expected_active_experts():
    assert rl.expected_active_experts(1, 128, 4) == pytest.approx(4)
    assert rl.expected_active_experts(0, 128, 4) == 0
    assert rl.expected_active_experts(2, 4, 2) == pytest.approx(3)       # 4 * (1 - (1/2)^2)
    assert rl.expected_active_experts(100_000, 128, 4) == pytest.approx(128)
    with pytest.raises(ValueError, match="top_k must be in 1..experts"):
        rl.expected_active_experts(1, 4, 5)


def test_moe_cost_by_hand():
    # 2 tokens, 4 experts, top-2, H = I = 32, bf16 weights, ids touch experts 0, 1, 3
    per_expert = 64 * 32 * 2 + 32 * 32 * 2 + (64 + 32) * 2        # w1, w2, biases: 6336
    expected = 3 * per_expert + 2 * 32 * 2 + 2 * 32 * 2             # + activations read + outputs written
    flops = 2 * 2 * (2 * 32 * 64 + 2 * 32 * 32)
    ids = [[0, 1], [1, 3]]
    for given in (ids, torch.tensor(ids), np.array(ids)):
        c = rl.moe_cost(2, 4, 2, 32, 32, weight="bf16", expert_ids=given)
        assert (c.bytes, c.flops) == (expected, flops)
    assert rl.moe_cost(2, 4, 2, 32, 32, weight="bf16", active_experts=3).bytes == expected
    # uniform expectation: 3 experts for 2 tokens of top-2 over 4
    assert rl.moe_cost(2, 4, 2, 32, 32, weight="bf16").bytes == pytest.approx(expected)
    assert rl.moe_cost(2, 4, 2, 32, 32, weight="bf16", bias=False, active_experts=1).bytes == 6336 - 192 + 256


def test_moe_cost_rejects_bad_routing():
    with pytest.raises(ValueError, match=r"expert_ids must be in 0..3, got \[4\]"):
        rl.moe_cost(2, 4, 2, 32, 32, expert_ids=[0, 4])
    with pytest.raises(ValueError, match="not both"):
        rl.moe_cost(2, 4, 2, 32, 32, expert_ids=[0], active_experts=1)
    with pytest.raises(ValueError, match="active_experts must be in 0..experts"):
        rl.moe_cost(2, 4, 2, 32, 32, active_experts=5)


def test_gpt_oss_expert_bytes():
    # w1 [5760, 2880] and w2 [2880, 2880] at 4.25 bits, bf16 biases: DESIGN.md's "≈ 13.2 MB" per expert
    per_expert = rl.moe_cost(1, 128, 4, 2880, 2880, active_experts=1).bytes - 2 * 2880 * 2
    assert per_expert == 5760 * 2880 * 17 / 32 + 2880 * 2880 * 17 / 32 + (5760 + 2880) * 2 == 13_236_480


def test_causal_pairs_and_windows():
    assert rl.causal_pairs(4) == 10
    assert rl.causal_pairs(4, window=2) == 1 + 2 + 2 + 2
    assert rl.causal_pairs(3, window=8) == 6
    assert rl.attended_keys(4096, 128) == 128 and rl.attended_keys(100) == 100


def test_attention_core_by_hand():
    kv_row, qo_row, sinks = 2 * 2 * 8 * 2, 2 * 32 * 2, 4 * 2     # K+V of a token, q read + o written, sinks
    c = rl.attention_core_cost(TINY, batch=1, context=10)
    assert (c.bytes, c.flops) == (10 * kv_row + kv_row + qo_row + sinks, 4 * 8 * 4 * 10)
    c = rl.attention_core_cost(TINY, batch=3, context=10, window=4)
    assert (c.bytes, c.flops) == (3 * (4 * kv_row + kv_row + qo_row) + sinks, 3 * 4 * 8 * 4 * 4)
    assert rl.attention_core_cost(TINY, batch=1, context=10, kv_dtype="fp8").bytes == 10 * 32 + 32 + qo_row + sinks
    c = rl.attention_core_cost(TINY, batch=1, context=5, phase="prefill")
    assert (c.bytes, c.flops) == (5 * (2 * kv_row + qo_row) + sinks, 4 * 8 * 4 * 15)
    with pytest.raises(ValueError, match="kv_dtype must be one of bf16, fp8"):
        rl.attention_core_cost(TINY, batch=1, context=5, kv_dtype="int8")


def test_cost_arithmetic_and_intensity():
    a, b = rl.Cost(10, 20), rl.Cost(30, 40)
    assert a + b == rl.Cost(40, 60) and sum([a, b]) == rl.Cost(40, 60) and 2 * a == rl.Cost(20, 40)
    assert a.intensity() == 2 and rl.Cost(0, 5).intensity() == math.inf and rl.ZERO.intensity() == 0


# ---- floors, the roofline, measured points ---------------------------------------------------------------

def test_floor_ridge_and_attainable():
    assert rl.floor_us(rl.Cost(3e6, 0), H100) == pytest.approx(1.0)          # 3 MB at 3 TB/s
    assert rl.floor_us(rl.Cost(1, 679e6), H100) == pytest.approx(1.0)        # 679 MFLOP at 679 TFLOP/s
    assert rl.ridge_point(H100) == pytest.approx(679e12 / 3e12)
    assert rl.attainable_tflops(1.0, H100) == pytest.approx(3.0)
    assert rl.attainable_tflops(1e4, H100) == 679.0
    assert rl.bound(rl.Cost(1, 10), H100) == "memory" and rl.bound(rl.Cost(1, 1e4), H100) == "compute"


def test_frac_of_floor():
    point = {"bytes": 3e6, "flops": 0.0, "us_graph": 2.0, "status": "ok"}
    assert rl.frac_of_floor(point, H100) == pytest.approx(0.5)
    assert rl.frac_of_floor({**point, "status": "incorrect"}, H100) is None
    assert rl.frac_of_floor({**point, "us_graph": float("nan")}, H100) is None
    assert rl.frac_of_floor({**point, "us_graph": 0}, H100) is None
    assert rl.frac_of_floor({"us_graph": 2.0}, H100) is None
    assert rl.frac_of_floor({"bytes": 3e6, "flops": 0, "us_graph": 1.0}, H100) == pytest.approx(1.0)  # no status


@pytest.mark.parametrize("m, floor", [(1, 103), (4, 103), (16, 105), (64, 111)])
def test_lm_head_floor_matches_design(m, floor):
    """DESIGN.md: lm_head 201088x2880 MXFP4 on H100 (3.0 TB/s, 679 TFLOP/s)."""
    assert rl.floor_us(rl.linear_cost(m, 201088, 2880, weight="mxfp4"), H100) == pytest.approx(floor, abs=0.6)


@pytest.mark.parametrize("tokens, active, floor", [
    (1, None, 17.7),     # 4 experts x 13.2 MB
    (8, 26, 115),        # DESIGN's 115 us is 26 distinct experts (a sampled routing; uniform expectation 28.7)
    (64, None, 491),
    (4096, None, 1201),  # flops-bound
])
def test_moe_floor_matches_design(tokens, active, floor):
    c = rl.moe_cost(tokens, 128, 4, 2880, 2880, active_experts=active)
    assert rl.floor_us(c, H100) == pytest.approx(floor, rel=0.005)


def test_lm_head_sanity_values():
    bf16, mx = rl.weight_bytes(201088, 2880, "bf16"), rl.weight_bytes(201088, 2880, "mxfp4")
    assert bf16 / 1e9 == pytest.approx(1.16, abs=0.005)
    assert mx / 1e9 == pytest.approx(0.31, abs=0.005)           # 0.29 GB of nibbles + 0.018 GB of scales
    for mxfp4, ms in ((False, 4.24), (True, 1.13)):              # GB10, 273 GB/s, per decoded token
        est = rl.model_step("gpt-oss-120b", batch=1, context=4096, mxfp4_lm_head=mxfp4, ceilings=GB10)
        assert est.component_floor_us["lm_head"] / 1e3 == pytest.approx(ms, abs=0.01)


def test_floor_curve():
    df = rl.floor_curve(lambda t: rl.moe_cost(t, 128, 4, 2880, 2880), [1, 8, 64, 4096], H100)
    assert list(df.columns) == ["tokens", "bytes", "flops", "floor_us", "bound"]
    assert df["floor_us"].is_monotonic_increasing and list(df["bound"]) == ["memory"] * 3 + ["compute"]


# ---- whole model -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, published", [("gpt-oss-120b", 5.1e9), ("gpt-oss-20b", 3.6e9)])
def test_active_params_match_the_model_card(name, published):
    cfg = gc.get_model(name)
    assert gc.active_params(cfg) == pytest.approx(published, rel=0.02)
    assert gc.active_params(cfg) == pytest.approx(cfg.published_active, rel=0.002)
    assert gc.total_params(cfg) == pytest.approx(cfg.published_total, rel=0.002)


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-20b"])
def test_decode_step_reads_the_active_weights(name):
    """A batch-1 decode step with a 1-token context reads the active parameters once (and little else)."""
    cfg = gc.get_model(name)
    p = gc.param_counts(cfg)
    expert_mxfp4 = rl.moe_cost(1, cfg.experts, cfg.top_k, cfg.hidden, cfg.intermediate, active_experts=1).bytes \
        - 2 * cfg.hidden * 2
    weights = 2 * (p["attention"] + p["router"] + p["norms"] + p["lm_head"]) \
        + cfg.layers * cfg.top_k * expert_mxfp4
    est = rl.model_step(name, batch=1, context=1, ceilings=H100)
    assert est.bytes_per_step == pytest.approx(weights, rel=0.001)
    assert est.bytes_per_step > weights


def test_model_step_structure():
    est = rl.model_step("gpt-oss-120b", batch=1, context=4096, ceilings=H100)
    assert list(est.components) == list(rl.COMPONENTS)
    assert est.total == sum(est.components.values())
    total = est.total
    assert est.floor_ms * 1e3 >= rl.floor_us(total, H100) - 1e-9     # sum of op floors >= floor of the sum
    assert est.tokens_per_s == pytest.approx(1e3 / est.floor_ms)
    assert est.bytes_per_token == est.bytes_per_step
    assert est.component_floor_us["norms"] < 0.01 * est.component_floor_us["moe"]
    d = est.as_dict()
    assert {"bytes_per_token", "floor_ms", "tokens_per_s", "components"} <= set(d)
    assert set(d["components"]["moe"]) == {"bytes", "flops", "floor_ms"}


def test_model_step_switches():
    base = rl.model_step("gpt-oss-120b", batch=1, context=4096, ceilings=H100)
    mx = rl.model_step("gpt-oss-120b", batch=1, context=4096, mxfp4_lm_head=True, ceilings=H100)
    assert {n for n in base.components if base.components[n] != mx.components[n]} == {"lm_head"}
    fp8 = rl.model_step("gpt-oss-120b", batch=1, context=4096, kv_dtype="fp8", ceilings=H100)
    # K and V rows (2 x 8 heads x 64) one byte smaller each: 4096 keys read on 18 full layers, 128 on 18
    # sliding ones, plus the new token's row appended on every layer
    kv_bytes = 18 * (4096 + 1) * 1024 + 18 * (128 + 1) * 1024
    assert base.components["attention"].bytes - fp8.components["attention"].bytes == kv_bytes
    b8 = rl.model_step("gpt-oss-120b", batch=8, context=4096, ceilings=H100)
    assert b8.tokens_per_step == 8 and b8.tokens_per_s > base.tokens_per_s
    assert b8.components["moe"].bytes > 5 * base.components["moe"].bytes          # ~28.7 experts vs 4 per layer
    pre = rl.model_step("gpt-oss-20b", batch=2, context=1024, phase="prefill", ceilings=H100)
    assert pre.tokens_per_step == 2048 and pre.bytes_per_token == pre.bytes_per_step / 2048
    assert pre.components["lm_head"] == rl.linear_cost(2, 201088, 2880, weight="bf16")   # last positions only


def test_model_step_errors():
    with pytest.raises(ValueError, match="unknown model 'gpt-oss-7b'; known models: gpt-oss-20b, gpt-oss-120b"):
        rl.model_step("gpt-oss-7b", batch=1, context=1, ceilings=H100)
    with pytest.raises(ValueError, match="phase must be one of decode, prefill"):
        rl.model_step("gpt-oss-20b", batch=1, context=1, phase="train", ceilings=H100)
    with pytest.raises(ValueError, match="batch and context must be at least 1"):
        rl.model_step("gpt-oss-20b", batch=0, context=1, ceilings=H100)
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        rl.model_step("gpt-oss-20b", batch=1, context=1, kv_dtype="fp4", ceilings=H100)


def test_tables():
    steps = rl.step_table("gpt-oss-120b", batch_sizes=[1, 8], context=4096, ceilings=H100)
    assert len(steps) == 4 and set(steps["lm_head"]) == {"bf16", "mxfp4"}
    gpus = rl.lm_head_across_gpus("gpt-oss-120b").set_index("gpu")
    assert gpus.loc["gb10", "lm_head_bf16_ms"] == pytest.approx(4.24, abs=0.01)
    assert (gpus["speedup"] > 1).all()
    est = {"bf16": rl.model_step("gpt-oss-20b", batch=1, context=128, ceilings=H100)}
    bd = rl.breakdown_table(est)
    assert list(bd["component"]) == list(rl.COMPONENTS) and bd["share"].sum() == pytest.approx(1.0)
    est["mxfp4"] = rl.model_step("gpt-oss-20b", batch=1, context=128, mxfp4_lm_head=True, ceilings=H100)
    wide = rl.breakdown_wide(est)
    assert list(wide.columns) == ["bf16", "mxfp4"] and list(wide.index) == list(rl.COMPONENTS)
    assert wide.loc["lm_head", "bf16"] > wide.loc["lm_head", "mxfp4"]


def test_gptoss_op_helpers():
    assert rl.gptoss_moe_cost("gpt-oss-120b", 64) == rl.moe_cost(64, 128, 4, 2880, 2880)
    assert rl.gptoss_moe_cost("gpt-oss-20b", 1).bytes == rl.moe_cost(1, 32, 4, 2880, 2880).bytes
    assert rl.gptoss_lm_head_cost("gpt-oss-120b", 1, weight="bf16") == rl.linear_cost(1, 201088, 2880, weight="bf16")
    ops = rl.reference_ops()
    assert rl.floor_us(ops["lm_head mxfp4 M=1"], H100) == pytest.approx(103, abs=0.6)
    assert rl.floor_us(ops["moe 4096 tok"], H100) == pytest.approx(1201, rel=0.005)
