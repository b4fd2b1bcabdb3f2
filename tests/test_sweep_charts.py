"""Sweep charts from run frames: floor lines, heat-map values, skew panels, the compare chart."""

import json

import pandas as pd
import pytest

from labkit import sweep_charts as sc
from labkit.results import compare_runs


def _frame(floor: bool) -> pd.DataFrame:
    rows = []
    for m in (1, 2, 4):
        for bn, us in ((32, 10.0 * m), (64, 8.0 * m)):
            rows.append({"variant": "gemv", "config": json.dumps({"BLOCK_N": bn, "BLOCK_K": 128}), "us": us})
        rows.append({"variant": "cublas_bf16", "config": "{}", "us": 20.0 * m})
        for r in rows[-3:]:
            r.update(op="linear", m=m, n=256, k=128, experts=None, top_k=None, routing=None, status="ok",
                     shape="lm_head", floor_us=4.0 * m if floor else None)
    df = pd.DataFrame(rows)
    df["us_graph" if floor else "us_eager"] = df.pop("us")
    if floor:
        df["frac_of_floor"] = df["floor_us"] / df["us_graph"]
    else:
        df["us_graph"] = None
    return df


def test_time_chart_draws_the_floor_and_one_line_per_variant():
    fig = sc.time_vs_tokens_chart(_frame(floor=True))
    names = [t.name for t in fig.data]
    assert names == ["cublas_bf16", "gemv", "floor (MXFP4)"]
    gemv = fig.data[1]
    assert list(gemv.y) == [8.0, 16.0, 32.0]  # the best config per token count
    assert list(fig.data[2].y) == [4.0, 8.0, 16.0]
    assert "CUDA-graph" in fig.layout.title.text


def test_heatmap_values_with_and_without_a_floor():
    d = sc.sweep_frame(_frame(floor=True))
    assert sc.pick_heatmap_variant(d, "BLOCK_N") == "gemv"
    table, what = sc.heatmap_values(d, "BLOCK_N", "gemv")
    assert what == "fraction of floor" and table.loc[64].tolist() == pytest.approx([0.5, 0.5, 0.5])
    assert table.loc[32].tolist() == pytest.approx([0.4, 0.4, 0.4])
    cpu = sc.sweep_frame(_frame(floor=False))
    table, what = sc.heatmap_values(cpu, "BLOCK_N", "gemv")
    assert "no floor" in what and table.loc[64].tolist() == pytest.approx([1.0] * 3)
    assert table.loc[32].tolist() == pytest.approx([0.8] * 3)
    fig = sc.tile_heatmap(cpu, "BLOCK_N")
    assert list(fig.data[0].y) == ["32", "64"] and list(fig.data[0].x) == ["1", "2", "4"]
    assert "no variant" in sc.tile_heatmap(cpu, "SPLIT_K").layout.annotations[0].text


def test_charts_without_a_floor_say_so():
    fig = sc.frac_vs_tokens_chart(_frame(floor=False))
    assert "no floor" in fig.layout.annotations[0].text
    assert "interpreter" in sc.time_vs_tokens_chart(_frame(floor=False)).layout.title.text


def test_skew_panels_one_per_routing():
    rows = []
    for rt in ("uniform", "all_to_one", "zipf(1.2)"):
        for m in (1, 8):
            rows.append({"op": "moe_layer", "variant": "moe_gemv", "config": '{"BLOCK_M": 1}', "m": m, "n": 128,
                         "k": 64,
                         "experts": 8, "top_k": 2, "routing": rt, "status": "ok", "model": "tiny",
                         "us_graph": 5.0 * m, "floor_us": 1.0 * m})
    fig = sc.skew_panels(pd.DataFrame(rows), model="tiny")
    assert [a.text for a in fig.layout.annotations] == ["all_to_one", "uniform", "zipf(1.2)"]
    assert sum(t.name == "floor (MXFP4)" for t in fig.data) == 3


def test_compare_chart_marks_verdicts():
    a = _frame(floor=True).assign(us_graph_p10=lambda d: d["us_graph"] * 0.99,
                                  us_graph_p90=lambda d: d["us_graph"] * 1.01)
    b = a.copy()
    b.loc[b["variant"] == "gemv", ["us_graph", "us_graph_p10", "us_graph_p90"]] *= 0.5
    cmp = compare_runs(a, b)
    assert set(cmp.loc[cmp["variant"] == "gemv", "verdict"]) == {"win"}
    assert set(cmp.loc[cmp["variant"] == "cublas_bf16", "verdict"]) == {"noise"}
    fig = sc.compare_chart(cmp)
    gemv = next(t for t in fig.data if t.name == "gemv")
    assert set(gemv.y) == {0.5} and set(gemv.marker.symbol) == {"triangle-down"}
    assert "share no ok points" in sc.compare_chart(cmp.iloc[0:0]).layout.annotations[0].text
