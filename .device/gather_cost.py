"""What moe_mma TMA=2's expert-sorted x costs: x_to_f16 then index_select (stop 44's three launches) against
x_to_f16(rows=...) (one launch), per token count, CUDA-graph replays timed by labkit.bench.time_calls; checks the
two agree bit for bit first. Prints a table; writes $OUT/gather_cost.csv when OUT is set."""
import os

import torch

from kernels.linear_f16 import x_to_f16
from labkit.bench import time_calls

H, TOPK = 2880, 4
rows = []
for T in (16, 64, 256, 1024, 4096, 8192):
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    slots = torch.randperm(T * TOPK, device="cuda")
    def old(x=x, slots=slots):
        return x_to_f16(x, pad=128, logical=True)[0].index_select(0, slots // TOPK)

    def new(x=x, slots=slots):
        return x_to_f16(x, pad=128, logical=True, rows=slots, top_k=TOPK)[0]

    assert torch.equal(old(), new()), T
    a, b = time_calls([old], reps=30), time_calls([new], reps=30)
    rows.append((T, a["us_graph"], a["us_graph_p10"], a["us_graph_p90"], b["us_graph"], b["us_graph_p10"],
                 b["us_graph_p90"]))
head = "tokens,old_us,old_p10,old_p90,new_us,new_p10,new_p90"
print(head)
for r in rows:
    print(",".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r))
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "gather_cost.csv"), "w") as f:
        f.write(head + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
