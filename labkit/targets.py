"""The lab's speed targets (DESIGN.md, issues #4 and #5) judged against measured runs.

`judge(runs)` answers "which targets are met, and by how much are the others missed" from run folders alone,
so the answer is re-derived from committed measurements rather than copied by hand.

How points of several runs are made comparable: every run measured its own ceilings, and those moved between
runs (a read ceiling timed without the spin kernel read 3-9% low, so that run's fractions of the floor read
3-9% high; see labkit/hardware.event_ms). So each point's floor is recomputed from its bytes and flops against
the *highest* read bandwidth and bf16 rate measured on that GPU model by any of the runs judged: the most
demanding floor, never a flattering one. A point's time is the run's median; the best over runs is the
correct (status ok) config of the lab's own variants with the highest fraction of that floor (the fastest,
where the metric is the time against cuBLAS): a MoE point's floor counts the experts its routing sample
touched, and samples differ between runs.

The best single measurement is what a target is judged on. Each point also carries a repeatable value: every
config measured there at least twice (over runs and sweep rounds) gets its median, and `median` is the best of
those, `repeats` that config's number of measurements and `met_median` whether it reaches the goal. A goal met by
one measurement but by no config's median is within the noise between runs (DESIGN.md: a difference smaller than
the spread is not a result).

A lab point counts only while this checkout can still run its config (labkit.tables.runnable): runs keep the configs
of options measured and later removed (PERSIST, SLICES, BACKOFF) and of removed combinations of kept options (NOBAR
on the cp.async ring: the variant's rules judge each point's config at its problem), and a target is met by the code
as it stands. Variants that quantize the activations (results.lossy: w4a8, w4a8_fp8) do not count: the targets are
for the MXFP4 kernels at bf16 accuracy. A best config that takes an option variant="auto" never picks
(labkit.tables.OPT_IN: ATOMIC's run-to-run bits, STEP_MAJOR's second weight copy) counts, and is marked (`opt_in`):
a user reaches that time by naming the config, not through auto.

Each point also shows `x_read`, its best time over a plain read of its bytes (labkit.readfloor) at the rate the
newest read-floor run on that GPU measured there: how far the kernel is from merely reading its weights once,
launches included (the floor's ceiling, torch.sum over 1 GiB, counts neither the launch nor a faster reader).
A MoE point also shows `bare2`: that read in the layer's two launches (mlp1's bytes, then mlp2's) as a fraction of
the floor, the value a layer that streams mlp2's weights only after mlp1 could reach by reading alone.

Runs made with LAB_PDL=1 (meta.json "lab_pdl") are left out: there each copy of the op in a CUDA-graph replay
starts while the one before drains, an overlap of back-to-back layers that one call of the op never gets.
(Unset, the default, launches only an op's own later kernels with PDL: its first waits for the op before.)
So are runs made with LAB_X16_SPLIT_ROWS set ("lab_x16_split_rows"): A/B arms of x_to_f16's program shapes,
which time a path the checkout does not take by default under the same configs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .readfloor import newest
from .results import BASELINES, find_runs, lossy, off_defaults, read_runs, resolve_run, run_meta, short_config
from .tables import full_config, opt_in, runnable_points

LINEAR_SHAPES = ("lm_head", "qkv", "attn_out")
MOE_MODELS = ("gpt-oss-120b", "gpt-oss-20b")


def env_override(meta: dict) -> bool:
    """Whether a run was made with an environment override that changes what a config runs (LAB_PDL=1,
    LAB_X16_SPLIT_ROWS), so that its points do not measure the checkout's default path."""
    return meta.get("lab_pdl") == "1" or meta.get("lab_x16_split_rows") is not None


@dataclass(frozen=True)
class Target:
    """One speed target: at every token count in `tokens`, for every problem in `problems`, the best variant's
    `metric` must reach `goal`. metric: "frac_of_floor" (floor / time) or "vs_bf16" (cuBLAS bf16 time / time)."""

    name: str
    issue: int
    op: str
    problems: tuple[str, ...]
    tokens: tuple[int, ...]
    metric: str
    goal: float
    routing: str | None = None


#: DESIGN.md's targets with the token counts the issues ask to measure.
TARGETS = (
    Target("lm_head, M <= 8: >= 90% of floor", 4, "linear", ("lm_head",), (1, 2, 4, 8), "frac_of_floor", 0.90),
    Target("lm_head, M <= 64: >= 80% of floor", 4, "linear", ("lm_head",), (1, 2, 4, 8, 16, 32, 64),
           "frac_of_floor", 0.80),
    Target("linear, M >= 2048: >= 70% of cuBLAS bf16", 4, "linear", LINEAR_SHAPES, (2048, 8192), "vs_bf16", 0.70),
    Target("MoE uniform, T <= 8: >= 75% of floor", 5, "moe_layer", MOE_MODELS, (1, 2, 4, 8), "frac_of_floor",
           0.75, "uniform"),
    Target("MoE uniform, 16 <= T <= 256: >= 90% of floor", 5, "moe_layer", MOE_MODELS, (16, 32, 64, 128, 256),
           "frac_of_floor", 0.90, "uniform"),
    Target("MoE uniform, T >= 512: >= 70% of floor", 5, "moe_layer", MOE_MODELS, (512, 1024, 4096, 8192),
           "frac_of_floor", 0.70, "uniform"),
)


def _measured_gpu(meta: dict) -> str | None:
    """The GPU of a run that measured its ceilings (a GPU run), else None."""
    c = meta.get("ceilings") or {}
    return meta.get("gpu") if c.get("source") == "measured" and c.get("read_gbps") else None


def _ceilings(metas: Iterable[dict]) -> dict[str, dict]:
    """Per GPU name: the highest read GB/s and bf16 TFLOP/s any of these runs measured (meta.json ceilings)."""
    out: dict[str, dict] = {}
    for meta in metas:
        gpu = _measured_gpu(meta)
        if gpu is None:
            continue
        c = meta["ceilings"]
        best = out.setdefault(gpu, {"read_gbps": 0.0, "bf16_tflops": 0.0})
        best["read_gbps"] = max(best["read_gbps"], float(c["read_gbps"]))
        best["bf16_tflops"] = max(best["bf16_tflops"], float(c.get("bf16_tflops") or 0.0))
        if c.get("bf16_tflops_sustained"):  # runs since stop 66 (labkit.hardware.SUSTAINED_CALLS)
            best["bf16_tflops_sustained"] = max(best.get("bf16_tflops_sustained", 0.0),
                                                float(c["bf16_tflops_sustained"]))
    return out


def _problem(df: pd.DataFrame) -> pd.Series:
    shape = df["shape"] if "shape" in df.columns else pd.Series(None, index=df.index, dtype=object)
    model = df["model"] if "model" in df.columns else pd.Series(None, index=df.index, dtype=object)
    return shape.where(df["op"] == "linear", model)


def _repeatable(pts: pd.DataFrame, metric: str, cublas: float) -> tuple[int, float | None]:
    """(measurements, median value) of the config with the best median among those measured at least twice at
    this point; (0, None) when no config was. vs_bf16: cuBLAS's best time over the config's median time."""
    key = [json.dumps(full_config(v, c), sort_keys=True) for v, c in zip(pts["variant"], pts["config"])]
    g = pts.assign(key=key).groupby("key")
    stats = pd.DataFrame({"n": g.size(), "frac": g["frac_of_floor"].median(), "us": g["us_graph"].median()})
    stats = stats[stats["n"] >= 2]
    if stats.empty:
        return 0, None
    stats["value"] = cublas / stats["us"] if metric == "vs_bf16" else stats["frac"]
    top = stats.loc[stats["value"].idxmax()]
    return int(top["n"]), float(top["value"])


def _runs(runs: Iterable[str | Path] | None) -> dict[Path, dict]:
    """{run folder: meta} of the runs given (default every run under results/), env_override runs left out."""
    paths = find_runs() if runs is None else [resolve_run(r) for r in runs]
    metas = {p: run_meta(p) for p in paths}
    return {p: m for p, m in metas.items() if not env_override(m)}


def _ok_points(paths: list[Path]) -> pd.DataFrame:
    """Correct, timed points of these runs whose configs this checkout can still run, with a `problem` column."""
    df = read_runs(paths)
    df = df[(df["status"] == "ok") & df["us_graph"].notna()].copy()
    df = df[[v in BASELINES or ok for v, ok in zip(df["variant"], runnable_points(df))]].copy()
    df["problem"] = _problem(df)
    return df


def _target_points(df: pd.DataFrame, t: Target) -> pd.DataFrame:
    """The points of df at target t's op, problems, token counts and routing (baselines included)."""
    sel = df[(df["op"] == t.op) & df["problem"].isin(t.problems) & df["m"].isin(t.tokens)]
    return sel if t.routing is None else sel[sel["routing"] == t.routing]


def _lab(sel: pd.DataFrame) -> pd.DataFrame:
    """The lab's own points of sel: baselines and variants that quantize activations left out (bf16 accuracy)."""
    return sel[~sel["variant"].isin(BASELINES) & ~sel["variant"].map(lossy).astype(bool)]


def default_gpu(metas: Iterable[dict]) -> str | None:
    """The GPU of the newest run that measured its ceilings (the machine the lab was last judged on)."""
    gpus = sorted((m.get("started") or "", g) for m in metas if (g := _measured_gpu(m)))
    return gpus[-1][1] if gpus else None


def judge(runs: Iterable[str | Path] | None = None, gpu: str | None = None,
          targets: Iterable[Target] = TARGETS, opt_in_ok: bool = True) -> pd.DataFrame:
    """One row per (target, problem, token count): the best measured variant there, its metric against the
    most demanding ceilings of the runs (see the module docstring), the goal, and whether it is met.

    runs: run folders or ids (default every run under results/; env_override runs are left out); gpu: a
    substring of the GPU name to judge (default the GPU of the newest run with measured ceilings); opt_in_ok:
    False leaves out configs with an option auto never picks (what variant="auto" can reach). Points never
    measured have met = None."""
    metas = _runs(runs)
    paths = list(metas)
    if gpu is None:
        gpu = default_gpu(metas.values())
        if gpu is None:
            raise ValueError("no run with measured ceilings (GPU runs) among the runs given")
    ceil = {g: c for g, c in _ceilings(metas.values()).items() if gpu.lower() in g.lower()}
    if not ceil:
        raise ValueError(f"no run on a GPU matching {gpu!r} measured its ceilings")
    df = _ok_points(paths)
    df = df[df["gpu"].isin(ceil)].copy()
    rate = lambda key: df["gpu"].map(lambda g: ceil[g][key])  # noqa: E731
    df["frac_of_floor"] = _floor_us(df["bytes"], df["flops"], rate("read_gbps"), rate("bf16_tflops")) / df["us_graph"]
    rows = []
    for t in targets:
        sel = _target_points(df, t)
        lab = _lab(sel)
        if not opt_in_ok:
            lab = lab[~lab["config"].map(opt_in).astype(bool)]
        for problem in t.problems:
            for m in t.tokens:
                pts = lab[(lab["problem"] == problem) & (lab["m"] == m)]
                row = {"target": t.name, "issue": t.issue, "problem": problem, "m": m, "metric": t.metric,
                       "goal": t.goal,
                       "variant": None, "config": None, "us": None, "bytes": None, "flops": None, "value": None,
                       "met": None, "run_id": None, "opt_in": None, "gpu": None,
                       "runs": int(pts["run_id"].nunique()), "repeats": 0, "median": None, "met_median": None}
                if len(pts):  # MoE points of different runs (or samples) touch different experts: rank by fraction
                    best = pts.loc[pts["us_graph" if t.metric == "vs_bf16" else "frac_of_floor"].agg(
                        "idxmin" if t.metric == "vs_bf16" else "idxmax")]
                    value = float(best["frac_of_floor"])
                    cublas = float("nan")
                    if t.metric == "vs_bf16":
                        base = sel[(sel["problem"] == problem) & (sel["m"] == m) & (sel["variant"] == "cublas_bf16")]
                        cublas = base["us_graph"].min() if len(base) else float("nan")
                        value = float(cublas / best["us_graph"])
                    repeats, median = _repeatable(pts, t.metric, cublas)
                    row.update(variant=best["variant"], config=short_config(best["config"], best["variant"]),
                               gpu=best["gpu"],
                               us=float(best["us_graph"]), bytes=float(best["bytes"]), flops=float(best["flops"]),
                               value=value,
                               met=None if pd.isna(value) else bool(value >= t.goal), run_id=best["run_id"],
                               opt_in=opt_in(best["config"]),
                               repeats=repeats, median=median,
                               met_median=None if median is None or pd.isna(median) else bool(median >= t.goal))
                rows.append(row)
    out = _with_held(_with_read(pd.DataFrame(rows), paths, ceil), ceil)
    out.attrs["ceilings"] = ceil
    out.attrs["runs"] = sum(m.get("gpu") in ceil for m in metas.values())
    out.attrs["other_gpus"] = sorted(g for g in _ceilings(metas.values()) if g not in ceil)
    return out


def _with_read(out: pd.DataFrame, paths: list[Path], ceil: dict) -> pd.DataFrame:
    """x_read per point: its best time over a plain read of its bytes at the rate the newest read-floor run among
    `paths` on this GPU measured for that point (labkit.readfloor; NaN where none did), that run's id in
    attrs["read_run"]; x_goal: the x_read a floor target's goal asks (the goal's time over the same read; NaN for
    a target against cuBLAS, whose goal is no time of the floor's). Why x_goal: it
    states a floor target in what a kernel can be compared with on any GPU, a plain read of the same bytes (the
    one-token lm_head asks 1.124 on an H200 and 1.108 on an H100, nearly the same though the H200 reads 1.4x
    faster). bare2: for a MoE layer, a plain read of its bytes in two launches (mlp1's 2/3, then mlp2's 1/3) as a
    fraction of the floor: the value of a layer that only read its weights, mlp2's after mlp1's (NaN where the
    newest run with such rows did not measure the point; its id in attrs["read2_run"])."""

    def over_read(launches: int) -> tuple[str | None, pd.Series]:
        found = newest(paths, ceil, launches)
        if not found:
            return None, pd.Series(float("nan"), index=out.index)
        rate = found[1].drop_duplicates(["problem", "m"]).set_index(["problem", "m"])["read_gbps"]
        gbps = pd.Series([rate.get((p, m), float("nan")) for p, m in zip(out["problem"], out["m"])], index=out.index)
        return found[0], out["us"].astype(float) * gbps * 1e3 / out["bytes"].astype(float)

    out.attrs["read_run"], x_read = over_read(1)
    x_goal = (x_read * out["value"].astype(float) / out["goal"].astype(float)).where(out["metric"] == "frac_of_floor")
    out.attrs["read2_run"], x_read2 = over_read(2)
    bare2 = (x_read2 * out["value"].astype(float)).where(out["metric"] == "frac_of_floor")
    return out.assign(x_read=x_read, x_goal=x_goal, bare2=bare2)


def _with_held(out: pd.DataFrame, ceil: dict) -> pd.DataFrame:
    """`held`: a compute-bound floor point's fraction of the floor at the bf16 rate matmuls sustain back to back
    (the highest `bf16_tflops_sustained` measured on its GPU; NaN where the floor is memory-bound, for targets
    against cuBLAS, or where no run measured it). Why beside `value`: the floor's bf16 rate is that of single
    calls at the boost clock, which a layer held for milliseconds does not keep (labkit.hardware.SUSTAINED_CALLS);
    the target stays judged on `value`."""
    if out.empty:
        return out.assign(held=float("nan"))
    rate = lambda key: out["gpu"].map(lambda g: (ceil.get(g) or {}).get(key)).astype(float)  # noqa: E731
    flops, nbytes, bw, held = out["flops"].astype(float), out["bytes"].astype(float), rate("read_gbps"), \
        rate("bf16_tflops_sustained")
    compute_bound = flops / (rate("bf16_tflops") * 1e12) > nbytes / (bw * 1e9)
    value = _floor_us(nbytes, flops, bw, held) / out["us"].astype(float)
    return out.assign(held=value.where(compute_bound & held.notna() & (out["metric"] == "frac_of_floor")))


def _floor_us(nbytes: pd.Series, flops: pd.Series, read_gbps: pd.Series, bf16_tflops: pd.Series) -> pd.Series:
    """DESIGN.md's floor in us: the larger of bytes over the read rate and flops over the bf16 rate."""
    return pd.concat([nbytes / (read_gbps * 1e9), flops / (bf16_tflops * 1e12)], axis=1).max(axis=1) * 1e6


def summary(judged: pd.DataFrame) -> pd.DataFrame:
    """Per target: points met / measured / asked (met_median: met by the best config's median over its repeated
    measurements too), and the worst point's value against the goal."""
    rows = []
    for name, g in judged.groupby("target", sort=False):
        measured = g[g["met"].notna()]
        worst = measured.loc[measured["value"].idxmin()] if len(measured) else None
        rows.append({"target": name, "issue": int(g["issue"].iloc[0]), "met": int(measured["met"].astype(bool).sum()),
                     "met_median": int(measured["met_median"].eq(True).sum()),
                     "measured": len(measured), "asked": len(g),
                     "worst": None if worst is None else f"{worst['problem']} {worst['m']}: {worst['value']:.1%}"})
    return pd.DataFrame(rows)


def _median_text(r: dict) -> str:
    return "not repeated" if r["median"] is None or pd.isna(r["median"]) else f"{r['median']:.1%} ({r['repeats']})"


def _x_text(r: dict) -> str:
    """x_read, with the x_goal a floor target asks in brackets."""
    if pd.isna(r["x_read"]):
        return ""
    return f"{r['x_read']:.3f}" + ("" if pd.isna(r["x_goal"]) else f" ({r['x_goal']:.3f})")


def markdown(judged: pd.DataFrame) -> str:
    """The judged points as a Markdown table, one line per point (for notes and READMEs)."""
    lines = ["| target | problem | tokens | best | time (us) | value | x_read (x_goal) | median (n) | goal | met "
             "| run |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in judged.to_dict("records"):
        if r["met"] is None:
            lines.append(f"| {r['target']} | {r['problem']} | {r['m']} | not measured | | | | | {r['goal']:.0%} | | |")
            continue
        best = r["variant"] + (" (opt-in)" if r["opt_in"] else "")
        lines.append(f"| {r['target']} | {r['problem']} | {r['m']} | {best} | {r['us']:.1f} | "
                     f"{r['value']:.1%} | {_x_text(r)} | "
                     f"{_median_text(r)} | {r['goal']:.0%} | "
                     f"{'yes' if r['met'] else 'no'} | {r['run_id']} |")
    return "\n".join(lines)


def targets_chart(judged: pd.DataFrame):
    """Each target's best measured value against tokens, one line per problem (hollow markers: the best median
    of a config measured at least twice), the goal as a dashed step: where the lab stands and how far the
    misses are, at a glance."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(dict.fromkeys(judged["target"]))
    cols = 3
    rows = -(-len(names) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=names, horizontal_spacing=0.06, vertical_spacing=0.18)
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
    for i, name in enumerate(names):
        g = judged[judged["target"] == name]
        r, c = i // cols + 1, i % cols + 1
        for j, (problem, p) in enumerate(g.groupby("problem", sort=False)):
            p = p[p["value"].notna()]
            fig.add_trace(go.Scatter(x=p["m"], y=p["value"], mode="lines+markers", name=problem,
                                     legendgroup=problem, showlegend=problem not in {t.name for t in fig.data},
                                     line={"color": palette[j % len(palette)]},
                                     customdata=p[["variant", "us", "run_id"]].to_numpy(),
                                     hovertemplate="%{x} tokens: %{y:.0%}<br>%{customdata[0]}, %{customdata[1]:.1f} us"
                                                   "<br>%{customdata[2]}<extra>" + problem + "</extra>"),
                          row=r, col=c)
            q = p[p["median"].notna()]  # the best repeated config's median: hollow markers under the best
            fig.add_trace(go.Scatter(x=q["m"], y=q["median"].astype(float), mode="markers", name=problem,
                                     legendgroup=problem, showlegend=False,
                                     marker={"symbol": "circle-open", "size": 9,
                                             "color": palette[j % len(palette)]},
                                     customdata=q[["repeats"]].to_numpy(),
                                     hovertemplate="%{x} tokens: median %{y:.0%} over %{customdata[0]} "
                                                   "measurements<extra>" + problem + "</extra>"),
                          row=r, col=c)
        goal = float(g["goal"].iloc[0])
        fig.add_trace(go.Scatter(x=[g["m"].min(), g["m"].max()], y=[goal, goal], mode="lines", showlegend=False,
                                 line={"dash": "dash", "color": "gray"}, hoverinfo="skip"), row=r, col=c)
        fig.update_xaxes(type="log", title_text="tokens", row=r, col=c)
        top = max(1.05, float(g["value"].max(skipna=True) or 0) + 0.05)
        fig.update_yaxes(tickformat=".0%", range=[0, top], row=r, col=c)
    fig.update_layout(title="Speed targets: best measured value (lines), repeated configs' best median (hollow), "
                            "goal (dashed)",
                      height=380 * rows, width=1200)
    return fig


def untried(gpu: str, from_gpu: str, top: int = 3, runs: Iterable[str | Path] | None = None,
            targets: Iterable[Target] = TARGETS) -> pd.DataFrame:
    """Per target point: the `top` fastest configs measured on a GPU matching from_gpu that never ran correctly
    on one matching gpu. Why: a GPU's leaders are the first guess on another one, and a point where they were
    never timed is a gap in the search, not a limit of the kernels (stop 68: an H100 leader never timed on the
    H200 took its 120b 512-token layer from 602 to 564 us). Columns: the point, the config, its time there and
    over the best there (ratio_there), and the best time here at the point."""
    df = _ok_points(list(_runs(runs)))

    def on(name: str) -> pd.DataFrame:
        pts = df[df["gpu"].fillna("").str.contains(name, case=False, regex=False)]
        if pts.empty:
            raise ValueError(f"no correct points measured on a GPU matching {name!r}")
        return pts

    def key(d: pd.DataFrame) -> list[str]:  # a config's identity: its variant and its completed config
        return [v + json.dumps(full_config(v, c), sort_keys=True) for v, c in zip(d["variant"], d["config"])]

    here, there = on(gpu), on(from_gpu)
    rows, seen = [], set()
    for t in targets:
        a, b = _lab(_target_points(there, t)), _lab(_target_points(here, t))
        for problem in t.problems:
            for m in t.tokens:
                pa = a[(a["problem"] == problem) & (a["m"] == m)]
                pb = b[(b["problem"] == problem) & (b["m"] == m)]
                if pa.empty:
                    continue
                ranked = pa.assign(key=key(pa)).groupby("key").agg(
                    us=("us_graph", "min"), variant=("variant", "first"), config=("config", "first"),
                    n=("n", "first"), k=("k", "first")).nsmallest(top, "us")
                tried = set(key(pb))
                for k, r in ranked.iterrows():
                    if k in tried or (problem, m, k) in seen:
                        continue
                    seen.add((problem, m, k))
                    rows.append({"op": t.op, "problem": problem, "m": m, "n": int(r["n"]), "k": int(r["k"]),
                                 "routing": t.routing, "variant": r["variant"],
                                 "config": short_config(r["config"], r["variant"]), "us_there": float(r["us"]),
                                 "ratio_there": float(r["us"] / ranked["us"].min()),
                                 "best_here": float(pb["us_graph"].min()) if len(pb) else float("nan"),
                                 "opt_in": opt_in(r["config"]),
                                 "full_config": full_config(r["variant"], r["config"])})
    cols = ["op", "problem", "m", "n", "k", "routing", "variant", "config", "us_there", "ratio_there", "best_here",
            "opt_in", "full_config"]
    return pd.DataFrame(rows, columns=cols)


def untried_specs(found: pd.DataFrame) -> dict[str, dict]:
    """Sweep specs ({"linear": spec, "moe": spec}, only the ops present) that time untried()'s configs, each at
    its own token count (a one-point grid with m_range, what it sets away from its variant's defaults), beside
    auto's tiled+nib pick there. Without a GPU they run auto's picks at small sizes."""
    specs: dict[str, dict] = {}
    for op, rows in found.groupby("op"):
        grids: dict[str, list] = {}
        for r in rows.to_dict("records"):
            grid = {k: [v] for k, v in sorted(off_defaults(r["full_config"], r["variant"]).items())}
            grid["m_range"] = [int(r["m"]), int(r["m"])]
            if grid not in grids.setdefault(r["variant"], []):
                grids[r["variant"]].append(grid)
        tokens = sorted({int(m) for m in rows["m"]})
        if op == "linear":
            shapes = {p: [int(g["n"].iloc[0]), int(g["k"].iloc[0])] for p, g in rows.groupby("problem")}
            spec = {"op": "linear", "shapes": shapes, "cpu_shapes": {p: [200, 192] for p in shapes}, "m": tokens,
                    "cpu_m": [3]}
        else:
            spec = {"op": "moe", "models": sorted(rows["problem"].unique()), "cpu_models": ["tiny"],
                    "tokens": tokens, "cpu_tokens": [3], "routings": ["uniform"], "cpu_routings": ["uniform"]}
        specs["moe" if op == "moe_layer" else op] = {**spec, "cpu_configs": 1, "auto_picks": ["tiled+nib"],
                                                      "variants": grids}
    return specs
