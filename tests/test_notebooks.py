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
    errors = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert list(tmp_path.glob("*.html")), "the notebook exports its charts into out_dir"
