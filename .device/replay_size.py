"""How much of a short op's timed replay is the graph's start: the lm_head (307.7 MB, so one call per replay already
touches 6x the L2) is timed one call per replay, the one-token MoE layer four relabeled calls per replay. This times
the leaders (checked first) with the same calls repeated 1-8 times per replay (each call's weights are reused only
after >= 150 MB of other reads, so the L2 still holds none of them) and divides, as time_calls always does: what
a call costs in a stream of calls, like a model's layers, against what one call costs alone.

call as: python3 .device/replay_size.py [OUT_DIR]   (writes replay_size.csv and meta.json)
"""

import pandas as pd

from labkit import routing as routing_gen
from labkit.bench import TOL, LinearBench, LinearCase, check_linear, time_calls
from labkit.bench_moe import TOL_MOE, MoEBench, MoECase, check_moe, point_seed
from labkit.runs import probe_run

LM = (201088, 2880)
MMA = dict(BLOCK_M=8, CHUNKS=1, EARLY=True, NIB=True, RING_W=True, ROWS=2, STAGES=3, TILED=True, TMA=2, WGMMA=True,
           num_warps=4)
LINEAR = [(1, "gemv_h2g", dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=4, EARLY=True, MAXNREG=72, NIB=True, PREFETCH=True,
                               num_stages=1, num_warps=1)),
          (2, "gemv_mma", MMA), (8, "gemv_mma", MMA)]
MOE = [(1, "moe_h2g", dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=4, BLOCK_N2=4, EARLY=2, NIB=True, PREFETCH=True,
                           num_stages=1, num_warps=1))]
REPEATS = (1, 2, 4, 8)


def main():
    run = probe_run("replay-size")
    points = []
    lb = LinearBench(*LM, max_m=8)
    for m, variant, cfg in LINEAR:
        case = LinearCase("lm_head", m, *LM, variant, cfg)
        err = check_linear(case, seed=0)
        if not err <= TOL:
            raise RuntimeError(f"lm_head {m} {variant}: relative error {err:.3g}")
        points.append((f"lm_head m={m} {variant}", err, lb.calls(case)))
    mb = MoEBench("gpt-oss-120b", baseline=False)
    for t, variant, cfg in MOE:
        case = MoECase(model=mb.model, tokens=t, routing="uniform", variant=variant, experts=mb.E, top_k=mb.k,
                       hidden=mb.H, intermediate=mb.I, config=cfg)
        sample = routing_gen.generate("uniform", t, mb.E, mb.k, seed=point_seed(t, "uniform"))
        err = check_moe(case, mb, sample, seed=0)
        if not err <= TOL_MOE:
            raise RuntimeError(f"moe 120b {t} {variant}: relative error {err:.3g}")
        points.append((f"moe 120b T={t} {variant}", err, mb.calls(case, sample)[0]))
    rows = []
    for rnd in range(2):
        for name, err, calls in points:
            for rep in REPEATS:
                r = time_calls(list(calls) * rep, reps=25)
                rows.append({"point": name, "max_rel_err": err, "round": rnd, "calls_per_replay": len(calls) * rep,
                             **r})
                print(f"{name:28s} round {rnd} {len(calls) * rep:3d} calls/replay: {r['us_graph']:8.1f} us per call "
                      f"({r['us_graph_p10']:.1f}-{r['us_graph_p90']:.1f})", flush=True)
    d = pd.DataFrame(rows)
    with pd.option_context("display.width", 200):
        print(d.pivot_table(index="point", columns=["calls_per_replay", "round"], values="us_graph").round(1)
              .to_string())
    if run:
        d.to_csv(run.path / "replay_size.csv", index=False)
        run.update_meta(contents="replay_size.csv: per leader point, round and calls per CUDA-graph replay (the "
                                 "point's calls repeated), the sweep's time_calls result (us per call)")
        run.finish()


if __name__ == "__main__":
    main()
