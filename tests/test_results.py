"""Results store: appends are durable, keys identify points, many runs read as one frame."""

import json
import sys
import threading

import pandas as pd
import pytest

from labkit.results import KEY_COLUMNS, POINT_COLUMNS, PointStore, point_key, read_runs
from labkit.runs import create_run, open_run, probe_run, write_atomic


def _point(**kw):
    p = {"op": "linear", "variant": "gemv", "config": {"BLOCK_N": 64}, "m": 1, "n": 128, "k": 64,
         "routing": None, "status": "ok", "us_graph": 3.0}
    p.update(kw)
    return p


def test_append_and_resume_keys(tmp_path):
    run = create_run("t", out=tmp_path / "r1", parameters={"a": 1})
    store = PointStore(run.path)
    store.append(_point())
    store.append([_point(m=2), _point(m=4, status="incorrect", max_rel_err=0.5)])
    df = store.read()
    assert list(df.columns[: len(POINT_COLUMNS)]) == POINT_COLUMNS
    assert df["m"].tolist() == [1, 2, 4]
    assert point_key(_point(m=2, config={"BLOCK_N": 64})) in store.done_keys()
    assert point_key(_point(m=8)) not in store.done_keys()
    # key order inside a config does not matter
    assert point_key(_point(config={"a": 1, "b": 2})) == point_key(_point(config={"b": 2, "a": 1}))
    assert not (run.path / "points.parquet.tmp").exists()


def test_reading_while_a_sweep_appends_never_sees_a_mixed_file(tmp_path):
    """A notebook or the kill test reads points.parquet while the sweep replaces it (CI failed this once:
    "Page was smaller (3) than expected (11)"); before the fix about one read in seven failed here."""
    store = PointStore(tmp_path)
    store.append(_point(m=0))
    done = threading.Event()

    def writer():
        for m in range(1, 150):
            store.append(_point(m=m))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    try:
        while not done.is_set():
            assert len(store.read()) >= 1
            reads += 1
    finally:
        thread.join()
    assert reads > 20 and len(store.read()) == 150


def test_a_write_that_dies_midway_leaves_the_old_file(tmp_path):
    path = tmp_path / "programs.parquet"
    write_atomic(path, lambda tmp: tmp.write_text("whole"))

    def dies(tmp):
        tmp.write_text("ha")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, dies)
    assert path.read_text() == "whole"


def test_bad_status_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="status must be one of ok, incorrect, failed"):
        PointStore(tmp_path).append(_point(status="fast"))


def test_read_runs_adds_run_columns(tmp_path):
    for name in ("a", "b"):
        run = create_run(name, out=tmp_path / name)
        PointStore(run.path).append(_point(variant=name))
    df = read_runs([tmp_path / "a", tmp_path / "b"])
    assert set(df["run_id"]) == {"a", "b"} and "gpu" in df.columns
    assert isinstance(df, pd.DataFrame) and set(KEY_COLUMNS) <= set(df.columns)
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        read_runs([tmp_path / "missing"])


# ---- many runs: dtypes, listing, SQL, best per point, comparing ------------------------------------------------


def _run(tmp_path, name, points, gpu=None):
    run = create_run(name, out=tmp_path / name)
    if gpu:
        run.update_meta(gpu=gpu)
    PointStore(run.path).append(points)
    return run.path


def _timed(m, us, p10, p90, **kw):
    return _point(m=m, us_graph=us, us_graph_p10=p10, us_graph_p90=p90, **kw)


def test_read_runs_gives_one_dtype_per_column(tmp_path):
    a = _run(tmp_path, "a", [_point(), _point(op="decode_step", variant="x", n=None, k=None, bias=True)])
    b = _run(tmp_path, "b", [_point(m=3, floor_us=None, bias=False)])
    df = read_runs([a, b])
    assert str(df["n"].dtype) == "Int64" and df["n"].isna().sum() == 1
    assert df["floor_us"].dtype == "float64" and str(df["bias"].dtype) == "boolean"


def test_compare_known_ratios_and_verdicts(tmp_path):
    a = _run(tmp_path, "a", [
        _timed(1, 100, 99, 101), _timed(2, 100, 99, 101), _timed(4, 100, 90, 110), _timed(8, 100, 99, 101),
        _timed(16, 100, 99, 101), _timed(32, 100, 99, 101),
        _point(m=64, us_graph=None, us_eager=200.0, us_eager_p10=198.0, us_eager_p90=202.0)])
    b = _run(tmp_path, "b", [
        _timed(1, 80, 79, 81),         # 0.8, bands apart: win
        _timed(2, 120, 119, 121),      # 1.2: loss
        _timed(4, 95, 85, 105),        # 0.95 but the bands overlap: noise
        _timed(8, 102.5, 102, 103),    # bands apart but 2.5% < min_band 3%: noise
        _point(m=16, status="failed", error="boom"),
        _point(m=64, us_graph=None, us_eager=100.0, us_eager_p10=99.0, us_eager_p90=101.0),  # eager only: win
        _timed(128, 100, 99, 101)])    # only in B
    from labkit.results import compare_runs, compare_summary

    cmp = compare_runs(a, b).set_index("m")
    assert cmp.loc[1, "ratio"] == pytest.approx(0.8) and cmp.loc[1, "verdict"] == "win"
    assert cmp.loc[1, "ratio_lo"] == pytest.approx(79 / 101) and cmp.loc[1, "ratio_hi"] == pytest.approx(81 / 99)
    assert cmp.loc[2, "ratio"] == pytest.approx(1.2) and cmp.loc[2, "verdict"] == "loss"
    assert cmp.loc[4, "verdict"] == "noise" and cmp.loc[8, "verdict"] == "noise"
    assert cmp.loc[16, "verdict"] == "n/a" and pd.isna(cmp.loc[16, "ratio"]) and cmp.loc[16, "status_b"] == "failed"
    assert cmp.loc[64, "metric"] == "us_eager" and cmp.loc[64, "ratio"] == pytest.approx(0.5)
    assert cmp.loc[64, "verdict"] == "win" and cmp.loc[1, "metric"] == "us_graph"
    assert 32 not in cmp.index and 128 not in cmp.index
    assert cmp.attrs["only_a"] == 1 and cmp.attrs["only_b"] == 1
    assert compare_runs(a, b, min_band=0.02).set_index("m").loc[8, "verdict"] == "loss"
    assert "6 points in both runs" in compare_summary(compare_runs(a, b))


def test_compare_reports_the_clock_ratio(tmp_path):
    """Where both runs recorded the SM clock, each point carries B's over A's, and the summary counts the wins and
    losses that ran at clocks more than 2% apart; runs without clocks get neither."""
    a = _run(tmp_path, "a", [_timed(1, 100, 99, 101, sm_mhz=1980.0), _timed(2, 100, 99, 101, sm_mhz=1650.0),
                             _timed(4, 100, 99, 101, sm_mhz=1980.0)])
    b = _run(tmp_path, "b", [_timed(1, 80, 79, 81, sm_mhz=1980.0), _timed(2, 110, 109, 111, sm_mhz=1530.0),
                             _timed(4, 100, 99, 101, sm_mhz=1700.0)])
    from labkit.results import compare_runs, compare_summary

    cmp = compare_runs(a, b)
    assert list(cmp.clock_ratio.round(4)) == [1.0, round(1530 / 1650, 4), round(1700 / 1980, 4)]
    assert "1 of the 2 wins and losses ran at SM clocks more than 2% apart" in compare_summary(cmp)
    plain = compare_runs(_run(tmp_path, "c", [_timed(1, 100, 99, 101)]), _run(tmp_path, "d", [_timed(1, 80, 79, 81)]))
    assert "clock_ratio" not in plain.columns and "SM clocks" not in compare_summary(plain)


def test_compare_needs_matching_shape_and_unique_keys(tmp_path):
    from labkit.results import compare_runs

    a = _run(tmp_path, "a", [_point(shape="lm_head")])
    b = _run(tmp_path, "b", [_point(shape="other")])  # same n/k, another shape: not the same problem here
    assert compare_runs(a, b).empty
    dup = pd.concat([read_runs([a])] * 2, ignore_index=True)
    with pytest.raises(ValueError, match="points with the same key"):
        compare_runs(dup, a)


def test_list_runs_counts_statuses(tmp_path):
    from labkit.results import list_runs

    _run(tmp_path, "r1", [_point(), _point(m=2, status="incorrect"), _point(m=3, status="failed")], gpu="H100")
    _run(tmp_path, "r2", [_point(op="moe_layer", experts=8, top_k=2, routing="uniform")])
    (tmp_path / "not_a_run").mkdir()
    df = list_runs(tmp_path).set_index("run_id")
    assert list(df.index) == ["r1", "r2"]
    assert df.loc["r1", ["points", "ok", "incorrect", "failed"]].tolist() == [3, 1, 1, 1]
    assert df.loc["r1", "gpu"] == "H100" and df.loc["r2", "gpu"] == "cpu" and df.loc["r2", "ops"] == "moe_layer 1"
    assert df.loc["r1", "wide"] == 0 and df.loc["r1", "wake_ratio"] is None  # no timing check recorded


def test_list_runs_flags_wide_bands_and_the_wake_check(tmp_path):
    """A point whose median sits more than 5% above its p10 (replays in two modes) is counted; the ceilings' wake
    check comes from meta.json."""
    from labkit.results import list_runs

    path = _run(tmp_path, "r", [_timed(1, 10, 9.9, 10.1), _timed(2, 27.3, 23.6, 27.6), _timed(4, 10.4, 10.0, 12.0),
                                _timed(8, 30, 20, 31, status="incorrect")])
    open_run(path).update_meta(ceilings={"read_gbps": 3000, "bf16_tflops": 800, "wake_ratio": 1.0017})
    row = list_runs(tmp_path).set_index("run_id").loc["r"]
    assert row["wide"] == 1 and row["wake_ratio"] == 1.002


def test_query_sql_over_runs(tmp_path):
    from labkit.results import query

    a = _run(tmp_path, "a", [_timed(1, 10, 9, 11), _timed(2, 20, 19, 21)])
    b = _run(tmp_path, "b", [_timed(1, 5, 4, 6), _point(m=2, status="failed")])
    df = query("SELECT run_id, count(*) AS n, min(us_graph) AS best FROM points WHERE status = 'ok' "
               "GROUP BY run_id ORDER BY run_id", runs=[a, b])
    assert df.to_dict("records") == [{"run_id": "a", "n": 2, "best": 10.0}, {"run_id": "b", "n": 1, "best": 5.0}]
    assert query("SELECT failed FROM runs WHERE run_id = 'b'", runs=[a, b])["failed"].tolist() == [1]
    with pytest.raises(ValueError, match=r"(?s)\"problem\" not found.*points: run_id, op, variant"):
        query("SELECT problem FROM points", runs=[a, b])  # a message naming the columns, not duckdb's traceback


def test_best_table_uses_each_ops_baseline(tmp_path):
    from labkit.results import best_table

    moe = {"op": "moe_layer", "n": 128, "k": 64, "experts": 8, "top_k": 2, "routing": "uniform", "model": "tiny"}
    df = read_runs([_run(tmp_path, "a", [
        _timed(1, 10, 9, 11, shape="lm_head"), _timed(1, 30, 29, 31, variant="cublas_bf16", config={}, shape="lm_head"),
        _point(**moe, variant="moe_gemv", us_graph=20.0), _point(**moe, variant="torch_bf16", config={}, us_graph=50.0),
        _point(**{**moe, "routing": "all_to_one"}, variant="moe_gemv", us_graph=40.0)])])
    best = best_table(df)
    lin = best[best["op"] == "linear"].iloc[0]
    assert lin["best"] == "gemv" and lin["baseline"] == "cublas_bf16" and lin["problem"] == "lm_head"
    assert lin["vs_baseline"] == pytest.approx(3.0)
    uni = best[(best["op"] == "moe_layer") & (best["routing"] == "uniform")].iloc[0]
    assert uni["baseline"] == "torch_bf16" and uni["vs_baseline"] == pytest.approx(2.5) and uni["problem"] == "tiny"
    skew = best[best["routing"] == "all_to_one"].iloc[0]
    assert pd.isna(skew["vs_baseline"])  # no torch_bf16 point under that routing


def test_vs_routing_puts_each_routing_against_one(tmp_path):
    """`./lab best --vs-routing R`: each MoE point's best time over the best under R at the same model and token
    count (the linear rows, and points R never ran, get NaN); a routing the run lacks is an error naming those
    it has."""
    from labkit.results import best_table, vs_routing

    moe = {"op": "moe_layer", "n": 128, "k": 64, "experts": 8, "top_k": 2, "model": "tiny"}
    df = read_runs([_run(tmp_path, "a", [
        _timed(1, 10, 9, 11, shape="lm_head"),
        _point(**moe, routing="uniform", m=4, variant="moe_gemv", us_graph=30.0),
        _point(**moe, routing="uniform", m=4, variant="moe_mma", us_graph=26.0),
        _point(**moe, routing="balanced", m=4, variant="moe_gemv", us_graph=20.0),
        _point(**moe, routing="uniform", m=8, variant="moe_gemv", us_graph=50.0)])])
    out = vs_routing(best_table(df), "balanced")
    got = {(r["routing"], r["m"]): r["vs_balanced"] for r in out[out["op"] == "moe_layer"].to_dict("records")}
    assert got[("uniform", 4)] == pytest.approx(1.3) and got[("balanced", 4)] == 1.0 and pd.isna(got[("uniform", 8)])
    assert pd.isna(out[out["op"] == "linear"]["vs_balanced"]).all()
    assert list(out.columns).index("vs_balanced") == list(out.columns).index("config") - 1
    with pytest.raises(ValueError, match="no MoE points under routing 'zipf' .*balanced, uniform"):
        vs_routing(best_table(df), "zipf")


def test_best_table_on_the_committed_moe_run():
    from labkit.results import best_table, find_runs

    runs = [p for p in find_runs() if p.name.endswith("moe_gptoss")]
    if not runs:
        pytest.skip("no committed moe_gptoss run")
    best = best_table(read_runs(runs[:1]))
    moe = best[best["op"] == "moe_layer"]
    assert set(moe["baseline"]) == {"torch_bf16"} and moe["vs_baseline"].notna().all()
    assert {"gpt-oss-120b", "gpt-oss-20b"} <= set(moe["problem"]) and "all_to_one" in set(moe["routing"])


def test_reference_runs_pick_the_most_overlap(tmp_path):
    from labkit.results import reference_runs

    fresh = _run(tmp_path, "fresh", [_point(m=m) for m in (1, 2, 3)])
    one = _run(tmp_path, "one", [_point(m=1)])
    two = _run(tmp_path, "two", [_point(m=1), _point(m=2), _point(m=9)])
    _run(tmp_path, "none", [_point(m=7)])
    assert reference_runs(fresh, candidates=[one, two, tmp_path / "none", fresh]) == {"linear": two}
    assert reference_runs(fresh, candidates=[tmp_path / "none"]) == {}


def test_reference_runs_prefer_the_same_gpu(tmp_path):
    """A run of the fresh run's GPU is its reference even when another GPU's run shares more points."""
    from labkit.results import reference_runs
    from labkit.runs import open_run

    fresh = _run(tmp_path, "fresh", [_point(m=m) for m in (1, 2, 3)])
    other = _run(tmp_path, "other", [_point(m=m) for m in (1, 2, 3)])
    mine = _run(tmp_path, "mine", [_point(m=1)])
    for run, gpu in ((fresh, "NVIDIA H200"), (other, "NVIDIA H100 80GB HBM3"), (mine, "NVIDIA H200")):
        open_run(run).update_meta(gpu=gpu)
    assert reference_runs(fresh, candidates=[other, mine]) == {"linear": mine}
    assert reference_runs(fresh, candidates=[other]) == {"linear": other}


def test_probe_run_is_made_before_measuring_and_names_its_command(tmp_path, monkeypatch):
    """A device probe's run folder exists (meta.json, not finished) before it measures; without OUT_DIR, none."""
    monkeypatch.setattr(sys, "argv", [".device/probe.py"])
    assert probe_run("probe") is None
    out = tmp_path / "probe"
    monkeypatch.setattr(sys, "argv", [".device/probe.py", str(out)])
    run = probe_run("probe")
    assert run.path == out and run.meta["finished"] is None
    assert run.meta["command"] == f"python3 .device/probe.py {out}"
    run.finish_with("t.csv: two rows", t=pd.DataFrame({"a": [1, 2]}))
    assert pd.read_csv(out / "t.csv")["a"].tolist() == [1, 2]
    assert run.meta["contents"] == "t.csv: two rows" and run.meta["finished"] is not None


def test_short_config_names_only_what_differs_from_the_variants_defaults():
    """With its variant, a config reads as the options it sets away from that variant's defaults (BLOCK_ dropped,
    sorted); without, every option; an unknown variant (a baseline) keeps them all."""
    import kernels as K
    from labkit.results import short_config

    cfg = {**K.VARIANTS["moe_mma"].defaults, "BLOCK_M": 128, "TMA": 2, "num_warps": 8}
    assert short_config(cfg, "moe_mma") == "M=128 TMA=2 warps=8"
    assert short_config(json.dumps(K.VARIANTS["gemv"].defaults), "gemv") == "defaults"
    assert short_config({"BLOCK_N": 64, "num_stages": 3}) == "N=64 stages=3"
    assert short_config({"BLOCK_N": 64}, "cublas_bf16") == "N=64"
    assert short_config({}, "gemv") == "-" and short_config(None) == "-"


def test_the_committed_tree_fits_the_device_tools_carry():
    """The device tool carries the working tree and its carry (.whl/slim, ~5 MB) in 64 MiB together (DESIGN.md:
    results included), so the files git tracks must stay under 56 MiB, and no run folder past 4 MiB ("a few MB").
    When this fails, slim the largest run folders (raw traces, executed notebooks) rather than raise the limit."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    sizes = {f: (root / f).stat().st_size for f in out.decode().split("\0") if f and (root / f).is_file()}
    total = sum(sizes.values())
    assert total < 56 * 2**20, f"tracked files take {total / 2**20:.1f} MiB"
    runs: dict[str, int] = {}
    for f, n in sizes.items():
        if f.startswith("results/") and f.count("/") >= 2:
            runs[f.split("/")[1]] = runs.get(f.split("/")[1], 0) + n
    big = {r: round(n / 2**20, 1) for r, n in runs.items() if n > 4 * 2**20}
    assert not big, f"run folders past 4 MiB: {big}"


def test_sigint_ignored_drops_a_second_interrupt_and_restores_the_handler():
    """A SIGINT inside (a second ^C while a job says how to go on) is dropped; after it, ^C raises again."""
    import os
    import signal
    import time

    from labkit.runs import sigint_ignored

    before = signal.getsignal(signal.SIGINT)
    with sigint_ignored():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
