"""Speed targets judged from runs: floors against the most demanding ceilings, PDL runs left out, misses shown."""

import math

import pandas as pd
import pytest

from labkit.results import PointStore
from labkit.runs import create_run
from labkit.targets import TARGETS, Target, judge, markdown, summary, targets_chart

GPU = "NVIDIA H100 80GB HBM3"
LM_HEAD = TARGETS[0]  # lm_head, M <= 8: 90% of floor


def _run(tmp_path, name, points, read_gbps, bf16_tflops=800.0, started="2026-11-23T00:00:00+00:00", **meta):
    run = create_run(name, out=tmp_path / name)
    run.update_meta(gpu=GPU, started=started, ceilings={"read_gbps": read_gbps, "bf16_tflops": bf16_tflops,
                                                        "source": "measured"}, **meta)
    PointStore(run.path).append(points)
    return run.path


def _lm_head(m, us, variant="gemv_h2g", nbytes=3.0e8, config=None, **kw):
    return {"op": "linear", "variant": variant, "config": config or {}, "m": m, "n": 201088, "k": 2880,
            "routing": None, "status": "ok", "us_graph": us, "bytes": nbytes, "flops": 2.0 * m * 201088 * 2880,
            "shape": "lm_head", **kw}


def test_floors_use_the_highest_ceiling_of_all_runs(tmp_path):
    # run a measured a low read ceiling (2 TB/s): its own fraction would read 150 / 100 = 1.5 of the floor
    a = _run(tmp_path, "a", [_lm_head(1, 100.0)], read_gbps=2000.0)
    b = _run(tmp_path, "b", [_lm_head(2, 110.0)], read_gbps=3000.0)
    out = judge([a, b], targets=[LM_HEAD])
    row = out.set_index("m").loc[1]
    assert row["value"] == pytest.approx(3.0e8 / 3000e9 * 1e6 / 100.0)  # 1.0: against 3 TB/s, not 2
    assert row["met"] and row["run_id"] == "a"
    assert out.set_index("m").loc[2]["value"] == pytest.approx(100.0 / 110.0)
    assert out.attrs["ceilings"][GPU]["read_gbps"] == 3000.0


def test_configs_this_checkout_cannot_run_are_left_out(tmp_path):
    # a faster point measured with an option since removed (PERSIST on gemv_mma: no such parameter now)
    a = _run(tmp_path, "a", [_lm_head(1, 90.0, variant="gemv_mma", config={"BLOCK_M": 16, "PERSIST": 2}),
                              _lm_head(1, 100.0, variant="gemv_mma", config={"BLOCK_M": 16})], read_gbps=3000.0)
    row = judge([a], targets=[LM_HEAD]).set_index("m").loc[1]
    assert row["us"] == 100.0 and "PERSIST" not in row["config"]


def test_variants_that_quantize_activations_are_left_out(tmp_path):
    """A faster W4A8 point (activations to 8 bits, ~3% error) meets no target and enters no auto table: the
    lab's kernels are judged at bf16 accuracy."""
    from labkit.tables import derive_tables

    fast = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128}
    a = _run(tmp_path, "a", [_lm_head(1, 90.0, variant="w4a8_fp8", config=fast),
                              _lm_head(1, 100.0, variant="gemv_h2g", config={})], read_gbps=3000.0)
    row = judge([a], targets=[LM_HEAD]).set_index("m").loc[1]
    assert row["variant"] == "gemv_h2g" and row["us"] == 100.0
    rows = derive_tables(a)["default"]
    assert [r[1] for r in rows] == ["gemv_h2g"]  # (max_m, variant, config)


def test_best_configs_auto_never_picks_are_marked_opt_in(tmp_path):
    """A best config with STEP_MAJOR (a second weight copy) or ATOMIC (run-to-run bits) still counts, marked
    opt_in: a user reaches that time by naming the config, not through variant="auto"; opt_in_ok=False judges
    only the configs auto may pick."""
    wg = {"BLOCK_M": 8, "ROWS": 2, "WGMMA": True, "STAGES": 3, "TILED": True, "RING_W": True}
    a = _run(tmp_path, "a", [_lm_head(1, 95.0, variant="gemv_mma", config={**wg, "STEP_MAJOR": True}),
                              _lm_head(1, 100.0, variant="gemv_mma", config=wg),
                              _lm_head(2, 100.0, variant="gemv_mma", config=wg)], read_gbps=3000.0)
    out = judge([a], targets=[LM_HEAD])
    rows = out.set_index("m")
    assert rows.loc[1, "us"] == 95.0 and rows.loc[1, "opt_in"] is True
    assert rows.loc[2, "opt_in"] is False and rows.loc[4, "opt_in"] is None  # 4: not measured
    assert "gemv_mma (opt-in)" in markdown(out)
    plain = judge([a], targets=[LM_HEAD], opt_in_ok=False).set_index("m")  # what auto can reach
    assert plain.loc[1, "us"] == 100.0 and plain.loc[1, "opt_in"] is False


def test_unmeasured_points_are_listed_and_misses_counted(tmp_path):
    a = _run(tmp_path, "a", [_lm_head(1, 100.0), _lm_head(1, 200.0, variant="gemv"),
                              _lm_head(2, 125.0), _lm_head(4, 90.0, status="incorrect")], read_gbps=3000.0)
    out = judge([a], targets=[LM_HEAD]).set_index("m")
    assert out.loc[1, "variant"] == "gemv_h2g" and out.loc[1, "met"]  # the best config, not the slower one
    assert out.loc[2, "met"] is False  # 80% < 90%
    assert out.loc[4, "met"] is None and out.loc[8, "met"] is None  # an incorrect point is no measurement
    s = summary(judge([a], targets=[LM_HEAD])).iloc[0]
    assert (s["met"], s["measured"], s["asked"]) == (1, 2, 4) and s["worst"] == "lm_head 2: 80.0%"
    md = markdown(judge([a], targets=[LM_HEAD]))
    assert "| lm_head | 4 | not measured |" in md and "| 80.0% |  | not repeated | 90% | no |" in md


def test_a_goal_met_once_is_told_apart_from_one_met_by_a_median(tmp_path):
    """The best single measurement judges a point; the best median of the configs measured at least twice
    says whether that holds up. Configs are compared with their defaults filled in (a run made before an
    option existed stored fewer keys)."""
    from kernels import VARIANTS

    d = VARIANTS["gemv_h2g"].defaults
    a = _run(tmp_path, "a", [_lm_head(1, 100.0, config={}), _lm_head(1, 125.0, config={}),
                              _lm_head(1, 105.0, variant="gemv", config={}),  # once: no median
                              _lm_head(2, 108.0, config={}), _lm_head(2, 110.0, config={})], read_gbps=3000.0)
    b = _run(tmp_path, "b", [_lm_head(1, 120.0, config=dict(d)), _lm_head(2, 112.0, config=dict(d))],
             read_gbps=3000.0)
    out = judge([a, b], targets=[LM_HEAD]).set_index("m")
    one, two = out.loc[1], out.loc[2]
    assert one["met"] and one["value"] == pytest.approx(1.0)  # 100 us against a 100 us floor
    assert one["repeats"] == 3 and one["median"] == pytest.approx(100.0 / 120.0) and one["met_median"] is False
    assert two["repeats"] == 3 and two["median"] == pytest.approx(100.0 / 110.0) and two["met_median"]
    s = summary(judge([a, b], targets=[LM_HEAD])).iloc[0]
    assert (s["met"], s["met_median"]) == (2, 1)
    assert "| 83.3% (3) |" in markdown(judge([a, b], targets=[LM_HEAD]))
    hollow = [t for t in targets_chart(judge([a, b], targets=[LM_HEAD])).data
              if t.marker is not None and t.marker.symbol == "circle-open"]
    assert len(hollow) == 1 and list(hollow[0].y) == pytest.approx([100.0 / 120.0, 100.0 / 110.0])


def test_runs_made_with_pdl_are_left_out(tmp_path):
    a = _run(tmp_path, "a", [_lm_head(1, 100.0)], read_gbps=3000.0, lab_pdl="1")
    b = _run(tmp_path, "b", [_lm_head(1, 125.0)], read_gbps=3000.0)
    row = judge([a, b], targets=[LM_HEAD]).set_index("m").loc[1]
    assert row["run_id"] == "b" and row["value"] == pytest.approx(0.8)


def test_runs_made_with_other_x16_programs_are_left_out(tmp_path):
    a = _run(tmp_path, "a", [_lm_head(1, 100.0)], read_gbps=3000.0, lab_x16_split_rows="64")
    b = _run(tmp_path, "b", [_lm_head(1, 125.0)], read_gbps=3000.0)
    row = judge([a, b], targets=[LM_HEAD]).set_index("m").loc[1]
    assert row["run_id"] == "b" and row["value"] == pytest.approx(0.8)


def test_vs_bf16_is_cublas_time_over_the_best_time(tmp_path):
    t = Target("big", 4, "linear", ("lm_head",), (2048,), "vs_bf16", 0.7)
    pts = [_lm_head(2048, 400.0, variant="dequant_gemm"), _lm_head(2048, 300.0, variant="cublas_bf16"),
           _lm_head(2048, 500.0, variant="gemv_mma")]
    a = _run(tmp_path, "a", pts, read_gbps=3000.0)
    row = judge([a], targets=[t]).iloc[0]
    assert row["variant"] == "dequant_gemm" and row["value"] == pytest.approx(0.75) and row["met"]


def test_no_gpu_run_is_a_clear_error(tmp_path):
    run = create_run("cpu", out=tmp_path / "cpu")
    PointStore(run.path).append(_lm_head(1, 1000.0))
    with pytest.raises(ValueError, match="no run with measured ceilings"):
        judge([run.path])


@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_committed_runs_judge_every_target_conservatively(gpu):
    """On the committed runs of each GPU: every asked point was measured, and no value is above the point's own
    run's fraction (the recomputed floors are never lower than the ones the runs measured)."""
    from labkit.results import read_runs, resolve_run

    out = judge(gpu=gpu)
    assert len(out) == sum(len(t.problems) * len(t.tokens) for t in TARGETS)
    assert out["met"].notna().all()
    frac = out[out["target"] != TARGETS[2].name]
    for r in frac.to_dict("records"):
        pts = read_runs([resolve_run(r["run_id"])])
        own = pts[(pts["m"] == r["m"]) & (pts["variant"] == r["variant"]) & (pts["us_graph"] == r["us"])]
        assert len(own) and r["value"] <= own["frac_of_floor"].max() + 1e-9
    fig = targets_chart(out)
    assert len(fig.layout.annotations) == len(TARGETS)
    assert not math.isnan(out["value"].min())


def test_cli_prints_the_judgement_and_fails_while_a_target_is_missed(tmp_path, capsys):
    from labkit.cli import main

    a = _run(tmp_path, "a", [_lm_head(m, 100.0) for m in (1, 2, 4)] + [_lm_head(8, 125.0)], read_gbps=3000.0)
    assert main(["targets", "--runs", str(a), "--chart", str(tmp_path / "charts" / "targets")]) == 1
    out = capsys.readouterr().out
    assert "3000 GB/s read" in out and "NO" in out and "lm_head, M <= 8: >= 90% of floor" in out
    assert (tmp_path / "charts" / "targets.html").is_file()
    assert main(["targets", "--runs", str(a), "--markdown"]) == 1
    assert capsys.readouterr().out.startswith("| target |")


def test_cli_judges_the_newest_gpu_and_names_the_others(tmp_path, capsys):
    """Runs of two GPUs: plain `targets` judges the GPU of the newest run and says how to see the other."""
    from labkit.cli import main
    from labkit.runs import open_run

    a = _run(tmp_path, "a", [_lm_head(1, 100.0)], read_gbps=3000.0)
    b = _run(tmp_path, "b", [_lm_head(1, 80.0)], read_gbps=4000.0, started="2026-11-28T00:00:00+00:00")
    open_run(b).update_meta(gpu="NVIDIA H200")
    main(["targets", "--runs", str(a), str(b)])
    out = capsys.readouterr().out
    assert "1 runs on that GPU (NVIDIA H200: 4000 GB/s read" in out
    assert f"also measured on {GPU}: ./lab targets --gpu '{GPU}'" in out
    main(["targets", "--runs", str(a), str(b), "--gpu", GPU])
    out = capsys.readouterr().out
    assert f"({GPU}: 3000 GB/s read" in out and "also measured on NVIDIA H200" in out


def test_held_shows_compute_bound_points_against_the_sustained_bf16_rate(tmp_path, capsys):
    """`held`: a compute-bound point's fraction of a floor at the highest `bf16_tflops_sustained` measured (runs
    before it have none); memory-bound points and runs without it get NaN, and `value` (the judged one) stays
    against the single-call rate."""
    from labkit.cli import main
    from labkit.runs import open_run

    large = next(t for t in TARGETS if t.op == "moe_layer" and 8192 in t.tokens)
    flops = 2.0 * 8192 * 4 * 3 * 2880 * 2880  # 20b at 8192 tokens: 1.6 TFLOP, 2.0 ms at 800 TFLOP/s

    def moe(m, us, f):
        return {"op": "moe_layer", "variant": "moe_mma", "config": {}, "m": m, "model": "gpt-oss-20b",
                "routing": "uniform", "status": "ok", "us_graph": us, "bytes": 4.2e8, "flops": f}

    old = _run(tmp_path, "old", [moe(8192, 3000.0, flops), moe(512, 300.0, 1e9)], read_gbps=4000.0)
    out = judge([old], targets=[large]).set_index(["problem", "m"])
    assert out["held"].isna().all()
    new = _run(tmp_path, "new", [moe(8192, 3100.0, flops)], read_gbps=4000.0)
    c = open_run(new).meta["ceilings"]
    open_run(new).update_meta(ceilings={**c, "bf16_tflops_sustained": 600.0})
    out = judge([old, new], targets=[large]).set_index(["problem", "m"])
    row = out.loc[("gpt-oss-20b", 8192)]
    assert row["us"] == 3000.0 and row["value"] == pytest.approx(flops / 800e12 * 1e6 / 3000)
    assert row["held"] == pytest.approx(flops / 600e12 * 1e6 / 3000)
    assert math.isnan(out.loc[("gpt-oss-20b", 512), "held"])  # memory-bound: 105 us of bytes, 1.25 of flops
    assert math.isnan(out.loc[("gpt-oss-120b", 8192), "held"])  # not measured
    main(["targets", "--runs", str(old), str(new)])
    text = capsys.readouterr().out
    assert "held: a compute-bound point's fraction of the floor at the bf16 rate 600 TFLOP/s" in text
    assert f"{row['held']:.1%}" in text


def test_untried_lists_the_other_gpus_leaders_never_run_here(tmp_path, capsys):
    """The H100's two fastest lm_head configs at one token: the one the H200 also ran is not listed, the other is
    (with its time there, its ratio to the best there and the H200's best); a config that failed on the H200
    counts as never run; the third fastest is beyond --top 2."""
    from labkit.cli import main
    from labkit.runs import open_run
    from labkit.sweep import expand_linear, load_spec
    from labkit.targets import untried

    def mma(m, us, rows, **kw):
        return _lm_head(m, us, variant="gemv_mma", config={"BLOCK_M": 16, "ROWS": rows}, **kw)

    a = _run(tmp_path, "a", [mma(1, 100.0, 4), mma(1, 101.0, 1), mma(1, 120.0, 2), mma(2, 100.0, 1)],
             read_gbps=3000.0)
    b = _run(tmp_path, "b", [mma(1, 80.0, 4), mma(2, 70.0, 1, status="failed")], read_gbps=4000.0)
    open_run(b).update_meta(gpu="NVIDIA H200")
    out = untried("H200", "H100", top=2, runs=[a, b], targets=[LM_HEAD])
    assert [(r["m"], r["config"]) for r in out.to_dict("records")] == [(1, "ROWS=1"), (2, "ROWS=1")]
    first = out.iloc[0]
    assert first["us_there"] == 101.0 and first["ratio_there"] == pytest.approx(1.01) and first["best_here"] == 80.0
    assert pd.isna(out.iloc[1]["best_here"])  # nothing correct on the H200 at 2 tokens
    assert main(["untried", "--gpu", "H200", "--from-gpu", "H100", "--top", "1", "--runs", str(a), str(b),
                 "--spec", str(tmp_path / "specs" / "gap")]) == 0
    printed = capsys.readouterr().out
    assert "1 configs at 1 points" in printed and "gap_linear.yaml" in printed
    # the written spec times that config at its token count only, beside auto's pick; on the CPU auto's alone
    spec = load_spec(str(tmp_path / "specs" / "gap_linear.yaml"))
    cases = expand_linear(spec, on_gpu=True)
    assert {(c.m, c.config["ROWS"]) for c in cases if c.variant == "gemv_mma" and c.config["ROWS"] == 1} == {(2, 1)}
    assert expand_linear(spec, on_gpu=False)
    with pytest.raises(ValueError, match="no correct points measured on a GPU matching 'B200'"):
        untried("B200", "H100", runs=[a, b])
