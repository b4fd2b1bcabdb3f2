"""How stable is the measured read ceiling, and does any reader beat torch.sum's?

`labkit.targets` judges every point against the highest read GB/s any run measured on that GPU model. Over the
committed H100 runs that is 3111 GB/s, from 3 of 342 runs; the others read 3044-3068. This probe measures, in
one process: measure_ceilings() N times (fresh buffers each time), then other readers of the same bytes, each
spin-led and event-timed like the ceiling (hardware.event_ms): torch.sum (fp32, and the buffer as bf16),
torch.amax, and Triton streaming reads (one tile per program; persistent grid-stride) at 1 GiB and at the lm_head
weight's 307.6 MB. Prints GB/s per reader: median, min, max over its repetitions."""
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

from labkit.hardware import event_ms, measure_ceilings

N_CEIL = int(sys.argv[1]) if len(sys.argv) > 1 else 10
REPS = 30


@triton.jit
def _tile_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + pid, tl.sum(v, axis=0))


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


rows = []
ceil = [measure_ceilings() for _ in range(N_CEIL)]
reads = [c.read_gbps for c in ceil]
rows.append(("measure_ceilings read", "1 GiB", statistics.median(reads), min(reads), max(reads)))
flops = [c.bf16_tflops for c in ceil]
print(f"bf16 TFLOP/s over {N_CEIL}: median {statistics.median(flops):.1f} min {min(flops):.1f} max {max(flops):.1f}")
sms = torch.cuda.get_device_properties(0).multi_processor_count
for label, nbytes in (("1 GiB", 1 << 30), ("lm_head 307.6 MB", 201088 * 2880 // 2 + 201088 * 90)):
    nbytes = nbytes // 64 * 64
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(nbytes // 4, device="cuda", generator=g)
    xi = x.view(torch.int32)
    n = xi.numel()
    rows.append(("torch.sum fp32", label, *gbps(nbytes, x.sum)))
    rows.append(("torch.sum bf16 view", label, *gbps(nbytes, lambda: x.view(torch.bfloat16).sum())))
    rows.append(("torch.amax fp32", label, *gbps(nbytes, x.amax)))
    for block, warps in ((2048, 4), (4096, 8), (8192, 8)):
        out = torch.empty(triton.cdiv(n, block), device="cuda", dtype=torch.int32)
        rows.append((f"triton tile {block}x4B nw{warps}", label,
                     *gbps(nbytes, lambda: _tile_sum[(triton.cdiv(n, block),)](xi, out, n, BLOCK=block,
                                                                               num_warps=warps))))
    for per_sm, block in ((4, 2048), (8, 1024), (2, 4096)):
        out = torch.empty(sms * per_sm, device="cuda", dtype=torch.int32)
        rows.append((f"triton grid-stride {per_sm}/SM {block}x4B", label,
                     *gbps(nbytes, lambda: _grid_sum[(sms * per_sm,)](xi, out, n, BLOCK=block, num_warps=8))))
    del x, xi
    torch.cuda.empty_cache()

print(f"{'reader':36s} {'bytes':18s} {'median':>8s} {'min':>8s} {'max':>8s}  (GB/s)")
for r in rows:
    print(f"{r[0]:36s} {r[1]:18s} {r[2]:8.1f} {r[3]:8.1f} {r[4]:8.1f}")
out_dir = os.environ.get("OUT")
if out_dir:
    with open(os.path.join(out_dir, "read_ceiling.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "ceilings": [c.as_meta() for c in ceil],
                   "readers": [dict(zip(("reader", "bytes", "median", "min", "max"), r)) for r in rows]},
                  f, indent=1, default=str)
