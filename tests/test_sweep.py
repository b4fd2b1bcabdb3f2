"""Sweeps on the CPU end to end: measured points, a config that raises, a killed sweep resumed."""

import dataclasses
import subprocess
import sys
import time

import pytest
import yaml

import kernels as K
from labkit.results import KEY_COLUMNS, PointStore, best_table, point_key, read_runs
from labkit.sweep import expand_linear, run_sweep

#: 2 gemv configs at 2 token counts + the cuBLAS baseline: 6 small points through the interpreter
TINY = {"name": "tiny_linear", "op": "linear", "shapes": {"t": [48, 64]}, "m": [1, 2],
        "baselines": ["cublas_bf16"],
        "variants": {"gemv": {"BLOCK_M": "auto", "BLOCK_N": [16, 32], "BLOCK_K": [64], "num_warps": [4],
                              "num_stages": [1]}}}


def test_small_sweep_end_to_end(tmp_path, capsys):
    path = run_sweep(TINY, out=tmp_path / "run", progress=False)
    df = read_runs([path])
    assert len(df) == 6 and set(df["status"]) == {"ok"}
    assert (df["us_eager"] > 0).all() and (df["us_eager_p10"] <= df["us_eager_p90"]).all()
    assert not df[KEY_COLUMNS].astype(str).duplicated().any()
    meta = yaml.safe_load((path / "meta.json").read_text())
    assert meta["finished"] and meta["parameters"]["specs"]["tiny_linear"]["op"] == "linear"
    best = best_table(df)
    assert set(best["best"]) == {"gemv"} and best["vs_baseline"].notna().all()
    assert "resumes" not in meta
    run_sweep(TINY, resume=path, progress=False)  # nothing left to measure
    assert len(PointStore(path).read()) == 6
    assert "6 already stored, 0 to measure" in capsys.readouterr().out
    resumes = yaml.safe_load((path / "meta.json").read_text())["resumes"]  # which checkout a resume ran
    assert len(resumes) == 1 and resumes[0]["what"] == "sweep tiny_linear" and "git_commit" in resumes[0]


def test_limit_counts_what_is_stored_apart_from_what_it_leaves_out(tmp_path, capsys):
    path = run_sweep(TINY, out=tmp_path / "run", limit=2, progress=False)
    assert "6 points in the spec, 0 already stored, 2 to measure (--limit 2)" in capsys.readouterr().out
    run_sweep(TINY, resume=path, limit=1, progress=False)
    assert "6 points in the spec, 2 already stored, 1 to measure (--limit 1)" in capsys.readouterr().out
    assert len(PointStore(path).read()) == 3


def test_config_that_raises_is_recorded_failed(tmp_path, monkeypatch):
    from kernels import VARIANTS

    gemv = VARIANTS["gemv"]

    def launcher(*args, **cfg):
        if cfg["BLOCK_N"] == 32:
            raise RuntimeError("launch rejected: BLOCK_N=32 (test)")
        return gemv.fn(*args, **cfg)

    monkeypatch.setitem(VARIANTS, "gemv", dataclasses.replace(gemv, fn=launcher))
    df = read_runs([run_sweep(TINY, out=tmp_path / "run", progress=False)])
    assert len(df) == 6
    bad = df[df["config"].str.contains('"BLOCK_N": 32')]
    assert len(bad) == 2 and set(bad["status"]) == {"failed"}
    assert bad["error"].str.contains("RuntimeError: launch rejected").all() and bad["us_eager"].isna().all()
    assert set(df.drop(bad.index)["status"]) == {"ok"}


def test_shapes_with_the_same_dims_are_refused():
    spec = {**TINY, "shapes": {"a": [48, 64], "b": [48, 64]}}
    with pytest.raises(ValueError, match="shapes 'a' and 'b' are both"):
        expand_linear(spec, on_gpu=True)


def test_resume_skips_stored_route_points(tmp_path, monkeypatch):
    from labkit import bench_moe

    path = run_sweep("route_gptoss", out=tmp_path / "run", progress=False)
    assert len(PointStore(path).read()) == 2

    def boom(*a, **k):
        raise AssertionError("a stored route point was measured again")

    monkeypatch.setattr(bench_moe, "measure_route", boom)
    run_sweep("route_gptoss", resume=path, progress=False)
    assert len(PointStore(path).read()) == 2


def test_route_all_measures_every_form_that_applies(tmp_path):
    """route: all (route_forms' spec) times each form of route at each token count, the form as the variant."""
    pts = PointStore(run_sweep("route_forms", out=tmp_path / "run", progress=False)).read()
    got = sorted(zip(pts["m"], pts["variant"], pts["status"]))
    assert got == [(1, "blocks", "ok"), (1, "fused", "ok"), (1, "torch", "ok"), (70, "blocks", "ok"),
                   (70, "torch", "ok")]


def test_interrupted_sweep_says_how_to_go_on(tmp_path, monkeypatch, capsys):
    """^C part way (a KeyboardInterrupt in the third point): the two points before it stay stored, the sweep
    names the command that measures the rest, and `labkit sweep` exits 130 without a traceback."""
    from labkit import bench
    from labkit.cli import main

    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump(TINY))
    measure, calls = bench.measure_linear, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return measure(*a, **k)

    monkeypatch.setattr(bench, "measure_linear", interrupted)
    run_dir = tmp_path / "run"
    assert main(["sweep", str(spec_file), "--out", str(run_dir), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert f"interrupted: 2 of the spec's 6 points are stored in {run_dir}" in err
    assert f"`./lab sweep {spec_file} --resume {run_dir}` measures the rest" in err
    assert "labkit sweep: interrupted" in err and "Traceback" not in err
    assert len(PointStore(run_dir).read()) == 2


def test_interrupted_precompile_drops_the_queued_compiles(monkeypatch):
    """^C while a GPU sweep compiles its configs in worker processes: precompile re-raises at once and cancels
    what is queued, rather than leaving the executor to wait for every compile (minutes on a full spec)."""
    from labkit import compile as comp

    class Pool:
        def __init__(self, **kw):
            self.shutdowns = []
            pools.append(self)

        def submit(self, fn, task):
            return task

        def shutdown(self, wait=True, cancel_futures=False):
            self.shutdowns.append((wait, cancel_futures))

    def interrupted(futs):
        raise KeyboardInterrupt
        yield

    pools: list = []
    monkeypatch.setattr(comp, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(comp, "as_completed", interrupted)
    tasks = [{"variant": "gemv", "config": {"BLOCK_N": n}, "m": 1, "n": 64, "k": 64} for n in (16, 32, 64)]
    with pytest.raises(KeyboardInterrupt):
        comp.precompile(tasks, workers=2, progress=False)
    assert pools[0].shutdowns == [(False, True)]


@pytest.mark.slow
def test_killed_sweep_resumes_without_losing_or_repeating_points(tmp_path):
    spec = {**TINY, "m": [1, 2, 3, 4, 5, 6]}  # 18 points
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "sweep", str(spec_file), "--out", str(run_dir),
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = PointStore(run_dir)
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if store.path.exists() and len(store.read()) >= 3:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the sweep stored no points in time" if proc.poll() is None else "the sweep ended first")
    finally:
        proc.kill()
        proc.wait()
    before = store.read()
    expected = {point_key(c.key()) for c in expand_linear(spec, on_gpu=False)}
    assert len(expected) == 18 and 3 <= len(before) < 18, "killed part way"

    run_sweep(str(spec_file), resume=run_dir, progress=False)
    after = store.read()
    keys = [point_key(r) for r in after.to_dict("records")]
    assert len(keys) == len(set(keys)) == 18 and set(keys) == expected  # none lost, none stored twice
    stored_first = after.iloc[: len(before)].reset_index(drop=True)
    cols = [*KEY_COLUMNS, "status", "us_eager"]
    assert stored_first[cols].astype(str).equals(before[cols].astype(str))  # earlier points untouched


def test_token_tiles_follow_tokens_per_program():
    from labkit.sweep import variant_configs

    grid = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [128], "BLOCK_K": [64]}
    moe = {"op": "moe", "m": 8, "tokens": 8, "experts": 8, "top_k": 4, "n": 128, "k": 64}
    # 8 tokens x 4 slots can put 32 tokens on one expert: tiles up to 32, not 128
    assert sorted(c["BLOCK_M"] for c in variant_configs("moe_tc", grid, moe)) == [16, 32]
    assert sorted(c["BLOCK_M"] for c in variant_configs("moe_tc", grid, moe, all_tiles=True)) == [16, 32, 64, 128]
    lin = {"op": "linear", "m": 20, "n": 64, "k": 64}
    assert sorted(c["BLOCK_M"] for c in variant_configs("mma", {"BLOCK_M": [64, 128]}, lin)) == [64]


def test_a_list_of_grids_gives_their_union():
    from labkit.sweep import variant_configs

    moe = {"op": "moe", "m": 8, "tokens": 8, "experts": 8, "top_k": 4, "n": 128, "k": 64}
    grids = [{"BLOCK_M": [1, 2], "BLOCK_N": [16]}, {"BLOCK_M": 2, "BLOCK_N": 16}, {"BLOCK_M": 4, "BLOCK_N": 32}]
    got = [(c["BLOCK_M"], c["BLOCK_N"]) for c in variant_configs("moe_h2", grids, moe)]
    assert got == [(1, 16), (2, 16), (4, 32)]


@pytest.mark.parametrize("name", sorted(p.stem for p in __import__("labkit.sweep", fromlist=["SPECS_DIR"]).SPECS_DIR
                                        .glob("*.yaml")))
def test_every_shipped_spec_expands(name):
    """Each shipped spec parses and expands to points at GPU and CPU sizes (a routing name broken by YAML's
    comma splitting, an unknown parameter or a grid the rules empty out fails here, not on the device)."""
    from labkit.sweep import expand_moe, load_spec

    spec = load_spec(name)
    expand = expand_moe if spec["op"] == "moe" else expand_linear
    for on_gpu in (True, False):
        assert expand(spec, on_gpu) or spec.get("route"), (name, on_gpu)  # a route spec times route alone


def test_auto_picks_add_what_auto_runs_in_each_layout():
    """`auto_picks: [rows, tiled, tiled+nib]` adds, at every point, the config variant="auto" picks for a
    row-major, a tiled and a shuffled tiled weight (once, even where the grid already holds it), so regret is
    measured in the same run."""
    from kernels.tables import pick_moe
    from labkit.sweep import expand_moe

    spec = {"op": "moe", "models": ["gpt-oss-20b"], "tokens": [1, 256], "routings": ["zipf(1.2)"],
            "variants": {}, "auto_picks": ["rows", "tiled", "tiled+nib"]}
    cases = expand_moe(spec, on_gpu=True)
    for t in (1, 256):
        got = [(c.variant, c.config) for c in cases if c.tokens == t]
        problem = {"op": "moe", "m": t, "tokens": t, "experts": 32, "top_k": 4, "n": 5760, "k": 2880,
                   "scale_min": 118, "scale_max": 124}
        for tiled, shuffled in ((False, False), (True, False), (True, True)):
            name, cfg = pick_moe({**problem, "tiled": tiled, "shuffled": shuffled})
            assert (name, {**K.VARIANTS[name].defaults, **cfg}) in got
        assert len(got) in (1, 2, 3) and any(c.get("TILED") for _, c in got) and any(c.get("NIB") for _, c in got)
    with pytest.raises(ValueError, match="auto_picks lists weight layouts"):
        expand_moe({**spec, "auto_picks": ["tiles"]}, on_gpu=True)


def test_a_grid_may_hold_its_own_token_range():
    from labkit.sweep import variant_configs

    grids = [{"BLOCK_M": [8], "ROWS": [1], "CHUNKS": [1], "TILED": [True], "m_range": [1, 8]},
             {"BLOCK_M": [16], "ROWS": [1], "CHUNKS": [1], "TILED": [True]}]
    problem = {"op": "linear", "m": 4, "n": 64, "k": 64, "scale_min": 118, "scale_max": 124}
    assert [c["BLOCK_M"] for c in variant_configs("gemv_mma", grids, problem)] == [8, 16]
    assert [c["BLOCK_M"] for c in variant_configs("gemv_mma", grids, {**problem, "m": 64})] == [16]


def test_best_of_adds_earlier_leaders_the_rules_admit(tmp_path):
    """`best_of` adds at each point the fastest configs earlier runs measured there (once each, only those
    the current rules admit for the point), so they are timed side by side on one routing sample."""
    from labkit.results import PointStore
    from labkit.runs import create_run
    from labkit.sweep import expand_moe

    h2g = {"BLOCK_K": 256, "BLOCK_M": 1, "BLOCK_N": 16, "num_warps": 2}
    pts = [{"op": "moe_layer", "variant": "moe_h2g", "config": {**h2g, "BLOCK_N": bn}, "m": 1, "n": 5760,
            "k": 2880, "experts": 32, "routing": "uniform", "model": "gpt-oss-20b", "status": "ok", "us_graph": us}
           for bn, us in ((16, 10.0), (32, 12.0), (64, 20.0))]
    pts.append({**pts[0], "config": {**h2g, "BLOCK_K": 48}, "us_graph": 1.0})  # ruled out now (BLOCK_K % 32)
    run = create_run("old", out=tmp_path / "old")
    PointStore(run.path).append(pts)
    spec = {"op": "moe", "models": ["gpt-oss-20b"], "tokens": [1, 2], "routings": ["uniform"], "variants": {},
            "best_of": {"top": 3, "runs": [str(tmp_path / "ol*")]}}
    cases = expand_moe(spec, on_gpu=True)
    got = sorted(c.config["BLOCK_N"] for c in cases if c.tokens == 1)
    assert got == [16, 32] and all(c.tokens == 1 for c in cases)
    assert all(c.config == {**K.VARIANTS["moe_h2g"].defaults, **c.config} for c in cases)
    also = expand_moe({**spec, "best_of": {**spec["best_of"], "also": {"BLOCK_K": 512, "ROWS": 2}}}, on_gpu=True)
    got = sorted((c.config["BLOCK_N"], c.config["BLOCK_K"]) for c in also if c.tokens == 1)
    # each leader, then with BLOCK_K=512 (moe_h2g has no ROWS) where the rules admit it: not BLOCK_N=32 on 2 warps
    assert got == [(16, 256), (16, 512), (32, 256)]
    nib = expand_moe({**spec, "best_of": {**spec["best_of"], "layouts": ["rows+nib", "tiled"]}}, on_gpu=True)
    assert nib == []  # the stored leaders read row-major weights, without NIB
    rows = expand_moe({**spec, "best_of": {**spec["best_of"], "layouts": ["rows"]}}, on_gpu=True)
    assert [c.config for c in rows] == [c.config for c in cases]
    # an opt-in leader (ATOMIC, which moe_h2g does not take, so here a moe_mma config) counts only with opt_in
    mma = {**K.VARIANTS["moe_mma"].defaults, "ATOMIC": True, "WGMMA": True, "CHAIN": True, "RING_W": True,
           "TILED": True, "STAGES": 3}
    PointStore(run.path).append({**pts[0], "variant": "moe_mma", "config": mma, "us_graph": 0.5})
    plain = {(c.variant, c.config.get("ATOMIC")) for c in expand_moe(spec, on_gpu=True)}
    opted = {(c.variant, c.config.get("ATOMIC"))
             for c in expand_moe({**spec, "best_of": {**spec["best_of"], "opt_in": True}}, on_gpu=True)}
    assert ("moe_mma", True) not in plain and ("moe_mma", True) in opted
    with pytest.raises(ValueError, match="layouts lists weight layouts"):
        expand_moe({**spec, "best_of": {**spec["best_of"], "layouts": ["tiles"]}}, on_gpu=True)
    with pytest.raises(ValueError, match="also is"):
        expand_moe({**spec, "best_of": {"top": 2, "also": [1]}}, on_gpu=True)
    with pytest.raises(ValueError, match="matches no run folder"):
        expand_moe({**spec, "best_of": {"top": 2, "runs": [str(tmp_path / "nothing*")]}}, on_gpu=True)
    with pytest.raises(ValueError, match="best_of is"):
        expand_moe({**spec, "best_of": {"top": 0}}, on_gpu=True)


def test_every_config_of_a_moe_point_is_timed_on_one_routing_sample():
    """The routing sample of a MoE point depends on the point only, so configs are compared on the same
    experts touched; points differ."""
    from labkit.bench_moe import point_seed
    from labkit.routing import generate

    assert point_seed(8, "uniform") == point_seed(8, "uniform")
    seeds = {point_seed(t, r) for t in (1, 8, 64) for r in ("uniform", "zipf(1.2)")}
    assert len(seeds) == 6
    a, b = (generate("uniform", 8, 128, 4, seed=point_seed(8, "uniform")) for _ in range(2))
    assert a.ids.equal(b.ids)
