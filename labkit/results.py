"""Results store: measured points of a run folder (points.parquet next to meta.json) and reading many runs.

Points are appended as they finish: each append rewrites points.parquet through a temporary file and an
atomic rename, so a run killed at any moment keeps every finished point and never a half-written file.
Schema: DESIGN.md "Results"; extra columns are allowed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

POINTS = "points.parquet"

#: Columns every point has (DESIGN.md), in order.
POINT_COLUMNS = [
    "op", "variant", "config", "m", "n", "k", "experts", "top_k", "routing", "status", "error",
    "us_graph", "us_graph_p10", "us_graph_p90", "us_eager", "bytes", "flops", "floor_us", "frac_of_floor",
    "gbps", "tflops", "max_rel_err",
]
#: Columns that identify a point: runs are compared by joining on these.
KEY_COLUMNS = ["op", "variant", "config", "m", "n", "k", "experts", "top_k", "routing"]
STATUSES = ("ok", "incorrect", "failed")
#: reference implementations measured next to the lab's kernels (not candidates for "best")
BASELINES = ("cublas_bf16", "dequant_matmul", "torch_bf16")


def config_json(config: Mapping | str | None) -> str:
    """Canonical JSON of a config (sorted keys), so equal configs compare equal as strings."""
    if config is None:
        return "{}"
    if isinstance(config, str):
        return json.dumps(json.loads(config), sort_keys=True)
    return json.dumps(dict(config), sort_keys=True)


def normalize_point(row: Mapping) -> dict:
    """A point with every schema column present (missing ones None) and config as canonical JSON."""
    out = {c: row.get(c) for c in POINT_COLUMNS}
    out.update({k: v for k, v in row.items() if k not in out})
    out["config"] = config_json(row.get("config"))
    if out["status"] not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {out['status']!r}")
    for c in ("m", "n", "k", "experts", "top_k"):
        out[c] = None if out[c] is None else int(out[c])
    return out


def point_key(row: Mapping) -> tuple:
    """The identity of a point (KEY_COLUMNS), usable as a dict key or set member."""
    vals = []
    for c in KEY_COLUMNS:
        v = row.get(c)
        if isinstance(v, float) and math.isnan(v):
            v = None
        if c == "config":
            v = config_json(v)
        elif c in ("m", "n", "k", "experts", "top_k") and v is not None:
            v = int(v)
        vals.append(v)
    return tuple(vals)


class PointStore:
    """The points of one run folder."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.path = self.dir / POINTS

    def read(self) -> pd.DataFrame:
        if not self.path.exists():
            return pd.DataFrame(columns=POINT_COLUMNS)
        return pd.read_parquet(self.path)

    def append(self, rows: Mapping | Iterable[Mapping]) -> None:
        """Add finished points; durable once this returns."""
        rows = [rows] if isinstance(rows, Mapping) else list(rows)
        if not rows:
            return
        new = pd.DataFrame([normalize_point(r) for r in rows])
        old = self.read()
        df = new if old.empty else pd.concat([old, new], ignore_index=True)
        tmp = self.path.with_name(POINTS + ".tmp")
        df.to_parquet(tmp, index=False)
        os.replace(tmp, self.path)

    def done_keys(self) -> set[tuple]:
        """Keys of points already stored (any status): a resumed sweep skips these."""
        df = self.read()
        return {point_key(r) for r in df.to_dict("records")}


def read_runs(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Points of many run folders in one DataFrame, with run_id, gpu and git_commit columns added."""
    frames = []
    for p in paths:
        p = Path(p)
        meta_path = p / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{p} is not a run folder (no meta.json)")
        meta = json.loads(meta_path.read_text())
        df = PointStore(p).read()
        df.insert(0, "run_id", p.name)
        df["gpu"] = meta.get("gpu")
        df["git_commit"] = meta.get("git_commit")
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["run_id", *POINT_COLUMNS])
    return pd.concat(frames, ignore_index=True)


def best_points(df: pd.DataFrame, by: tuple[str, ...] = ("op", "n", "k", "m", "experts", "top_k", "routing"),
                metric: str = "us_graph") -> pd.DataFrame:
    """The fastest `ok` point of the lab's own variants per problem (CUDA-graph time, or eager without a GPU)."""
    ok = df[(df["status"] == "ok") & ~df["variant"].isin(BASELINES)].copy()
    if ok.empty:
        return ok
    if ok[metric].isna().all():
        metric = "us_eager"
    by = [c for c in by if c in ok.columns]
    ok["_t"] = ok[metric]
    keyed = ok.assign(**{c: ok[c].astype(object).where(ok[c].notna(), "-") for c in by})
    idx = keyed.groupby(by, dropna=False)["_t"].idxmin()
    return ok.loc[idx.values].drop(columns="_t").sort_values([c for c in by]).reset_index(drop=True)
