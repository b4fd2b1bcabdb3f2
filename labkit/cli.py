"""`labkit` command line. Each subcommand is a thin wrapper over a labkit function."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap


def cmd_info(args) -> int:
    """Print versions, the GPU (or its absence) and how Triton runs."""
    from .env import environment

    env = environment()
    if args.json:
        print(json.dumps(env, indent=2, default=str))
        return 0
    gpu = env["gpu"] or "none (kernels run on the CPU through the Triton interpreter)"
    rows = [
        ("python", env["python"]),
        ("gpu", gpu),
    ]
    if env["gpu"]:
        l2 = f"{env['l2_bytes'] / 2**20:.0f} MiB" if env["l2_bytes"] else "?"
        rows += [("sm_count", env["sm_count"]), ("l2", l2), ("capability", env["capability"]),
                 ("driver", env["driver"]), ("cuda", env["cuda"])]
    rows += [("triton", f"{env['triton']} ({env['triton_mode']})")]
    rows += [(p, env[p] or "not installed")
             for p in ("torch", "numpy", "pandas", "pyarrow", "plotly", "papermill", "nvtx")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def cmd_quickstart(args) -> int:
    """The README's main job: the default batch of notebooks into a new run folder; says where the charts are."""
    from .quickstart import quickstart

    result = quickstart(out=args.out, progress=not args.quiet)
    return 1 if result.failures else 0


def cmd_sweep(args) -> int:
    """Run a sweep spec into a run folder, resuming where a killed run stopped."""
    from .sweep import run_sweep, shipped_specs

    if args.list is not None:
        specs = shipped_specs(args.list)
        for name, summary in specs:
            print(name, textwrap.fill(summary, 116, initial_indent="    ", subsequent_indent="    "), sep="\n")
        print(f"{len(specs)} shipped spec(s)" + (f" mentioning {args.list!r}" if args.list else "")
              + " in labkit/specs; `./lab sweep NAME` runs one")
        return 0 if specs else 1
    if not args.spec:
        raise SystemExit("labkit sweep: name a spec (a YAML file or a shipped name), or --list [WORD] to find one")
    run_sweep(args.spec, out=args.out, resume=args.resume, limit=args.limit, progress=not args.quiet)
    return 0


def _parse_config(text: str | None) -> dict:
    cfg = {}
    for item in filter(None, (text or "").split(",")):
        k, _, v = item.partition("=")
        if not _:
            raise ValueError(f"--config items look like NAME=VALUE, got {item!r}")
        v = v.strip()
        cfg[k.strip()] = {"true": True, "false": False}.get(v.lower(), int(v) if v.lstrip("-").isdigit() else v)
    return cfg


def cmd_sass(args) -> int:
    """Compile a variant config (no GPU needed) and print registers, spills, shared memory, programs per SM
    and what bounds them, loop mix, and the tensor-core instructions each kernel runs."""
    from .compile import static_report

    rows = static_report(args.variant, _parse_config(args.config), args.m, args.n, args.k, arch=args.arch,
                         model=args.model)
    hazard = any(r["wgmma_hazards"] for r in rows)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 1 if hazard else 0
    for r in rows:
        per = r["loop_instructions"]
        occ = r.get("per_sm")
        occ = f"; {occ['programs']} per SM ({', '.join(occ['limited_by'])})" if occ else ""
        print(f"{r['kernel']}: {r.get('regs', '?')} registers, {r.get('local', '?')} B local (spills), "
              f"{r['shared']} B shared, {r['num_warps']} warps{occ}; main loop {per} instructions per thread")
        print("  " + ", ".join(f"{k} {v}" for k, v in r["mix"].items()))
        if r["tensor_core"]:
            print("  tensor cores: " + ", ".join(f"{k} x{v}" for k, v in r["tensor_core"].items()))
        if args.loops:
            for lp in r["mma_loops"]:
                print(f"  loop at {lp['first']}: {lp['instructions']} instructions, {lp['bar_sync']} BAR.SYNC, "
                      f"{lp['mbarrier_waits']} mbarrier waits, {lp['tma_copies']} TMA copies; "
                      + ", ".join(f"{k} x{v}" for k, v in lp["tensor_core"].items()))
        for h in r["wgmma_hazards"]:
            print(f"  WGMMA HAZARD: {h}")
    return 1 if hazard else 0


def cmd_selfcheck(args) -> int:
    """Every kernel once on odd small shapes against the reference (run it under compute-sanitizer too); each
    call's line is printed as it finishes (its error check syncs, so a launch error lands on its own line)."""
    from .selfcheck import selfcheck_linear, selfcheck_moe

    only = args.variant or None
    checks = ([selfcheck_linear(only=only)] if args.op in ("all", "linear") else []) + (
        [selfcheck_moe(only=only)] if args.op in ("all", "moe") else [])
    done = bad = 0
    for rows in checks:
        for r in rows:
            done, bad = done + 1, bad + (not r["ok"])
            err = "-" if r["err"] is None else f"{r['err']:.2e}"
            print(f"{'ok ' if r['ok'] else 'BAD'} {r['variant']:12s} m={r['m']:<3d} n={r['n']:<4d} k={r['k']:<4d} "
                  f"err={err} {r.get('error', '')}", flush=True)
    if not done:
        raise ValueError(f"no check matches --op {args.op} and --variant {' '.join(args.variant or [])}")
    print(f"{done - bad}/{done} correct")
    return 1 if bad else 0


def cmd_roofline(args) -> int:
    """Floor of one GPT-OSS step on a GPU: per-component bytes, flops and ms, and the tokens/s bound."""
    from .hardware import GPUS, resolve_ceilings
    from .roofline import model_step

    if not args.gpu and not args.ceilings_from:
        raise ValueError(f"give --gpu (auto or one of {', '.join(GPUS)}) or --ceilings-from RUN_DIR")
    ceilings = resolve_ceilings(args.gpu, run_dir=args.ceilings_from)
    est = model_step(args.model, batch=args.batch, context=args.context, phase=args.phase,
                     mxfp4_lm_head=args.mxfp4_lm_head, kv_dtype=args.kv_dtype, ceilings=ceilings)
    if args.json:
        print(json.dumps({"gpu": args.gpu, **est.as_dict()}, indent=2))
        return 0
    print(f"{est.model} {est.phase}, batch {est.batch}, context {est.context}, "
          f"lm_head {'mxfp4' if est.mxfp4_lm_head else 'bf16'}, KV cache {est.kv_dtype}")
    print(f"ceilings ({ceilings.source}{', ' + args.gpu if args.gpu else ''}): {ceilings.read_gbps:.0f} GB/s read, "
          f"{ceilings.bf16_tflops:.0f} TFLOP/s bf16")
    print(f"{'component':<10} {'MB/step':>12} {'GFLOP/step':>12} {'floor ms':>10} {'share':>6}")
    for name, c in est.components.items():
        ms = est.component_floor_us[name] / 1e3
        print(f"{name:<10} {c.bytes / 1e6:>12.1f} {c.flops / 1e9:>12.2f} {ms:>10.4f} {ms / est.floor_ms:>6.1%}")
    total = est.total
    print(f"{'total':<10} {total.bytes / 1e6:>12.1f} {total.flops / 1e9:>12.2f} {est.floor_ms:>10.4f}")
    print(f"{est.bytes_per_token / 1e6:.1f} MB per token; floor {est.floor_ms:.3f} ms per step "
          f"({est.tokens_per_step} tokens); at most {est.tokens_per_s:,.0f} tokens/s")
    return 0


def cmd_best(args) -> int:
    """The fastest correct variant/config per point of a run, vs the floor and its op's baseline."""
    from .results import best_table, read_runs, vs_routing

    out = best_table(read_runs([args.run]))
    if out.empty:
        print("no ok points in this run")
        return 1
    if args.vs_routing:
        out = vs_routing(out, args.vs_routing)
    print(out.to_json(orient="records", indent=2) if args.json else out.to_string(index=False, float_format="%.3g"))
    return 0


def cmd_untried(args) -> int:
    """Another GPU's leaders at the target points never timed on this GPU, and how to time them."""
    from pathlib import Path

    import pandas as pd

    from .targets import untried, untried_specs

    if args.top < 1:
        raise ValueError(f"--top must be at least 1, got {args.top}")
    out = untried(args.gpu, args.from_gpu, top=args.top, runs=args.runs)
    if out.empty:
        print(f"every one of the {args.top} fastest configs on {args.from_gpu} at each target point has run on "
              f"{args.gpu}")
        return 0
    show = out.drop(columns=["op", "n", "k", "full_config"])
    show = show.assign(opt_in=out["opt_in"].map({True: "opt-in", False: ""}),
                      us_there=out["us_there"].round(1), ratio_there=out["ratio_there"].round(3),
                      best_here=out["best_here"].map(lambda v: "" if pd.isna(v) else f"{v:.1f}"),
                      routing=out["routing"].fillna(""))
    with pd.option_context("display.width", 250, "display.max_colwidth", 160):
        print(show.to_string(index=False))
    if args.spec:
        import yaml

        for op, spec in untried_specs(out).items():
            path = Path(f"{args.spec}_{op}.yaml")
            path.parent.mkdir(parents=True, exist_ok=True)
            head = (f"# written by ./lab untried --gpu {args.gpu} --from-gpu {args.from_gpu} --top {args.top}: the "
                    f"configs fastest on {args.from_gpu} never timed correctly on {args.gpu},\n# each at its own "
                    f"token count, beside auto's pick\n")
            path.write_text(head + yaml.safe_dump(spec, sort_keys=False, width=116, default_flow_style=None))
            print(f"wrote {path}: ./lab sweep {path}")
    print(f"{len(out)} configs at {out.groupby(['problem', 'm']).ngroups} points: ratio_there is a config's time "
          f"over the best on {args.from_gpu} there, best_here the best time on {args.gpu}"
          + ("" if args.spec else "; --spec PREFIX writes sweep specs that time them"))
    return 0


def cmd_targets(args) -> int:
    """The speed targets judged against measured runs: met or missed, by how much, from which run."""
    from pathlib import Path

    import pandas as pd

    from .targets import judge, markdown, summary, targets_chart

    judged = judge(args.runs, gpu=args.gpu, opt_in_ok=not args.no_opt_in)
    if args.json:
        print(judged.to_json(orient="records", indent=2))
    elif args.markdown:
        print(markdown(judged))
    else:
        ceil = "; ".join(f"{g}: {c['read_gbps']:.0f} GB/s read, {c['bf16_tflops']:.0f} TFLOP/s bf16"
                         for g, c in judged.attrs["ceilings"].items())
        print(f"floors against the highest ceilings measured by the {judged.attrs['runs']} runs on that GPU "
              f"({ceil})")
        pct = lambda v: "" if pd.isna(v) else f"{v:.1%}"  # noqa: E731  (89.6% must not read as a met 90%)
        show = judged.assign(value=judged["value"].map(pct), median=judged["median"].map(pct),
                             x_read=judged["x_read"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}"),
                             x_goal=judged["x_goal"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}"),
                             held=judged["held"].map(pct), bare2=judged["bare2"].map(pct),
                             goal=judged["goal"].map("{:.0%}".format),
                             met=judged["met"].map({True: "yes", False: "NO", None: "not measured"}),
                             auto=judged["opt_in"].map({True: "opt-in"}).fillna(""))
        print("value: the best single measurement; median: the best median of any config measured at least twice "
              "there (n: its measurements over runs and rounds); auto: opt-in where that best config takes an "
              "option variant='auto' never picks (labkit.tables.OPT_IN)")
        if args.no_opt_in:
            print("--no-opt-in: only configs variant='auto' may pick are judged")
        read = judged.attrs.get("read_run")
        if read:
            print(f"x_read: the best time over a plain read of its bytes (labkit.readfloor, {read}); x_goal: the "
                  "x_read the goal asks")
        if judged["bare2"].notna().any():
            print(f"bare2: a plain read of a MoE layer's bytes in two launches (mlp1's, then mlp2's) as a fraction "
                  f"of the floor, what a layer reading mlp2's weights after mlp1 reaches by reading alone "
                  f"({judged.attrs['read2_run']})")
        held = {c.get("bf16_tflops_sustained") for c in judged.attrs["ceilings"].values()} - {None}
        if judged["held"].notna().any():
            print(f"held: a compute-bound point's fraction of the floor at the bf16 rate {max(held):.0f} TFLOP/s "
                  "that matmuls sustain back to back (labkit.hardware.SUSTAINED_CALLS); judged on value")
        for name, g in show.groupby("target", sort=False):
            print(f"\n{name}")
            cols = ["problem", "m", "goal", "variant", "us", "value", "median", "n", "met", "auto", "run_id"]
            if read and g["x_read"].notna().any():
                cols[6:6] = ["x_read", "x_goal"]
            if judged.loc[g.index, "bare2"].notna().any():
                cols[cols.index("value") + 1:cols.index("value") + 1] = ["bare2"]
            if judged.loc[g.index, "held"].notna().any():
                cols[cols.index("value") + 1:cols.index("value") + 1] = ["held"]
            g = g.rename(columns={"repeats": "n"})[cols]
            print(g.to_string(index=False, float_format="%.1f"))
        print()
        print(summary(judged).to_string(index=False))
        for g in judged.attrs.get("other_gpus", ()):
            print(f"also measured on {g}: ./lab targets --gpu '{g}'")
    if args.chart:
        from .charts import save_figure

        out = Path(args.chart)
        for p in save_figure(targets_chart(judged), out.parent, out.stem):
            print(f"chart: {p}")
    return 0 if judged["met"].eq(True).all() else 1


def cmd_readfloor(args) -> int:
    """Time a plain read of each judged memory-bound point's bytes on this GPU into a run (labkit.readfloor)."""
    import torch

    from .readfloor import FILE, measure, memory_bound
    from .runs import create_run
    from .targets import judge

    if not torch.cuda.is_available():
        print("labkit readfloor: a read floor is measured on a GPU, and torch sees none", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name()
    judged = judge(args.runs, gpu=gpu)
    points = memory_bound(judged)
    bw = max(c["read_gbps"] for c in judged.attrs["ceilings"].values())  # the GB/s the floors divide by
    if not len(points):
        print(f"labkit readfloor: no judged memory-bound point measured on {gpu}", file=sys.stderr)
        return 2
    run = create_run("read-floor", out=args.out, parameters={"points": len(points)})
    print(f"{run.path}: {len(points)} points", flush=True)

    def progress(row):
        print(f"{row['problem']:>12s} {row['m']:5d}: read {row['read_us']:8.1f} us ({row['read_gbps']:5.0f} GB/s) in "
              f"{row['launches']} launch{'es' if row['launches'] > 1 else ''}, "
              f"{row['bytes'] / bw / 1e3 / row['read_us']:.1%} of the floor at {bw:.0f} GB/s", flush=True)

    df = measure(points, progress)
    run.finish_with(f"{FILE}: per judged memory-bound point, a plain Triton read of its bytes (labkit.readfloor."
                    "read_call) timed like the sweeps; MoE points also in two launches (mlp1's 2/3, then mlp2's "
                    "1/3)", read_floor=df)
    print(f"./lab targets now shows each point's best time over its read time (x_read) from {run.path.name}")
    return 0


def cmd_compare(args) -> int:
    """Per-point ratio B/A of two runs with each run's p10-p90 noise band, wins and losses marked."""
    import pandas as pd

    from .results import compare_runs, compare_summary, run_meta, short_config

    cmp = compare_runs(args.run_a, args.run_b, min_band=args.min_band)
    if args.op:
        cmp = cmp[cmp["op"] == args.op]
    if args.csv:
        cmp.to_csv(args.csv, index=False)
    if args.json:
        print(cmp.to_json(orient="records", indent=2))
        return 0
    shown = cmp[cmp["verdict"].isin(["win", "loss", "n/a"])] if args.changes else cmp
    if len(shown):
        def band(side):
            return [f"{u:.4g} [{lo:.4g}-{hi:.4g}]" if pd.notna(u) else "-" for u, lo, hi in
                    zip(shown[f"{side}_us"], shown[f"{side}_p10"], shown[f"{side}_p90"])]

        where = pd.Series(pd.NA, index=shown.index, dtype=object)  # linear shape or MoE model
        for c in ("model", "shape"):
            if c in shown:
                where = shown[c].astype(object).where(shown[c].notna(), where)
        table = pd.DataFrame({
            "op": shown["op"], "where": where, "routing": shown["routing"],
            "m": shown["m"], "variant": shown["variant"],
            "config": [short_config(c, v) for c, v in zip(shown["config"], shown["variant"])],
            "A us [p10-p90]": band("a"), "B us [p10-p90]": band("b"), "B/A": shown["ratio"].round(3),
            "verdict": shown["verdict"]})
        table = table.drop(columns=[c for c in ("where", "routing") if table[c].isna().all()])
        print(table.to_string(index=False))
    gpus = [run_meta(r).get("gpu") or "no GPU" for r in (args.run_a, args.run_b)]
    print(f"A = {cmp.attrs['run_a']} ({gpus[0]})\nB = {cmp.attrs['run_b']} ({gpus[1]})")
    if gpus[0] != gpus[1]:
        print("A and B ran on different GPUs: each ratio is the GPU's effect as much as the code's")
    print(compare_summary(cmp))
    _compare_profiles(args.run_a, args.run_b)
    return 0


def _compare_profiles(run_a, run_b) -> None:
    """Where both runs are decode profiles (`lab model profile`), where the step's time moved: per component
    and per kernel."""
    from .results import resolve_run

    paths = [resolve_run(r) / "profile.json" for r in (run_a, run_b)]
    if not all(p.is_file() for p in paths):
        return
    from .model.profile import compare_profiles, load_profile

    comp, ker = compare_profiles(*(load_profile(p.parent) for p in paths))
    fmt = {"A us": "{:.1f}".format, "B us": "{:.1f}".format, "B-A us": "{:+.1f}".format, "B/A": "{:.3f}".format}
    print("\ndecode step per component (us per step):")
    print(comp.to_string(index=False, formatters=fmt, na_rep="-"))
    print("\nkernels that moved most (us per step):")
    print(ker.to_string(index=False, formatters=fmt, na_rep="-"))


def cmd_runs(args) -> int:
    """Every run folder with its GPU, date, commit and how many points are ok / incorrect / failed."""
    from .results import list_runs

    df = list_runs(args.root)
    if df.empty:
        print(f"no run folders under {args.root or 'results/'}")
        return 0
    total = len(df)
    if args.gpu:
        df = df[df["gpu"].fillna("").str.contains(args.gpu, case=False, regex=False)]
    if args.match:
        df = df[df["run_id"].str.contains(args.match, case=False, regex=False)]
    df = df.sort_values("run_id").tail(args.last) if args.last else df
    if df.empty:
        print(f"none of the {total} run folders matches")
        return 1
    if args.json:
        print(df.to_json(orient="records", indent=2))
        return 0
    df["started"] = df["started"].str.replace("T", " ").str.slice(0, 16)
    print(df.drop(columns="path").to_string(index=False))
    return 0


def cmd_sql(args) -> int:
    """SQL (DuckDB) over the points of runs: views `points` and `runs`."""
    from .results import query

    df = query(args.sql, runs=args.runs or None)
    print(df.to_json(orient="records", indent=2) if args.json else df.to_string(index=False))
    return 0


def cmd_batch(args) -> int:
    """One papermill output notebook per parameter set of a grid, into one run folder; failures listed."""
    from .notebooks import load_grid, run_batch

    result = run_batch(args.notebook, load_grid(args.grid), out=args.out, progress=not args.quiet)
    return 1 if result.failures else 0


def cmd_timeline(args) -> int:
    """Trace moe_mma layers' programs on the GPU into a run folder (programs.parquet, layer_us.csv, summary.csv,
    one chart per point), or summarize and chart a stored one (--from)."""
    from pathlib import Path

    import pandas as pd

    from .timeline import build_occupancy, point_label, report, trace_layer

    if args.from_dir:
        from .results import resolve_run

        out = Path(args.from_dir)
        out = out if out.is_dir() else resolve_run(out)  # a folder, or a run id under results/
        if not (out / "programs.parquet").is_file():
            raise FileNotFoundError(f"{out} holds no programs.parquet: not a `labkit timeline` run")
        df = pd.read_parquet(out / "programs.parquet")
    else:
        if not args.point:
            print("labkit timeline: give --point MODEL TOKENS CONFIG (one or more) or --from RUN_DIR", file=sys.stderr)
            return 2
        from .runs import create_run, write_atomic

        run = create_run("moe-timeline", out=args.out, parameters={"points": args.point, "routing": args.routing})
        out = run.path
        frames, times, fits = [], [], []
        for model, tokens, config in args.point:
            label = point_label(model, tokens, [t["point"] for t in times])
            d, us_traced, us_plain = trace_layer(model, int(tokens), _parse_config(config), routing=args.routing)
            frames.append(d.assign(point=label))
            times.append({"point": label, "config": config, "us_traced": round(us_traced, 2),
                          "us_untraced": round(us_plain, 2)})
            print(f"{label}: layer {us_plain:.1f} us untraced, {us_traced:.1f} traced", flush=True)
            fit = build_occupancy(model, int(tokens), _parse_config(config)).assign(point=label)
            fits.append(fit)
            per = fit.pivot(index="launch", columns="traced", values="programs_per_sm")
            for launch, row in per.iterrows():
                if row.get(True) is not None and row.get(False) is not None and row[True] < row[False]:
                    print(f"{label}: the traced {launch} fits {row[True]} programs per SM, the untraced one "
                          f"{row[False]}: this timeline's occupancy is not the timed layer's", flush=True)
            df = pd.concat(frames, ignore_index=True)  # written after each point: a killed run keeps them
            write_atomic(out / "programs.parquet", lambda tmp, df=df: df.to_parquet(tmp, index=False))
            write_atomic(out / "layer_us.csv", lambda tmp: pd.DataFrame(times).to_csv(tmp, index=False))
            write_atomic(out / "occupancy.csv", lambda tmp: pd.concat(fits, ignore_index=True).to_csv(tmp, index=False))
        run.update_meta(contents="programs.parquet: one row per mlp1/mlp2 program of each traced layer call (us "
                                 "from the call's first program start); layer_us.csv: CUDA-graph us per layer call, "
                                 "traced and untraced; occupancy.csv: registers and programs per SM of each "
                                 "launch's build, traced and untraced (labkit.timeline.build_occupancy); "
                                 "summary.csv, stream.csv, fill.csv and timeline-*.html: labkit.timeline")
        run.finish()
    layer_us = pd.read_csv(out / "layer_us.csv") if (out / "layer_us.csv").is_file() else pd.DataFrame()
    configs = {row.point: _parse_config(row.config) for row in layer_us.itertuples()}
    summary, stream, fill = report(df, out, configs)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(summary[summary.call == summary.groupby("point").call.transform("max")].drop(columns=["call"])
              .to_string(index=False))
        if stream is not None:
            print("\nweight stream (model: each program's bytes spread evenly over its run), last call per point:")
            print(stream[stream.call == stream.groupby("point").call.transform("max")].drop(columns=["call"])
                  .to_string(index=False))
        if fill is not None:
            print("\nrun time by tile fill (live programs of every call, by the tokens their tile holds):")
            print(fill.to_string(index=False))
    print(f"written under {out}")
    return 0


def cmd_once(args) -> int:
    """Run one variant config a few times on random weights: the workload to put under ncu. A MoE variant
    runs one layer of --model's shape with --m tokens under --routing."""
    import torch

    import kernels

    from .bench import device, random_mxfp4

    cfg = _parse_config(args.config)
    if args.variant == "auto":  # the config variant="auto" picks here, named so ncu's report can be read against it
        from .bench_moe import MODELS
        from .results import off_defaults, sweep_problem
        from .sweep import auto_picks

        if args.model:
            E, top_k, H, I = MODELS[args.model]
            problem = sweep_problem("moe", args.m, 2 * I, H, E, top_k)
        else:
            problem = sweep_problem("linear", args.m, args.n, args.k)
        [(args.variant, picked)] = auto_picks({"auto_picks": [args.layout]}, problem)
        shown = ",".join(f"{k}={v}" for k, v in off_defaults(picked, args.variant).items())  # as --config takes it
        print(f"auto picks {args.variant} for a {args.layout} weight: {shown or 'defaults'}")
        cfg = {**picked, **cfg}
    if args.variant not in kernels.VARIANTS:
        raise SystemExit(f"unknown variant {args.variant!r}; known: auto, {', '.join(sorted(kernels.VARIANTS))}")
    if kernels.VARIANTS[args.variant].op == "moe":
        from .bench_moe import MODELS, _layer
        from .routing import generate

        args.model = args.model or "gpt-oss-120b"
        E, top_k, H, I = MODELS[args.model]
        layer = _layer(E, H, I, seed=0, dev=device())
        sample = generate(args.routing, args.m, E, top_k, seed=0)
        r = kernels.Routing.from_ids(sample.ids.to(device()), sample.weights.to(device()), E)
        x = torch.randn(args.m, H, device=device()).to(torch.bfloat16)
        run = lambda: kernels.moe_mxfp4(x, r, *layer, variant=args.variant, **cfg)  # noqa: E731
        what = f"{args.model} T={args.m} {args.routing}"
    else:
        w = random_mxfp4(args.n, args.k, seed=0)
        x = torch.randn(args.m, args.k, device=device()).to(torch.bfloat16)
        run = lambda: kernels.mxfp4_linear(x, w, variant=args.variant, **cfg)  # noqa: E731
        what = f"m={args.m} n={args.n} k={args.k}"
    for _ in range(1 + args.repeat):
        y = run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(f"{args.variant} {what} {cfg}: ran {1 + args.repeat} times, out {tuple(y.shape)}")
    return 0


def cmd_model_profile(args) -> int:
    """Decode profile of a GPT-OSS model: load, prefill, TTFT, tok/s, breakdown; stored as a run."""
    from .model.profile import profile_decode, store_profile

    result = profile_decode(args.model, weights=args.weights, batch=args.batch, prompt=args.prompt,
                            decode=args.decode, moe=args.moe, lm_head=args.lm_head, rounding=args.rounding,
                            attention=args.attention, layout=args.layout, lm_head_layout=args.lm_head_layout or "",
                            seed=args.seed, device=args.device, profile_steps=args.profile_steps, nvtx=args.nvtx,
                            check=not args.no_check)
    print(result.summary())
    path = store_profile(result, out=args.out)
    print(f"run folder: {path}")
    return 0


def cmd_model_diverge(args) -> int:
    """Run two model variants on the same tokens; report the first component and layer that diverges."""
    import torch

    from .charts import save_figure
    from .model import get_config
    from .model.diverge import diverge, divergence_chart
    from .model.loaders import load_weights
    from .runs import create_run, write_json_atomic

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    weights = load_weights(get_config(args.model), args.weights, seed=args.seed, device=device)
    report = diverge(args.a, args.b, model=args.model, weights=weights, batch=args.batch, seq=args.seq,
                     seed=args.seed, tol=args.tol, device=device)
    with_layer = report.table.assign(layer=report.table["layer"].astype("string").fillna("-"))
    cols = ["layer", "component", "rel_err", "rel_err_agreed", "flipped", "max_abs_err"]
    print(with_layer[cols].to_string(index=False, float_format="%.3g"))
    print(report.summary())
    run = create_run(f"model-diverge-{args.model}", out=args.out, parameters={
        "a": args.a, "b": args.b, "model": args.model, "weights": args.weights, "batch": args.batch,
        "seq": args.seq, "seed": args.seed, "tol": args.tol})
    report.table.to_csv(run.path / "divergence.csv", index=False)
    write_json_atomic(run.path / "divergence.json", {"summary": report.summary(), "first": report.first})
    save_figure(divergence_chart(report), run.path, "divergence")
    run.finish()
    print(f"run folder: {run.path}")
    return 1 if report.first is not None else 0


def _add_model_parser(sub) -> None:
    from kernels import HELD_LAYOUTS, ROUNDINGS

    from .model.backends import ATTENTION_BACKENDS, LM_HEAD_BACKENDS, MOE_BACKENDS
    from .model.config import PRESETS

    model = sub.add_parser("model", help="GPT-OSS model runs: decode profile, divergence finder")
    msub = model.add_subparsers(dest="model_command", metavar="MODEL_COMMAND", required=True)

    def common(p):
        p.add_argument("--model", default="tiny", choices=list(PRESETS), help="model preset (default: tiny)")
        p.add_argument("--weights", default="synthetic",
                       help="'synthetic' (seeded random, any size) or a checkpoint: OpenAI/HF safetensors, GGUF")
        p.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
        p.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights and prompt (default 0)")
        p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
        p.add_argument("--out", help="run folder to write (default: results/<run_id>)")

    p = msub.add_parser("profile", help="load time, prefill, TTFT, decode tok/s, per-component share of decode")
    common(p)
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("--decode", type=int, default=64, help="decode steps timed (default 64)")
    p.add_argument("--attention", default="auto", choices=["auto", *ATTENTION_BACKENDS],
                   help="attention and norm backend (auto: triton on a GPU, torch on a CPU)")
    p.add_argument("--moe", default="auto", choices=["auto", *MOE_BACKENDS],
                   help="MoE backend (auto: triton on a GPU, torch on a CPU)")
    p.add_argument("--lm-head", default="auto", choices=["auto", *LM_HEAD_BACKENDS],
                   help="lm_head backend (auto: mxfp4 kernel on a GPU, mxfp4-torch on a CPU)")
    p.add_argument("--rounding", default="floor", choices=list(ROUNDINGS), help="MXFP4 scale rule of the lm_head")
    p.add_argument("--layout", default="rows", choices=list(HELD_LAYOUTS),
                   help="weight layout of the MXFP4 kernels: rows (prepare_mxfp4) or tiled (tile_mxfp4, the TILED "
                        "configs' auto tables), each also as shuffle_nibbles' copy (+nib: the NIB configs' tables); "
                        "default rows")
    p.add_argument("--lm-head-layout", choices=list(HELD_LAYOUTS),
                   help="the mxfp4 lm_head's own layout (default: --layout's); on an H200 tiled+nib's one-token "
                        "lm_head config beats rows+nib's, whose experts lead decode")
    p.add_argument("--profile-steps", type=int, default=3, help="eager decode steps under torch.profiler")
    p.add_argument("--nvtx", action="store_true", help="emit NVTX ranges (domain mxfp4lab) for Nsight Systems")
    p.add_argument("--no-check", action="store_true", help="skip the parity check against the torch reference")
    p.set_defaults(func=cmd_model_profile)

    p = msub.add_parser("diverge", help="first component and layer where two model variants differ "
                                        "(exit 1 when they do)")
    p.add_argument("a", help="variant A, e.g. ref, kernels, moe=torch,lm_head=mxfp4-torch")
    p.add_argument("b", help="variant B, e.g. kernels or a fault name such as gqa_mod")
    common(p)
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence (default 16)")
    p.add_argument("--tol", type=float, default=0.05, help="relative error that counts as divergence")
    p.set_defaults(func=cmd_model_diverge)


def cmd_table(args) -> int:
    """Derive/write the variant="auto" tables from runs, or report a table set's regret on a run."""
    from kernels.prepare import HELD_LAYOUTS
    from kernels.tables import gpu_tables

    from .hardware import get_gpu, match_gpu
    from .results import run_meta
    from .tables import TABLE_NAMES, derive_tables, regret, table_set, tables_path, write_tables

    if args.table_command == "write":
        if not args.linear and not args.moe:
            raise ValueError("give --linear RUN and/or --moe RUN")
        spec = get_gpu(args.gpu) if args.gpu else None
        for run in (args.linear or []) + (args.moe or []) if spec else ():  # a GPU's set: that GPU's runs only
            gpu = run_meta(run).get("gpu") or ""
            if match_gpu(gpu) != spec:
                raise ValueError(f"{run} was measured on {gpu or 'no GPU'}, not on the GPU this set is for "
                                 f"({spec.name})")
        tm = table_set(spec.key if spec else None)
        # an op not given, or a layout its runs never measured, keeps its current tables
        tables = {name: getattr(tm, name, None) for name in TABLE_NAMES.values()}
        for op, runs in (("linear", args.linear), ("moe", args.moe)):
            for layout in HELD_LAYOUTS if runs else ():
                try:
                    tables[TABLE_NAMES[op, layout]] = derive_tables(runs, op, routing=args.routing, layout=layout)
                except ValueError as e:
                    print(f"{op} {layout}: {e}; its current tables are kept")
        sources = dict(getattr(tm, "SOURCES", {}))
        sources.update({k: " + ".join(map(str, v)) for k, v in (("linear", args.linear), ("moe", args.moe)) if v})
        path = tables_path(spec.key if spec else None)
        print(f"wrote {write_tables(tables, sources, path, gpu_match=spec.match if spec else ())}")
        return 0
    if args.tables_from:
        tables = derive_tables(args.tables_from, args.op, routing=args.routing, layout=args.layout)
    else:  # what auto reads on the GPU the run was measured on: that GPU's set, else the default set
        gpu = run_meta(args.run[0]).get("gpu")
        name = TABLE_NAMES[args.op, args.layout]
        tm = next((m for m in (gpu_tables(gpu), table_set()) if getattr(m, name, None)), None)
        if tm is None:
            raise ValueError(f"no measured {args.layout} tables for {args.op}")
        print(f"tables: {tm.__name__}.{name} (what auto reads on {gpu})")
        tables = getattr(tm, name)
    df = regret(args.run, tables, args.op, layout=args.layout)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    by = "routing" if args.op == "moe" else "shape"
    for col, against in (("regret", "the best of any layout"), ("layout_regret", f"the best {args.layout} config")):
        print(f"\nregret of the {args.layout} tables against {against}, by {by}:\n"
              + df.groupby(by)[col].describe()[["count", "mean", "max"]].to_string())
    over = df[df["layout_regret"] > 1.05]
    print(f"\npoints with layout_regret above 1.05: {len(over)}, of which beyond the noise (auto's p10-p90 band "
          f"above the best's, medians more than 3% apart): {int((over['layout_verdict'] == 'loss').sum())}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from kernels.prepare import HELD_LAYOUTS

    parser = argparse.ArgumentParser(
        prog="labkit",
        description="MXFP4 performance lab: kernels, rooflines, sweeps and GPT-OSS runs, measured on your GPU.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("info", help="versions, GPU, and whether Triton runs compiled or interpreted")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("quickstart", help="the default job: GEMV and MoE sweeps (the size this machine allows), "
                                          "then the compare and roofline notebooks, into one new run folder")
    p.add_argument("--out", help="run folder to write (default: results/<run_id>)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_quickstart)

    p = sub.add_parser("sweep", help="run a sweep spec (YAML or shipped name) into a run folder, resumable")
    p.add_argument("spec", nargs="?", help="YAML file or the name of a shipped spec, e.g. linear_gptoss")
    p.add_argument("--list", nargs="?", const="", metavar="WORD",
                   help="list the shipped specs (those whose name or comment mentions WORD) and what each measures")
    p.add_argument("--out", help="run folder to create (default results/<run_id>)")
    p.add_argument("--resume", metavar="RUN", help="continue a run folder, skipping points already stored")
    p.add_argument("--limit", type=int, help="measure at most N points this time")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("sass", help="compile a variant config without a GPU: registers, spills, loop instructions")
    p.add_argument("variant", help="a linear or MoE variant name (kernels.VARIANTS)")
    p.add_argument("--m", type=int, default=1, help="tokens (default 1)")
    p.add_argument("--n", type=int, default=201088, help="output features (default lm_head 201088)")
    p.add_argument("--k", type=int, default=2880, help="input features (default 2880)")
    p.add_argument("--model", default="gpt-oss-120b", help="MoE variants: the model whose layer is compiled")
    p.add_argument("--config", help="comma-separated NAME=VALUE over the variant's defaults")
    p.add_argument("--arch", type=int, help="compute capability as 90, 100, 120 (default: this GPU or 90)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--loops", action="store_true",
                   help="also each innermost tensor-core loop: instructions, CTA barriers, mbarrier waits, TMA "
                        "copies, MMA shapes (a build with HALF or ABSORB has several K loops)")
    p.set_defaults(func=cmd_sass)

    p = sub.add_parser("timeline", help="per-program timeline of moe_mma layers (GPU), or of a stored run (--from)")
    p.add_argument("--point", nargs=3, action="append", metavar=("MODEL", "TOKENS", "CONFIG"),
                   help="a layer to trace: model, tokens and comma-separated NAME=VALUE config over moe_mma's "
                        "defaults (WGMMA=true needed); repeatable")
    p.add_argument("--routing", default="uniform", help="routing generator (default uniform)")
    p.add_argument("--out", help="run folder (default results/<run id>)")
    p.add_argument("--from", dest="from_dir", help="summarize and chart this run folder's programs.parquet instead")
    p.set_defaults(func=cmd_timeline)

    p = sub.add_parser("once", help="run one variant config a few times (a workload for ncu or nsys)")
    p.add_argument("variant", help="a linear or MoE variant name (kernels.VARIANTS), or auto: the config "
                   "variant='auto' picks for this problem and --layout, printed, then run (a MoE layer with --model)")
    p.add_argument("--m", type=int, default=1, help="tokens (default 1)")
    p.add_argument("--n", type=int, default=201088, help="linear variants: output features (default lm_head 201088)")
    p.add_argument("--k", type=int, default=2880, help="linear variants: input features (default 2880)")
    p.add_argument("--model", help="MoE variants: the layer shape (gpt-oss-120b, the default; gpt-oss-20b, tiny)")
    p.add_argument("--layout", default="tiled+nib", choices=HELD_LAYOUTS,
                   help="auto: the weight layout whose table picks (default tiled+nib, what the sweeps' auto_picks "
                        "and the targets use)")
    p.add_argument("--routing", default="uniform", help="MoE variants: routing generator, e.g. zipf(1.2)")
    p.add_argument("--config", help="comma-separated NAME=VALUE over the variant's defaults")
    p.add_argument("--repeat", type=int, default=2, help="calls after the first (warm-up) one")
    p.set_defaults(func=cmd_once)

    p = sub.add_parser("selfcheck", help="every kernel once on odd small shapes against the fp32 reference")
    p.add_argument("--op", choices=("all", "linear", "moe"), default="all")
    p.add_argument("--variant", nargs="+", metavar="NAME",
                   help="only these variants (route: the routing check); default every registered one")
    p.set_defaults(func=cmd_selfcheck)

    p = sub.add_parser("best", help="fastest correct variant/config per point of a run, vs the floor and the "
                                    "op's baseline (cuBLAS bf16 for linear, torch bf16 for MoE)")
    p.add_argument("run", help="run folder or run id under results/")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--vs-routing", metavar="ROUTING",
                   help="MoE: each point's best time over the best under this routing at the same model and tokens "
                        "(e.g. balanced: what uniform routing's imbalance costs)")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("table", help="variant='auto' tables: derive them from runs, or report their regret")
    tsub = p.add_subparsers(dest="table_command", metavar="TABLE_COMMAND", required=True)
    t = tsub.add_parser("write", help="derive tables from runs and write kernels/tables_measured.py (both "
                                      "weight layouts: row-major and tile_mxfp4's)")
    t.add_argument("--linear", metavar="RUN", nargs="+", help="run folder(s) with linear points")
    t.add_argument("--moe", metavar="RUN", nargs="+", help="run folder(s) with moe_layer points")
    t.add_argument("--routing", default="uniform", help="routing the MoE tables are fitted to (default uniform)")
    t.add_argument("--gpu", help="write this GPU's own set (a datasheet key such as h200: kernels/"
                                 "tables_measured_h200.py), from runs measured on it; default: the default set")
    t.set_defaults(func=cmd_table)
    t = tsub.add_parser("regret", help="auto's time over the best time, per measured point of a run")
    t.add_argument("run", nargs="+", help="run folder(s)")
    t.add_argument("--op", choices=("linear", "moe"), default="linear")
    t.add_argument("--tables-from", metavar="RUN", nargs="+",
                   help="derive the tables from these runs instead of the package's")
    t.add_argument("--routing", default="uniform")
    t.add_argument("--layout", choices=HELD_LAYOUTS, default="rows",
                   help="the weight layout whose tables are judged (default rows; tiled: tile_mxfp4's copy; "
                        "+nib: held as shuffle_nibbles' copy)")
    t.set_defaults(func=cmd_table)

    p = sub.add_parser("compare", help="per-point ratio of two runs (B/A) with their noise bands, wins and losses; "
                                       "of two decode profiles also per component and kernel")
    p.add_argument("run_a", help="run folder or run id (the reference)")
    p.add_argument("run_b", help="run folder or run id (the candidate: a ratio below 1 means B is faster)")
    p.add_argument("--op", help="only this op (linear, moe_layer, route, ...)")
    p.add_argument("--changes", action="store_true", help="print only wins, losses and points not ok")
    p.add_argument("--min-band", type=float, default=0.03,
                   help="least relative change that counts, besides the p10-p90 bands (default 0.03)")
    p.add_argument("--csv", metavar="FILE", help="also write the whole comparison as CSV")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("targets", help="the speed targets (DESIGN.md) judged against measured runs: met or "
                                       "missed, by how much, and whether a repeated config's median holds it "
                                       "(exit status 1 while any is missed)")
    p.add_argument("--runs", nargs="+", metavar="RUN", help="run folders or ids (default: every run under results/)")
    p.add_argument("--gpu", help="substring of the GPU name to judge (default: the newest GPU run's)")
    p.add_argument("--markdown", action="store_true", help="print one Markdown table")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--chart", metavar="PATH", help="also write the chart there (PATH.html, and .png if possible)")
    p.add_argument("--no-opt-in", action="store_true",
                   help="judge only configs variant='auto' may pick (none with labkit.tables.OPT_IN's options)")
    p.set_defaults(func=cmd_targets)

    p = sub.add_parser("untried", help="the fastest configs of another GPU at each target point that never ran "
                                       "correctly on this one: the first guesses a sweep on this GPU has left out")
    p.add_argument("--gpu", required=True, help="substring of the GPU name to look for gaps on, e.g. H200")
    p.add_argument("--from-gpu", required=True, help="substring of the GPU name whose leaders to take, e.g. H100")
    p.add_argument("--top", type=int, default=3, help="that many fastest configs per point there (default 3)")
    p.add_argument("--runs", nargs="+", metavar="RUN", help="run folders or ids (default: every run under results/)")
    p.add_argument("--spec", metavar="PREFIX", help="also write sweep specs that time them, each at its token count "
                   "beside auto's pick: PREFIX_moe.yaml and/or PREFIX_linear.yaml (run with ./lab sweep PATH)")
    p.set_defaults(func=cmd_untried)

    p = sub.add_parser("readfloor", help="time a plain read of each judged memory-bound point's bytes on this GPU "
                                         "(GPU): ./lab targets then shows how far each best time is from it")
    p.add_argument("--runs", nargs="+", metavar="RUN", help="run folders or ids to judge (default: every run under "
                                                            "results/)")
    p.add_argument("--out", help="run folder to write into (default: a new results/<run_id>)")
    p.set_defaults(func=cmd_readfloor)

    p = sub.add_parser("runs", help="list run folders: GPU, date, commit, points ok / incorrect / failed")
    p.add_argument("root", nargs="?", help="folder holding run folders (default results/)")
    p.add_argument("--gpu", help="only runs whose GPU name contains this (e.g. H200, cpu)")
    p.add_argument("--match", metavar="WORD", help="only runs whose id contains WORD (e.g. memcheck, moe-tables)")
    p.add_argument("--last", type=int, metavar="N", help="only the newest N of those")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("sql", help="SQL (DuckDB) over run points: views `points` and `runs`")
    p.add_argument("sql", help="e.g. \"SELECT variant, min(us_graph) FROM points WHERE op='linear' GROUP BY 1\"")
    p.add_argument("--runs", nargs="+", metavar="RUN", help="run folders or ids (default: every run under results/)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("batch", help="execute a notebook once per parameter set of a grid (papermill) into a run")
    p.add_argument("notebook", help="notebook path or name, e.g. 02_gemv_sweep")
    p.add_argument("--grid", required=True,
                   help="YAML: a list of parameter dicts, or param -> list of values (every combination); "
                        "or the name of a shipped grid (labkit/grids)")
    p.add_argument("--out", help="run folder to write into (default: a new results/<run_id>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_batch)

    p = sub.add_parser("roofline", help="floor of a GPT-OSS decode or prefill step on a GPU, per component")
    p.add_argument("--gpu", help="datasheet GPU (e.g. h100-sxm, gb10) or 'auto' for this machine's GPU")
    p.add_argument("--ceilings-from", metavar="RUN_DIR",
                   help="run folder whose meta.json ceilings (measured) override the datasheet")
    p.add_argument("--model", default="gpt-oss-120b", help="gpt-oss-120b (default) or gpt-oss-20b")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    p.add_argument("--context", type=int, default=4096, help="tokens in context (default 4096)")
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    p.add_argument("--mxfp4-lm-head", action="store_true", help="lm_head weights in MXFP4 instead of BF16")
    p.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16", help="KV cache dtype (default bf16)")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.set_defaults(func=cmd_roofline)

    _add_model_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["sass"]:  # compile for real: decided before any module imports kernels
        import os

        os.environ["TRITON_INTERPRET"] = "0"
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    command = " ".join(filter(None, [args.command, getattr(args, "model_command", None)]))
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, KeyError, ImportError) as e:
        print(f"labkit {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a long sweep stopped by ^C: its points are stored, and it said how to go on
        from .runs import sigint_ignored

        with sigint_ignored():
            print(f"labkit {command}: interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
