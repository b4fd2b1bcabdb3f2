"""Probe: why moe_h2g on tiled weights is slower than on row-major ones at decode (gpt-oss-120b).

Modes: rows (row-major w1, w2), tiled (w1 tiled deinterleaved, as moe_mma needs), tiled_il (w1 tiled in its
interleaved row order), w2tiled (w1 row-major, w2 tiled) and w1tiled (w1 tiled deinterleaved, w2 row-major).
Without --ncu: CUDA-graph time of the whole layer per mode (bench.time_calls, routings rotated over relabeled
experts). With --ncu: one call per mode after a warm-up, for `ncu -k regex:h2g` (2 launches per call).
"""
import sys

import torch

import kernels
import kernels.moe as km
from kernels.prepare import prepare_mxfp4, tile_mxfp4
from labkit.bench import device, time_calls
from labkit.bench_moe import MoEBench, _relabel
from labkit.routing import generate

km.tile_mxfp4 = lambda p, deinterleave=False: p  # the launcher keeps the layout it is given (TILED, DEINT from p)

CFG = {1: dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=16, BLOCK_N2=8, num_stages=1, num_warps=4),
       4: dict(BLOCK_K=256, BLOCK_M=1, BLOCK_N=16, BLOCK_N2=16, num_stages=3, num_warps=2),
       8: dict(BLOCK_K=256, BLOCK_M=1, BLOCK_N=16, BLOCK_N2=16, num_stages=3, num_warps=2)}
ncu = "--ncu" in sys.argv
model = sys.argv[sys.argv.index("--model") + 1] if "--model" in sys.argv else "gpt-oss-120b"
b = MoEBench(model, baseline=False)
dev = device()
r1, r2 = prepare_mxfp4(b.w1), prepare_mxfp4(b.w2)
MODES = {"rows": (r1, r2), "tiled": (tile_mxfp4(r1, True), tile_mxfp4(r2)),
         "tiled_il": (tile_mxfp4(r1), tile_mxfp4(r2)), "w2tiled": (r1, tile_mxfp4(r2)),
         "w1tiled": (tile_mxfp4(r1, True), r2)}
print("T mode us_graph")
from labkit.bench_moe import point_seed  # noqa: E402

SEEDS = {"seed0": lambda T: 0, "point": lambda T: point_seed(T, "uniform")}
for (T, cfg), (sname, seed), n in [(tc, sd, n) for tc in CFG.items() for sd in SEEDS.items()
                                   for n in ((24, 1) if dev.type == "cuda" and not ncu else (1,))]:
    sample = generate("uniform", T, b.E, b.k, seed=seed(T))
    x = torch.randn(T, b.H, device=dev).to(torch.bfloat16)
    routings = [kernels.Routing.from_ids(sample.ids.to(dev) if c == 0 else _relabel(sample.ids.to(dev), b.E, seed=c),
                                         sample.weights.to(dev), b.E, validate=False) for c in range(n)]
    ref = None
    for mode, (p1, p2) in MODES.items():
        if mode not in ("rows", "tiled") and (sname != "seed0" or n != 24):
            continue
        c = dict(cfg, TILED=p1.tiled or p2.tiled)
        fn = lambda r, p1=p1, p2=p2, c=c, x=x: km._run_moe_h2g(x, r, p1, b.b1, p2, b.b2, 1.702, 7.0, **c)  # noqa: E731
        y = fn(routings[0])
        ref = y if ref is None else ref
        ok = torch.equal(y, ref)
        if ncu:
            print(f"NCU {T} {sname} {mode}", flush=True)
            fn(routings[0])
            torch.cuda.synchronize()
            continue
        t = time_calls([lambda r=r, fn=fn: fn(r) for r in routings])
        print(f"{T} {sname} distinct={sample.stats()['distinct_experts']} copies={n} {mode:9s} "
              f"{t['us_graph'] or t['us_eager']:8.1f} {'same' if ok else 'DIFFERENT'}", flush=True)
