"""Sweeps declared as data: which op, shapes, token counts, variants and tile values to measure.

A spec is a dict or a YAML file (labkit/specs/*.yaml ship the lab's standard sweeps):

    op: linear
    shapes: {lm_head: [201088, 2880]}        # name: [N, K]  (GPU sizes)
    cpu_shapes: {lm_head: [96, 128]}         # the small sizes used without a GPU (Triton interpreter)
    m: [1, 2, 4]                             # token counts (cpu_m without a GPU)
    variants:                                # variant: {param: [values]} or a list of such grids (union);
                                             # BLOCK_M: auto = smallest tile >= M
      gemv: {BLOCK_M: auto, BLOCK_N: [32, 64], BLOCK_K: [256]}
    m_range: {gemv: [1, 16]}                 # token counts a variant is swept at (default: all); a grid may
                                             # hold its own m_range: [lo, hi]
    baselines: [cublas_bf16, dequant_matmul]
    gemv_bf16: {block_n: [4, 8], block_k: [512]}   # the lab's bf16 GEMV (kernels.linear_bf16) as a baseline
                                             # over a grid, at token counts up to its MAX_ROWS
    cpu_configs: 2                           # configs per variant and point without a GPU (interpreter is slow)
    auto_picks: [rows, tiled]                # also what variant="auto" picks at each point, per weight layout
                                             # (kernels/tables.py as checked out): regret measured in the same run
    best_of: {top: 4, runs: [sources]}       # also the `top` fastest configs per layout that earlier runs measured
                                             # at each point (tables.leaders); runs: folders or globs, `sources`
                                             # = the runs the op's tables came from; also: {PARAM: value} adds
                                             # each leader once more with those values (an A/B of one change
                                             # against the best configs, on one routing sample); layouts:
                                             # [tiled+nib, ...] keeps only leaders that read those layouts;
                                             # opt_in: true ranks configs with options auto never takes too

`run_sweep` measures every point not already stored in the run folder, appending each as it finishes, so a
sweep killed at any moment resumes where it stopped and loses at most the point in flight.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

import yaml

from kernels import VARIANTS
from kernels.variants import get_variant

from .results import sweep_problem

SPECS_DIR = Path(__file__).parent / "specs"


def load_spec(spec) -> dict:
    """A spec from a dict, a YAML path, or the name of a shipped spec (labkit/specs/<name>.yaml)."""
    if isinstance(spec, dict):
        return dict(spec)
    p = Path(spec)
    if not p.is_file():
        p = SPECS_DIR / f"{spec}.yaml"
    if not p.is_file():
        near = [q.stem for q in sorted(SPECS_DIR.glob(f"{str(spec).split('_')[0]}_*.yaml"))][:12]
        raise FileNotFoundError(f"no sweep spec {spec!r} (neither a file nor a shipped name); `./lab sweep --list` "
                                f"names the shipped ones" + (f", e.g. {', '.join(near)}" if near else ""))
    out = yaml.safe_load(p.read_text())
    if not isinstance(out, dict) or "op" not in out:
        raise ValueError(f"{p}: a sweep spec is a mapping with at least an 'op' key")
    out.setdefault("name", p.stem)
    return out


def shipped_specs(word: str = "") -> list[tuple[str, str]]:
    """(name, first sentence of its opening comment) of every shipped spec whose name or comment holds `word`
    (case ignored): 188 specs are too many to find by file name alone."""
    out = []
    for p in sorted(SPECS_DIR.glob("*.yaml")):
        lines = p.read_text().splitlines()
        head = " ".join(ln.lstrip("#").strip() for ln in lines[:next((i for i, ln in enumerate(lines)
                                                                       if not ln.startswith("#")), len(lines))])
        if word.lower() in f"{p.stem} {head}".lower():
            first, dot, _ = head.partition(". ")
            out.append((p.stem, first + ("." if dot else "")))
    return out


def _token_tile(values: tuple, m: int) -> int:
    """Smallest token tile in `values` that covers m tokens, else the largest."""
    fits = [v for v in sorted(values) if v >= m]
    return fits[0] if fits else max(values)


def _grid(grid: dict) -> list[dict]:
    """Every combination of a {param: [values]} grid (a scalar is one value)."""
    keys = list(grid)
    vals = [g if isinstance(g, (list, tuple)) else [g] for g in grid.values()]
    return [dict(zip(keys, combo)) for combo in itertools.product(*vals)]


def variant_configs(name: str, grid: dict | list, problem: dict, *, all_tiles: bool = False) -> list[dict]:
    """Configs of one variant for one problem: the spec's grid (BLOCK_M: auto resolved) filtered by the rules.
    A list of grids gives the union of their configs (for a few hand-picked configs next to a grid).

    Token tiles larger than the most tokens one program can get (M for a linear, T*k for a MoE expert) are
    skipped unless all_tiles (the spec's `all_tiles: true`) asks for every tile anyway.
    """
    if isinstance(grid, list):
        out: list[dict] = []
        for g in grid:
            out += [c for c in variant_configs(name, g, problem, all_tiles=all_tiles) if c not in out]
        return out
    v = get_variant(name, problem.get("op", "linear"))
    grid = dict(grid or {})
    lo, hi = grid.pop("m_range", (0, float("inf")))  # this grid's token counts (the spec's m_range: the variant's)
    if not lo <= problem["m"] <= hi:
        return []
    if grid.get("BLOCK_M") == "auto":
        grid["BLOCK_M"] = [_token_tile(tuple(v.space.get("BLOCK_M", (1,))), problem["m"])]
    unknown = set(grid) - set(v.space) - set(v.defaults)
    if unknown:
        raise ValueError(f"spec: variant {name!r} has no parameter(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(sorted(set(v.space) | set(v.defaults)))}")
    # never sweep a token tile bigger than the tokens need (beyond the smallest tile offered)
    bm_values = grid.get("BLOCK_M", [v.defaults.get("BLOCK_M", 1)])
    bm_values = bm_values if isinstance(bm_values, (list, tuple)) else [bm_values]
    most = problem["m"] * problem.get("top_k", 1) if problem.get("op") == "moe" else problem["m"]
    bm_cap = float("inf") if all_tiles else max(min(bm_values), 1 << max(0, most - 1).bit_length())
    out = []
    for combo in _grid(grid):
        cfg = {**v.defaults, **combo}
        if cfg.get("BLOCK_M", 1) > bm_cap:
            continue
        if v.reason(cfg, problem) is None and cfg not in out:
            out.append(cfg)
    return out


def best_of(spec: dict, op: str) -> dict:
    """tables.leaders of the spec's `best_of` runs ({} without the key)."""
    import glob

    from kernels.prepare import HELD_LAYOUTS

    from .tables import config_layout, leaders, source_runs

    bo = spec.get("best_of")
    if not bo:
        return {}
    if not isinstance(bo, dict) or not isinstance(bo.get("top"), int) or bo["top"] < 1:
        raise ValueError(f"spec: best_of is {{top: N >= 1, runs: [...], also: {{...}}}}, got {bo!r}")
    if not isinstance(bo.get("also", {}), dict):
        raise ValueError(f"spec: best_of's also is {{PARAM: value}}, got {bo['also']!r}")
    layouts = bo.get("layouts")
    if layouts is not None and (not isinstance(layouts, list) or set(layouts) - set(HELD_LAYOUTS)):
        raise ValueError(f"spec: best_of's layouts lists weight layouts ({', '.join(HELD_LAYOUTS)}), got {layouts!r}")
    runs: list[str] = []
    for r in bo.get("runs", ["sources"]):
        found = source_runs(op) if r == "sources" else sorted(glob.glob(r))
        if not found:
            raise ValueError(f"spec: best_of run {r!r} matches no run folder")
        runs += [f for f in found if f not in runs]
    lead = leaders(runs, op, bo["top"], with_opt_in=bool(bo.get("opt_in")))
    if layouts is not None:
        lead = {k: [(v, c) for v, c in lst if config_layout(json.dumps(c)) in layouts] for k, lst in lead.items()}
    return lead


def _extras(spec: dict, problem: dict, lead: list, have: set) -> list[tuple[str, dict]]:
    """Leaders of earlier runs that the rules admit for `problem`, then auto's picks: what the spec's best_of
    and auto_picks add to a point beyond its grids (`have`: the (variant, _key(config)) it already holds)."""
    out = []
    also = (spec.get("best_of") or {}).get("also") or {}
    for name, cfg in lead:
        v = VARIANTS.get(name)
        if v is None:
            continue
        full = {**v.defaults, **cfg}
        changed = {**full, **{k: val for k, val in also.items() if k in v.space}}
        for c in (full, changed):  # a change that changes nothing is dropped as a repeat below
            if v.reason(c, problem) is None:
                out.append((name, c))
    out += auto_picks(spec, problem)
    seen = set(have)
    kept = []
    for name, cfg in out:
        if (name, _key(cfg)) not in seen:
            seen.add((name, _key(cfg)))
            kept.append((name, cfg))
    return kept


def auto_picks(spec: dict, problem: dict) -> list[tuple[str, dict]]:
    """(variant, full config) that variant="auto" picks for `problem` with the weight in each layout the
    spec's `auto_picks` lists ("rows": prepare_mxfp4's, "tiled": tile_mxfp4's, "+nib": held as
    shuffle_nibbles' copy of either)."""
    from kernels.prepare import HELD_LAYOUTS
    from kernels.tables import pick_linear, pick_moe

    out: list[tuple[str, dict]] = []
    for layout in spec.get("auto_picks", []):
        if layout not in HELD_LAYOUTS:
            raise ValueError(f"spec: auto_picks lists weight layouts ({', '.join(HELD_LAYOUTS)}), got {layout!r}")
        held = {"tiled": layout.startswith("tiled"), "shuffled": layout.endswith("+nib")}
        name, cfg = (pick_moe if problem.get("op") == "moe" else pick_linear)({**problem, **held})
        out.append((name, {**VARIANTS[name].defaults, **cfg}))  # _extras drops repeats
    return out


def expand_linear(spec: dict, on_gpu: bool):
    """Every LinearCase of a linear spec (GPU sizes with a GPU, the cpu_* sizes without)."""
    from .bench import LinearCase

    shapes = spec["shapes"] if on_gpu else spec.get("cpu_shapes", spec["shapes"])
    ms = spec["m"] if on_gpu else spec.get("cpu_m", spec["m"])
    ranges = spec.get("m_range", {})
    seen: dict[tuple, str] = {}
    for shape, (n, k) in shapes.items():  # a point is keyed by (n, k), not the shape's name
        if (n, k) in seen:
            raise ValueError(f"spec: shapes {seen[(n, k)]!r} and {shape!r} are both [{n}, {k}]; points are keyed "
                             "by [N, K], so they would be the same points: keep one")
        seen[(n, k)] = shape
    from kernels.linear_bf16 import MAX_ROWS as bf16_max_rows
    from kernels.linear_bf16 import fits as bf16_fits

    rng = random.Random(0)
    lead = best_of(spec, "linear")
    cases = []
    for shape, (n, k) in shapes.items():
        for m in ms:
            point_start = len(cases)
            problem = sweep_problem("linear", m, n, k)
            for base in spec.get("baselines", []):
                cases.append(LinearCase(shape, m, n, k, base, {}, spec.get("bias", False)))
            if "gemv_bf16" in spec and m <= bf16_max_rows:  # the lab's bf16 GEMV: a baseline with a grid
                cfgs = [c for c in _grid(spec["gemv_bf16"]) if bf16_fits(m, **c)]
                if not on_gpu and spec.get("cpu_configs"):
                    cfgs = rng.sample(cfgs, min(len(cfgs), spec["cpu_configs"]))
                cases += [LinearCase(shape, m, n, k, "gemv_bf16", c, spec.get("bias", False)) for c in cfgs]
            for name, grid in spec.get("variants", {}).items():
                lo, hi = ranges.get(name, [0, float("inf")])
                if not lo <= m <= hi:
                    continue
                cfgs = variant_configs(name, grid, problem, all_tiles=spec.get("all_tiles", False))
                if not on_gpu and spec.get("cpu_configs"):
                    cfgs = rng.sample(cfgs, min(len(cfgs), spec["cpu_configs"]))
                cases += [LinearCase(shape, m, n, k, name, c, spec.get("bias", False)) for c in cfgs]
            have = {(c.variant, _key(c.config)) for c in cases[point_start:]}
            cases += [LinearCase(shape, m, n, k, name, c, spec.get("bias", False))
                      for name, c in _extras(spec, problem, lead.get((m,), []), have)]
    return cases


def _key(cfg: dict) -> str:
    return repr(sorted(cfg.items()))


def expand_moe(spec: dict, on_gpu: bool):
    """Every MoECase of a moe spec: models x tokens x routings x (baselines + variant configs)."""
    from .bench_moe import MODELS, MoECase
    from .routing import parse

    models = spec["models"] if on_gpu else spec.get("cpu_models", ["tiny"])
    tokens = spec["tokens"] if on_gpu else spec.get("cpu_tokens", spec["tokens"])
    routings = spec["routings"] if on_gpu else spec.get("cpu_routings", spec["routings"])
    for rt in set(spec["routings"]) | set(spec.get("cpu_routings", [])):
        parse(rt)  # a bad routing name fails here, before any GPU time is spent
    ranges = spec.get("m_range", {})
    rng = random.Random(0)
    lead = best_of(spec, "moe")
    cases = []
    for model in models:
        if model not in MODELS:
            raise ValueError(f"spec: unknown model {model!r}; known: {', '.join(MODELS)}")
        E, k, H, I = MODELS[model]
        for t in tokens:
            for rt in routings:
                point_start = len(cases)
                base = dict(model=model, tokens=t, routing=rt, experts=E, top_k=k, hidden=H, intermediate=I)
                for b in spec.get("baselines", []):
                    cases.append(MoECase(variant=b, **base))
                problem = sweep_problem("moe", t, 2 * I, H, E, k)
                for name, grid in spec.get("variants", {}).items():
                    lo, hi = ranges.get(name, [0, float("inf")])
                    if not lo <= t <= hi:
                        continue
                    cfgs = variant_configs(name, grid, problem, all_tiles=spec.get("all_tiles", False))
                    if not on_gpu and spec.get("cpu_configs"):
                        cfgs = rng.sample(cfgs, min(len(cfgs), spec["cpu_configs"]))
                    cases += [MoECase(variant=name, config=c, **base) for c in cfgs]
                have = {(c.variant, _key(c.config)) for c in cases[point_start:]}
                cases += [MoECase(variant=name, config=c, **base)
                          for name, c in _extras(spec, problem, lead.get((t, rt), []), have)]
    return cases


def run_sweep(spec, *, out: str | Path | None = None, resume: str | Path | None = None, limit: int | None = None,
              progress: bool = True, precompile_workers: int | None = None) -> Path:
    """Run a sweep into a run folder (new, `out`, or `resume`d); returns the folder."""
    import torch
    from tqdm import tqdm

    from .results import PointStore, point_key
    from .runs import create_run, open_run, sigint_ignored

    given = str(spec) if isinstance(spec, (str, Path)) else None
    spec = load_spec(spec)
    if spec["op"] not in ("linear", "moe"):
        raise ValueError(f"spec op {spec['op']!r} is not supported (known: linear, moe)")
    on_gpu = torch.cuda.is_available()
    cases = expand_linear(spec, on_gpu) if spec["op"] == "linear" else expand_moe(spec, on_gpu)
    name = spec.get("name", "sweep")
    if resume:  # several specs may share one run folder (the quickstart's): each is kept under `specs`
        run = open_run(resume)
        old = run.meta.get("parameters", {})
        run.update_meta(parameters={**old, "spec": spec, "specs": {**old.get("specs", {}), name: spec}})
        run.note_resume(f"sweep {name}")
    else:
        run = create_run(name, out=out, parameters={"spec": spec, "specs": {name: spec}})
    store = PointStore(run.path)
    done = store.done_keys()
    todo = [c for c in cases if point_key(c.key()) not in done]
    stored = len(cases) - len(todo)
    if limit is not None:
        todo = todo[:limit]
    print(f"run folder: {run.path}\n{len(cases)} points in the spec, {stored} already stored, {len(todo)} to "
          f"measure" + (f" (--limit {limit})" if limit is not None else ""))
    bar = None
    try:
        ceilings = _prepare_gpu(spec, todo, run, precompile_workers, progress) if on_gpu and todo else None
        bar = tqdm(total=len(todo), disable=not progress, unit="pt", dynamic_ncols=True)
        _measure(spec, todo, done, store, ceilings, bar, on_gpu)
    except KeyboardInterrupt:
        with sigint_ignored():
            if bar is not None:
                bar.close()
            again = f"./lab sweep {given or name} --resume {run.path}"
            stored = store.done_keys()
            n = sum(point_key(c.key()) in stored for c in cases)
            print(f"\ninterrupted: {n} of the spec's {len(cases)} points are stored in {run.path}; "
                  f"`{again}` measures the rest", file=sys.stderr, flush=True)
        raise
    bar.close()
    run.finish()
    return run.path


def _prepare_gpu(spec: dict, todo: list, run, workers: int | None, progress: bool):
    """Measure the ceilings into the run's meta, then compile every config of `todo` in parallel worker
    processes (labkit.compile.precompile), so the timing loop only loads kernels; returns the ceilings."""
    from .compile import precompile
    from .hardware import WAKE_LIMIT, measure_ceilings

    print("measuring ceilings (read bandwidth, bf16 matmul) ...", flush=True)
    ceilings = measure_ceilings()
    run.update_meta(ceilings=ceilings.as_meta())
    if ceilings.wake_ratio and ceilings.wake_ratio > WAKE_LIMIT:
        print(f"warning: a timed call after a 30 ms host gap ran {ceilings.wake_ratio:.2f}x as long as warm: "
              "this GPU wakes more slowly than the spin kernel ahead of each timed call lasts, so points timed "
              "after a host stall read slow; raise LAB_SPIN_CYCLES (labkit.hardware.SPIN_CYCLES)", flush=True)
    if spec["op"] == "linear":
        tasks = [{"variant": c.variant, "config": c.config, "m": c.m, "n": c.n, "k": c.k, "bias": c.bias}
                 for c in todo if c.variant in VARIANTS]
    else:
        tasks = [{"op": "moe", "variant": c.variant, "config": c.config, "m": c.tokens, "experts": c.experts,
                  "top_k": c.top_k, "n": 2 * c.intermediate, "k": c.hidden} for c in todo if c.variant in VARIANTS]
    failed = [r for r in precompile(tasks, workers=workers, progress=progress) if not r["ok"]]
    if failed:
        print(f"{len(failed)} config(s) failed to compile; they are stored as failed points")
    return ceilings


def _measure(spec: dict, todo: list, done: set, store, ceilings, bar, on_gpu: bool) -> None:
    """Time `todo`'s cases, one bench per shape (linear) or model (moe), then the spec's route points; each
    point is appended to `store` as it finishes, so an interrupted sweep keeps all but the point in flight."""
    import torch

    from . import bench
    from .results import point_key

    groups: dict = {}
    for c in todo:
        groups.setdefault((c.shape, c.n, c.k) if spec["op"] == "linear" else c.model, []).append(c)
    seed = len(done)
    for key, group in groups.items():
        if spec["op"] == "linear":
            b = bench.LinearBench(key[1], key[2], max_m=max(c.m for c in group))
            measure = bench.measure_linear
        else:
            from . import bench_moe

            b = bench_moe.MoEBench(key, baseline=any(c.variant == "torch_bf16" for c in group))
            measure = bench_moe.measure_moe
        for c in group:
            bar.set_postfix_str(f"{key[0] if isinstance(key, tuple) else key} m={c.key()['m']} {c.variant}",
                                refresh=False)
            seed += 1
            store.append(measure(c, b, ceilings=ceilings, seed=seed))
            bar.update()
        b.release()
        if on_gpu:
            torch.cuda.empty_cache()
    if spec["op"] == "moe" and spec.get("route"):
        from kernels.routing import route_forms, route_path

        from . import bench_moe

        models = spec["models"] if on_gpu else spec.get("cpu_models", ["tiny"])
        tokens = spec["tokens"] if on_gpu else spec.get("cpu_tokens", spec["tokens"])
        for model in models:
            E, k, H, _ = bench_moe.MODELS[model]
            for t in tokens:  # route: true, the form route() picks; route: all, every form that applies
                forms = route_forms(t, E, k) if spec["route"] == "all" else [route_path(t, E, k)]
                for form in forms:
                    key = {"op": "route", "variant": form, "config": {}, "m": t, "n": E, "k": H,
                           "experts": E, "top_k": k, "routing": "from_logits"}
                    if point_key(key) not in done:  # a resumed sweep does not measure stored route points again
                        store.append(bench_moe.measure_route(model, t, form=form))


def sweep_points(spec, run_dirs=(), out_dir: str | Path | None = None, *, limit: int | None = None,
                 progress: bool = False):
    """The points a sweep notebook charts: read from `run_dirs` (paths or run ids) when given, else measured
    by running `spec` into out_dir (resuming it when it is already a run folder, so a batch of notebooks
    over one folder sweeps once) or into a new results/<run_id>. Returns read_runs' DataFrame."""
    from .results import read_runs

    if run_dirs:
        if isinstance(run_dirs, (str, Path)):
            run_dirs = [run_dirs]
        return read_runs(run_dirs)
    if out_dir and (Path(out_dir) / "meta.json").is_file():
        path = run_sweep(spec, resume=out_dir, limit=limit, progress=progress)
    else:
        path = run_sweep(spec, out=out_dir or None, limit=limit, progress=progress)
    return read_runs([path])
