"""Everything around the kernels: hardware, rooflines, timing, sweeps, results, model runs, plots, CLI."""

from pathlib import Path

#: Repository root (where notebooks/ and results/ live when running from a checkout).
REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "results"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
