"""Why a sweep times moe_h2g on tiled weights slower than a plain script does: the same case through
measure_moe (check on fresh weights, then time) and through bench.calls + time_calls alone, alternated."""
from labkit.bench import time_calls
from labkit.bench_moe import MoEBench, MoECase, measure_moe, point_seed
from labkit.routing import generate

b = MoEBench("gpt-oss-120b", baseline=False)
CFG = dict(BLOCK_K=256, BLOCK_M=1, BLOCK_N=16, BLOCK_N2=16, num_stages=3, num_warps=2)
for t in (8, 1):
    sample = generate("uniform", t, 128, 4, seed=point_seed(t, "uniform"))
    for rep in range(2):
        for tiled in (False, True):
            case = MoECase(model="gpt-oss-120b", tokens=t, routing="uniform", experts=128, top_k=4, hidden=2880,
                           intermediate=2880, variant="moe_h2g", config={**CFG, "TILED": tiled})
            full = measure_moe(case, b, seed=rep + 1)["us_graph"]
            plain = time_calls(b.calls(case, sample)[0])["us_graph"]
            full2 = measure_moe(case, b, seed=rep + 7)["us_graph"]
            print(f"T={t} rep={rep} tiled={tiled!s:5s} measure_moe {full:7.1f} plain {plain:7.1f} again {full2:7.1f}",
                  flush=True)
