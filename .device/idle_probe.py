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
from probe_points import WG8, check_moe_point, moe_case

import labkit.hardware as hardware
from labkit.bench import capture_graph, settle_allocator
from labkit.bench_moe import MoEBench
from labkit.runs import probe_run

GAPS_MS = (0, 0.1, 1, 3, 10, 50)
REPS = 12
CFG = dict(WG8, ROWS=2, ROWS2=1, EPI_EARLY=2)


def timed(fn, spin_cycles):
    """event_ms of fn() behind a spin kernel of spin_cycles (none for 0), in us."""
    hardware.SPIN_CYCLES = spin_cycles
    return hardware.event_ms(fn, spin=bool(spin_cycles)) * 1e3


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
    case, sample = moe_case(bench, 16, "moe_mma", CFG)
    err = check_moe_point(bench, case, sample)
    settle_allocator()
    calls, _ = bench.calls(case, sample)
    for c in calls:
        c()
    graph = capture_graph(calls)
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
        run.finish_with("idle.csv: per host gap before it, each timed call: sleep_20k (8 back-to-back 20k-cycle sleep "
                        "kernels, i = position), sum_1gib (1 GiB fp32 torch.sum, spin = cycles of the sleep kernel "
                        "queued before its start event), moe_120b_16 (the 16-token layer's CUDA graph, checked first: "
                        "max_rel_err)", idle=d)


if __name__ == "__main__":
    main()
