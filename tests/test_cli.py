"""The labkit command line."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from labkit.cli import main


def test_help_lists_subcommands(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert "info" in out and "quickstart" in out and "roofline" in out


def test_info_json_reports_gpu_and_triton_mode(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    import torch

    assert (info["gpu"] is None) == (not torch.cuda.is_available())
    assert info["triton_mode"] in ("compiled", "interpreted")
    if info["gpu"] is None:
        assert info["triton_mode"] == "interpreted"
    assert info["torch"] and info["triton"]


def test_info_table_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "labkit", "info"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "triton" in out.stdout and "gpu" in out.stdout


def test_roofline_json(capsys):
    assert main(["roofline", "--gpu", "gb10", "--model", "gpt-oss-120b", "--batch", "1", "--context", "4096",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"bytes_per_token", "floor_ms", "tokens_per_s", "components"} <= set(out)
    assert set(out["components"]) == {"embedding", "attention", "router", "moe", "norms", "lm_head"}
    assert out["components"]["lm_head"]["floor_ms"] == pytest.approx(4.24, abs=0.01)
    assert set(out["components"]["moe"]) == {"bytes", "flops", "floor_ms"}
    assert main(["roofline", "--gpu", "gb10", "--mxfp4-lm-head", "--json"]) == 0
    mx = json.loads(capsys.readouterr().out)
    assert mx["components"]["lm_head"]["floor_ms"] == pytest.approx(1.13, abs=0.01)
    assert mx["tokens_per_s"] > out["tokens_per_s"]


def test_roofline_table(capsys):
    assert main(["roofline", "--gpu", "h100-sxm", "--model", "gpt-oss-20b", "--batch", "8", "--context", "1024",
                 "--kv-dtype", "fp8", "--phase", "prefill"]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss-20b prefill, batch 8, context 1024" in out and "KV cache fp8" in out
    for name in ("attention", "moe", "lm_head", "total", "tokens/s"):
        assert name in out


@pytest.mark.parametrize("args, message", [
    (["--gpu", "h999"], "unknown GPU 'h999'; known GPUs: h100-sxm"),
    (["--gpu", "h100-sxm", "--model", "gpt-oss-7b"], "unknown model 'gpt-oss-7b'; known models: gpt-oss-20b"),
    ([], "give --gpu"),
])
def test_roofline_errors_list_known_names(capsys, args, message):
    assert main(["roofline", *args]) == 2
    assert message in capsys.readouterr().err


def test_roofline_ceilings_from_a_run(capsys, tmp_path):
    from labkit.runs import create_run

    run = create_run("t", out=tmp_path / "r", ceilings={"read_gbps": 3000.0, "bf16_tflops": 679.0})
    assert main(["roofline", "--ceilings-from", str(run.path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ceilings"]["read_gbps"] == 3000.0 and out["ceilings"]["source"] == "measured"
    assert main(["roofline", "--ceilings-from", str(tmp_path / "missing")]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_sass_compiles_for_hopper_without_a_gpu():
    # static report of a real sm_90 compile (Triton's bundled ptxas), on any machine
    out = subprocess.run([sys.executable, "-m", "labkit", "sass", "gemv_h2", "--m", "1", "--n", "256", "--k", "256",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)
    main = [r for r in rows if r["kernel"] == "_gemv_h2_kernel"][0]
    assert main["regs"] > 0 and main["local"] == 0 and main["loop_instructions"] > 0 and "HFMA2" in main["mix"]
    # a MoE variant compiles the named model's layer (mlp1 and mlp2); NIB's E4M3 conversions are F2FP (plain
    # Triton here: the Gluon kernels are written against Triton 3.6, the GPU machine's, not this one's 3.9)
    out = subprocess.run([sys.executable, "-m", "labkit", "sass", "moe_h2g", "--m", "4", "--model", "gpt-oss-20b",
                          "--config", "NIB=true", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    h2g = [r for r in json.loads(out.stdout) if r["kernel"] == "_moe_h2g_kernel"]
    assert len(h2g) == 2 and all("F2FP" in r["mix"] and r["local"] == 0 for r in h2g)


def test_sass_names_the_tensor_core_instructions():
    """w4a8_fp8 runs sm_90's fp8 wgmma (QGMMA ... E4M3) with its weights decoded in registers (A operand R<n>);
    the text report lists each kernel's tensor-core instructions. (w4a8's tl.dot_scaled(e4m3, e2m1) compiles
    to HGMMA ... BF16 on sm_90 with Triton 3.6 and 3.9: the report is how that was seen.)"""
    out = subprocess.run([sys.executable, "-m", "labkit", "sass", "w4a8_fp8", "--m", "256", "--n", "256", "--k",
                          "256", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    main = [r for r in json.loads(out.stdout) if r["kernel"] == "_w4a8_fp8_kernel"][0]
    assert main["tensor_core"] and all(op.startswith("QGMMA") and op.endswith("E4M3.E4M3")
                                       for op in main["tensor_core"]), main["tensor_core"]
    assert main["local"] == 0 and main["wgmma_hazards"] == []
    text = subprocess.run([sys.executable, "-m", "labkit", "sass", "w4a8_fp8", "--m", "256", "--n", "256", "--k",
                           "256"], capture_output=True, text=True, timeout=300).stdout
    assert "tensor cores: QGMMA" in text


def test_programs_per_sm_names_what_bounds_them():
    """sm_90: 64K registers (8-register allocation steps), 228 KB of shared memory (+1 KB reserved per block),
    64 warps, 32 blocks per SM; the sm_90 builds of gemv_mma at 32 tokens, 3 slots: cp.async 141 registers ->
    3 programs, TMA 128 registers and 50712 B -> 4, bounded by both."""
    from labkit.compile import programs_per_sm

    assert programs_per_sm(141, 51200, 4) == {"programs": 3, "limited_by": ["registers"]}
    assert programs_per_sm(128, 50712, 4) == {"programs": 4, "limited_by": ["registers", "shared memory"]}
    assert programs_per_sm(32, 0, 1)["limited_by"] == ["blocks"]
    assert programs_per_sm(32, 0, 8)["programs"] == 8  # 64 warps
    assert programs_per_sm(128, 50712, 4, arch=75) is None


RETRY_AFTER_EXIT = """
.L_x_2:
        /*0010*/                   DEPBAR.LE SB0, 0x2 ;
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], R8 ;
        /*0030*/               @!P1 BRA `(.L_x_1) ;
.L_x_3:
        /*0040*/                   HMUL2 R40, R40, R10 ;
        /*0050*/                   HGMMA.64x16x16.F32 R24, R40, gdesc[UR8], R24, gsb0 ;
        /*0060*/               @P0 BRA `(.L_x_2) ;
        /*0070*/                   STG.E.U16 desc[UR14][R4.64], R34 ;
        /*0080*/                   EXIT ;
.L_x_1:
        /*0090*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], R8 ;
        /*00a0*/               @!P1 BRA `(.L_x_1) ;
        /*00b0*/                   BRA `(.L_x_3) ;
"""


def test_main_loop_is_not_an_mbarrier_retry_span():
    """ptxas puts an mbarrier wait's retry after the epilogue and branches back into the K loop (gemv_mma TMA):
    that span holds the EXIT and the stores, so the K loop is the loop reported."""
    from labkit.compile import main_loop_mix

    n, mix = main_loop_mix(RETRY_AFTER_EXIT)
    assert n == 6 and mix["HGMMA"] == 1 and "STG" not in mix


def test_mma_loops_lists_each_innermost_tensor_core_loop():
    """mma_loops reports the K loop inside the retry span (not the span), with its tensor-core shapes and its
    mbarrier wait; two K loops of different widths are two rows."""
    from labkit.compile import mma_loops

    loops = mma_loops(RETRY_AFTER_EXIT)
    assert len(loops) == 1 and loops[0]["instructions"] == 6 and loops[0]["mbarrier_waits"] == 1
    assert loops[0]["tensor_core"] == {"HGMMA.64x16x16.F32": 1} and loops[0]["bar_sync"] == 0
    two = RETRY_AFTER_EXIT.replace("        /*0070*/", """.L_x_4:
        /*0068*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0069*/                   HGMMA.64x32x16.F32 R24, R40, gdesc[UR8], R24, gsb0 ;
        /*006a*/               @P1 BRA `(.L_x_4) ;
        /*0070*/""")
    loops = mma_loops(two)
    assert [lp["tensor_core"] for lp in loops] == [{"HGMMA.64x16x16.F32": 1}, {"HGMMA.64x32x16.F32": 1}]
    assert loops[1]["bar_sync"] == 1 and loops[1]["instructions"] == 3


FAKE_LOOP = """
.L_x_1:
        /*0010*/                   WARPGROUP.ARRIVE ;
        /*0020*/                   HGMMA.64x64x16.F32 R24, R100, gdesc[UR12], R24 ;
        /*0030*/                   HGMMA.64x64x16.F32 R24, R104, gdesc[UR12], R24, gsb0 ;
        /*0040*/                   {early} ;
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0060*/                   HMUL2 R200, R1, R2 ;
        /*0070*/                   WARPGROUP.ARRIVE ;
        /*0080*/                   HGMMA.64x64x16.F32 R24, R200, gdesc[UR12], R24, gsb0 ;
        /*0090*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*00a0*/                   {late} ;
        /*00b0*/               @P0 BRA `(.L_x_1) ;
"""


def test_wgmma_hazards_finds_a_write_under_a_running_mma():
    """A write to a register an HGMMA group reads as A, before the wait that retires the group (around the
    loop, counting the groups issued since), is reported; the same write after it is not; a 128-bit load
    writes four registers."""
    from labkit.compile import wgmma_hazards

    ok = FAKE_LOOP.format(early="NOP", late="HMUL2 R103, R1, R2")  # after the second wait: group 1 retired
    assert wgmma_hazards(ok) == []
    assert len(wgmma_hazards(FAKE_LOOP.format(early="HMUL2 R107, R1, R2", late="NOP"))) == 1
    assert len(wgmma_hazards(FAKE_LOOP.format(early="NOP", late="LDS.128 R198, [R3]"))) == 1  # R198-R201: group 2
    assert wgmma_hazards(FAKE_LOOP.format(early="ISETP.NE.AND P0, PT, R100, RZ, PT", late="NOP")) == []


def test_wgmma_builds_have_no_hazard():
    """The sm_90 builds of the WGMMA leaders (moe_mma and gemv_mma with RING_W) leave no A register written
    under a running wgmma (`labkit sass` exits 1 on one; each K step waits for its MMA, since ptxas frees the A
    registers at the HGMMA). Gluon kernels compile with the GPU machine's Triton (3.6) only, so elsewhere this
    is skipped."""
    rows = []
    for args in (["moe_mma", "--m", "512", "--model", "gpt-oss-20b", "--config",
                  "BLOCK_M=64,ROWS=2,CHUNKS=1,num_warps=4,STAGES=4,TILED=true,WGMMA=true,RING_W=true,NIB=true"],
                 ["gemv_mma", "--m", "32", "--n", "201088", "--k", "2880", "--config",
                  "BLOCK_M=32,ROWS=2,CHUNKS=1,num_warps=4,STAGES=3,TILED=true,WGMMA=true,RING_W=true"]):
        out = subprocess.run([sys.executable, "-m", "labkit", "sass", *args, "--json"], capture_output=True,
                             text=True, timeout=600)
        if out.returncode != 0 and "CompilationError" in out.stderr:
            pytest.skip("Gluon kernels compile with the GPU machine's Triton only")
        assert out.stdout, out.stderr[-2000:]
        rows += json.loads(out.stdout)
        assert out.returncode == 0, [r["wgmma_hazards"] for r in rows]
    wg = [r for r in rows if r["mix"].get("HGMMA")]
    assert len(wg) == 3 and all(r["local"] == 0 and r["wgmma_hazards"] == [] for r in wg), rows


def _two_runs(tmp_path):
    from labkit.results import PointStore
    from labkit.runs import create_run

    def pt(m, us, variant="gemv"):
        return {"op": "linear", "variant": variant, "config": {"BLOCK_N": 32} if variant == "gemv" else {}, "m": m,
                "n": 128, "k": 64, "routing": None, "status": "ok", "shape": "lm_head", "us_graph": us,
                "us_graph_p10": us * 0.99, "us_graph_p90": us * 1.01}

    for name, scale in (("a", 1.0), ("b", 0.5)):
        run = create_run(name, out=tmp_path / name)
        PointStore(run.path).append([pt(1, 10 * scale), pt(2, 20), pt(1, 30, "cublas_bf16")])
    return tmp_path / "a", tmp_path / "b"


def test_compare_runs_and_sql_commands(tmp_path, capsys):
    from labkit.runs import open_run

    a, b = _two_runs(tmp_path)
    assert main(["compare", str(a), str(b), "--csv", str(tmp_path / "c.csv")]) == 0
    out = capsys.readouterr().out
    assert "3 points in both runs" in out and "1 wins, 0 losses, 2 within noise" in out
    assert "10 [9.9-10.1]" in out and "N=32" in out and "different GPUs" not in out
    assert main(["compare", str(a), str(b), "--changes"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[-1] for r in rows[1:-3]] == ["win"]  # header, the win, then A =, B = and the summary
    assert (tmp_path / "c.csv").read_text().count("\n") == 4
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ok  incorrect  failed" in out and out.count("linear 3") == 2
    open_run(b).update_meta(gpu="NVIDIA H200")
    assert main(["runs", str(tmp_path), "--gpu", "h200"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2 and rows[1].split()[0] == "b"
    assert main(["runs", str(tmp_path), "--last", "1", "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == ["b"]
    assert main(["runs", str(tmp_path), "--match", "nope"]) == 1
    assert "none of the 2 run folders matches" in capsys.readouterr().out
    assert main(["sql", "SELECT run_id, min(us_graph) AS best FROM points GROUP BY 1 ORDER BY 1", "--runs", str(a),
                 str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"run_id": "a", "best": 10.0}, {"run_id": "b", "best": 5.0}]
    assert main(["best", str(b)]) == 0
    out = capsys.readouterr().out
    assert "cublas_bf16" in out and "vs_baseline" in out and "lm_head" in out
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    open_run(b).update_meta(gpu="NVIDIA H200")  # a comparison across GPUs says so
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"B = {b.name} (NVIDIA H200)" in out and "A and B ran on different GPUs" in out


def test_compare_of_two_decode_profiles_says_where_the_step_moved(tmp_path, capsys):
    """Two `lab model profile` runs: after the point table, per component and per kernel us, B - A and B / A;
    a kernel only one side launched shows a blank on the other; C++ kernel names are cut to their name."""
    from labkit.model.profile import compare_profiles, short_kernel

    a, b = _two_runs(tmp_path)
    long = "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long>(at::Info<long>, int)"
    prof = {
        a: {"step_us": 100.0, "breakdown": [{"component": "router", "us": 20.0}, {"component": "moe", "us": 80.0}],
            "kernels": [{"kernel": "_router_kernel", "us": 12.0}, {"kernel": "_route_fused_kernel", "us": 8.0},
                        {"kernel": "_moe_kernel", "us": 80.0}, {"kernel": long, "us": 1.0}]},
        b: {"step_us": 95.0, "breakdown": [{"component": "router", "us": 15.0}, {"component": "moe", "us": 80.0}],
            "kernels": [{"kernel": "_router_kernel", "us": 15.0}, {"kernel": "_moe_kernel", "us": 80.0},
                        {"kernel": long, "us": 1.0}]}}
    for run, p in prof.items():
        (run / "profile.json").write_text(json.dumps(p))
    comp, ker = compare_profiles(prof[a], prof[b])
    assert comp.set_index("component")["B-A us"].to_dict() == {"router": -5.0, "moe": 0.0, "step": -5.0}
    assert ker["kernel"].tolist()[:2] == ["_route_fused_kernel", "_router_kernel"]  # largest |B - A| first
    assert pd.isna(ker.set_index("kernel").loc["_route_fused_kernel", "B us"])
    assert short_kernel(long) == "at::native::indexSelectSmallIndex<c10::BFloat16, long>"
    assert len(short_kernel("k" * 100)) == 60
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "decode step per component" in out and "kernels that moved most" in out
    assert [ln.split() for ln in out.splitlines() if ln.strip().startswith(("router ", "step "))] == [
        ["router", "20.0", "15.0", "-5.0", "0.750"], ["step", "100.0", "95.0", "-5.0", "0.950"]]
    assert any(ln.split() == ["_route_fused_kernel", "8.0", "-", "-8.0", "-"] for ln in out.splitlines())


@pytest.mark.parametrize("argv, expect", [
    (["once", "gemv_h2g", "--m", "2", "--n", "48", "--k", "64", "--repeat", "0"], "m=2 n=48 k=64"),
    (["once", "moe_mma", "--model", "tiny", "--m", "5", "--routing", "zipf(1.2)", "--config", "BLOCK_M=8",
      "--repeat", "0"], "tiny T=5 zipf(1.2) {'BLOCK_M': 8}: ran 1 times, out (5, 64)"),
])
def test_once_runs_linear_and_moe_variants(argv, expect, capsys):
    """`labkit once` (the ncu workload) runs a linear config on its shape and a MoE config on a model's layer."""
    assert main(argv) == 0
    assert expect in capsys.readouterr().out


@pytest.mark.parametrize("argv, problem", [
    (["once", "auto", "--m", "3", "--n", "96", "--k", "64", "--repeat", "0"], {"op": "linear", "n": 96, "k": 64}),
    (["once", "auto", "--model", "tiny", "--m", "5", "--layout", "rows", "--repeat", "0"],
     {"op": "moe", "tokens": 5, "experts": 8, "top_k": 2, "n": 128, "k": 64}),
])
def test_once_auto_names_and_runs_autos_pick(argv, problem, capsys):
    """`labkit once auto` runs the config variant="auto" picks for the problem and --layout (ncu's workload as
    auto runs it) and prints it: a linear one without --model, a MoE layer with it."""
    from kernels.tables import pick_linear, pick_moe

    layout = argv[argv.index("--layout") + 1] if "--layout" in argv else "tiled+nib"
    held = {"tiled": layout.startswith("tiled"), "shuffled": layout.endswith("+nib")}
    name, cfg = (pick_moe if problem["op"] == "moe" else pick_linear)(
        {**problem, "m": 3 if problem["op"] == "linear" else 5, **held, "scale_min": 118, "scale_max": 124})
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"auto picks {name} for a {layout} weight: ")
    ran = out.splitlines()[1]
    assert ran.startswith(name) and all(f"'{k}': {v!r}" in ran for k, v in cfg.items()), (cfg, ran)


def test_selfcheck_prints_each_check_and_fails_on_a_wrong_kernel(capsys, monkeypatch):
    """`labkit selfcheck --variant`: a line per checked call, a count, exit 0; a kernel whose output is 10% off
    is reported BAD and the command exits 1; an unknown name is an error before anything runs."""
    import dataclasses

    import kernels as K

    assert main(["selfcheck", "--variant", "gemv", "route"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "11/11 correct"  # 3 shapes x (defaults + 1 drawn config), 5 routing checks
    assert sum(ln.startswith("ok  gemv ") for ln in out) == 6 and sum(ln.startswith("ok  route ") for ln in out) == 5
    v = K.VARIANTS["gemv"]
    monkeypatch.setitem(K.VARIANTS, "gemv", dataclasses.replace(v, fn=lambda *a, **c: v.fn(*a, **c) * 1.1))
    assert main(["selfcheck", "--op", "linear", "--variant", "gemv"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "0/6 correct" and all(ln.startswith("BAD gemv ") for ln in out[:-1])
    assert main(["selfcheck", "--variant", "nope"]) == 2
    assert "unknown variant(s) nope" in capsys.readouterr().err


def test_sweep_list_finds_shipped_specs_by_word(capsys):
    assert main(["sweep", "--list", "imbalance"]) == 0
    out = capsys.readouterr().out
    assert "moe_balanced\n    What chance imbalance costs the MoE layer" in out and "linear_gptoss" not in out
    assert main(["sweep", "--list"]) == 0
    from labkit.sweep import SPECS_DIR

    assert f"{len(list(SPECS_DIR.glob('*.yaml')))} shipped spec(s)" in capsys.readouterr().out
    assert main(["sweep", "--list", "no spec says this"]) == 1


def test_sweep_of_an_unknown_spec_points_to_the_list():
    from labkit.sweep import load_spec

    with pytest.raises(FileNotFoundError, match=r"--list.*e\.g\. moe_"):
        load_spec("moe_no_such_spec")
    with pytest.raises(SystemExit, match="--list"):
        main(["sweep"])


def test_sass_of_an_unknown_variant_names_the_known_ones():
    # static_report, not main(["sass", ...]): main sets TRITON_INTERPRET=0 for the whole process (compile for real),
    # which would reach the notebooks that later tests of this worker start
    from labkit.compile import static_report

    with pytest.raises(ValueError, match="unknown variant 'gemv_nope'; known: dequant_gemm"):
        static_report("gemv_nope", {}, 1, 64, 64)


def _committed(run_id: str):
    from labkit import RESULTS_DIR

    path = RESULTS_DIR / run_id
    if not (path / "meta.json").is_file():
        pytest.skip(f"committed run {run_id} is not here")
    return path


def test_table_regret_takes_a_run_id(capsys):
    """`table regret` (and every command reading points) takes a run id as well as a folder: read_runs resolves
    it, where `table regret RUN_ID` had failed with 'not a run folder' after naming the tables."""
    run = "20261129T174308-h200-linear-regret-h200"
    _committed(run)
    assert main(["table", "regret", run, "--op", "linear", "--layout", "tiled+nib"]) == 0
    out = capsys.readouterr().out
    assert "tables: kernels.tables_measured_h200.LINEAR_TABLES_TILED_NIB (what auto reads on NVIDIA H200)" in out
    assert "regret of the tiled+nib tables against the best tiled+nib config, by shape" in out
    assert "points with layout_regret above 1.05:" in out


def test_timeline_from_a_stored_run_charts_it_without_a_gpu(tmp_path, capsys):
    """`timeline --from RUN` summarizes a GPU's stored program records anywhere (README): the same summary and
    stream tables as the run's own, and a chart per point, written into that folder."""
    import shutil

    src = _committed("20261129T195308-h200-moe-timeline-decode")
    run = shutil.copytree(src, tmp_path / "run")
    for f in [*run.glob("*.html"), run / "summary.csv", run / "stream.csv"]:
        f.unlink()
    assert main(["timeline", "--from", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"written under {run}" in out and "weight stream" in out
    for name in ("summary.csv", "stream.csv"):
        assert pd.read_csv(run / name).equals(pd.read_csv(src / name)), name
    assert {p.name for p in run.glob("*.html")} == {p.name for p in src.glob("*.html")}
