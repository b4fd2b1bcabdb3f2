"""What a host gap before a timed replay does to the GPU: .device/slow_mode.py found single MoE layer replays 5-8%
slower after a 3 ms host sleep than back to back, for tiled and row-major weights alike. This times, after host gaps
of 0-50 ms: (1) eight back-to-back sleep kernels of 20k cycles each (their length gives the SM clock as it ramps),
(2) a 1 GiB fp32 sum (DRAM-bound) with and without the usual spin kernel ahead of it, and (3) the 120b 16-token MoE
leader (checked against reference_moe first) behind spin kernels of 0.1M, 1M and 4M cycles.

call as: python3 .device/idle_probe.py [OUT_DIR]   (writes idle.csv and meta.json)
"""

import time

import pandas as pd
import torch

import kernels as K
from labkit import routing as routing_gen
from labkit.bench import settle_allocator
from labkit.bench_moe import TOL_MOE, MoEBench, MoECase, check_moe, point_seed
from labkit.runs import probe_run

GAPS_MS = (0, 0.1, 1, 3, 10, 50)
REPS = 12
CFG = dict(CHUNKS=1, num_warps=4, WGMMA=True, TILED=True, RING_W=True, NIB=True, BLOCK_M=8, STAGES=4, CHAIN=True,
           ROWS=2, ROWS2=1, EPI_EARLY=2)


def timed(fn, spin_cycles):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if spin_cycles:
        torch.cuda._sleep(spin_cycles)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3


def clock_ramp(gap_s):
    """Eight 20k-cycle sleep kernels right after the gap, each between its own events: us each."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(9)]
    ev[0].record()
    for i in range(8):
        torch.cuda._sleep(20000)
        ev[i + 1].record()
    ev[-1].synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(8)]


def main():
    run = probe_run("idle-probe")
    rows = []
    big = torch.ones(2**28, device="cuda")  # 1 GiB fp32
    bench = MoEBench("gpt-oss-120b", baseline=False)
    tokens = 16
    full = {**K.VARIANTS["moe_mma"].defaults, **CFG}
    case = MoECase(model=bench.model, tokens=tokens, routing="uniform", variant="moe_mma", experts=bench.E,
                   top_k=bench.k, hidden=bench.H, intermediate=bench.I, config=full)
    sample = routing_gen.generate("uniform", tokens, bench.E, bench.k, seed=point_seed(tokens, "uniform"))
    err = check_moe(case, bench, sample, seed=0)
    if not err <= TOL_MOE:
        raise RuntimeError(f"relative error {err:.3g} against reference_moe")
    settle_allocator()
    calls, _ = bench.calls(case, sample)
    graph = torch.cuda.CUDAGraph()
    for c in calls:
        c()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    tests = [("sum_1gib", lambda: big.sum(), 0), ("sum_1gib", lambda: big.sum(), 100_000)]
    tests += [("moe_120b_16", graph.replay, s) for s in (100_000, 1_000_000, 4_000_000)]
    for gap in GAPS_MS:
        for r in range(REPS):
            time.sleep(gap / 1e3)
            for i, us in enumerate(clock_ramp(gap)):
                rows.append({"test": "sleep_20k", "spin": 0, "gap_ms": gap, "rep": r, "i": i, "us": us})
        for name, fn, spin in tests:
            for r in range(REPS):
                time.sleep(gap / 1e3)
                rows.append({"test": name, "spin": spin, "gap_ms": gap, "rep": r, "i": 0, "us": timed(fn, spin)})
        print(f"gap {gap} ms done", flush=True)
    d = pd.DataFrame(rows)
    d["max_rel_err"] = err
    ramp = d[d.test == "sleep_20k"].pivot_table(index="gap_ms", columns="i", values="us", aggfunc="median").round(2)
    other = d[d.test != "sleep_20k"].pivot_table(index=["test", "spin"], columns="gap_ms", values="us",
                                                 aggfunc="median").round(1)
    with pd.option_context("display.width", 200):
        print("sleep kernels of 20k cycles after each gap (us, median over reps; 10.1 us is 1980 MHz):")
        print(ramp.to_string())
        print("median us by host gap (ms):")
        print(other.to_string())
    if run:
        d.to_csv(run.path / "idle.csv", index=False)
        run.update_meta(contents="idle.csv: per host gap before it, each timed call: sleep_20k (8 back-to-back 20k-"
                                 "cycle sleep kernels, i = position), sum_1gib (1 GiB fp32 torch.sum, spin = cycles "
                                 "of the sleep kernel queued before its start event), moe_120b_16 (the 16-token "
                                 "layer's CUDA graph, checked first: max_rel_err)")
        run.finish()


if __name__ == "__main__":
    main()
