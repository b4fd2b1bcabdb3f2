"""Why some MoE points time in two modes: at 20b 8192 tokens the leaders' replays spread over p10 3.27-3.30 ms and
p90 3.50-3.69 ms (results/20261127T082219-h100-80gb-hbm3-moe-regret-uniform, ...081004-...-moe-tables), so a
config's median lands in either mode and the tables' regret there (1.06) says more about the mode than the config.
This times single CUDA-graph replays of a layer pass (the sweep's calls, labkit.bench_moe.MoEBench.calls) back to
back, each inside a labkit.clocks.ClockSampler sampling every 5 ms: if the slow replays are the ones run at a lower
clock (power or thermal capping), the two modes are the GPU's, not the kernels'. (Its run at ac2a584,
results/20261127T103603-h100-80gb-hbm3-clock-probe, sampled nvidia-smi in a thread of its own, before labkit.clocks
existed, and also wrote every raw sample to clocks.csv.) What it can show depends on the load: that first version
replayed six layer calls (~20 ms) back to back and found two modes ~100 MHz apart; this one replays the sweep's one
call per replay and waits after each for a clock sample, so the GPU idles between replays, and its run at f52c94d
(results/20261127T114158-h100-80gb-hbm3-clock-probe) found 20b at 8192 tokens within 1.4% at ~1970 MHz: the power cap
comes with sustained load.

call as: python3 .device/clock_probe.py [OUT_DIR]   (writes replays.csv, summary.csv and meta.json)
"""

import statistics
import time

import pandas as pd
import torch
from probe_points import check_moe_point, moe_case

from labkit.bench import capture_graph, settle_allocator
from labkit.bench_moe import MoEBench
from labkit.clocks import ClockSampler
from labkit.hardware import event_ms
from labkit.runs import probe_run

WG = dict(CHUNKS=1, num_warps=4, WGMMA=True, TILED=True, RING_W=True, NIB=True)
T64 = dict(WG, BLOCK_M=64, ROWS=2, STAGES=3, MAXNREG=168, TMA=2)
C8 = dict(WG, BLOCK_M=8, ROWS=2, ROWS2=1, STAGES=4, CHAIN=True, EPI_EARLY=2)
POINTS = [("gpt-oss-20b", 8192, dict(T64, EPI_EARLY=1)), ("gpt-oss-20b", 8192, dict(T64, EPI_EARLY=2)),
          ("gpt-oss-120b", 4096, dict(T64, EPI_EARLY=1)), ("gpt-oss-120b", 32, C8)]
REPLAYS = 120


def main():
    run = probe_run("clock-probe")
    replays = []
    bench = None
    for pi, (model, tokens, cfg) in enumerate(POINTS):
        if bench is None or bench.model != model:
            bench = None
            torch.cuda.empty_cache()
            bench = MoEBench(model, baseline=False)
        case, sample = moe_case(bench, tokens, "moe_mma", cfg)
        err = check_moe_point(bench, case, sample)  # correctness first, as the sweep checks it
        calls, _ = bench.calls(case, sample)
        for c in calls:
            c()
        torch.cuda.synchronize()
        settle_allocator()
        graph = capture_graph(calls)
        for i in range(REPLAYS):
            with ClockSampler(interval_ms=5) as clocks:
                ms = event_ms(graph.replay)
            replays.append({"point": pi, "model": model, "tokens": tokens, "config": str(cfg), "max_rel_err": err,
                            "i": i, "t": time.monotonic(), "us": ms * 1e3 / len(calls), **clocks.result})
        del graph
        us = [r["us"] for r in replays if r["point"] == pi]
        print(f"{model} {tokens}: median {statistics.median(us):.1f} us, min {min(us):.1f}, max {max(us):.1f}",
              flush=True)
    rep = pd.DataFrame(replays)
    rep["mode"] = rep.groupby("point").us.transform(lambda u: (u > u.median()).map({True: "slow", False: "fast"}))
    summary = rep.groupby(["point", "model", "tokens", "config", "mode"]).agg(
        replays=("us", "size"), us=("us", "median"), sm_mhz=("sm_mhz", "mean"), power_w=("power_w", "mean"),
        clock_capped=("clock_capped", "mean")).reset_index()
    corr = rep.groupby("point").apply(lambda d: d.us.corr(d.sm_mhz)).rename("corr_us_sm_mhz").reset_index()
    summary = summary.merge(corr, on="point")
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print(summary.drop(columns=["config"]).to_string(index=False))
    if run:
        run.finish_with("replays.csv: each CUDA-graph replay of a layer pass (us per layer call) with the SM clock, "
                        "power and capped share labkit.clocks sampled while it ran; summary.csv: per point, replays "
                        "above and below the median", replays=rep, summary=summary)


if __name__ == "__main__":
    main()
