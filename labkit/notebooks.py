"""Execute the lab's parameterized notebooks with papermill into a run folder."""

from __future__ import annotations

import sys
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
    params = {"out_dir": str(run_dir.resolve()), **(parameters or {})}  # the notebook runs in notebooks/
    out = run_dir / (output_name or src.name)
    pm.execute_notebook(str(src), str(out), parameters=params, kernel_name="python3",
                        progress_bar=progress, cwd=str(src.parent.resolve()))
    return out


# ---- batches: one notebook over a grid of parameter sets ---------------------------------------------------

GRIDS_DIR = Path(__file__).parent / "grids"


def load_grid(grid) -> list[dict]:
    """Parameter sets from a grid: a list of dicts (taken as is) or a mapping param -> value or list of values
    (every combination, in the mapping's order). `grid` is such an object, a YAML file, or the name of a
    shipped grid (labkit/grids/<name>.yaml)."""
    import itertools

    import yaml

    if isinstance(grid, (str, Path)):
        p = Path(grid)
        if not p.is_file():
            p = GRIDS_DIR / f"{grid}.yaml"
        if not p.is_file():
            known = ", ".join(sorted(q.stem for q in GRIDS_DIR.glob("*.yaml")))
            raise FileNotFoundError(f"no grid {str(grid)!r}; shipped grids: {known}")
        grid = yaml.safe_load(p.read_text())
    if grid is None:
        return [{}]
    if isinstance(grid, dict):
        keys = list(grid)
        vals = [v if isinstance(v, list) else [v] for v in grid.values()]
        return [dict(zip(keys, combo)) for combo in itertools.product(*vals)]
    if isinstance(grid, list) and all(isinstance(g, dict) for g in grid):
        return [dict(g) for g in grid] or [{}]
    raise ValueError("a grid is a list of parameter dicts or a mapping param -> list of values, "
                     f"got {type(grid).__name__}")


def output_name(notebook: str | Path, params: dict) -> str:
    """Executed notebook's file name carrying its parameters, e.g. 02_gemv_sweep__m=1__shape=lm_head.ipynb
    (only letters, digits and . _ + - = ; a path by its last part; very long names end in a hash)."""
    import hashlib
    import re

    def safe(v) -> str:
        v = "+".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
        v = Path(v).name if "/" in v else v  # a run folder by its name, not its whole path
        return re.sub(r"[^A-Za-z0-9._+-]+", "-", v).strip("-")

    stem = Path(notebook).stem
    parts = [stem, *(f"{safe(k)}={safe(v)}" for k, v in params.items())]
    name = "__".join(parts)
    if len(name) > 150:
        digest = hashlib.sha1(repr(sorted(params.items())).encode()).hexdigest()[:10]
        name = f"{name[:130]}__{digest}"
    return name + ".ipynb"


class BatchResult:
    """What a batch did: the run folder, the executed notebooks and the failures (output name, error)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.outputs: list[Path] = []
        self.failures: list[tuple[str, str]] = []

    def html(self) -> list[Path]:
        return sorted(self.run_dir.glob("*.html"))


def _error_text(e: Exception) -> str:
    ename, evalue = getattr(e, "ename", None), getattr(e, "evalue", None)
    if ename:  # papermill's PapermillExecutionError: the failing cell's exception
        return f"{ename}: {evalue} (cell {getattr(e, 'exec_count', '?')})"
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def run_batch(notebook: str, grid: list[dict], *, out: str | Path | None = None, progress: bool = True,
              result: BatchResult | None = None) -> BatchResult:
    """Execute `notebook` once per parameter set into one run folder (`out`, else a new results/<run_id>).

    Each execution gets out_dir = the run folder and writes <notebook>__<param>=<value>....ipynb there. A
    notebook that fails is kept (papermill saves it up to the failing cell) and listed at the end; the
    batch goes on with the next parameter set.
    """
    from tqdm import tqdm

    from .runs import create_run, open_run, sigint_ignored

    src = notebook_path(notebook)
    params = {"notebook": src.stem, "grid": grid}
    if out and (Path(out) / "meta.json").is_file():
        run = open_run(out)
        old = run.meta.get("parameters", {})
        run.update_meta(parameters={**old, "batches": [*old.get("batches", []), params]})
    else:
        run = create_run(f"batch-{src.stem}", out=out, parameters={"batches": [params]})
    result = result or BatchResult(run.path)
    print(f"run folder: {run.path}\n{src.name}: {len(grid)} parameter set(s)", flush=True)
    names = []
    for p in grid:
        name = output_name(src, p)
        while name in names:  # two sets that print alike still get their own file
            name = name.removesuffix(".ipynb") + "_.ipynb"
        names.append(name)
    bar = tqdm(list(zip(grid, names)), disable=not progress, unit="nb", dynamic_ncols=True)
    try:
        for p, name in bar:
            bar.set_postfix_str(name, refresh=True)
            try:
                result.outputs.append(execute_notebook(str(src), run.path, p, output_name=name))
            except Exception as e:  # noqa: BLE001 - one failing notebook must not stop the batch
                result.failures.append((name, _error_text(e)))
                bar.write(f"FAILED {name}: {_error_text(e)}")
    except KeyboardInterrupt:
        with sigint_ignored():
            bar.close()
            print(f"\ninterrupted: {src.stem} stopped in {run.path}; run again with --out {run.path} to go on "
                  "(the points its sweeps stored are not measured again)", file=sys.stderr, flush=True)
        raise
    bar.close()
    run.finish()
    ok = len(grid) - sum(1 for n, _ in result.failures if n in names)
    print(f"{ok}/{len(grid)} notebook(s) executed into {run.path}")
    if result.failures:
        print("failed:")
        for name, err in result.failures:
            print(f"  {run.path / name}: {err}")
    return result
