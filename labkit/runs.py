"""Run folders: results/<run_id>/ with meta.json (schema in DESIGN.md "Results").

A run is created before any work starts (so a killed run still says what it was) and `finish()` stamps
the end time. Measured points are stored by labkit.results next to meta.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import RESULTS_DIR
from .env import environment, git_commit

META = "meta.json"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def make_run_id(name: str, gpu: str | None) -> str:
    """<UTC time>-<gpu or 'cpu'>-<name>, e.g. 20261122T0553-h100-80gb-hbm3-gemv. CPU runs are git-ignored."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    dev = _slug(gpu.replace("NVIDIA", "")) if gpu else "cpu"
    return f"{stamp}-{dev}-{_slug(name)}"


def write_atomic(path: Path, write) -> None:
    """Make a file through write(temporary path) and a rename, so a kill never leaves half a file where a whole
    one stood (a run's meta, points and traces are rewritten as it goes)."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON through write_atomic."""
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"))


def _command_line() -> str:
    prog = Path(sys.argv[0]).name
    if prog in ("__main__.py", "-m", "-c") or prog.startswith("python"):
        prog = "labkit"
    return " ".join([prog, *sys.argv[1:]])


@dataclass
class Run:
    """One run folder and its metadata."""

    path: Path

    @property
    def meta(self) -> dict:
        return json.loads((self.path / META).read_text())

    def update_meta(self, **fields) -> None:
        meta = self.meta
        meta.update(fields)
        write_json_atomic(self.path / META, meta)

    def finish(self) -> None:
        self.update_meta(finished=_now())

    def finish_with(self, contents: str, **tables) -> None:
        """A probe's end: each DataFrame in `tables` written as <name>.csv, `contents` (what they hold) in the meta,
        then finish()."""
        for name, df in tables.items():
            df.to_csv(self.path / f"{name}.csv", index=False)
        self.update_meta(contents=contents)
        self.finish()

    def note_resume(self, what: str) -> None:
        """Record a resume in meta["resumes"]: the points measured after it ran this checkout's commit, which
        may differ from the run's git_commit."""
        self.update_meta(resumes=self.meta.get("resumes", []) + [{"git_commit": git_commit(), "at": _now(),
                                                                   "what": what}])


@contextlib.contextmanager
def sigint_ignored():
    """Inside: SIGINT is ignored (main thread only). For the words a job prints when ^C stops it, which a second
    ^C, or one signal sent to the process and to its group alike (`timeout -s INT` does both), would cut short."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:  # None: a handler not set from Python, which cannot be put back
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


def create_run(name: str, *, parameters: dict | None = None, out: str | Path | None = None,
               command: str | None = None, ceilings: dict | None = None) -> Run:
    """Create results/<run_id>/ (or `out`) with meta.json describing this machine and command."""
    env = environment()
    path = Path(out) if out else RESULTS_DIR / make_run_id(name, env["gpu"])
    path.mkdir(parents=True, exist_ok=True)
    meta = {
        "gpu": env["gpu"],
        "sm_count": env["sm_count"],
        "driver": env["driver"],
        "cuda": env["cuda"],
        "torch": env["torch"],
        "triton": env["triton"],
        "triton_mode": env["triton_mode"],
        "lab_pdl": env["lab_pdl"],
        "pdl": env["pdl"],
        **({"lab_x16_split_rows": env["lab_x16_split_rows"]} if env.get("lab_x16_split_rows") is not None else {}),
        "git_commit": git_commit(),
        "host": env["host"],
        "started": _now(),
        "finished": None,
        "ceilings": ceilings or {"read_gbps": None, "bf16_tflops": None},
        "command": command if command is not None else _command_line(),
        "parameters": parameters or {},
    }
    if (path / META).exists():  # resuming: keep the original start, refresh the rest
        old = json.loads((path / META).read_text())
        meta["started"] = old.get("started", meta["started"])
    write_json_atomic(path / META, meta)
    return Run(path)


def probe_run(name: str) -> Run | None:
    """The run folder of a device probe called as `python3 .device/<script>.py [OUT_DIR]`, made before it
    measures (a killed probe still leaves its meta.json); None when no OUT_DIR is given."""
    if len(sys.argv) < 2:
        return None
    return create_run(name, out=sys.argv[1], command=f"python3 {sys.argv[0]} {sys.argv[1]}")


def open_run(path: str | Path) -> Run:
    """An existing run folder; raises FileNotFoundError naming the path if it has no meta.json."""
    p = Path(path)
    if not (p / META).is_file():
        raise FileNotFoundError(f"{p} is not a run folder (no {META})")
    return Run(p)
