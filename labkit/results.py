"""Results store: measured points of a run folder (points.parquet next to meta.json) and reading many runs.

Points are appended as they finish: each append rewrites points.parquet through a temporary file and an
atomic rename, so a run killed at any moment keeps every finished point and never a half-written file.
Schema: DESIGN.md "Results"; extra columns are allowed.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from . import RESULTS_DIR
from .runs import write_atomic

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
BASELINES = ("cublas_bf16", "gemv_bf16", "dequant_matmul", "torch_bf16")


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


#: the scale-byte window of the sweeps' synthetic weights (labkit.bench): what a variant's scale rules judge
SWEEP_SCALES = {"scale_min": 118, "scale_max": 124}


def sweep_problem(op: str, m: int, n: int, k: int, experts: int | None = None, top_k: int | None = None) -> dict:
    """The problem dict a variant's rules judge (kernels.variants) for a sweep point: op "linear" or "moe"
    (n = 2I, k = H for a MoE layer of m tokens), with the sweeps' scale window."""
    p = {"op": op, "m": int(m), "n": int(n), "k": int(k), **SWEEP_SCALES}
    if op == "moe":
        p["tokens"] = int(m)
        p.update({key: int(v) for key, v in (("experts", experts), ("top_k", top_k)) if not _isna(v)})
    return p


def stored_problem(row: Mapping) -> dict:
    """sweep_problem of a stored point (a row of read_runs: op "linear" or "moe_layer")."""
    moe = row["op"] == "moe_layer"
    return sweep_problem("moe" if moe else "linear", row["m"], row["n"], row["k"],
                         row["experts"] if moe else None, row["top_k"] if moe else None)


def point_key(row: Mapping) -> tuple:
    """The identity of a point (KEY_COLUMNS), usable as a dict key or set member."""
    vals = []
    for c in KEY_COLUMNS:
        v = row.get(c)
        if v is pd.NA or (isinstance(v, float) and math.isnan(v)):  # NaN / pd.NA from a read frame: absent
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
        """The stored points. The file is read in one go: parquet readers given a path open it more than once
        (footer, then pages), and a sweep's append replacing it in between made them mix two files."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return pd.DataFrame(columns=POINT_COLUMNS)
        return pd.read_parquet(io.BytesIO(data))

    def append(self, rows: Mapping | Iterable[Mapping]) -> None:
        """Add finished points; durable once this returns."""
        rows = [rows] if isinstance(rows, Mapping) else list(rows)
        if not rows:
            return
        new = pd.DataFrame([normalize_point(r) for r in rows])
        old = self.read()
        df = new if old.empty else pd.concat([old, new], ignore_index=True)
        write_atomic(self.path, lambda tmp: df.to_parquet(tmp, index=False))

    def done_keys(self) -> set[tuple]:
        """Keys of points already stored (any status): a resumed sweep skips these."""
        df = self.read()
        return {point_key(r) for r in df.to_dict("records")}


#: point columns that hold whole numbers (nullable) and measurements (float), whatever a run's parquet says
INT_COLUMNS = ("m", "n", "k", "experts", "top_k")
FLOAT_COLUMNS = ("us_graph", "us_graph_p10", "us_graph_p90", "us_eager", "us_eager_p10", "us_eager_p90", "bytes",
                 "flops", "floor_us", "frac_of_floor", "gbps", "tflops", "max_rel_err")


def _tidy_dtypes(df: pd.DataFrame) -> pd.DataFrame:
    """One dtype per column across runs: a run whose points mix None and numbers (a decode step has no n/k;
    a CPU run has no floor) stores them as objects, which neither DuckDB nor plotting can take."""
    for c in df.columns:
        if c in INT_COLUMNS:
            df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
        elif c in FLOAT_COLUMNS:
            df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
        elif df[c].dtype == object:
            vals = df[c].dropna()
            if len(vals) and all(isinstance(v, bool) for v in vals):
                df[c] = df[c].astype("boolean")
            elif len(vals) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def resolve_run(run: str | Path) -> Path:
    """A run folder from a path or a run id under results/ (so notebooks and commands accept either)."""
    p = Path(run)
    if (p / "meta.json").is_file():
        return p
    for q in (RESULTS_DIR / str(run), RESULTS_DIR.parent / str(run)):  # a run id, or a path from the repo root
        if (q / "meta.json").is_file():
            return q
    raise FileNotFoundError(f"{run} is not a run folder (no meta.json there nor under {RESULTS_DIR})")


def run_meta(run: str | Path) -> dict:
    """A run's meta.json (run: a folder or a run id, as resolve_run takes)."""
    return json.loads((resolve_run(run) / "meta.json").read_text())


def find_runs(root: str | Path | None = None) -> list[Path]:
    """Run folders (those holding meta.json) directly under root (default results/), oldest first by name."""
    root = Path(root) if root else RESULTS_DIR
    return sorted(p for p in root.iterdir() if (p / "meta.json").is_file()) if root.is_dir() else []


def read_runs(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Points of many run folders (paths or run ids, as resolve_run takes) in one DataFrame, with run_id, gpu
    and git_commit columns added."""
    frames = []
    for p in paths:
        p = resolve_run(p)
        meta = json.loads((p / "meta.json").read_text())
        df = PointStore(p).read()
        df.insert(0, "run_id", p.name)
        df["gpu"] = meta.get("gpu")
        df["git_commit"] = meta.get("git_commit")
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["run_id", *POINT_COLUMNS])
    frames = [f for f in frames if len(f)] or frames[:1]  # an empty run adds no rows, only all-NA dtypes
    return _tidy_dtypes(pd.concat(frames, ignore_index=True))


def lossy(variant: str) -> bool:
    """Whether a variant trades accuracy for speed (it quantizes the activations: w4a8, w4a8_fp8). The auto
    tables and the speed targets leave such variants out (the lab's kernels are judged at bf16 accuracy);
    `best` shows them with their error."""
    from kernels import VARIANTS

    v = VARIANTS.get(variant)
    return bool(v is not None and v.extra.get("lossy_activations"))


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


# ---- many runs: listing, SQL, best per point, comparing two runs -------------------------------------------

#: the reference each op's best variant is judged against in `best_table`
BASELINE_FOR_OP = {"linear": "cublas_bf16", "moe_layer": "torch_bf16"}
#: columns joined on besides KEY_COLUMNS when both runs have them (see compare_runs)
COMPARE_EXTRA_KEYS = ("shape", "model", "bias")
#: least relative change of the medians that counts as a result (see compare_runs)
MIN_BAND = 0.03
#: list_runs' `wide`: a point whose median is more than this above its p10
WIDE = 0.05


def list_runs(root: str | Path | Iterable[str | Path] | None = None) -> pd.DataFrame:
    """One row per run folder (under root, default results/, or the given folders): GPU, start time, commit,
    how many points and how many of them are ok / incorrect / failed, which ops they measure, and two signs of how
    far its times can be trusted: `wake_ratio` (its ceilings' check that the spin kernel ahead of each timed call
    outlasts the GPU's wake-up, labkit.hardware.wake_ratio; empty for runs before it existed) and `wide` (ok
    CUDA-graph points whose median is more than WIDE above their p10: replays in two modes, such as a cold GPU or a
    power cap)."""
    paths = find_runs(root) if root is None or isinstance(root, (str, Path)) else [Path(p) for p in root]
    rows = []
    for p in paths:
        meta = run_meta(p)
        pts = PointStore(p).read()
        status = pts["status"].value_counts() if len(pts) else pd.Series(dtype=int)
        ops = pts["op"].value_counts() if len(pts) else pd.Series(dtype=int)
        wide = 0
        if len(pts) and {"us_graph", "us_graph_p10"} <= set(pts.columns):
            ok = pts[pts["status"] == "ok"].dropna(subset=["us_graph", "us_graph_p10"])
            wide = int((ok["us_graph"] > (1 + WIDE) * ok["us_graph_p10"]).sum())
        wake = (meta.get("ceilings") or {}).get("wake_ratio")
        rows.append({
            "run_id": p.name, "gpu": meta.get("gpu") or "cpu", "started": meta.get("started"),
            "finished": bool(meta.get("finished")), "git_commit": (meta.get("git_commit") or "")[:10],
            "points": len(pts), **{s: int(status.get(s, 0)) for s in STATUSES},
            "wake_ratio": round(float(wake), 3) if wake is not None else None, "wide": wide,
            "ops": ", ".join(f"{op} {n}" for op, n in ops.items()), "path": str(p)})
    cols = ["run_id", "gpu", "started", "finished", "git_commit", "points", *STATUSES, "wake_ratio", "wide", "ops",
            "path"]
    return pd.DataFrame(rows, columns=cols)


def query(sql: str, runs: Iterable[str | Path] | None = None) -> pd.DataFrame:
    """Run SQL (DuckDB, in process) over the points of `runs` (default: every run under results/).

    Views: `points` (read_runs: one row per point, with run_id, gpu, git_commit) and `runs` (list_runs).
    """
    import duckdb

    paths = find_runs() if runs is None else [resolve_run(r) for r in runs]
    con = duckdb.connect()
    try:
        views = {"points": read_runs(paths), "runs": list_runs(paths)}
        for name, df in views.items():
            con.register(name, df)
        try:
            return con.execute(sql).df()
        except duckdb.Error as e:  # a message, not a traceback: a wrong column is the usual slip
            cols = "; ".join(f"{name}: {', '.join(map(str, df.columns))}" for name, df in views.items())
            raise ValueError(f"{e}\ncolumns of the views ({cols})") from None
    finally:
        con.close()


def off_defaults(config: Mapping, variant: str) -> dict:
    """What a config sets away from its variant's registered defaults (all of it for a variant not registered,
    such as a baseline): a tensor-core config is ~25 options, most at their defaults."""
    from kernels import VARIANTS

    defaults = VARIANTS[variant].defaults if variant in VARIANTS else {}
    return {k: v for k, v in config.items() if k not in defaults or defaults[k] != v}


def short_config(config: str | Mapping | None, variant: str | None = None) -> str:
    """A config as 'N=64 K=128 warps=4' (BLOCK_ dropped) for tables and chart labels. Given its variant, only what
    differs from that variant's defaults (off_defaults; 'defaults' if nothing does)."""
    cfg = json.loads(config) if isinstance(config, str) else dict(config or {})
    if variant is not None and cfg:
        cfg = off_defaults(cfg, variant)
        if not cfg:
            return "defaults"
    names = {"num_warps": "warps", "num_stages": "stages"}
    return " ".join(f"{names.get(k, k.removeprefix('BLOCK_'))}={v}" for k, v in sorted(cfg.items())) or "-"


def _time_column(df: pd.DataFrame) -> str:
    return "us_graph" if "us_graph" in df.columns and df["us_graph"].notna().any() else "us_eager"


def best_table(df: pd.DataFrame) -> pd.DataFrame:
    """The fastest correct variant/config per point (best_points) beside its op's baseline (BASELINE_FOR_OP:
    cuBLAS bf16 for linear, torch bf16 for moe_layer), `vs_baseline` = baseline time / best time."""
    best = best_points(df)
    if best.empty:
        return best
    t = _time_column(best)
    ok = df[df["status"] == "ok"]
    base = {}
    for r in ok[ok["variant"].isin(BASELINE_FOR_OP.values())].to_dict("records"):
        if BASELINE_FOR_OP.get(r["op"]) == r["variant"]:
            base[point_key({**r, "variant": None, "config": None})] = r[t]
    rows = []
    for r in best.to_dict("records"):
        b = base.get(point_key({**r, "variant": None, "config": None}))
        where = r.get("shape") if r["op"] == "linear" else r.get("model")
        rows.append({"op": r["op"], "problem": None if pd.isna(where) else where, "routing": r.get("routing"),
                     "m": r["m"], "n": r["n"], "k": r["k"], "best": r["variant"], t: r[t],
                     "frac_of_floor": r.get("frac_of_floor"), "max_rel_err": r.get("max_rel_err"),
                     "baseline": BASELINE_FOR_OP.get(r["op"]),
                     "vs_baseline": None if b is None or pd.isna(b) else b / r[t],
                     "config": short_config(r["config"], r["variant"])})
    out = pd.DataFrame(rows)
    empty = [c for c in ("problem", "routing", "frac_of_floor", "max_rel_err", "vs_baseline") if out[c].isna().all()]
    return out.drop(columns=empty)


def vs_routing(best: pd.DataFrame, routing: str) -> pd.DataFrame:
    """best_table's MoE rows with `vs_<routing>`: each point's best time over the best time under `routing` at
    the same model and token count (e.g. 1.31 for uniform against balanced: what the routing costs the layer);
    NaN where the run has no such point."""
    if "routing" not in best.columns or routing not in set(best["routing"].dropna()):
        have = sorted(set(best["routing"].dropna())) if "routing" in best.columns else []
        raise ValueError(f"the run has no MoE points under routing {routing!r} (it has: {', '.join(have) or 'none'})")
    t = _time_column(best)
    ref = best[best["routing"] == routing].set_index(["problem", "m"])[t]
    ratio = [t_ / ref[k] if k in ref.index else float("nan") for t_, k in zip(best[t], zip(best["problem"], best["m"]))]
    out = best.copy()
    out.insert(list(out.columns).index("config") if "config" in out.columns else len(out.columns), f"vs_{routing}",
               ratio)
    return out


def time_band(df: pd.DataFrame, graph: pd.Series) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(median, p10, p90) per point: CUDA-graph time where `graph` (e.g. where both compared runs have it), else
    eager; a missing percentile counts as no spread."""
    def col(name):
        return df[name] if name in df.columns else pd.Series(float("nan"), index=df.index)

    med = col("us_graph").where(graph, col("us_eager"))
    p10 = col("us_graph_p10").where(graph, col("us_eager_p10")).fillna(med)
    p90 = col("us_graph_p90").where(graph, col("us_eager_p90")).fillna(med)
    return med, p10, p90


def band_verdict(a_us, a_p10, a_p90, b_us, b_p10, b_p90, min_band: float = MIN_BAND):
    """DESIGN.md's noise rule for B against A (scalars or Series): "win" where B's p10-p90 band lies below A's
    and its median is more than min_band faster, "loss" the other way round, else "noise"."""
    ratio = b_us / a_us
    win = (b_p90 / a_p10 < 1) & (ratio < 1 - min_band)
    loss = (b_p10 / a_p90 > 1) & (ratio > 1 + min_band)
    out = np.select([np.asarray(win, bool), np.asarray(loss, bool)], ["win", "loss"], "noise")
    return pd.Series(out, index=ratio.index) if isinstance(ratio, pd.Series) else str(out)


def compare_runs(a, b, *, min_band: float = MIN_BAND) -> pd.DataFrame:
    """Per-point ratio of two runs (B over A: `ratio` = time_b / time_a, below 1 means B is faster).

    a, b: run folders (path or run id) or DataFrames of points. Points are joined on KEY_COLUMNS, which are
    unique within a run (the sweep skips stored keys; it refuses two linear shapes with the same [N, K], and
    a MoE model is fixed by experts, n = 2*intermediate and k = hidden), plus `shape`, `model` and `bias`
    where both runs have them, so a renamed shape or a bias/no-bias run never pairs up by accident.
    Time is CUDA-graph (us_graph) where both runs have it, else eager (`metric` says which).

    Noise: each run's p10-p90 band of that time. `ratio_lo` = b_p10 / a_p90 and `ratio_hi` = b_p90 / a_p10
    bound the ratio over both bands; a `win` needs the bands apart (ratio_hi < 1) and the medians more than
    `min_band` apart, a `loss` the same the other way; everything else is `noise`, and a point not ok in
    either run is `n/a`. min_band covers drift between runs that replays within one run cannot show (two
    H100 runs of mostly unchanged linear kernels: median |ratio - 1| 0.7%, 90th percentile 2.3%).
    Where both runs recorded the SM clock (labkit.clocks), `clock_ratio` = B's mean SM clock over A's: a win
    or loss beside a clock ratio away from 1 may be the GPU's power state, not the code.
    """
    da = a if isinstance(a, pd.DataFrame) else read_runs([a])
    db = b if isinstance(b, pd.DataFrame) else read_runs([b])
    extra = [c for c in COMPARE_EXTRA_KEYS if c in da.columns and c in db.columns]
    keyed = []
    for name, d in (("A", da), ("B", db)):
        d = d.reset_index(drop=True)
        key = pd.Series([repr(point_key(r) + tuple(None if _isna(r.get(c)) else r.get(c) for c in extra))
                         for r in d.to_dict("records")], index=d.index, dtype=object)
        if key.duplicated().any():
            raise ValueError(f"run {name} has {int(key.duplicated().sum())} points with the same key; "
                             "compare one run against one run")
        keyed.append(d.assign(_key=key))
    ka, kb = keyed
    j = ka.merge(kb, on="_key", suffixes=("_a", "_b"))
    out = pd.DataFrame({c: j[f"{c}_a"] for c in [*KEY_COLUMNS, *extra]})
    out["status_a"], out["status_b"] = j["status_a"], j["status_b"]
    graph = j["us_graph_a"].notna() & j["us_graph_b"].notna() if "us_graph_a" in j else pd.Series(False, j.index)
    out["metric"] = graph.map({True: "us_graph", False: "us_eager"})
    for side in ("a", "b"):
        cols = {c.removesuffix(f"_{side}"): j[c] for c in j.columns if c.endswith(f"_{side}")}
        med, p10, p90 = time_band(pd.DataFrame(cols), graph)
        out[f"{side}_us"], out[f"{side}_p10"], out[f"{side}_p90"] = med, p10, p90
    ok = (out["status_a"] == "ok") & (out["status_b"] == "ok") & (out["a_us"] > 0) & (out["b_us"] > 0)
    out["ratio"] = (out["b_us"] / out["a_us"]).where(ok)
    out["ratio_lo"] = (out["b_p10"] / out["a_p90"]).where(ok)
    out["ratio_hi"] = (out["b_p90"] / out["a_p10"]).where(ok)
    out["verdict"] = band_verdict(out["a_us"], out["a_p10"], out["a_p90"], out["b_us"], out["b_p10"], out["b_p90"],
                                  min_band)
    out.loc[~ok, "verdict"] = "n/a"
    if "sm_mhz_a" in j and "sm_mhz_b" in j:  # labkit.clocks: a power-capped GPU can make a win or a loss
        out["clock_ratio"] = (j["sm_mhz_b"] / j["sm_mhz_a"]).where(ok)
    out = out.sort_values(["op", *[c for c in ("shape", "model") if c in out], "routing", "m", "variant"],
                          na_position="first", kind="stable").reset_index(drop=True)
    out.attrs.update(only_a=len(ka) - len(j), only_b=len(kb) - len(j), min_band=min_band,
                     run_a=_run_label(da), run_b=_run_label(db))
    return out


def _isna(v) -> bool:
    return v is None or (not isinstance(v, (str, dict, list, tuple)) and bool(pd.isna(v)))


def _run_label(df: pd.DataFrame) -> str:
    ids = df["run_id"].dropna().unique().tolist() if "run_id" in df.columns else []
    return ", ".join(map(str, ids)) or "points"


def compare_summary(cmp: pd.DataFrame) -> str:
    """One line: how many points joined, wins/losses/noise, and the geometric mean ratio."""
    import numpy as np

    counts = cmp["verdict"].value_counts()
    r = cmp["ratio"].dropna()
    geo = float(np.exp(np.log(r).mean())) if len(r) else float("nan")
    return (f"{len(cmp)} points in both runs (only in A: {cmp.attrs.get('only_a', 0)}, only in B: "
            f"{cmp.attrs.get('only_b', 0)}); {counts.get('win', 0)} wins, {counts.get('loss', 0)} losses, "
            f"{counts.get('noise', 0)} within noise, {counts.get('n/a', 0)} not ok in a run; "
            f"geometric mean ratio B/A {geo:.3f} (band: p10-p90 of each run, at least "
            f"{cmp.attrs.get('min_band', MIN_BAND):.0%}){_clock_note(cmp)}")


def _clock_note(cmp: pd.DataFrame, tol: float = 0.02) -> str:
    """"; N of the wins and losses ran at SM clocks more than 2% apart" where that happened, else ""."""
    if "clock_ratio" not in cmp.columns:
        return ""
    decided = cmp["verdict"].isin(["win", "loss"])
    apart = decided & ((cmp["clock_ratio"] - 1).abs() > tol)
    if not apart.any():
        return ""
    return (f"; {int(apart.sum())} of the {int(decided.sum())} wins and losses ran at SM clocks more than "
            f"{tol:.0%} apart (clock_ratio: the GPU's power state may explain them)")


def compare_by(cmp: pd.DataFrame, by: str | list[str] = "variant") -> pd.DataFrame:
    """Verdict counts and the geometric mean ratio per group (default per variant) of a comparison."""
    import numpy as np

    by = [by] if isinstance(by, str) else list(by)
    g = cmp.assign(log_ratio=np.log(cmp["ratio"]))
    out = g.groupby(by, dropna=False).agg(points=("verdict", "size"), wins=("verdict", lambda v: (v == "win").sum()),
                                          losses=("verdict", lambda v: (v == "loss").sum()),
                                          noise=("verdict", lambda v: (v == "noise").sum()),
                                          geomean_ratio=("log_ratio", "mean"))
    out["geomean_ratio"] = np.exp(out["geomean_ratio"])
    return out.reset_index()


def reference_runs(run: str | Path, candidates: Iterable[str | Path] | None = None) -> dict[str, Path]:
    """For each op of `run`, the other run folder (default: every run under results/) sharing the most ok
    point keys with it, a run of the same GPU before any other (times of two GPUs differ by more than any
    change): what a fresh run is best compared against. Ops no other run shares are left out."""
    run = resolve_run(run)
    gpu = run_meta(run).get("gpu")
    mine = PointStore(run).read()
    mine = mine[mine["status"] == "ok"]
    keys = {op: {point_key(r) for r in g.to_dict("records")} for op, g in mine.groupby("op")}
    best: dict[str, tuple[tuple[bool, int], Path]] = {}
    for p in (find_runs() if candidates is None else [resolve_run(c) for c in candidates]):
        if p.resolve() == run.resolve():
            continue
        pts = PointStore(p).read()
        pts = pts[pts["status"] == "ok"]
        same = run_meta(p).get("gpu") == gpu
        for op, g in pts[pts["op"].isin(list(keys))].groupby("op"):
            n = len(keys[op] & {point_key(r) for r in g.to_dict("records")})
            if n and (same, n) > best.get(op, ((False, 0), None))[0]:
                best[op] = ((same, n), p)
    return {op: p for op, (_, p) in best.items()}
