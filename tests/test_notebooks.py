"""Every notebook in notebooks/ runs top to bottom under papermill with its CPU-safe defaults."""

import json

import pytest

from labkit import NOTEBOOKS_DIR
from labkit.notebooks import execute_notebook

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_clean_in_git(nb):
    cells = json.loads(nb.read_text())["cells"]
    assert not any(c.get("outputs") for c in cells if c["cell_type"] == "code"), "commit notebooks without outputs"
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"


@pytest.mark.slow
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(nb, tmp_path):
    out = execute_notebook(str(nb), tmp_path)
    cells = json.loads(out.read_text())["cells"]
    errors = [o for c in cells if c["cell_type"] == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert list(tmp_path.glob("*.html")), "the notebook exports its charts into out_dir"


#: the sweep notebooks on committed H100 runs too (floors, heat maps of fractions): the GPU-size path on a CPU
COMMITTED = {"02_gemv_sweep": "20261122T070939-h100-80gb-hbm3-linear_gptoss",
             "03_moe_sweep": "20261122T073433-h100-80gb-hbm3-moe_gptoss"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_sweep_notebook_charts_a_committed_gpu_run(name, tmp_path):
    from labkit import RESULTS_DIR

    if not (RESULTS_DIR / COMMITTED[name] / "meta.json").is_file():
        pytest.skip(f"committed run {COMMITTED[name]} is not here")
    out = execute_notebook(name, tmp_path, {"run_dirs": [COMMITTED[name]]})
    text = out.read_text()
    assert "fraction of floor" in text and not (tmp_path / "points.parquet").exists()  # charted, not swept
    assert len(list(tmp_path.glob("*heatmap*.html"))) >= 2


def _parameters(name: str) -> dict:
    cells = json.loads((NOTEBOOKS_DIR / f"{name}.ipynb").read_text())["cells"]
    cell = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    values: dict = {}
    exec("".join(cell["source"]), {}, values)
    return values


@pytest.mark.parametrize("name, fn, left_out", [
    ("04_model_run", "labkit.model.profile:profile_decode", {"device", "profile_steps", "nvtx", "check"}),
    ("06_divergence", "labkit.model.diverge:diverge", {"device", "tokens"}),
])
def test_model_notebooks_take_the_commands_options(name, fn, left_out):
    """04_model_run and 06_divergence set every option of `./lab model profile` / `diverge` that changes what is
    measured, so a command-line run (`--layout rows+nib`, the decode leader on Hopper; `--batch 8`, where near
    ties route tokens apart) can be repeated as a notebook."""
    import importlib
    import inspect

    module, func = fn.split(":")
    wanted = set(inspect.signature(getattr(importlib.import_module(module), func)).parameters) - left_out
    assert wanted <= set(_parameters(name))
