"""The labkit command line."""

import json
import subprocess
import sys

from labkit.cli import main


def test_help_lists_subcommands(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    assert "info" in out and "quickstart" in out


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
