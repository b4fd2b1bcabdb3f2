"""Which tiled weight makes moe_h2g slow in the slow allocator state (.device/sweep_ab2.py: after 4 GB were
allocated and freed, tiled decode timed ~12% slower): each mode timed after a 1 GB (fast state) and after a
4 GB (slow state) alloc+free, gpt-oss-120b, 4 and 8 tokens, the point's routing sample, one copy."""
import torch

import kernels
import kernels.moe as km
from kernels.prepare import prepare_mxfp4, tile_mxfp4
from labkit.bench import time_calls
from labkit.bench_moe import MoEBench, point_seed
from labkit.routing import generate

km.tile_mxfp4 = lambda p, deinterleave=False: p  # the launcher keeps the layout it is given (TILED, DEINT from p)
b = MoEBench("gpt-oss-120b", baseline=False)
r1, r2 = prepare_mxfp4(b.w1), prepare_mxfp4(b.w2)
MODES = {"rows": (r1, r2), "tiled": (tile_mxfp4(r1, True), tile_mxfp4(r2)),
         "tiled_il": (tile_mxfp4(r1), tile_mxfp4(r2)), "w2tiled": (r1, tile_mxfp4(r2)),
         "w1tiled": (tile_mxfp4(r1, True), r2), "w1tiled_il": (tile_mxfp4(r1), r2)}
CFG = dict(BLOCK_K=256, BLOCK_M=1, BLOCK_N=16, BLOCK_N2=16, num_stages=3, num_warps=2)


def churn(gb):
    x = torch.empty(int(gb * 2**30), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    del x


for T in (8, 4):
    s = generate("uniform", T, b.E, b.k, seed=point_seed(T, "uniform"))
    x = torch.randn(T, b.H, device="cuda").to(torch.bfloat16)
    for gb in (1, 4, 1, 4):
        line = []
        for mode, (p1, p2) in MODES.items():
            churn(gb)
            r = kernels.Routing.from_ids(s.ids.cuda(), s.weights.cuda(), b.E, validate=False)
            c = dict(CFG, TILED=p1.tiled or p2.tiled)
            fn = lambda p1=p1, p2=p2, c=c, x=x, r=r: km._run_moe_h2g(x, r, p1, b.b1, p2, b.b2, 1.702, 7.0, **c)  # noqa: E731
            t = time_calls([fn])
            line.append(f"{mode} {t['us_graph']:6.1f} ({t['us_graph_p10']:.0f})")
        print(f"T={T} after {gb} GB: " + "  ".join(line), flush=True)
