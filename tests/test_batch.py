"""labkit batch: grids, output names, and a batch that goes on past a failing notebook."""

import json

import pytest

from labkit.cli import main
from labkit.notebooks import load_grid, output_name


def test_grid_from_a_mapping_is_every_combination():
    assert load_grid({"m": [1, 2], "shape": ["lm_head", "qkv"]}) == [
        {"m": 1, "shape": "lm_head"}, {"m": 1, "shape": "qkv"}, {"m": 2, "shape": "lm_head"}, {"m": 2, "shape": "qkv"}]
    assert load_grid({"tile": "BLOCK_N", "m": [4]}) == [{"tile": "BLOCK_N", "m": 4}]
    assert load_grid([{"a": 1}, {"a": 2, "b": "x"}]) == [{"a": 1}, {"a": 2, "b": "x"}]
    assert load_grid(None) == [{}]
    with pytest.raises(ValueError, match="a list of parameter dicts or a mapping"):
        load_grid([1, 2])


def test_shipped_grids_and_yaml_files(tmp_path):
    assert load_grid("gemv_sweep") == [{"tile": "BLOCK_N"}, {"tile": "BLOCK_K"}]
    assert load_grid("moe_sweep") == [{"tile": "BLOCK_M"}, {"tile": "BLOCK_N"}]
    f = tmp_path / "g.yaml"
    f.write_text("- {run_a: a, run_b: b}\n- {run_a: a, run_b: c}\n")
    assert load_grid(f) == [{"run_a": "a", "run_b": "b"}, {"run_a": "a", "run_b": "c"}]
    with pytest.raises(FileNotFoundError, match="shipped grids: gemv_sweep"):
        load_grid("nope")


def test_output_names_carry_the_parameters_in_safe_characters():
    assert output_name("notebooks/02_gemv_sweep.ipynb", {"m": 1, "shape": "lm_head"}) == \
        "02_gemv_sweep__m=1__shape=lm_head.ipynb"
    assert output_name("05_compare", {"run_a": "/x/results/2026-h100-run", "routing": "hot(0.5,4)"}) == \
        "05_compare__run_a=2026-h100-run__routing=hot-0.5-4.ipynb"
    assert output_name("02_gemv_sweep", {}) == "02_gemv_sweep.ipynb"
    assert output_name("n", {"ms": [1, 2]}) == "n__ms=1+2.ipynb"
    long = output_name("n", {"p": "x" * 300})
    assert len(long) < 160 and long != output_name("n", {"p": "x" * 299})


NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "execution_count": None, "id": "p", "metadata": {"tags": ["parameters"]}, "outputs": [],
         "source": ["x = 1\n", "out_dir = \"\""]},
        {"cell_type": "code", "execution_count": None, "id": "a", "metadata": {}, "outputs": [],
         "source": ["assert x != 2, 'x is two'\n", "open(f'{out_dir}/chart_{x}.html', 'w').write('<html/>')"]},
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def _probe_batch(tmp_path):
    """`labkit batch` arguments running NOTEBOOK for x = 1, 2, 3 into tmp_path/run, and that run folder."""
    nb = tmp_path / "probe.ipynb"
    nb.write_text(json.dumps(NOTEBOOK))
    grid = tmp_path / "grid.yaml"
    grid.write_text("x: [1, 2, 3]\n")
    run = tmp_path / "run"
    return ["batch", str(nb), "--grid", str(grid), "--out", str(run), "--quiet"], run


@pytest.mark.slow
def test_batch_goes_on_past_a_failed_notebook_and_lists_it(tmp_path, capsys):
    argv, run = _probe_batch(tmp_path)
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert sorted(p.name for p in run.glob("*.ipynb")) == ["probe__x=1.ipynb", "probe__x=2.ipynb", "probe__x=3.ipynb"]
    assert sorted(p.name for p in run.glob("*.html")) == ["chart_1.html", "chart_3.html"]  # 3 ran after 2 failed
    assert "2/3 notebook(s) executed" in out and "probe__x=2.ipynb: AssertionError: x is two" in out
    meta = json.loads((run / "meta.json").read_text())
    assert meta["finished"] and meta["parameters"]["batches"][0]["grid"] == [{"x": 1}, {"x": 2}, {"x": 3}]


def test_interrupted_batch_says_how_to_go_on(tmp_path, monkeypatch, capsys):
    """^C during the second notebook: the batch names the --out that goes on, leaves its run unfinished, and
    `labkit batch` exits 130."""
    from labkit import notebooks

    def execute(src, out_dir, params, output_name):
        if params["x"] == 2:
            raise KeyboardInterrupt
        return out_dir / output_name

    monkeypatch.setattr(notebooks, "execute_notebook", execute)
    argv, run = _probe_batch(tmp_path)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert f"interrupted: probe stopped in {run}; run again with --out {run} to go on" in err
    assert not json.loads((run / "meta.json").read_text())["finished"]
