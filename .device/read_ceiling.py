"""How good a floor is the measured read ceiling, and how long a plain read of each judged point's bytes takes.

call as: python3 .device/read_ceiling.py [OUT_DIR]   (writes readers.csv, read_floor.csv and meta.json)

`labkit.targets` judges every point against the highest read GB/s any run measured on that GPU model
(hardware.measure_ceilings: torch.sum over a 1 GiB fp32 buffer). Over the committed H100 runs that is 3111 GB/s,
from 3 of 342 runs; the others read 3044-3068. This probe, in one process:
1. measure_ceilings() ten times (fresh buffers each time): the ceiling's own spread;
2. other readers of the same 1 GiB and of the lm_head's 307.6 MB, spin-led and event-timed like the ceiling
   (hardware.event_ms): torch.sum (fp32; the buffer as bf16), torch.amax, and Triton streaming reads (one tile
   per program; a persistent grid-stride loop). GB/s per reader: median, min, max;
3. for each point `./lab targets` judges against the floor where the bytes term dominates
   (.device/read_floor_points.csv: its bytes and the best time measured there), the fastest reader of (2) over
   exactly those bytes, timed like the sweeps (bench.time_calls: CUDA-graph replays over copies rotated past
   4x L2), in one launch and, for the MoE layer, in two launches of 2/3 and 1/3 of the bytes (mlp1 and mlp2's
   weights) - what a kernel that only read its bytes would take there, launches, ramp and drain included."""
import math
import statistics
import sys
from pathlib import Path

import pandas as pd
import torch
import triton
import triton.language as tl

from labkit.bench import time_calls
from labkit.hardware import event_ms, measure_ceilings
from labkit.readfloor import read_call
from labkit.runs import probe_run

REPS = 30


@triton.jit
def _grid_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for start in tl.range(pid.to(tl.int64) * BLOCK, n, tl.num_programs(0) * BLOCK, num_stages=4):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def gbps(nbytes, fn):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = [nbytes / (event_ms(fn) * 1e-3) / 1e9 for _ in range(REPS)]
    return statistics.median(ts), min(ts), max(ts)


def readers():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for label, nbytes in (("1 GiB", 1 << 30), ("lm_head 307.6 MB", 201088 * 2880 // 2 + 201088 * 90)):
        nbytes = nbytes // 64 * 64
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(nbytes // 4, device="cuda", generator=g)
        xi = x.view(torch.int32)
        n = xi.numel()
        for name, fn in (("torch.sum fp32", x.sum), ("torch.sum bf16 view", lambda x=x: x.view(torch.bfloat16).sum()),
                         ("torch.amax fp32", x.amax)):
            rows.append((name, label, *gbps(nbytes, fn)))
        for block, warps in ((2048, 4), (4096, 8), (8192, 8)):
            rows.append((f"triton tile {block}x4B nw{warps}", label, *gbps(nbytes, read_call(xi, block, warps))))
        for per_sm, block in ((4, 2048), (8, 1024), (2, 4096)):
            out = torch.empty(sms * per_sm, device="cuda", dtype=torch.int32)
            rows.append((f"triton grid-stride {per_sm}/SM {block}x4B", label,
                         *gbps(nbytes, lambda g=sms * per_sm, xi=xi, out=out, n=n, block=block:
                              _grid_sum[(g,)](xi, out, n, BLOCK=block, num_warps=8))))
        del x, xi
        torch.cuda.empty_cache()
    return pd.DataFrame(rows, columns=["reader", "bytes", "gbps_median", "gbps_min", "gbps_max"])


def read_floor(points: pd.DataFrame, ceiling_gbps: float):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for p in points.to_dict("records"):
        words = int(p["bytes"]) // 4
        parts = [words] if p["problem"] == "lm_head" else [words * 2 // 3, words - words * 2 // 3]
        copies = max(2, math.ceil(4 * l2 / (4 * words)))
        for launches in ([1] if len(parts) == 1 else [1, 2]):
            split = [words] if launches == 1 else parts
            bufs = [[torch.randint(0, 1 << 20, (w,), device="cuda", dtype=torch.int32) for w in split]
                    for _ in range(copies)]
            for block, warps in ((2048, 4), (4096, 8)):
                calls = []
                for b in bufs:
                    fns = [read_call(x, block, warps) for x in b]
                    calls.append(lambda fns=fns: [f() for f in fns])
                t = time_calls(calls, reps=40)
                us = t["us_graph"]
                rows.append({"problem": p["problem"], "m": p["m"], "bytes": p["bytes"], "launches": launches,
                             "reader": f"tile {block}x4B nw{warps}", "read_us": us, "read_p10": t["us_graph_p10"],
                             "read_p90": t["us_graph_p90"], "read_gbps": p["bytes"] / us / 1e3,
                             "floor_us": p["bytes"] / ceiling_gbps / 1e3, "best_us": p["best_us"],
                             "best_run": p["run_id"], "best_over_read": p["best_us"] / us, "copies": copies})
                print(f"{p['problem']:>12s} {p['m']:5d} launches {launches} {rows[-1]['reader']:18s} read "
                      f"{us:8.1f} us ({rows[-1]['read_gbps']:6.0f} GB/s)  best {p['best_us']:8.1f} us "
                      f"= {p['best_us'] / us:5.3f}x read", flush=True)
            del bufs
            torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def main():
    run = probe_run("read-ceiling")
    ceil = [measure_ceilings() for _ in range(10)]
    reads = [c.read_gbps for c in ceil]
    flops = [c.bf16_tflops for c in ceil]
    print(f"measure_ceilings x10: read median {statistics.median(reads):.1f} min {min(reads):.1f} max "
          f"{max(reads):.1f} GB/s; bf16 median {statistics.median(flops):.1f} min {min(flops):.1f} max "
          f"{max(flops):.1f} TFLOP/s", flush=True)
    r = readers()
    print(r.to_string(index=False), flush=True)
    points = pd.read_csv(Path(__file__).with_name("read_floor_points.csv"))
    f = read_floor(points, 3111.2128659608793)  # the read ceiling ./lab targets judges H100 points against
    if run:
        run.update_meta(ceilings=ceil[0].as_meta(), ceilings_repeated=[c.as_meta() for c in ceil])
        run.finish_with("readers.csv: GB/s of torch and Triton readers over 1 GiB and 307.6 MB (spin-led events, "
                        "30 reps); read_floor.csv: per judged memory-bound point, a Triton tile read of its bytes "
                        "(1 launch; MoE also 2 launches, 2/3 then 1/3) timed like the sweeps, against the point's "
                        "best time (best_over_read) and the 3111 GB/s floor ./lab targets uses", readers=r,
                        read_floor=f)


if __name__ == "__main__":
    sys.exit(main())
