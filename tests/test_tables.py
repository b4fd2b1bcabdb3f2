"""variant='auto' tables: derived from runs, keyed by shape with a default, and their regret."""

import pytest

from kernels.tables import pick_linear, pick_moe
from labkit.results import PointStore
from labkit.runs import create_run
from labkit.tables import derive_tables, regret, write_tables


def _run(tmp_path, points):
    run = create_run("t", out=tmp_path / "run")
    PointStore(run.path).append(points)
    return run.path


def _pt(shape, n, m, variant, us, cfg=None):
    return {"op": "linear", "variant": variant, "config": cfg or {"BLOCK_N": 64}, "m": m, "n": n, "k": 64,
            "shape": shape, "status": "ok", "us_graph": us}


def test_tables_pick_the_fastest_per_shape_and_minimax_by_default(tmp_path):
    pts = [_pt("a", 128, 1, "gemv", 10), _pt("a", 128, 1, "gemv_h2", 8), _pt("b", 256, 1, "gemv", 10),
           _pt("b", 256, 1, "gemv_h2", 30), _pt("a", 128, 8, "dot_scaled", 5), _pt("b", 256, 8, "dot_scaled", 6)]
    run = _run(tmp_path, pts)
    t = derive_tables(run, "linear")
    assert t[(128, 64)][0][:2] == (1, "gemv_h2") and t[(256, 64)][0][:2] == (1, "gemv")
    # default: gemv's worst regret (10/8 = 1.25) beats gemv_h2's (30/10 = 3)
    assert t["default"][0][:2] == (1, "gemv") and t["default"][-1][1] == "dot_scaled"
    r = regret(run, t, "linear")
    assert (r["regret"] == 1.0).all() and len(r) == 4
    r = regret(run, {"default": t["default"]}, "linear")
    assert sorted(r["regret"].round(3).tolist()) == [1.0, 1.0, 1.0, 1.25]
    path = write_tables({"LINEAR_TABLES": t}, {"linear": str(run)}, path=tmp_path / "tables_measured.py")
    ns = {}
    exec(path.read_text(), ns)
    assert ns["LINEAR_TABLES"] == t and ns["SOURCES"]["linear"] == str(run)


def test_a_focused_run_refines_a_broad_one(tmp_path):
    broad = _run(tmp_path / "a", [_pt("a", 128, 1, "gemv", 10), _pt("a", 128, 8, "dot_scaled", 5)])
    focused = _run(tmp_path / "b", [_pt("a", 128, 1, "gemv_h2", 7), _pt("a", 128, 1, "gemv", 12)])
    t = derive_tables([broad, focused], "linear")
    assert [r[1] for r in t[(128, 64)]] == ["gemv_h2", "dot_scaled"]
    r = regret([broad, focused], t, "linear")
    assert (r["regret"] == 1.0).all() and len(r) == 2


def test_configs_this_checkout_cannot_run_are_never_picked(tmp_path):
    """A run keeps configs of options since removed (or of removed variants); a table from it must not
    hand auto a config that check() would reject."""
    run = _run(tmp_path, [_pt("a", 128, 1, "gemv", 10), _pt("a", 128, 1, "gemv", 5, {"GONE": True}),
                          _pt("a", 128, 1, "gone_variant", 4)])
    t = derive_tables(run, "linear")
    assert t[(128, 64)] == t["default"] == [(1 << 62, "gemv", {"BLOCK_N": 64})]


def test_a_removed_option_stored_off_is_the_config_without_it():
    """Runs between an option's adding and removal store it in every config, off in most: those configs are the
    ones this checkout runs without it; stored on (True, a number, a string) they are not runnable."""
    import json

    from labkit.tables import runnable

    base = {"BLOCK_M": 8, "ROWS": 2, "WGMMA": True}
    for off in (None, False, 0):
        assert runnable("moe_mma", json.dumps({**base, "GONE": off})), off
    for on in (True, 4, "x"):
        assert not runnable("moe_mma", json.dumps({**base, "GONE": on})), on
    assert not runnable("gone_variant", json.dumps(base))


def test_a_removed_combination_of_kept_options_is_not_runnable():
    """NOBAR on the cp.async ring was measured (stop 73) and removed while NOBAR stayed for TMA's ring: a stored
    point of it is not runnable at its own problem, so neither the targets nor the tables credit it, while the
    same point with TMA is; runnable_points judges each row of a run frame at the problem it ran (a row without
    its n and k, as some tests store, by its options alone)."""
    import json

    import pandas as pd

    from labkit.results import stored_problem
    from labkit.tables import runnable, runnable_points

    tma = {"BLOCK_M": 8, "ROWS": 2, "WGMMA": True, "RING_W": True, "TILED": True, "NIB": True, "TMA": 2,
           "NOBAR": True, "STAGES": 3, "CHUNKS": 1}
    cp_ring = {**tma, "TMA": False}
    row = {"op": "moe_layer", "m": 32, "n": 5760, "k": 2880, "experts": 128, "top_k": 4}
    assert stored_problem(row) == {"op": "moe", "m": 32, "tokens": 32, "n": 5760, "k": 2880, "experts": 128,
                                   "top_k": 4, "scale_min": 118, "scale_max": 124}
    assert runnable("moe_mma", json.dumps(cp_ring))  # its options alone are all known
    assert not runnable("moe_mma", json.dumps(cp_ring), stored_problem(row))
    assert runnable("moe_mma", json.dumps(tma), stored_problem(row))
    df = pd.DataFrame([{**row, "variant": "moe_mma", "config": json.dumps(c)} for c in (tma, cp_ring)]
                      + [{"op": "linear", "m": 4, "n": 256, "k": 128, "experts": None, "top_k": None,
                          "variant": "gemv_mma", "config": json.dumps({**c, "BLOCK_M": 8})} for c in (tma, cp_ring)])
    assert runnable_points(df) == [True, False, True, False]
    bare = pd.DataFrame([{"op": "moe_layer", "m": 32, "variant": "moe_mma", "config": json.dumps(cp_ring)}])
    assert runnable_points(bare) == [True]  # no n or k stored: judged by its options alone


def test_a_removed_option_stored_off_completes_to_the_same_config():
    """full_config drops a removed option stored off, so a run that stored it (XIN: false, measured and removed
    in stop 58) repeats the config of the runs before and after it, and labkit.targets' median groups them; a
    removed option stored on stays, a config of its own."""
    import json

    from labkit.tables import full_config

    base = {"BLOCK_M": 8, "ROWS": 2, "WGMMA": True}
    for off in (None, False, 0):
        assert full_config("moe_mma", json.dumps({**base, "GONE": off})) == full_config("moe_mma", base), off
    assert full_config("moe_mma", {**base, "GONE": True})["GONE"] is True
    assert full_config("moe_mma", {**base, "TAIL": False}) == full_config("moe_mma", base)


def test_opt_in_options_are_never_picked(tmp_path):
    """STEP_MAJOR (a second copy of the weights) and ATOMIC (bits that vary with the order of additions) are a
    user's explicit choice: a faster config with either never enters a table (both configs below can run)."""
    wg = {"WGMMA": True, "TILED": True, "RING_W": True, "STAGES": 3, "CHUNKS": 1}
    run = _run(tmp_path, [_pt("a", 128, 1, "gemv_mma", 10, wg),
                          _pt("a", 128, 1, "gemv_mma", 5, {**wg, "STEP_MAJOR": True})])
    t = derive_tables(run, "linear", layout="tiled")
    assert t[(128, 64)] == t["default"] == [(1 << 62, "gemv_mma", wg)]
    moe = {"op": "moe_layer", "m": 4, "n": 128, "k": 64, "experts": 8, "top_k": 2, "routing": "uniform",
           "shape": "a", "status": "ok", "variant": "moe_mma"}
    run = _run(tmp_path / "moe", [{**moe, "config": wg, "us_graph": 10},
                                  {**moe, "config": {**wg, "ATOMIC": True, "SPLITK2": 2}, "us_graph": 4}])
    t = derive_tables(run, "moe", layout="tiled")
    assert t[(8, 128, 64)] == [(1 << 62, "moe_mma", wg)]


def test_each_layout_has_its_own_tables_and_regret_counts_the_other(tmp_path):
    """TILED configs read tile_mxfp4's copy of the weight: the rows tables never pick them (a weight is held in
    one layout), the tiled tables pick only them, neither picks NIB configs (shuffle_nibbles' copy), and
    regret measures both against the best of any layout; a
    stored config without an option added later (here TILED) matches the table config that spells out that
    option's default."""
    mma = {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 2, "PREFETCH": True, "num_warps": 2}
    run = _run(tmp_path, [_pt("a", 128, 4, "gemv_mma", 10, mma), _pt("a", 128, 4, "gemv", 9),
                          _pt("a", 128, 4, "gemv_mma", 8, {**mma, "TILED": True}),
                          _pt("a", 128, 4, "gemv_mma", 7, {**mma, "NIB": True}),  # shuffle_nibbles' copy
                          _pt("a", 128, 4, "gemv_mma", 7, {**mma, "TILED": True, "NIB": True})])
    t = derive_tables(run, "linear")
    assert t[(128, 64)] == [(1 << 62, "gemv", {"BLOCK_N": 64})]
    tiled = derive_tables(run, "linear", layout="tiled")
    assert tiled[(128, 64)] == tiled["default"] == [(1 << 62, "gemv_mma", {**mma, "TILED": True})]
    assert regret(run, tiled, "linear")["regret"].round(3).tolist() == [round(8 / 7, 3)]
    r = regret(run, {"default": [(1 << 62, "gemv_mma", {**mma, "TILED": False, "MAXNREG": None})]}, "linear")
    assert r["regret"].round(3).tolist() == [round(10 / 7, 3)]
    only_rows = _run(tmp_path / "r", [_pt("a", 128, 4, "gemv", 9)])
    with pytest.raises(ValueError, match="tiled layout"):
        derive_tables(only_rows, "linear", layout="tiled")


def test_layout_regret_says_whether_it_is_beyond_the_noise(tmp_path):
    """A pick 6% slower by median is a "loss" only where its p10-p90 band lies above the best's; a pick whose band
    reaches the best's (a config timed in two modes) is "noise", by DESIGN.md's rule, and stays visible as a regret."""
    def pt(m, variant, us, p10, p90):
        return {**_pt("a", 128, m, variant, us), "us_graph_p10": p10, "us_graph_p90": p90}

    run = _run(tmp_path, [pt(1, "gemv", 106, 105, 107), pt(1, "gemv_h2", 100, 99, 101),
                          pt(2, "gemv", 106, 99, 108), pt(2, "gemv_h2", 100, 99, 101),
                          pt(4, "gemv", 101, 100, 102), pt(4, "gemv_h2", 100, 99, 101)])
    r = regret(run, {"default": [(1 << 62, "gemv", {"BLOCK_N": 64})]}, "linear", layout="rows")
    assert r["layout_regret"].round(2).tolist() == [1.06, 1.06, 1.01]
    assert r["layout_verdict"].tolist() == ["loss", "noise", "noise"]


def test_package_tables_come_from_committed_h100_runs():
    import json

    import kernels.tables_measured as tm
    from labkit import RESULTS_DIR

    for op in ("linear", "moe"):
        runs = tm.SOURCES[op].split(" + ")
        broad = False
        for r in runs:  # every source is a committed run measured on an H100
            meta = json.loads((RESULTS_DIR / r.removeprefix("results/") / "meta.json").read_text())
            assert "H100" in meta["gpu"], (r, meta["gpu"])
            # the broad sweep, or a best_of run remeasuring the leaders of earlier sweeps side by side
            broad |= f"{op}_gptoss" in r.replace("-", "_") or "best_of" in meta["parameters"]["spec"]
        assert broad, runs
    lm_head = {"m": 1, "n": 201088, "k": 2880, "scale_min": 118, "scale_max": 124}
    assert pick_linear(lm_head)[0] == tm.LINEAR_TABLES[(201088, 2880)][0][1]
    moe = {"m": 4096, "tokens": 4096, "experts": 128, "n": 5760, "k": 2880, "top_k": 4, "scale_min": 118,
           "scale_max": 124}
    variant, cfg = pick_moe(moe)[:2]
    assert variant == "moe_mma" and cfg["WGMMA"] and not cfg["TILED"]  # prefill: wgmma on the row-major weights


def test_leaders_are_the_fastest_per_layout_unioned_over_problems(tmp_path):
    """tables.leaders: per token count, the `top` fastest configs of each problem in each layout, unioned
    over the problems (what a best_of sweep remeasures side by side)."""
    from labkit.tables import leaders

    mma = {"BLOCK_M": 8, "ROWS": 1, "CHUNKS": 2, "PREFETCH": True, "num_warps": 2}
    run = _run(tmp_path, [_pt("a", 128, 4, "gemv", 9), _pt("a", 128, 4, "gemv", 7, {"BLOCK_N": 32}),
                          _pt("a", 128, 4, "gemv", 11, {"BLOCK_N": 16}),
                          _pt("b", 256, 4, "gemv", 5, {"BLOCK_N": 16}), _pt("b", 256, 4, "gemv", 6),
                          _pt("a", 128, 4, "gemv_mma", 8, {**mma, "TILED": True}),
                          _pt("a", 128, 8, "gemv", 3)])
    got = leaders(run, "linear", top=1)
    assert got[(4,)] == [("gemv", {"BLOCK_N": 32}), ("gemv_mma", {**mma, "TILED": True}), ("gemv", {"BLOCK_N": 16})]
    assert got[(8,)] == [("gemv", {"BLOCK_N": 64})]
    assert len(leaders(run, "linear", top=2)[(4,)]) == 4  # a: 32, 64 and the tiled one; b adds 16


def test_shuffled_weights_read_their_own_nib_tables(tmp_path, monkeypatch):
    """Each layout held as shuffle_nibbles' copy has its own tables, derived from NIB configs alone (a config
    that leads only with NIB, here ROWS=2, is found), and auto on a shuffled weight reads them first; without
    them it falls back to its layout's plain tables with NIB set."""
    from types import SimpleNamespace

    import kernels.tables as kt

    mma = {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 1, "PREFETCH": False, "num_warps": 4, "TILED": True}
    pts = [_pt("lm", 201088, 16, "gemv_mma", 10, mma), _pt("lm", 201088, 16, "gemv_mma", 12, {**mma, "ROWS": 2}),
           _pt("lm", 201088, 16, "gemv_mma", 9, {**mma, "NIB": True}),
           _pt("lm", 201088, 16, "gemv_mma", 8, {**mma, "ROWS": 2, "NIB": True})]
    for p in pts:
        p["k"] = 2880
    run = _run(tmp_path, pts)
    tiled = derive_tables(run, "linear", layout="tiled")
    nib = derive_tables(run, "linear", layout="tiled+nib")
    assert tiled["default"] == [(1 << 62, "gemv_mma", mma)]
    assert nib["default"] == [(1 << 62, "gemv_mma", {**mma, "ROWS": 2, "NIB": True})]
    problem = {"m": 16, "n": 201088, "k": 2880, "scale_min": 118, "scale_max": 124, "tiled": True, "shuffled": True}
    monkeypatch.setattr(kt, "_measured", SimpleNamespace(LINEAR_TABLES_TILED=tiled, LINEAR_TABLES_TILED_NIB=nib))
    assert kt.pick_linear(problem) == ("gemv_mma", {**mma, "ROWS": 2, "NIB": True})
    monkeypatch.setattr(kt, "_measured", SimpleNamespace(LINEAR_TABLES_TILED=tiled))
    assert kt.pick_linear(problem) == ("gemv_mma", {**mma, "NIB": True})
    path = write_tables({"LINEAR_TABLES_TILED_NIB": nib}, {}, path=tmp_path / "t.py")
    ns = {}
    exec(path.read_text(), ns)
    assert ns["LINEAR_TABLES_TILED_NIB"] == nib


def test_a_gpu_reads_its_own_table_set_first_and_the_default_set_for_tables_it_lacks(monkeypatch):
    """kernels.tables.gpu_tables: a per-GPU set (tables_measured_<gpu>, selected by GPU_MATCH against the device
    name) is read first on that GPU; a table it lacks, any other GPU and a machine without one read the default
    set."""
    from types import SimpleNamespace

    import kernels.tables as kt

    mine = SimpleNamespace(__name__="h200", GPU_MATCH=("H200",),
                           LINEAR_TABLES={"default": [(1 << 62, "gemv", {"BLOCK_N": 32})]})
    default = SimpleNamespace(LINEAR_TABLES={"default": [(1 << 62, "gemv", {"BLOCK_N": 16})]},
                              LINEAR_TABLES_TILED={"default": [(1 << 62, "gemv_mma", {"TILED": True})]})
    monkeypatch.setattr(kt, "_gpu_sets", lambda: (mine,))
    monkeypatch.setattr(kt, "_measured", default)
    assert kt.gpu_tables("NVIDIA H200") is mine and kt.gpu_tables("NVIDIA H100 80GB HBM3") is default
    assert kt.gpu_tables(None) is default
    monkeypatch.setattr(kt, "_device_name", lambda: "NVIDIA H200")
    assert kt._keyed("LINEAR_TABLES", (1, 2)) == mine.LINEAR_TABLES["default"]
    assert kt._keyed("LINEAR_TABLES", (1, 2), tiled=True) == default.LINEAR_TABLES_TILED["default"]
    monkeypatch.setattr(kt, "_device_name", lambda: None)
    assert kt._keyed("LINEAR_TABLES", (1, 2)) == default.LINEAR_TABLES["default"]


def test_best_of_sources_are_the_runs_of_the_set_this_gpu_reads(monkeypatch):
    """A spec's best_of `sources` remeasures the runs behind the tables auto reads here: a GPU's own set's."""
    from types import SimpleNamespace

    import kernels.tables as kt
    from labkit.tables import source_runs

    mine = SimpleNamespace(GPU_MATCH=("H200",), SOURCES={"moe": "results/a + results/b"})
    monkeypatch.setattr(kt, "_gpu_sets", lambda: (mine,))
    monkeypatch.setattr(kt, "_measured", SimpleNamespace(SOURCES={"moe": "results/h100"}))
    monkeypatch.setattr(kt, "_device_name", lambda: "NVIDIA H200")
    assert source_runs("moe") == ["results/a", "results/b"]
    monkeypatch.setattr(kt, "_device_name", lambda: None)
    assert source_runs("moe") == ["results/h100"] and source_runs("linear") == []


def test_table_write_gpu_fits_a_set_to_that_gpus_runs_only(tmp_path, monkeypatch, capsys):
    """`labkit table write --gpu h200` writes kernels/tables_measured_h200.py with GPU_MATCH from the datasheet
    row, and refuses a run measured on another GPU (a set must come from the GPU it is read on)."""
    import labkit.tables as lt
    from labkit import cli
    from labkit.runs import open_run

    run = _run(tmp_path, [_pt("a", 128, 1, "gemv", 10), _pt("a", 128, 1, "gemv_h2", 8)])
    monkeypatch.setattr(lt, "TABLES_MODULE", tmp_path / "tables_measured.py")
    open_run(run).update_meta(gpu="NVIDIA H100 80GB HBM3")
    assert cli.main(["table", "write", "--gpu", "h200", "--linear", str(run)]) != 0
    assert "measured on NVIDIA H100 80GB HBM3, not on the GPU this set is for" in capsys.readouterr().err
    open_run(run).update_meta(gpu="NVIDIA H200")
    assert cli.main(["table", "write", "--gpu", "h200", "--linear", str(run)]) == 0
    ns = {}
    exec((tmp_path / "tables_measured_h200.py").read_text(), ns)
    assert ns["GPU_MATCH"] == ("H200",) and ns["SOURCES"] == {"linear": str(run)}
    assert ns["LINEAR_TABLES"][(128, 64)][0][1] == "gemv_h2" and "MOE_TABLES" not in ns
    assert not (tmp_path / "tables_measured.py").exists()  # the default set is left alone


def test_the_shipped_h200_set_comes_from_committed_h200_tables_runs():
    import kernels.tables_measured_h200 as h200
    from kernels.tables import gpu_tables
    from labkit.results import run_meta

    assert gpu_tables("NVIDIA H200") is h200 and gpu_tables("NVIDIA H100 80GB HBM3") is not h200
    for op in ("linear", "moe"):
        for r in h200.SOURCES[op].split(" + "):
            meta = run_meta(r)
            assert meta["gpu"] == "NVIDIA H200" and "best_of" in meta["parameters"]["spec"], r
