"""Derive the host-side `variant="auto"` tables from a measured run, report their regret, write them to the package.

A table maps token-count buckets to one (variant, config); the bucket of a measured count m covers the
counts above the previous measured count up to m. Auto knows on the host the token count and the weight
shapes (not the routing), so there is one table per measured problem shape, keyed (N, K) for linears and
(experts, 2I, H) for MoE (rows: the fastest config at each count, MoE under the `uniform` routing), plus a
"default" table for shapes never measured: at each count, the candidate measured on every problem with the
smallest worst-case regret.

Every function taking a run also takes a list of runs: a focused sweep (say 1-64 tokens with a new decode
variant) then refines a broad one without remeasuring it.

There is one table set per weight layout (kernels.prepare): "rows" tables pick among configs that read the
row-major weight, "tiled" tables among the TILED configs that read tile_mxfp4's copy. A weight is held in one
layout, so a table never mixes them; NIB configs (shuffle_nibbles' copy) are in neither.

Regret of a table on a run: for every measured problem, the time of the config auto picks there over the
best time measured for that problem in either layout (1.0 = auto is the best; NaN = auto's pick was not
measured there). The rows tables' regret thus shows what the tiled layout would buy, and the reverse.
"""

from __future__ import annotations

import json
import math
import pprint
from pathlib import Path

import pandas as pd

from kernels.prepare import HELD_LAYOUTS

from .results import BASELINES, band_verdict, lossy, read_runs, stored_problem, time_band

TABLES_MODULE = Path(__file__).resolve().parent.parent / "kernels" / "tables_measured.py"


def tables_path(gpu: str | None = None) -> Path:
    """Where a table set lives: the default set, or GPU `gpu`'s own (a labkit.hardware key, e.g. h200)."""
    return TABLES_MODULE if not gpu else TABLES_MODULE.with_name(f"tables_measured_{gpu.lower()}.py")


def table_set(gpu: str | None = None):
    """The table set as a module (its *_TABLES dicts and SOURCES): the default one, or GPU `gpu`'s own; a GPU
    without a set yet gives an empty one."""
    import importlib
    from types import SimpleNamespace

    if not gpu:
        return importlib.import_module("kernels.tables_measured")
    if not tables_path(gpu).is_file():
        return SimpleNamespace(SOURCES={})
    return importlib.import_module(f"kernels.{tables_path(gpu).stem}")


def _problem_cols(op: str) -> list[str]:
    return ["shape", "n", "k"] if op == "linear" else ["model", "experts", "routing"]


def runnable(variant: str, config: str, problem: dict | None = None) -> bool:
    """Whether this checkout can still run a stored (variant, config): the variant is registered and knows
    every parameter set on (runs keep configs of options measured and later removed, e.g. L2_PREFETCH). A
    parameter it no longer knows, stored off (None, False or 0: a removed option's default), is the config
    without it: the runs between an option's adding and removal store it so in every other config. Given the
    point's problem (results.stored_problem), the variant's rules must also admit the config there: a removed
    combination of kept options (NOBAR on the cp.async ring) is no longer runnable either."""
    from kernels import VARIANTS

    v = VARIANTS.get(variant)
    on = {k for k, val in json.loads(config).items() if not _off(val)}
    if v is None or on - set(v.space) - set(v.defaults):
        return False
    return problem is None or v.reason(full_config(variant, config), problem) is None


def runnable_points(df: pd.DataFrame) -> list[bool]:
    """runnable for each stored point of df (a read_runs frame), judged at the point's own problem (a linear's or
    a MoE layer's with its m, n and k; other points by their options alone). Each distinct point is judged once:
    the committed runs hold ~80k points of ~7k configs."""
    cols = ["variant", "config", "op", "m", "n", "k", "experts", "top_k"]
    points = df.reindex(columns=cols)
    distinct = points.drop_duplicates()
    ok = []
    for r in distinct.to_dict("records"):
        whole = r["op"] in ("linear", "moe_layer") and not any(pd.isna(r[c]) for c in ("m", "n", "k"))
        ok.append(runnable(r["variant"], r["config"], stored_problem(r) if whole else None))
    judged = points.merge(distinct.assign(_ok=ok), on=cols, how="left")["_ok"]
    return judged.astype(bool).tolist()


def _off(value) -> bool:
    """A stored option value that runs what its absence runs: None, False or 0."""
    return value is None or value is False or value == 0


TABLE_NAMES = {(op, layout): f"{op.upper()}_TABLES" + ("_TILED" if layout.startswith("tiled") else "")
               + ("_NIB" if layout.endswith("+nib") else "") for op in ("linear", "moe") for layout in HELD_LAYOUTS}


def config_layout(config: str) -> str:
    """The weight layout a stored config reads: "tiled" (TILED=True: tile_mxfp4's copy) or "rows", with
    "+nib" when it reads shuffle_nibbles' copy of that (NIB=True). Holding two copies is not an option auto
    may take (gpt-oss-120b's experts alone are ~57 GB of an 80 GB H100), so each layout has its own tables
    and picks only its own configs (a shuffled weight reads its "+nib" tables, kernels.tables)."""
    c = json.loads(config)
    return ("tiled" if c.get("TILED") else "rows") + ("+nib" if c.get("NIB") else "")


#: options auto never takes: STEP_MAJOR reads a second copy of the weights (prepare.step_major, made on first use),
#: ATOMIC adds mlp2's rows in whatever order they land, so the last bits vary from run to run (SPLITK2 without it
#: stores its slices apart and the combine sums them in order: auto may take that)
OPT_IN = ("STEP_MAJOR", "ATOMIC")


def opt_in(config: str) -> bool:
    """Whether a stored config uses an option only a user's explicit config may take (OPT_IN)."""
    c = json.loads(config)
    return any(c.get(k) for k in OPT_IN)


def _points(runs, op: str, layout: str | None = None, with_opt_in: bool = False) -> pd.DataFrame:
    """ok, non-baseline points of op from one run folder or a list of them (a config measured in several
    runs keeps each measurement; the fastest counts), limited to configs this checkout can run (layout: and
    that read that weight layout) of variants at bf16 accuracy (auto never picks a lossy one: results.lossy) and
    without OPT_IN options (unless with_opt_in)."""
    if layout is not None and layout not in HELD_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(HELD_LAYOUTS)}, got {layout!r}")
    df = read_runs(list(runs) if isinstance(runs, (list, tuple)) else [runs])
    point_op = "linear" if op == "linear" else "moe_layer"
    df = df[(df["op"] == point_op) & (df["status"] == "ok") & ~df["variant"].isin(BASELINES)].copy()
    df = df[[ok and not lossy(v) and (with_opt_in or not opt_in(c)) and layout in (None, config_layout(c))
             for ok, v, c in zip(runnable_points(df), df["variant"], df["config"])]]
    if df.empty:
        raise ValueError(f"{runs} has no ok {point_op} points" + (f" in the {layout} layout" if layout else ""))
    df["t"], df["t_p10"], df["t_p90"] = time_band(df, df["us_graph"].notna())  # t and its band (the noise rule)
    if "shape" not in df.columns:
        df["shape"] = ""
    if "model" not in df.columns:
        df["model"] = ""
    return df


def shape_key(op: str, row) -> tuple:
    """The host-known shape a table is keyed by: (N, K) for a linear, (experts, 2I, H) for a MoE layer."""
    return (int(row["n"]), int(row["k"])) if op == "linear" else (int(row["experts"]), int(row["n"]), int(row["k"]))


def derive_tables(run_dir, op: str = "linear", routing: str = "uniform", layout: str = "rows") -> dict:
    """{"default": rows, shape key: rows} for `op` ('linear' or 'moe') and weight `layout` (HELD_LAYOUTS);
    MoE rows come from `routing` points."""
    df = _points(run_dir, op, layout)
    if op == "moe":
        df = df[df["routing"] == routing]
    tables = {"default": derive_table(run_dir, op, routing, layout)}
    for _, g in df.groupby(["n", "k"] if op == "linear" else ["experts", "n", "k"]):
        best = g.loc[g.groupby("m")["t"].idxmin()].sort_values("m")
        ms = list(best["m"])
        tables[shape_key(op, best.iloc[0])] = [
            (int(m) if i < len(ms) - 1 else (1 << 62), r["variant"], json.loads(r["config"]))
            for i, (m, (_, r)) in enumerate(zip(ms, best.iterrows()))]
    return tables


def pick(tables: dict, op: str, problem_row) -> tuple[str, dict]:
    """The (variant, config) a keyed table set gives for a problem (shape key first, then default)."""
    rows = tables.get(shape_key(op, problem_row), tables["default"])
    row = next((r for r in rows if problem_row["m"] <= r[0]), rows[-1])
    return row[1], row[2]


def derive_table(run_dir, op: str = "linear", routing: str = "uniform", layout: str = "rows"
                 ) -> list[tuple[int, str, dict]]:
    """The shape-agnostic [(max_m, variant, config)] for `op` and `layout` from a run (MoE rows from `routing`
    points)."""
    df = _points(run_dir, op, layout)
    if op == "moe":
        df = df[df["routing"] == routing]
        if df.empty:
            raise ValueError(f"{run_dir} has no MoE points with routing {routing!r}")
    pcols = _problem_cols(op)
    df["best"] = df.groupby(pcols + ["m"])["t"].transform("min")
    df["regret"] = df["t"] / df["best"]
    rows = []
    ms = sorted(df["m"].unique())
    for i, m in enumerate(ms):
        at = df[df["m"] == m]
        n_problems = at.groupby(pcols).ngroups
        cand = at.groupby(["variant", "config"]).agg(worst=("regret", "max"), mean=("regret", "mean"),
                                                      problems=("regret", "size")).reset_index()
        cand = cand[cand["problems"] == n_problems].sort_values(["worst", "mean"])
        if cand.empty:
            continue
        top = cand.iloc[0]
        max_m = int(m) if i < len(ms) - 1 else (1 << 62)
        rows.append((max_m, top["variant"], json.loads(top["config"])))
    return rows


def regret(run_dir, tables: dict, op: str = "linear", layout: str | None = None) -> pd.DataFrame:
    """Per measured problem: auto's pick from `tables` and its time over the best time of that problem (any
    layout: what holding the weights in the tables' layout costs, picks included); with `layout`, also over the
    best config that reads that layout (layout_regret: how well the tables pick within it) and `layout_verdict`,
    DESIGN.md's noise rule for that pair ("loss": auto's p10-p90 band lies above the best's and its median is more
    than 3% slower; "noise": a tie within the spread of the replays)."""
    df = _points(run_dir, op)
    pcols = _problem_cols(op)
    out = []
    for key, g in df.groupby(pcols + ["m"]):
        variant, cfg_d = pick(tables, op, g.iloc[0])
        cfg = json.dumps(cfg_d, sort_keys=True)
        picked = g[(g["variant"] == variant)
                   & g["config"].map(lambda c, want=cfg_d, v=variant: _same_config(v, c, want))]
        best = g["t"].min()
        out.append({**dict(zip(pcols + ["m"], key)), "auto_variant": variant, "auto_config": cfg,
                    "best_variant": g.loc[g["t"].idxmin(), "variant"], "best_us": best,
                    "auto_us": picked["t"].min() if len(picked) else math.nan,
                    "regret": picked["t"].min() / best if len(picked) else math.nan})
        if layout is not None:
            same = g[g["config"].map(config_layout) == layout]
            out[-1]["layout_best_us"] = same["t"].min() if len(same) else math.nan
            out[-1]["layout_regret"] = out[-1]["auto_us"] / same["t"].min() if len(same) else math.nan
            verdict = math.nan
            if len(same) and len(picked):
                a, b = same.loc[same["t"].idxmin()], picked.loc[picked["t"].idxmin()]
                verdict = band_verdict(a["t"], a["t_p10"], a["t_p90"], b["t"], b["t_p10"], b["t_p90"])
            out[-1]["layout_verdict"] = verdict
    return pd.DataFrame(out)


def full_config(variant: str, config: str | dict) -> dict:
    """A config (stored JSON or a dict) completed with its variant's defaults: a run made before an option
    existed ran what its default does now, and one made while a since-removed option existed but was off
    (stored None, False or 0; runnable's rule) ran what the config without it runs, so configs compare equal
    once completed and the repeats of one config group together (labkit.targets' medians)."""
    from kernels import VARIANTS

    v = VARIANTS.get(variant)
    c = json.loads(config) if isinstance(config, str) else config
    if v is not None:
        c = {k: val for k, val in c.items() if k in v.space or k in v.defaults or not _off(val)}
    return {**(v.defaults if v else {}), **c}


def _same_config(variant: str, stored: str, cfg: dict) -> bool:
    """A stored point config and a table config run the same kernel."""
    return full_config(variant, stored) == full_config(variant, cfg)


def source_runs(op: str) -> list[str]:
    """The run folders that the table set auto reads on this GPU says op's tables were derived from."""
    from kernels.tables import _device_name, gpu_tables

    src = getattr(gpu_tables(_device_name()), "SOURCES", {}).get(op, "")
    return [r for r in src.split(" + ") if r]


def leaders(runs, op: str, top: int, with_opt_in: bool = False) -> dict[tuple, list[tuple[str, dict]]]:
    """{(m,) linear / (m, routing) MoE: [(variant, config)]}: the `top` fastest configs of every measured problem
    there, per weight layout, unioned over the problems (so each can be remeasured on all of them, as a
    shape-agnostic table needs). Why: a sweep that times these leaders side by side on one routing sample
    (spec key best_of) gives a best time and a table regret free of sample-to-sample noise. with_opt_in: the
    fastest including OPT_IN configs (what the targets judge), not only those auto may take."""
    df = _points(runs, op, with_opt_in=with_opt_in)
    df["layout"] = df["config"].map(config_layout)
    out: dict[tuple, list[tuple[str, dict]]] = {}
    for key, g in df.groupby(_problem_cols(op) + ["m", "layout"]):
        fastest = g.groupby(["variant", "config"])["t"].min().nsmallest(top)
        where = (int(key[3]),) if op == "linear" else (int(key[3]), key[2])
        lst = out.setdefault(where, [])
        for variant, config in fastest.index:
            cand = (variant, json.loads(config))
            if cand not in lst:
                lst.append(cand)
    return out


def write_tables(tables: dict[str, dict], sources: dict[str, str], path: Path = TABLES_MODULE,
                 gpu_match: tuple[str, ...] = ()) -> Path:
    """Write kernels/tables_measured.py (or a GPU's own set, with the device-name substrings `gpu_match` that
    select it): the keyed tables ({TABLE_NAMES value: tables}) as Python data plus the runs they came from."""
    unknown = set(tables) - set(TABLE_NAMES.values())
    if unknown:
        raise ValueError(f"unknown table name(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(TABLE_NAMES.values())}")
    lines = ['"""Measured variant="auto" tables, written by labkit.tables.write_tables; do not edit by hand.',
             "", "Keys: a shape ((N, K) linear, (experts, 2I, H) MoE) or \"default\"; rows: (max tokens, variant,",
             "config). *_TILED: the tables of weights in tile_mxfp4's layout; *_NIB: of weights held as",
             "shuffle_nibbles' copy. SOURCES names the runs each op's tables were derived from.", '"""', "",
             f"SOURCES = {pprint.pformat(sources, width=110)}", ""]
    if gpu_match:
        lines[5:5] = ["", "GPU_MATCH: this set is read first on a GPU whose name holds one of these; a table it",
                      "lacks is read from kernels/tables_measured.py."]
        lines += [f"GPU_MATCH = {tuple(gpu_match)!r}", ""]
    for name in TABLE_NAMES.values():
        if tables.get(name):
            lines += [f"{name} = {pprint.pformat(tables[name], width=110, sort_dicts=True)}", ""]
    path.write_text("\n".join(lines))
    return path
