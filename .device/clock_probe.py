"""Why some MoE points time in two modes: at 20b 8192 tokens the leaders' replays spread over p10 3.27-3.30 ms and
p90 3.50-3.69 ms (results/20261127T082219-h100-80gb-hbm3-moe-regret-uniform, ...081004-...-moe-tables), so a
config's median lands in either mode and the tables' regret there (1.06) says more about the mode than the config.
This times single CUDA-graph replays of a layer pass (the sweep's calls: one layer per routing relabeling) back to
back while a thread samples the GPU's SM clock, power and clock-event reasons (nvidia-smi, every 5 ms), and
joins each replay with the samples inside it: if the slow replays are the ones run at a lower clock (power or
thermal capping), the two modes are the GPU's, not the kernels'.

call as: python3 .device/clock_probe.py [OUT_DIR]   (writes replays.csv, clocks.csv, summary.csv and meta.json)
"""
import statistics
import subprocess
import threading
import time

import pandas as pd
import torch

import kernels as K
from kernels import moe_mma as MM
from labkit import routing as routing_gen
from labkit.bench import settle_allocator
from labkit.bench_moe import MoEBench, _relabel, point_seed
from labkit.hardware import event_ms
from labkit.runs import probe_run

WG = dict(CHUNKS=1, num_warps=4, WGMMA=True, TILED=True, RING_W=True, NIB=True)
T64 = dict(WG, BLOCK_M=64, ROWS=2, STAGES=3, MAXNREG=168, TMA=2)
C8 = dict(WG, BLOCK_M=8, ROWS=2, ROWS2=1, STAGES=4, CHAIN=True, EPI_EARLY=2)
POINTS = [("gpt-oss-20b", 8192, dict(T64, EPI_EARLY=1)), ("gpt-oss-20b", 8192, dict(T64, EPI_EARLY=2)),
          ("gpt-oss-120b", 4096, dict(T64, EPI_EARLY=1)), ("gpt-oss-120b", 32, C8)]
FIELDS = ["clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_event_reasons.active"]
REPLAYS = 120


def sampler(rows, stop):
    """nvidia-smi's samples every 5 ms into rows as (host time, fields...), until stop is set."""
    fields = list(FIELDS)
    probe = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True)
    if probe.returncode:
        fields = fields[:-1]
    p = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                          "-lms", "5"], stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        rows.append([time.time()] + [v.strip() for v in line.split(",")])
        if stop.is_set():
            break
    p.terminate()
    return fields


def layer_calls(x, rs, p1, p2, bench, full):
    """One layer call per routing, as the sweep's moe_layer op makes them."""
    return [lambda r=r: MM.run_moe_mma(x, r, p1, bench.b1, p2, bench.b2, 1.702, 7.0, **full) for r in rs]


def main():
    run = probe_run("clock-probe")
    out = run.path if run else None
    samples, stop = [], threading.Event()
    th = threading.Thread(target=sampler, args=(samples, stop), daemon=True)
    th.start()
    replays = []
    bench = None
    for pi, (model, tokens, cfg) in enumerate(POINTS):
        if bench is None or bench.model != model:
            bench = None
            torch.cuda.empty_cache()
            bench = MoEBench(model, baseline=False)
        full = {**K.VARIANTS["moe_mma"].defaults, **cfg}
        sample = routing_gen.generate("uniform", tokens, bench.E, bench.k, seed=point_seed(tokens, "uniform"))
        ids = sample.ids.cuda()
        p1, p2 = K.prepare_mxfp4(bench.w1), K.prepare_mxfp4(bench.w2)
        x = torch.randn(tokens, bench.H, device="cuda").to(torch.bfloat16)
        rs = [K.Routing.from_ids(ids if i == 0 else _relabel(ids, bench.E, seed=i), sample.weights.cuda(), bench.E,
                                 validate=False) for i in range(6)]
        calls = layer_calls(x, rs, p1, p2, bench, full)
        for c in calls:
            c()
        torch.cuda.synchronize()
        settle_allocator()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        for i in range(REPLAYS):
            t0 = time.time()
            ms = event_ms(graph.replay)
            replays.append({"point": pi, "model": model, "tokens": tokens, "config": str(cfg), "i": i, "t0": t0,
                            "t1": time.time(), "us": ms * 1e3 / len(calls)})
        del graph
        us = [r["us"] for r in replays if r["point"] == pi]
        print(f"{model} {tokens}: median {statistics.median(us):.1f} us, min {min(us):.1f}, max {max(us):.1f}",
              flush=True)
    time.sleep(0.05)
    stop.set()
    fields = FIELDS if samples and len(samples[0]) == len(FIELDS) + 1 else FIELDS[:-1]
    clocks = pd.DataFrame(samples, columns=["t"] + fields)
    for f in fields[:-1] if fields[-1].startswith("clocks_event") else fields:
        clocks[f] = pd.to_numeric(clocks[f], errors="coerce")
    rep = pd.DataFrame(replays)
    # each replay with the samples taken while it ran (the host times around it hold the device time)
    sm, power, reasons = [], [], []
    for r in rep.itertuples():
        s = clocks[(clocks.t >= r.t0 - 0.005) & (clocks.t <= r.t1 + 0.005)]
        sm.append(s["clocks.sm"].mean() if len(s) else float("nan"))
        power.append(s["power.draw"].mean() if len(s) else float("nan"))
        reasons.append(";".join(sorted(set(s[fields[-1]].astype(str)))) if len(s) and "event" in fields[-1] else "")
    rep["sm_mhz"], rep["power_w"], rep["reasons"] = sm, power, reasons
    rep["mode"] = rep.groupby("point").us.transform(lambda u: (u > u.median()).map({True: "slow", False: "fast"}))
    summary = rep.groupby(["point", "model", "tokens", "config", "mode"]).agg(
        replays=("us", "size"), us=("us", "median"), sm_mhz=("sm_mhz", "mean"), power_w=("power_w", "mean"),
        reasons=("reasons", lambda s: ";".join(sorted({x for v in s for x in str(v).split(";") if x})))).reset_index()
    corr = rep.groupby("point").apply(lambda d: d.us.corr(d.sm_mhz)).rename("corr_us_sm_mhz").reset_index()
    summary = summary.merge(corr, on="point")
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.max_colwidth", 60):
        print(summary.drop(columns=["config"]).to_string(index=False))
    if out:
        rep.to_csv(out / "replays.csv", index=False)
        clocks.to_csv(out / "clocks.csv", index=False)
        summary.to_csv(out / "summary.csv", index=False)
        run.update_meta(contents="replays.csv: each CUDA-graph replay of a layer pass (us per layer call) with the "
                                 "SM clock, power and clock-event reasons nvidia-smi sampled while it ran; clocks.csv: "
                                 "every sample; summary.csv: per point, replays above and below the median")
        run.finish()


if __name__ == "__main__":
    main()
