"""Roofline charts (plotly figures; export them with labkit.charts.save_figure).

- roofline_chart: intensity vs attainable TFLOP/s, ridge marked, model operations and measured points on it
- time_vs_tokens_chart: an operation's floor (µs) across token counts, measured times beside it
- breakdown_chart: where a step's floor goes, stacked per component, one bar per configuration
- lm_head_chart: the lm_head's floor per token in bf16 and MXFP4 on each GPU of the table
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from .hardware import Ceilings
from .roofline import Cost, StepEstimate, attainable_tflops, breakdown_table, floor_curve, ridge_point


def measured_rates(points: pd.DataFrame) -> pd.DataFrame:
    """The ok points with positive bytes, flops and us_graph, plus `intensity` and achieved `tflops`."""
    need = {"bytes", "flops", "us_graph"}
    missing = need - set(points.columns)
    if missing:
        raise ValueError(f"points need columns {', '.join(sorted(need))}; missing {', '.join(sorted(missing))}")
    df = points.copy()
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    for c in need:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df[(df["bytes"] > 0) & (df["flops"] > 0) & (df["us_graph"] > 0)].copy()
    df["intensity"] = df["flops"] / df["bytes"]
    df["tflops"] = df["flops"] / (df["us_graph"] * 1e-6) / 1e12
    return df


def _hover_label(df: pd.DataFrame) -> pd.Series:
    parts = [df[c].astype(str).radd(f"{c}=") for c in ("op", "variant", "m") if c in df.columns]
    if not parts:
        return pd.Series([""] * len(df), index=df.index)
    label = parts[0]
    for p in parts[1:]:
        label = label + " " + p
    return label


def roofline_chart(ceilings: Ceilings, points: pd.DataFrame | None = None, *,
                   ops: Mapping[str, Cost] | None = None, title: str = "Roofline"):
    """Log-log roofline of `ceilings`: the roof, the ridge point, each of `ops` on the roof (where its floor
    puts it) and measured `points` (results schema: flops, bytes, us_graph, variant, op, m) by variant."""
    import plotly.graph_objects as go

    ridge = ridge_point(ceilings)
    intensities = [c.intensity() for c in (ops or {}).values()]
    if points is not None and len(points):
        rates = measured_rates(points)
        intensities += rates["intensity"].tolist()
    else:
        rates = None
    finite = [i for i in intensities if 0 < i < float("inf")]
    lo = min([ridge / 1000, *finite]) / 2
    hi = max([ridge * 20, *finite]) * 2
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    y_lo = attainable_tflops(lo, ceilings)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=[attainable_tflops(i, ceilings) for i in x], mode="lines", name="roof",
                             line={"color": "black"},
                             hovertemplate="%{x:.3g} flop/B → %{y:.4g} TFLOP/s<extra>roof</extra>"))
    # a trace, not a layout shape: shapes on log axes take log10 coordinates, traces take data
    fig.add_trace(go.Scatter(x=[ridge, ridge], y=[y_lo, ceilings.bf16_tflops], mode="lines+text",
                             name=f"ridge {ridge:.0f} flop/B", line={"color": "gray", "dash": "dash"},
                             text=[f"ridge {ridge:.0f} flop/B", ""], textposition="top right",
                             hoverinfo="name"))
    for name, cost in (ops or {}).items():
        i = cost.intensity()
        fig.add_trace(go.Scatter(x=[i], y=[attainable_tflops(i, ceilings)], mode="markers", name=f"floor: {name}",
                                 marker={"symbol": "diamond", "size": 10},
                                 hovertemplate=f"{name}<br>%{{x:.3g}} flop/B, "
                                               "at most %{y:.4g} TFLOP/s<extra></extra>"))
    if rates is not None and len(rates):
        group = rates["variant"].astype(str) if "variant" in rates.columns else pd.Series("measured", rates.index)
        for variant, df in rates.groupby(group):
            fig.add_trace(go.Scatter(x=df["intensity"], y=df["tflops"], mode="markers", name=str(variant),
                                     text=_hover_label(df),
                                     hovertemplate="%{text}<br>%{x:.3g} flop/B, %{y:.4g} TFLOP/s<extra></extra>"))
    fig.update_layout(
        title=f"{title} ({ceilings.source}: {ceilings.read_gbps:.0f} GB/s, {ceilings.bf16_tflops:.0f} TFLOP/s bf16)",
        xaxis={"type": "log", "title": "arithmetic intensity (flop / byte)", "range": [np.log10(lo), np.log10(hi)]},
        yaxis={"type": "log", "title": "TFLOP/s"})
    return fig


def time_vs_tokens_chart(cost_fn: Callable[[int], Cost], tokens: Iterable[int], ceilings: Ceilings, *,
                         points: pd.DataFrame | None = None, title: str = "Floor vs tokens"):
    """Floor (µs) of cost_fn(tokens) across token counts on a log-x axis, with measured us_graph per m."""
    import plotly.graph_objects as go

    curve = floor_curve(cost_fn, tokens, ceilings)
    fig = go.Figure(go.Scatter(x=curve["tokens"], y=curve["floor_us"], mode="lines+markers", name="floor",
                               text=curve["bound"], line={"color": "black"},
                               hovertemplate="%{x} tokens: %{y:.4g} µs (%{text}-bound)<extra>floor</extra>"))
    if points is not None and len(points):
        df = points
        if "status" in df.columns:
            df = df[df["status"] == "ok"]
        group = df["variant"].astype(str) if "variant" in df.columns else pd.Series("measured", df.index)
        for variant, d in df.groupby(group):
            fig.add_trace(go.Scatter(x=d["m"], y=d["us_graph"], mode="markers", name=str(variant)))
    fig.update_layout(title=title, xaxis={"type": "log", "title": "tokens"}, yaxis={"type": "log", "title": "µs"})
    return fig


def breakdown_chart(estimates: Mapping[str, StepEstimate], *, title: str = "Where the step's floor goes"):
    """Stacked per-component floor (ms) of each labelled step estimate (e.g. bf16 vs MXFP4 lm_head)."""
    import plotly.express as px

    df = breakdown_table(estimates)
    fig = px.bar(df, x="config", y="floor_ms", color="component", title=title,
                 hover_data={"bytes": ":.3s", "share": ":.1%"},
                 labels={"floor_ms": "floor (ms)", "config": ""})
    fig.update_layout(barmode="stack")
    return fig


def lm_head_chart(table: pd.DataFrame, *, title: str = "lm_head per decoded token: bf16 vs MXFP4"):
    """Grouped bars of roofline.lm_head_across_gpus: lm_head floor (ms per token) per GPU and format."""
    import plotly.express as px

    df = table.melt(id_vars="gpu", value_vars=["lm_head_bf16_ms", "lm_head_mxfp4_ms"], var_name="lm_head",
                    value_name="ms")
    df["lm_head"] = df["lm_head"].str.removeprefix("lm_head_").str.removesuffix("_ms")
    fig = px.bar(df, x="gpu", y="ms", color="lm_head", barmode="group", log_y=True, title=title,
                 labels={"ms": "floor (ms per token)", "gpu": ""})
    return fig
