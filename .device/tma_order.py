"""A/B probe of the TMA=2 ring's order (kernels.linear_mma._TMA_ORDER, set by LAB_TMA_ORDER before import): the
large-token MoE layers at their leaders' configs and the 32/64-token lm_head, each checked against its reference,
then timed as the sweeps time them. One process per order (the order is fixed at compile time); appends a CSV row
per point to $OUT/tma_order.csv. Call as: LAB_TMA_ORDER=<0..3> python3 .device/tma_order.py [round]"""
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from probe_points import LinearBench, LM_HEAD, checked_lm_head_calls, checked_moe_calls  # noqa: E402

from labkit.bench import time_calls  # noqa: E402
from labkit.bench_moe import MoEBench  # noqa: E402

B = dict(CHUNKS=1, TMA=2, WGMMA=True, RING_W=True, TILED=True, NIB=True, num_warps=4)
C8 = dict(B, BLOCK_M=128, ROWS=1, STAGES=2, EPI_EARLY=2)
C64 = dict(B, BLOCK_M=64, ROWS=2, MAXNREG=168)
MOE = [("gpt-oss-20b", 8192, C8), ("gpt-oss-20b", 4096, dict(C64, STAGES=2, EPI_EARLY=1)),
       ("gpt-oss-20b", 1024, dict(C64, STAGES=3, EPI_EARLY=1, HALF=True, CHAIN=True)),
       ("gpt-oss-120b", 8192, C8), ("gpt-oss-120b", 4096, dict(C64, STAGES=3, EPI_EARLY=2, HALF=True))]
LIN = dict(B, EARLY=True, ROWS=2, STAGES=3, TAIL=True)
LMH = [(32, dict(LIN, BLOCK_M=32)), (64, dict(LIN, BLOCK_M=64, MAXNREG=168))]

order, rnd = os.environ.get("LAB_TMA_ORDER", "0"), sys.argv[1] if len(sys.argv) > 1 else "0"
path = os.path.join(os.environ.get("OUT", "."), "tma_order.csv")
new = not os.path.exists(path)
with open(path, "a", newline="") as f:
    w = csv.writer(f)
    if new:
        w.writerow(["order", "round", "point", "max_rel_err", "us_graph", "us_graph_p10", "us_graph_p90", "sm_mhz"])
    points = []
    lb = LinearBench(*LM_HEAD, max_m=64)
    for m, cfg in LMH:
        points.append((f"lm_head {m}", *checked_lm_head_calls(lb, m, "gemv_mma", cfg)))
    del lb
    for model in ("gpt-oss-20b", "gpt-oss-120b"):
        mb = MoEBench(model, baseline=False)
        points += [(f"{model} {t}", *checked_moe_calls(mb, t, "moe_mma", cfg)) for md, t, cfg in MOE if md == model]
        for name, err, calls in points:
            r = time_calls(calls, reps=25)
            w.writerow([order, rnd, name, f"{err:.3g}", r["us_graph"], r["us_graph_p10"], r["us_graph_p90"],
                        r["sm_mhz"]])
            print(f"order {order} round {rnd} {name:20s} {r['us_graph']:9.2f} us err {err:.2g} {r['sm_mhz']} MHz",
                  flush=True)
        points = []
        del mb
