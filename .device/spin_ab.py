"""A/B of the spin kernel ahead of timed graph replays (hardware.event_ms): replay times with SPIN_CYCLES = 0
(the start event may wait for the host to launch the graph) and with the default, alternated, on linear and MoE
points of every size class."""
import torch

import labkit.hardware as hardware
from labkit.bench import LinearBench, LinearCase, time_calls
from labkit.bench_moe import MoEBench, MoECase, point_seed
from labkit.routing import generate

SPIN = hardware.SPIN_CYCLES
H2G = {"BLOCK_K": 512, "BLOCK_M": 1, "BLOCK_N": 16, "num_stages": 1, "num_warps": 4}
rows = []
for n, k, m in ((5120, 2880, 1), (2880, 4096, 1), (201088, 2880, 1)):
    lb = LinearBench(n, k, max_m=m)
    calls = lb.calls(LinearCase("x", m, n, k, "gemv_h2g", H2G))
    rows.append((f"linear {n}x{k} m={m} copies={len(calls)}", calls))
mb = MoEBench("gpt-oss-120b", baseline=False)
for t, cfg in ((1, dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=16, BLOCK_N2=8, num_stages=1, num_warps=4)),
               (8, dict(BLOCK_K=256, BLOCK_M=1, BLOCK_N=16, BLOCK_N2=16, num_stages=3, num_warps=2))):
    for tiled in (False, True):
        case = MoECase(model="gpt-oss-120b", tokens=t, routing="uniform", experts=128, top_k=4, hidden=2880,
                       intermediate=2880, variant="moe_h2g", config={**cfg, "TILED": tiled})
        calls, _ = mb.calls(case, generate("uniform", t, 128, 4, seed=point_seed(t, "uniform")))
        rows.append((f"moe 120b T={t} tiled={tiled} copies={len(calls)}", calls))
print(f"{'case':44s} {'no spin':>9s} {'spin':>9s} {'no spin':>9s} {'spin':>9s}  (us_graph median, p10-p90)")
for name, calls in rows:
    out = []
    for s in (0, SPIN, 0, SPIN):
        hardware.SPIN_CYCLES = s
        r = time_calls(calls)
        out.append(f"{r['us_graph']:7.1f} ({r['us_graph_p10']:.1f}-{r['us_graph_p90']:.1f})")
    print(f"{name:44s} " + "  ".join(out), flush=True)
torch.cuda.synchronize()
