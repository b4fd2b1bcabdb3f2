"""Which step before the timing slows tiled moe_h2g in measure_moe: each line runs one step, then times the
tiled case (bench.calls + time_calls)."""
import time

import torch

from kernels import tile_mxfp4
from labkit.bench import time_calls
from labkit.bench_moe import MoEBench, MoECase, _layer, check_moe, point_seed
from labkit.routing import generate

b = MoEBench("gpt-oss-120b", baseline=False)
CFG = dict(BLOCK_K=256, BLOCK_M=1, BLOCK_N=16, BLOCK_N2=16, num_stages=3, num_warps=2)
t = 8
sample = generate("uniform", t, 128, 4, seed=point_seed(t, "uniform"))
case = {tl: MoECase(model="gpt-oss-120b", tokens=t, routing="uniform", experts=128, top_k=4, hidden=2880,
                    intermediate=2880, variant="moe_h2g", config={**CFG, "TILED": tl}) for tl in (False, True)}


def tiled_time(tl=True):
    return time_calls(b.calls(case[tl], sample)[0])["us_graph"]


def fresh_tiles():
    w1, _, w2, _ = _layer(128, 2880, 2880, seed=5, dev="cuda")
    tile_mxfp4(w1, deinterleave=True), tile_mxfp4(w2)
    torch.cuda.synchronize()


def check_then_empty():
    check_moe(case[True], b, sample, seed=3)
    torch.cuda.empty_cache()


def check_then_sleep():
    check_moe(case[True], b, sample, seed=3)
    time.sleep(1.0)


def big_alloc(gb):
    x = torch.empty(int(gb * 2**30), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    del x


STEPS = {"nothing": lambda: None, "fresh tiles": fresh_tiles, "alloc+free 1 GB": lambda: big_alloc(1),
         "alloc+free 4 GB": lambda: big_alloc(4), "alloc+free 16 GB": lambda: big_alloc(16)}
for rep in range(2):
    for name, step in STEPS.items():
        for tl in (True, False):
            step()
            m0 = torch.cuda.memory_allocated() / 2**30
            m1 = torch.cuda.memory_reserved() / 2**30
            print(f"rep {rep} {name:20s} tiled={tl!s:5s} {tiled_time(tl):7.1f} alloc {m0:.1f} reserved {m1:.1f} GB",
                  flush=True)
