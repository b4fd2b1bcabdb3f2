"""What moe_mma TMA=2's expert-sorted x costs: x_to_f16 then index_select (stop 44's three launches) against
x_to_f16(rows=...) (one launch), per token count, CUDA-graph replays timed by labkit.bench.time_calls; checks the
two agree bit for bit first. Prints a table; with OUT_DIR writes gather_cost.csv and meta.json there. (Its first
run, at fa9a997, wrote the CSV alone; it is kept in results/20261127T055505-h100-80gb-hbm3-moe-mma-tma2-gather,
the sweep of the same device call.)

call as: python3 .device/gather_cost.py [OUT_DIR]"""
import torch

from kernels.linear_f16 import x_to_f16
from labkit.bench import time_calls
from labkit.runs import probe_run

H, TOPK = 2880, 4
run = probe_run("gather-cost")
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
if run:
    (run.path / "gather_cost.csv").write_text(head + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    run.update_meta(contents="gather_cost.csv: CUDA-graph us of x_to_f16 + index_select against x_to_f16(rows=...)")
    run.finish()
