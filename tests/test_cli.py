"""The labkit command line."""

import json
import subprocess
import sys

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
