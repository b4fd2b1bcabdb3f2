"""How far the bf16 attention projections' decode GEMV is from a bare read of its weight (GPU).

For gpt-oss's qkv [5120, 2880] and out [2880, 4096] at one row: a plain read of the weight's bytes
(labkit.readfloor.read_us, one launch), kernels.linear_bf16.gemv_bf16 at its pick and over a grid of tiles, and
cuBLAS (F.linear), each timed like a sweep point (bench.time_calls over copies rotated past 4x the L2), each
GEMV checked against F.linear in fp32 first. Writes OUT/proj_read.csv and prints the table.
call as: python3 .device/proj_read.py OUT
"""

import itertools
import math
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from kernels.linear_bf16 import fits, gemv_bf16, pick
from labkit.bench import time_calls
from labkit.readfloor import read_us

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rows = []
l2 = torch.cuda.get_device_properties(0).L2_cache_size
for name, n, k in (("qkv", 5120, 2880), ("attn_out", 2880, 4096)):
    nbytes = n * k * 2
    r = read_us(nbytes)
    rows.append({"shape": name, "what": "bare read", "us": r["read_us"], "p10": r["read_p10"], "p90": r["read_p90"]})
    copies = max(2, math.ceil(4 * l2 / nbytes))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    want = F.linear(x.float(), ws[0].float())
    t = time_calls([lambda w=w, x=x: F.linear(x, w) for w in ws])
    rows.append({"shape": name, "what": "cublas", "us": t["us_graph"], "p10": t["us_graph_p10"],
                 "p90": t["us_graph_p90"]})
    configs = [None] + [{"block_n": bn, "block_k": bk, "num_warps": nw} for bn, bk, nw in
                        itertools.product((1, 2, 4, 8, 16), (256, 512, 1024, 2048), (2, 4, 8)) if fits(1, bn, bk, nw)]
    for cfg in configs:
        kw = cfg or {}
        err = ((gemv_bf16(x, ws[0], **kw).float() - want).norm() / want.norm()).item()
        if err > 1e-2:
            rows.append({"shape": name, "what": f"gemv {kw or 'pick'}", "us": None, "error": err})
            continue
        t = time_calls([lambda w=w, x=x, kw=kw: gemv_bf16(x, w, **kw) for w in ws])
        rows.append({"shape": name, "what": f"gemv {kw or 'pick ' + str(pick(1, n, k))}", "us": t["us_graph"],
                     "p10": t["us_graph_p10"], "p90": t["us_graph_p90"], "error": err})
    del ws
    torch.cuda.empty_cache()
df = pd.DataFrame(rows)
df["gbps"] = [2 * {"qkv": 5120 * 2880, "attn_out": 2880 * 4096}[s] / u / 1e3 if u == u and u else None
              for s, u in zip(df["shape"], df["us"])]
df.to_csv(out / "proj_read.csv", index=False)
with pd.option_context("display.width", 200, "display.max_colwidth", 80):
    for _, g in df.groupby("shape", sort=False):
        print(g.sort_values("us").head(8).to_string(index=False))
