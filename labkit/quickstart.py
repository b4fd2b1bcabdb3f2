"""The lab's default job (the README's first command): the default batch into one new run folder.

1. 02_gemv_sweep over the `gemv_sweep` grid and 03_moe_sweep over `moe_sweep`: each measures its shipped spec
   (linear_gptoss, moe_gptoss) into the run folder once (the other grid entries resume it and find every point
   stored) and charts it. Without a GPU the specs' `cpu_*` sizes run through the Triton interpreter (a couple
   of minutes); with one, the same command sweeps full GPT-OSS sizes against measured ceilings.
2. 05_compare: per op, this run against the committed run sharing the most points with it, a run of the same
   GPU first (on a GPU running the shipped specs, its runs under results/, else the H100's). A CPU run shares
   none (interpreter sizes), so the notebook's defaults compare two committed H100 runs instead, and the job
   says so.
3. 01_roofline: datasheet H100 without a GPU; on a GPU this machine with the run's measured ceilings and points.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .notebooks import BatchResult, load_grid, run_batch
from .runs import create_run, sigint_ignored

STEPS = ("02_gemv_sweep", "03_moe_sweep", "05_compare", "01_roofline")


def compare_grid(run_dir: Path) -> tuple[list[dict], str]:
    """05_compare's parameter sets for a fresh run: one per op with a committed reference, else the defaults."""
    from .results import reference_runs

    refs = reference_runs(run_dir)
    if not refs:
        return [{}], ("no committed run shares points with this run (a CPU run measures interpreter sizes): "
                      "05_compare shows its defaults, two committed H100 runs")
    grid = [{"run_a": str(ref), "run_b": str(run_dir), "op": op} for op, ref in sorted(refs.items())]
    return grid, "comparing with " + ", ".join(f"{op}: {ref.name}" for op, ref in sorted(refs.items()))


def quickstart(out: str | Path | None = None, *, progress: bool = True) -> BatchResult:
    """Run the default batch into a new run folder (or `out`) and print where its HTML charts are; the
    result lists the executed notebooks and any that failed (the others still ran)."""
    import torch

    on_gpu = torch.cuda.is_available()
    run = create_run("quickstart", out=out, parameters={"notebooks": list(STEPS), "on_gpu": on_gpu})
    print(f"run folder: {run.path}  ({'GPU: full-size sweeps' if on_gpu else 'no GPU: interpreter-size sweeps'})")
    result = BatchResult(run.path)
    try:
        run_batch("02_gemv_sweep", load_grid("gemv_sweep"), out=run.path, progress=progress, result=result)
        run_batch("03_moe_sweep", load_grid("moe_sweep"), out=run.path, progress=progress, result=result)
        grid, note = compare_grid(run.path)
        print(note)
        run_batch("05_compare", grid, out=run.path, progress=progress, result=result)
        roofline = [{"gpu": "auto", "ceilings_from": str(run.path), "points_from": str(run.path)}] if on_gpu else [{}]
        run_batch("01_roofline", roofline, out=run.path, progress=progress, result=result)
    except KeyboardInterrupt:
        with sigint_ignored():
            print(f"\ninterrupted: the points measured so far are stored in {run.path}; "
                  f"`./lab quickstart --out {run.path}` goes on from there", file=sys.stderr, flush=True)
        raise
    run.finish()
    print("\nHTML charts (open in a browser):")
    for html in result.html():
        print(f"  {html}")
    print(f"executed notebooks: {run.path}/*.ipynb")
    if result.failures:
        print("failed notebooks:")
        for name, err in result.failures:
            print(f"  {run.path / name}: {err}")
    return result
