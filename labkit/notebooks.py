"""Execute the lab's parameterized notebooks with papermill into a run folder."""

from __future__ import annotations

from pathlib import Path

from . import NOTEBOOKS_DIR


def notebook_path(name: str) -> Path:
    """Resolve 'notebooks/00_formats.ipynb', '00_formats.ipynb' or '00_formats' to a notebook file."""
    p = Path(name)
    if p.is_file():
        return p
    for cand in (NOTEBOOKS_DIR / name, NOTEBOOKS_DIR / f"{name}.ipynb"):
        if cand.is_file():
            return cand
    known = ", ".join(sorted(q.stem for q in NOTEBOOKS_DIR.glob("*.ipynb")))
    raise FileNotFoundError(f"no notebook {name!r}; known notebooks: {known}")


def execute_notebook(name: str, run_dir: str | Path, parameters: dict | None = None,
                     output_name: str | None = None, progress: bool = False) -> Path:
    """Run a notebook top to bottom with papermill; the executed copy lands in run_dir.

    The notebook receives `out_dir` (the run folder) so it can export its charts there.
    """
    import papermill as pm

    src = notebook_path(name)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    params = {"out_dir": str(run_dir), **(parameters or {})}
    out = run_dir / (output_name or src.name)
    pm.execute_notebook(str(src), str(out), parameters=params, kernel_name="python3",
                        progress_bar=progress, cwd=str(src.parent.resolve()))
    return out
