"""Model instrumentation on the tiny preset: NVTX/profiler ranges, decode profile, parity, divergence finder."""

import dataclasses
import json

import fake_kernels
import pandas as pd
import pytest
import torch

from labkit.cli import main
from labkit.model import FAULTS, Backends, GptOss, get_config, nvtx_ranges, synthetic_weights
from labkit.model.diverge import (
    Capture,
    DivergenceReport,
    agreed_errors,
    capture,
    compare,
    diverge,
    divergence_chart,
    first_divergence,
    parse_variant,
    routing_agreement,
)
from labkit.model.parity import final_hidden, lm_head_chart, lm_head_study, logit_metrics, model_parity
from labkit.model.profile import by_component, component_breakdown, kernel_table, moe_verdict, profile_decode

CFG = get_config("tiny")


@pytest.fixture(scope="module")
def weights():
    return synthetic_weights(CFG, seed=0)


def toks(t=12):
    return torch.randint(0, CFG.vocab, (1, t), generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------------------------------- ranges


def test_ranges_cost_nothing_when_disabled():
    assert not nvtx_ranges.enabled()
    assert nvtx_ranges.rng("moe") is nvtx_ranges.rng("attention")  # one shared no-op context
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, nvtx_ranges.rng("moe"):
        torch.ones(4).sum()
    assert "moe" not in {e.name for e in prof.events()}


def test_ranges_reach_the_profiler_and_nvtx(weights):
    m = GptOss(CFG.replace(layers=2), synthetic_weights(CFG.replace(layers=2)))
    with nvtx_ranges.ranges(nvtx=True, profiler=True), \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        m.generate(toks(6), 2)
    names = {e.name for e in prof.events()}
    assert {"embedding", "layer.0", "layer.1", "attention", "router", "moe", "moe.mlp1", "moe.mlp2", "final_norm",
            "lm_head", "sampling"} <= names
    assert not nvtx_ranges.enabled()  # restored


def test_breakdown_charges_ops_to_the_innermost_component():
    with nvtx_ranges.ranges(nvtx=False), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        with nvtx_ranges.rng("layer.0"), nvtx_ranges.rng("moe"):
            with nvtx_ranges.rng("moe.mlp1"):
                torch.randn(64, 64) @ torch.randn(64, 64)
            torch.randn(8).sum()
        torch.randn(8).sum()
    df = component_breakdown(p.events(), steps=2)
    assert set(df["range"]) == {"moe", "moe.mlp1", "other"}
    comp = by_component(df).set_index("component")
    assert comp.loc["moe", "share"] + comp.loc["other", "share"] == pytest.approx(1.0)
    assert comp.loc["attention", "us"] == 0


def test_moe_verdict_follows_the_seeds_gate():
    assert moe_verdict(0.05).startswith("stop")
    assert moe_verdict(0.2).startswith("modest")
    assert moe_verdict(0.45).startswith("worthwhile")


# ---------------------------------------------------------------------------------------------------- profile


def test_profile_on_cpu_measures_and_breaks_down_decode():
    r = profile_decode("tiny", prompt=8, decode=3, profile_steps=2, device="cpu")  # also on a GPU machine
    assert not r.graph and r.device == "cpu" and r.backends == Backends(moe="torch", lm_head="mxfp4-torch")
    assert r.step_us > 0 and r.tok_s == pytest.approx(1e6 / r.step_us) and r.ttft_ms >= r.prefill_ms > 0
    comp = by_component(r.breakdown).set_index("component")
    assert comp["share"].sum() == pytest.approx(1.0)
    assert comp.loc["moe", "us"] > 0 and comp.loc["attention", "us"] > 0 and comp.loc["lm_head", "us"] > 0
    assert r.moe_share == pytest.approx(comp.loc["moe", "share"])
    assert len(r.generated) == 4 and r.roofline is None and r.status == "ok"
    assert r.parity is None and r.max_rel_err is None  # the torch reference itself: nothing to check


def test_profile_checks_kernel_backends_against_their_reference(monkeypatch):
    fake_kernels.install(monkeypatch)
    r = profile_decode("tiny", prompt=8, decode=2, profile_steps=1, moe="triton", lm_head="mxfp4", device="cpu")
    assert r.backends == Backends(moe="triton", lm_head="mxfp4", attention="torch") and not r.graph  # CPU: eager
    assert r.status == "ok" and r.max_rel_err < 0.05 and r.parity["top1_agree"] > 0.9
    assert r.point()["status"] == "ok" and r.point()["variant"] == "moe=triton,lm_head=mxfp4/floor"


def test_cli_profile_stores_a_decode_step_run(tmp_path, capsys):
    assert main(["model", "profile", "--model", "tiny", "--prompt", "8", "--decode", "4", "--device", "cpu", "--out",
                 str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "MoE share" in out and "tok/s" in out
    run = tmp_path / "run"
    pts = pd.read_parquet(run / "points.parquet")
    assert pts["op"].tolist() == ["decode_step"] and pts["status"].tolist() == ["ok"]
    assert pts["us_eager"].iloc[0] > 0 and pts["m"].iloc[0] == 1 and pts["experts"].iloc[0] == CFG.experts
    prof = json.loads((run / "profile.json").read_text())
    assert {r["component"] for r in prof["by_component"]} >= {"attention", "moe", "lm_head"}
    assert (run / "decode_breakdown.html").exists()
    assert json.loads((run / "meta.json").read_text())["finished"]


def test_cli_profile_layout_is_a_run_parameter(tmp_path, capsys):
    """--layout (and --lm-head-layout) reach the Backends, the run's parameters and its point's label (the head's
    only where a kernel reads it); with the torch backends (auto on a CPU) nothing reads the layout, so no
    parity check is run against an identical reference."""
    assert main(["model", "profile", "--model", "tiny", "--prompt", "4", "--decode", "2", "--profile-steps", "1",
                 "--layout", "tiled", "--lm-head-layout", "rows+nib", "--device", "cpu", "--out",
                 str(tmp_path / "run")]) == 0
    assert "layout=tiled" in capsys.readouterr().out
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["parameters"]["backends"]["layout"] == "tiled"
    assert meta["parameters"]["backends"]["lm_head_layout"] == "rows+nib"
    pts = pd.read_parquet(tmp_path / "run" / "points.parquet")
    assert pts["variant"].tolist() == ["moe=torch,lm_head=mxfp4-torch/floor,layout=tiled"]
    assert json.loads((tmp_path / "run" / "profile.json").read_text())["parity"] is None
    with pytest.raises(SystemExit):
        main(["model", "profile", "--layout", "cols"])
    assert "argument --layout: invalid choice: 'cols'" in capsys.readouterr().err


def test_cli_model_errors_exit_2(capsys):
    assert main(["model", "profile", "--decode", "0"]) == 2
    assert "labkit model profile: error: decode must be at least 1" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- parity


def test_logit_metrics():
    a = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    m = logit_metrics(a, a)
    assert m["top1_agree"] == 1 and m["kl"] == pytest.approx(0, abs=1e-12) and m["max_logit_err"] == 0
    b = torch.tensor([[0.0, 3.0, 2.0], [3.0, 0.0, 0.0]])
    m = logit_metrics(a, b)
    assert m["top1_agree"] == 0.5 and m["kl"] > 0 and m["max_logit_err"] == 2


def test_model_parity_reports_per_layer_errors(weights):
    ref = GptOss(CFG, weights)
    same = model_parity(ref, GptOss(CFG, weights), toks())
    assert same.logits["top1_agree"] == 1 and same.per_component["rel_err"].max() == 0
    w4a8 = model_parity(ref, GptOss(CFG, weights, Backends(moe="torch-w4a8")), toks())
    per_layer = w4a8.per_layer()
    assert list(per_layer.index) == [0, 1, 2, 3] and (per_layer["moe"] > 0).all()
    assert (per_layer["attention"].iloc[0] == 0)  # layer 0 attention runs before any MoE
    assert 0 < w4a8.logits["kl"] < 0.1


def test_routing_flips_are_counted_and_left_out_of_the_judged_errors():
    """A token whose top-k flips differs by O(1) in its gates and MoE rows in two correct models; the
    agreed-token errors leave it out, and each routed row counts it."""
    gates = torch.tensor([[0.6, 0.4, 0, 0], [0, 0.5, 0.5, 0], [0.7, 0, 0.3, 0], [0, 0, 0.2, 0.8]]).repeat(10, 1)
    flipped = gates.clone()
    flipped[2] = torch.tensor([0.7, 0, 0, 0.3])  # token 2 of 40: expert 3 instead of 2
    moe = torch.randn(1, 40, 3)
    moe_b = moe.clone()
    moe_b[0, 2] += 5.0
    mlp1 = torch.randn(40, 2, 5)
    mlp1_b = mlp1.clone()
    mlp1_b[2] = -mlp1_b[2]
    a = Capture({(0, "router"): gates, (0, "moe.mlp1"): mlp1, (0, "moe"): moe})
    b = Capture({(0, "router"): flipped, (0, "moe.mlp1"): mlp1_b, (0, "moe"): moe_b})
    t = agreed_errors(a, b, compare(a, b)).set_index("component")
    assert (t["rel_err"] > 0.05).all() and (t["rel_err_agreed"] == 0).all()  # over the finder's tol, 0 agreed
    assert (t["flipped"] == 1).all() and (t["flipped_share"] == 1 / 40).all()
    assert routing_agreement(a, b, 0).tolist() == [i != 2 for i in range(40)]
    assert routing_agreement(a, b, 1) is None

    def report():
        table = agreed_errors(a, b, compare(a, b))
        return DivergenceReport(parse_variant("ref"), parse_variant("kernels"), CFG, 0.05, table,
                                first_divergence(table, 0.05))

    # the divergence finder still names the flip, and says it is one near-tie token
    assert report().first["component"] == "router" and "1 token(s) took other experts" in report().summary()
    assert "near tie" in report().summary()
    b.outputs[(0, "router")][4:12] = gates[[6, 7, 4, 5, 6, 7, 4, 5]]  # 9 of 40 flipped (22%): not near ties
    assert "9 token(s) (22%) took other experts" in report().summary() and "near tie" not in report().summary()
    b.outputs[(0, "router")][4:12] = gates[4:12]
    b.outputs[(0, "router")][0] *= 2  # a gate off on a token routed alike: a real router error, no excuse
    assert report().first["component"] == "router" and "near tie" not in report().summary()


def test_profile_parity_judges_layer0_over_agreed_tokens(weights):
    """256 tokens through a model whose layer-0 attention output projection carries 1% noise (as a bf16
    kernel against the fp32 reference does): a few near-tie tokens route elsewhere, which made whole-tensor
    layer-0 errors exceed the limit in correct batch-8 profiles; over the agreed tokens they stay small.
    Noise in the router's own weights, a wrong router, flips many tokens and is still judged incorrect."""
    from labkit.model.profile import PARITY_FLIP_TOL, parity_status, parity_summary

    ids = torch.randint(0, CFG.vocab, (8, 32), generator=torch.Generator().manual_seed(0))

    def noisy(name, amount):
        g = torch.Generator().manual_seed(2)
        lw = weights.layers[0]
        w = getattr(lw, name)
        w = (w.float() * (1 + amount * torch.randn(w.shape, generator=g))).to(w.dtype)
        layers = [dataclasses.replace(lw, **{name: w})] + weights.layers[1:]
        return GptOss(CFG, dataclasses.replace(weights, layers=layers))

    ref = GptOss(CFG, weights)
    near_model = noisy("out_w", 0.01)
    near = parity_summary(ref, near_model, ids)
    assert 0 < near["layer0_flipped"] and near["layer0_flipped_share"] <= PARITY_FLIP_TOL
    assert parity_status(near) == "ok"
    whole = model_parity(ref, near_model, ids).per_component  # whole tensors: the flipped tokens dominate
    assert whole[whole["layer"] == 0]["rel_err"].max() > 5 * near["layer0_max_rel_err"]
    wrong = parity_summary(ref, noisy("gate_w", 1.0), ids)
    assert wrong["layer0_flipped_share"] > PARITY_FLIP_TOL and parity_status(wrong) == "incorrect"


def test_lm_head_study_ranks_formats(weights):
    h = final_hidden(GptOss(CFG, weights), toks(16))
    assert h.shape == (16, CFG.hidden)
    study = lm_head_study(h, weights.unembedding).set_index("variant")
    assert set(study.index) == {"bf16", "mxfp4/floor", "mxfp4/ceil", "mxfp4/rceil", "mxfp4/even", "nvfp4",
                                "w4a8 mxfp4/floor"}
    assert study.loc["bf16", "kl"] == pytest.approx(0, abs=1e-12) and study.loc["bf16", "top1_agree"] == 1
    for v in study.index.drop("bf16"):
        assert 0 < study.loc[v, "kl"] < 0.5 and study.loc[v, "max_logit_err"] > 0
    assert study.loc["w4a8 mxfp4/floor", "rel_err"] > study.loc["mxfp4/floor", "rel_err"]  # activations add error
    assert study.loc["nvfp4", "rel_err"] < study.loc["mxfp4/floor", "rel_err"]  # finer blocks, finer scales
    lm_head_chart(study.reset_index())


# ---------------------------------------------------------------------------------------------------- diverge


def test_variant_specs():
    v = parse_variant("kernels,sinks_dropped")
    assert v.backends == Backends(moe="triton", lm_head="mxfp4", attention="triton") and v.faults == {"sinks_dropped"}
    assert parse_variant("ref").backends == Backends(attention="torch", moe="torch", lm_head="bf16")
    assert parse_variant("kernels,attention=torch").backends.attention == "torch"
    v = parse_variant("moe=torch-w4a8,lm_head=mxfp4-torch,rounding=even,faults=gqa_mod+rope_pairs")
    assert v.backends == Backends("torch-w4a8", "mxfp4-torch", "even") and v.faults == {"gqa_mod", "rope_pairs"}
    assert parse_variant("kernels,layout=tiled").backends == Backends("triton", "mxfp4", attention="triton",
                                                                       layout="tiled")
    with pytest.raises(ValueError, match="layout must be one of rows, tiled"):
        parse_variant("layout=cols")
    with pytest.raises(ValueError, match="unknown setting 'kv'"):
        parse_variant("kv=fp8")
    with pytest.raises(ValueError, match="lm_head backend must be one of"):
        parse_variant("lm_head=fp8")


def test_capture_covers_every_component(weights):
    cap = capture(GptOss(CFG, weights), toks(5))
    keys = cap.keys()
    assert keys[0] == (None, "embedding") and keys[-2:] == [(None, "final_norm"), (None, "logits")]
    per_layer = [c for (layer, c) in keys if layer == 0]
    assert per_layer == ["attention", "router", "moe.mlp1", "moe.mlp2", "moe", "residual"]
    assert cap.outputs[(0, "router")].shape == (5, CFG.experts)
    assert cap.outputs[(0, "moe.mlp1")].shape == (5, CFG.top_k, CFG.intermediate)


def test_no_fault_no_divergence(weights):
    r = diverge("ref", "ref", weights=weights)
    assert r.first is None and r.table["rel_err"].max() == 0
    assert "no divergence" in r.summary()


@pytest.mark.parametrize("fault", list(FAULTS))
def test_finder_names_the_faulty_component(weights, fault):
    r = diverge("ref", fault, weights=weights)
    assert r.first is not None, r.summary()
    assert (r.first["layer"], r.first["component"]) == (0, FAULTS[fault].shows_in), r.summary()
    # everything that ran before it agrees exactly
    before = r.table[r.table["step"] < r.first["step"]]
    assert (before["rel_err"] == 0).all()


def test_finder_on_a_later_layer_only_fault(weights):
    """A bug confined to one layer's weights is found at that layer."""
    import dataclasses

    bad = dataclasses.replace(weights, layers=list(weights.layers))
    bad.layers[2] = dataclasses.replace(bad.layers[2], sinks=bad.layers[2].sinks * 0 - 30)
    a, b = capture(GptOss(CFG, weights), toks()), capture(GptOss(CFG, bad), toks())
    from labkit.model.diverge import compare, first_divergence

    first = first_divergence(compare(a, b))
    assert (first["layer"], first["component"]) == (2, "attention")


def test_cli_diverge_reports_and_exits_1_on_divergence(tmp_path, capsys):
    assert main(["model", "diverge", "ref", "ref", "--seq", "6", "--out", str(tmp_path / "same")]) == 0
    assert "no divergence" in capsys.readouterr().out
    assert main(["model", "diverge", "ref", "scale_bias_128", "--seq", "6", "--out", str(tmp_path / "d")]) == 1
    out = capsys.readouterr().out
    assert "first divergence at layer 0, component moe.mlp1" in out
    assert (tmp_path / "d" / "divergence.html").exists() and (tmp_path / "d" / "divergence.csv").exists()
    first = json.loads((tmp_path / "d" / "divergence.json").read_text())["first"]
    assert first["component"] == "moe.mlp1" and first["layer"] == 0


def test_divergence_chart_marks_the_first_divergence(weights):
    fig = divergence_chart(diverge("ref", "gqa_mod", weights=weights))
    assert len(fig.data) == 2 and fig.data[1].y[0] == "attention"


class _Span:
    def __init__(self, start, end):
        self.start, self.end = start, end

    def elapsed_us(self):
        return self.end - self.start


class _Evt:
    """A torch.profiler FunctionEvent stand-in (GPU profiles cannot be recorded on a CPU)."""

    def __init__(self, name, parent=None, start=0.0, end=0.0, cpu_us=0.0, device=torch.autograd.DeviceType.CPU):
        self.name, self.cpu_parent, self.device_type = name, parent, device
        self.time_range = _Span(start, end)
        self.self_cpu_time_total = cpu_us


def test_gpu_breakdown_charges_kernels_to_the_innermost_range_window():
    cuda = torch.autograd.DeviceType.CUDA
    layer = _Evt("layer.0", start=0, end=100)
    attn = _Evt("attention", layer, start=1, end=20)
    moe = _Evt("moe", layer, start=21, end=90)
    mm = _Evt("aten::mm", attn, start=2, end=3, cpu_us=2.0)
    events = [layer, attn, moe, mm,
              _Evt("gemm_kernel", start=5, end=15, device=cuda),  # aten kernel inside the attention window
              _Evt("_moe_gemv_kernel", start=30, end=60, device=cuda),  # a Triton kernel: no launch link
              _Evt("moe", start=25, end=95, device=cuda),  # the GPU-side copy of the range: not work
              _Evt("_combine_kernel", start=91, end=93, device=cuda),  # in layer.0 but in no component range
              _Evt("lm_head", start=120, end=150), _Evt("_gemv_h2_kernel", start=125, end=135, device=cuda)]
    comp = by_component(component_breakdown(events, steps=2, device_time=True)).set_index("component")
    assert comp.loc["attention", "us"] == 5 and comp.loc["moe", "us"] == 15 and comp.loc["lm_head", "us"] == 5
    assert comp.loc["other", "us"] == 1 and comp["share"].sum() == pytest.approx(1.0)
    cpu = by_component(component_breakdown(events)).set_index("component")
    assert cpu.loc["moe", "us"] == 0 and cpu.loc["attention", "us"] == 2  # markers' own CPU time not charged
    k = kernel_table(events + [_Evt("_moe_gemv_kernel", start=61, end=65, device=cuda)], steps=2)
    assert list(k["kernel"][:2]) == ["_moe_gemv_kernel", "gemm_kernel"]  # slowest first
    top = k.iloc[0]
    assert (top["range"], top["launches"], top["us"], top["us_per_launch"]) == ("moe", 1.0, 17.0, 17.0)
    assert k.set_index("kernel").loc["_combine_kernel", "range"] == "other"


def test_pdl_modes(monkeypatch):
    """LAB_PDL unset: only launches inside one op call (inner) use PDL; LAB_PDL=1: all; pdl_scope(False): none,
    restored after the scope."""
    import kernels._triton as T

    monkeypatch.setattr(T, "HOPPER", True)
    monkeypatch.setattr(T, "PDL", False)
    monkeypatch.setattr(T, "INNER_PDL", True)
    assert T.pdl_launch() == {} and T.pdl_launch(inner=True) == {"launch_pdl": True}
    with T.pdl_scope(False):
        assert T.pdl_launch(inner=True) == {}
    with T.pdl_scope(True):
        assert T.pdl_launch() == {"launch_pdl": True}
    assert T.pdl_launch() == {} and T.pdl_launch(inner=True) == {"launch_pdl": True}
