"""The lab's default job (the README's first command)."""

from __future__ import annotations

from pathlib import Path

from .notebooks import execute_notebook
from .runs import create_run


def quickstart(out: str | Path | None = None) -> Path:
    """Run the format notebook into a new run folder and print where its charts are."""
    run = create_run("quickstart", out=out, parameters={"notebooks": ["00_formats"]})
    print(f"run folder: {run.path}")
    nb = execute_notebook("00_formats", run.path, progress=True)
    run.finish()
    print(f"executed notebook: {nb}")
    for html in sorted(run.path.glob("*.html")):
        print(f"chart: {html}")
    return run.path
