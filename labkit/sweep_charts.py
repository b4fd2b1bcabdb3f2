"""Sweep charts (plotly figures from read_runs frames; export them with labkit.charts.save_figure).

- time_vs_tokens_chart / frac_vs_tokens_chart: best config per variant across token counts, with the floor
- tile_heatmap: one tile parameter x tokens -> fraction of the floor (best over the other parameters)
- skew_panels: the same time-vs-tokens lines, one panel per routing (how skew moves the winner)
- compare_chart: per-point ratio of two runs with its noise band (results.compare_runs)

A run without a GPU has interpreter wall-clock times and no floor: charts then say so rather than invent one,
and the heat map shows speed relative to the variant's best config at each token count instead.
"""

from __future__ import annotations

import json

import pandas as pd

from .results import BASELINES, short_config

_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf", "#393b79", "#ad494a", "#637939"]


def sweep_frame(df: pd.DataFrame, op: str | None = None) -> pd.DataFrame:
    """The ok points (of `op`) ready to chart: `time_us` (CUDA-graph time where the run has it, else eager),
    `problem` (linear shape or MoE model), `label` (short config) and one column per tile parameter."""
    d = df[df["status"] == "ok"].copy()
    if op:
        d = d[d["op"] == op]
    graph = "us_graph" in d.columns and d["us_graph"].notna().any()
    d["time_us"] = d["us_graph"] if graph else d["us_eager"]
    d = d[d["time_us"].notna() & (d["time_us"] > 0)]
    d.attrs["timing"] = "CUDA-graph µs" if graph else "eager µs (no GPU: interpreter wall clock)"
    shape = d["shape"] if "shape" in d.columns else pd.Series(pd.NA, index=d.index)
    model = d["model"] if "model" in d.columns else pd.Series(pd.NA, index=d.index)
    d["problem"] = shape.where(d["op"] == "linear", model).fillna(d["op"]).astype(str)
    d["routing"] = d["routing"].astype(object).where(d["routing"].notna(), "-")
    cfgs = [json.loads(c) if isinstance(c, str) else {} for c in d["config"]]
    d["label"] = [short_config(c, v) for c, v in zip(cfgs, d["variant"])]
    for name in sorted({k for c in cfgs for k in c}):
        d[f"cfg_{name}"] = [c.get(name) for c in cfgs]
    for c in ("floor_us", "frac_of_floor"):
        d[c] = pd.to_numeric(d[c], errors="coerce") if c in d.columns else float("nan")
    return d


def best_per_variant(d: pd.DataFrame, by=("problem", "routing", "m")) -> pd.DataFrame:
    """Fastest config of each variant per (problem, routing, m): one line per variant on the charts."""
    idx = d.groupby(["variant", *by], dropna=False)["time_us"].idxmin()
    return d.loc[idx.values].sort_values(["variant", *by]).reset_index(drop=True)


def floor_per_point(d: pd.DataFrame, by=("problem", "routing", "m")) -> pd.DataFrame:
    """The MXFP4 floor per point (the lab's variants, not the bf16 baselines whose floor is higher)."""
    own = d[~d["variant"].isin(BASELINES) & d["floor_us"].notna()]
    return own.groupby(list(by), dropna=False)["floor_us"].min().reset_index()


def _colors(variants) -> dict:
    return {v: _PALETTE[i % len(_PALETTE)] for i, v in enumerate(sorted(set(variants)))}


def _grid(n: int, cols: int = 3) -> tuple[int, int]:
    c = min(cols, max(n, 1))
    return -(-max(n, 1) // c), c


def _empty(title: str, note: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_annotation(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title=title, xaxis={"visible": False}, yaxis={"visible": False})
    return fig


def _panels(d: pd.DataFrame, facet: str, y: str, *, floor: str | None, title: str, y_title: str, log_y: bool):
    """Small multiples: one panel per value of `facet`, a line per variant (best config), an optional floor."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    best = best_per_variant(d)
    best = best[best[y].notna()]
    if best.empty:
        return None
    facets = sorted(best[facet].unique(), key=str)
    rows, cols = _grid(len(facets))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[str(f) for f in facets], shared_yaxes=False,
                        horizontal_spacing=0.06, vertical_spacing=0.12)
    colors = _colors(best["variant"])
    floors = floor_per_point(d) if floor == "floor_us" else None
    for i, f in enumerate(facets):
        r, c = i // cols + 1, i % cols + 1
        sub = best[best[facet] == f]
        for v, g in sub.groupby("variant"):
            g = g.groupby("m", as_index=False).agg({y: "min", "label": "first", "time_us": "min"})
            fig.add_trace(go.Scatter(
                x=g["m"], y=g[y], mode="lines+markers", name=v, legendgroup=v, showlegend=i == 0,
                line={"color": colors[v], "dash": "dot" if v in BASELINES else "solid"}, text=g["label"],
                hovertemplate=f"{v}<br>%{{x}} tokens: %{{y:.4g}}<br>%{{text}}<extra>{f}</extra>"), row=r, col=c)
        if floors is not None:
            fl = floors[floors[facet] == f].groupby("m", as_index=False)["floor_us"].min()
            if len(fl):
                fig.add_trace(go.Scatter(x=fl["m"], y=fl["floor_us"], mode="lines", name="floor (MXFP4)",
                                         legendgroup="floor", showlegend=i == 0,
                                         line={"color": "black", "dash": "dash"},
                                         hovertemplate="%{x} tokens: floor %{y:.4g} µs<extra></extra>"), row=r, col=c)
        elif floor == "one":
            ms = sorted(sub["m"].unique())
            fig.add_trace(go.Scatter(x=[ms[0], ms[-1]], y=[1, 1], mode="lines", name="floor", legendgroup="floor",
                                     showlegend=i == 0, line={"color": "black", "dash": "dash"}, hoverinfo="skip"),
                          row=r, col=c)
    fig.update_xaxes(type="log", title_text="tokens (m)")
    fig.update_yaxes(type="log" if log_y else "linear", title_text=y_title)
    fig.update_layout(title=title, height=max(380, 330 * rows), legend={"title": "variant"})
    return fig


def time_vs_tokens_chart(df: pd.DataFrame, *, op: str | None = None, facet: str = "problem",
                         title: str = "Time vs tokens (best config per variant)"):
    """Time of each variant's best config vs tokens, a panel per problem, with the MXFP4 floor line."""
    d = df if "time_us" in df.columns else sweep_frame(df, op)
    fig = _panels(d, facet, "time_us", floor="floor_us", title=f"{title} — {d.attrs.get('timing', 'µs')}",
                  y_title="µs", log_y=True)
    return fig or _empty(title, "no ok points to chart")


def frac_vs_tokens_chart(df: pd.DataFrame, *, op: str | None = None, facet: str = "problem",
                         title: str = "Fraction of the floor vs tokens (best config per variant)"):
    """floor / time of each variant's best config vs tokens (1 = at the floor), a panel per problem."""
    d = df if "time_us" in df.columns else sweep_frame(df, op)
    fig = _panels(d, facet, "frac_of_floor", floor="one", title=title, y_title="fraction of floor", log_y=False)
    return fig or _empty(title, "no floor in this run: it has no measured ceilings (a CPU run times the "
                                "Triton interpreter, which has no roofline)")


def heatmap_values(d: pd.DataFrame, tile: str, variant: str) -> tuple[pd.DataFrame, str]:
    """tile value x tokens table of one variant: best frac_of_floor over the other parameters, or, without a
    floor, speed relative to the variant's best config at that token count (1 = the best tile)."""
    col = f"cfg_{tile}"
    v = d[(d["variant"] == variant) & d[col].notna()] if col in d.columns else d.iloc[0:0]
    if v["frac_of_floor"].notna().any():
        return v.pivot_table(index=col, columns="m", values="frac_of_floor", aggfunc="max"), "fraction of floor"
    best = v.groupby("m")["time_us"].transform("min")
    v = v.assign(rel=best / v["time_us"])
    return v.pivot_table(index=col, columns="m", values="rel", aggfunc="max"), "speed vs best config (no floor)"


def pick_heatmap_variant(d: pd.DataFrame, tile: str) -> str | None:
    """The variant that has `tile` and wins the most points (ties: the one swept over more tile values)."""
    col = f"cfg_{tile}"
    if col not in d.columns:
        return None
    has = d[d[col].notna() & ~d["variant"].isin(BASELINES)]
    if has.empty:
        return None
    best = best_per_variant(has)
    winners = best.loc[best.groupby(["problem", "routing", "m"])["time_us"].idxmin(), "variant"].value_counts()
    spread = has.groupby("variant")[col].nunique()
    return max(spread.index, key=lambda v: (int(spread[v] > 1), winners.get(v, 0), spread[v]))


def tile_heatmap(df: pd.DataFrame, tile: str, *, variant: str | None = None, op: str | None = None,
                 title: str | None = None):
    """Heat map of one tile parameter (rows) x tokens (columns) -> fraction of the floor for one variant
    (default: the one with that parameter that wins most points). Pass one problem/routing's points."""
    import plotly.graph_objects as go

    d = df if "time_us" in df.columns else sweep_frame(df, op)
    variant = variant or pick_heatmap_variant(d, tile)
    title = title or f"{variant or '-'}: {tile} x tokens"
    if variant is None:
        return _empty(title, f"no variant in these points has a {tile} parameter")
    table, what = heatmap_values(d, tile, variant)
    if table.empty:
        return _empty(title, f"{variant} has no ok points with a {tile} parameter here")
    table = table.sort_index()
    fig = go.Figure(go.Heatmap(
        z=table.values, x=[str(m) for m in table.columns], y=[_tick(t) for t in table.index], colorscale="Viridis",
        zmin=0, zmax=max(1.0, float(pd.DataFrame(table).max().max())) if what != "fraction of floor" else None,
        colorbar={"title": what}, text=[["" if pd.isna(v) else f"{v:.2f}" for v in row] for row in table.values],
        texttemplate="%{text}",
        hovertemplate=f"{tile}=%{{y}}, %{{x}} tokens: %{{z:.3f}}<extra>{variant}</extra>"))
    fig.update_layout(title=f"{title} — {what}", xaxis={"title": "tokens (m)", "type": "category"},
                      yaxis={"title": tile, "type": "category"})
    return fig


def _tick(v) -> str:
    """64.0 -> '64' (tile values come back as floats when some configs lack the parameter)."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def skew_panels(df: pd.DataFrame, *, model: str | None = None, metric: str = "time",
                title: str | None = None):
    """One panel per routing (uniform to all-on-one-expert) of a MoE model: each variant's best time (or
    fraction of floor) vs tokens, with the floor of the experts that routing actually touches."""
    d = df if "time_us" in df.columns else sweep_frame(df, "moe_layer")
    if model:
        d = d[d["problem"] == model]
    title = title or f"{model or 'MoE'}: routing skew"
    if metric == "frac":
        fig = _panels(d, "routing", "frac_of_floor", floor="one", title=f"{title}, fraction of floor",
                      y_title="fraction of floor", log_y=False)
        return fig or _empty(title, "no floor in this run (no measured ceilings)")
    fig = _panels(d, "routing", "time_us", floor="floor_us", title=f"{title} — {d.attrs.get('timing', 'µs')}",
                  y_title="µs", log_y=True)
    return fig or _empty(title, "no ok MoE points to chart")


def compare_chart(cmp: pd.DataFrame, *, title: str | None = None):
    """Ratio B/A per point (results.compare_runs) vs tokens, a colour per variant, the p10-p90 range of the
    ratio as error bars and the min_band as a grey band: points outside it with bars clear of 1 are real."""
    import plotly.graph_objects as go

    d = cmp[cmp["ratio"].notna()].copy()
    band = cmp.attrs.get("min_band", 0.03)
    title = title or f"B/A per point — A: {cmp.attrs.get('run_a', 'A')}, B: {cmp.attrs.get('run_b', 'B')}"
    if d.empty:
        return _empty(title, "the two runs share no ok points (different shapes, models or configs)")
    where = next((c for c in ("shape", "model") if c in d.columns), None)
    d["where"] = d[where].astype(object).where(d[where].notna(), "") if where else ""
    d["text"] = (d["op"].astype(str) + " " + d["where"].astype(str) + " " + d["routing"].astype(object)
                 .where(d["routing"].notna(), "").astype(str) + "<br>"
                 + pd.Series([short_config(c, v) for c, v in zip(d["config"], d["variant"])], index=d.index) + "<br>"
                 + d["verdict"])
    variants = sorted(d["variant"].unique())
    colors = _colors(variants)
    fig = go.Figure()
    ms = sorted(d["m"].unique())
    fig.add_trace(go.Scatter(x=[ms[0] / 1.3, ms[-1] * 1.3, ms[-1] * 1.3, ms[0] / 1.3], y=[1 - band, 1 - band,
                             1 + band, 1 + band], mode="lines", fill="toself", fillcolor="rgba(128,128,128,0.2)",
                             line={"width": 0},
                             name=f"±{band:.0%} (min band)", hoverinfo="skip"))
    symbols = {"win": "triangle-down", "loss": "triangle-up", "noise": "circle-open"}
    for i, v in enumerate(variants):
        g = d[d["variant"] == v]
        x = g["m"] * (1.06 ** (i - len(variants) / 2))  # spread variants apart at the same token count
        fig.add_trace(go.Scatter(
            x=x, y=g["ratio"], mode="markers", name=v, marker={"color": colors[v], "size": 9,
                                                                 "symbol": g["verdict"].map(symbols).tolist()},
            error_y={"type": "data", "symmetric": False, "array": (g["ratio_hi"] - g["ratio"]).clip(lower=0),
                     "arrayminus": (g["ratio"] - g["ratio_lo"]).clip(lower=0), "thickness": 1},
            text=g["text"], customdata=g["m"],
            hovertemplate=f"{v}, %{{customdata}} tokens: B/A %{{y:.3f}}<br>%{{text}}<extra></extra>"))
    fig.add_hline(y=1, line={"color": "black", "width": 1})
    fig.update_layout(title=title, xaxis={"type": "log", "title": "tokens (m)"},
                      yaxis={"title": "B / A time (below 1: B faster)"},
                      legend={"title": "variant (▼ win, ▲ loss, ○ noise)"})
    return fig
