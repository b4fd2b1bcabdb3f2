"""Roofline charts build from floors and measured points and render to HTML without a browser."""

import pandas as pd
import pytest

from labkit import roofline as rl
from labkit import roofline_charts as rc
from labkit.charts import save_figure
from labkit.hardware import Ceilings

H100 = Ceilings(read_gbps=3000.0, bf16_tflops=679.0, source="measured")

POINTS = pd.DataFrame([
    {"op": "linear", "variant": "gemv", "m": 1, "status": "ok", "bytes": 3.08e8, "flops": 1.16e9, "us_graph": 120.0},
    {"op": "linear", "variant": "gemv", "m": 64, "status": "ok", "bytes": 3.34e8, "flops": 7.4e10, "us_graph": 140.0},
    {"op": "linear", "variant": "gemm", "m": 64, "status": "incorrect", "bytes": 3.34e8, "flops": 7.4e10,
     "us_graph": None},
    {"op": "moe_layer", "variant": "moe", "m": 8, "status": "failed", "bytes": None, "flops": None, "us_graph": None},
])


def test_measured_rates_keeps_ok_points_only():
    df = rc.measured_rates(POINTS)
    assert len(df) == 2
    assert df["tflops"].iloc[0] == pytest.approx(1.16e9 / 120e-6 / 1e12)
    assert df["intensity"].iloc[1] == pytest.approx(7.4e10 / 3.34e8)
    with pytest.raises(ValueError, match="missing us_graph"):
        rc.measured_rates(POINTS.drop(columns=["us_graph"]))


def test_roofline_chart(tmp_path):
    ops = {"lm_head M=1": rl.linear_cost(1, 201088, 2880), "moe 4096": rl.moe_cost(4096, 128, 4, 2880, 2880)}
    fig = rc.roofline_chart(H100, POINTS, ops=ops, title="t")
    names = [t.name for t in fig.data]
    assert names == ["roof", "ridge 226 flop/B", "floor: lm_head M=1", "floor: moe 4096", "gemv"]
    roof, ridge = fig.data[0], fig.data[1]
    assert max(roof.y) == 679.0 and min(roof.y) < 1.0
    assert list(ridge.x) == pytest.approx([679 / 3] * 2)
    paths = save_figure(fig, tmp_path, "roofline", png=False)
    assert paths == [tmp_path / "roofline.html"] and "plotly" in paths[0].read_text()
    assert rc.roofline_chart(H100).data[0].name == "roof"          # no ops, no points


def test_time_vs_tokens_chart(tmp_path):
    pts = pd.DataFrame({"m": [1, 64], "us_graph": [68.0, 550.0], "variant": ["a", "a"], "status": ["ok", "ok"]})
    fig = rc.time_vs_tokens_chart(lambda t: rl.moe_cost(t, 128, 4, 2880, 2880), [1, 8, 64, 4096], H100,
                                  points=pts)
    assert [t.name for t in fig.data] == ["floor", "a"]
    assert list(fig.data[0].y) == pytest.approx([17.65, 126.7, 491.0, 1200.8], rel=0.002)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert save_figure(fig, tmp_path, "moe", png=False)[0].is_file()


def test_breakdown_chart(tmp_path):
    est = {f"{w} b{b}": rl.model_step("gpt-oss-120b", batch=b, context=4096, mxfp4_lm_head=w == "mxfp4",
                                      ceilings=H100) for w in ("bf16", "mxfp4") for b in (1, 8)}
    fig = rc.breakdown_chart(est)
    assert {t.name for t in fig.data} == set(rl.COMPONENTS)
    assert fig.layout.barmode == "stack"
    lm = next(t for t in fig.data if t.name == "lm_head")
    assert list(lm.x) == list(est) and lm.y[0] > lm.y[2]           # bf16 lm_head slower than MXFP4
    assert save_figure(fig, tmp_path, "breakdown", png=False)[0].is_file()


def test_lm_head_chart(tmp_path):
    fig = rc.lm_head_chart(rl.lm_head_across_gpus("gpt-oss-120b"))
    assert [t.name for t in fig.data] == ["bf16", "mxfp4"]
    bf16 = dict(zip(fig.data[0].x, fig.data[0].y))
    assert bf16["gb10"] == pytest.approx(4.24, abs=0.01)
    assert save_figure(fig, tmp_path, "lm_head", png=False)[0].is_file()
