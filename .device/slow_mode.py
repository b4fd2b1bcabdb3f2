"""Where the gpt-oss-120b tiled slow mode comes from: at 4-32 tokens, configs reading tile_mxfp4's copies time in
two modes (120b at 16 tokens: p10 236 us, median 273 for one config of results/20261127T105459-h100-80gb-hbm3-moe-
regret-uniform), and in the sweeps' database nearly every bimodal 120b point is a TILED config (107 of 516 moe_mma
points at 16 tokens against 0 of 134 row-major ones); 20b's tiled configs almost never are. The slow mode is a state
that lasts several replays (...20261127T114158-...-clock-probe, 120b 32 tokens: runs of 376 us among 397-400).

For each config this times, on the bench's cached tiled copies and then on copies made again (after a settle and
after a 4 GiB alloc-and-free churn): the sweep's own time_calls twice, single replays back to back, and single
replays after a 3 ms host sleep each. Every config is first checked against reference_moe, as the sweep does.

call as: python3 .device/slow_mode.py [OUT_DIR]   (writes replays.csv, summary.csv and meta.json)
"""

import time

import pandas as pd
import torch
from probe_points import WG8, check_moe_point, moe_case

from kernels.prepare import prepare_mxfp4
from labkit.bench import capture_graph, settle_allocator, time_calls
from labkit.bench_moe import MoEBench
from labkit.hardware import event_ms
from labkit.runs import probe_run

MODEL = "gpt-oss-120b"
CONFIGS = {
    "tiled_epi2": ("moe_mma", dict(WG8, ROWS=2, ROWS2=1, EPI_EARLY=2)),
    "tiled_rows1": ("moe_mma", dict(WG8, ROWS=1, EPI_EARLY=1, XSKIP=True)),
    "rows_h2g": ("moe_h2g", dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=16, NIB=True, num_warps=4)),
}
POINTS = (16, 32)
SEQ = 100
GAPPED = 60


def drop_copies(bench):
    """Forget the tiled and shuffled copies cached on the bench's weights, so the next call makes them again."""
    for w in (bench.w1, bench.w2):
        p = prepare_mxfp4(w)
        for q in (p, getattr(p, "_tiled", None), getattr(p, "_tiled_deinterleaved", None)):
            if q is not None and hasattr(q, "_shuffled"):
                object.__delattr__(q, "_shuffled")
        for attr in ("_tiled", "_tiled_deinterleaved", "_shuffled"):
            if hasattr(p, attr):
                object.__delattr__(p, attr)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def churn(gib):
    x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    del x
    torch.cuda.synchronize()


def main():
    run = probe_run("slow-mode")
    bench = MoEBench(MODEL, baseline=False)
    rows, summary = [], []
    for state in ("cached", "remade", "churned"):
        if state == "remade":
            drop_copies(bench)
            settle_allocator()
        if state == "churned":
            drop_copies(bench)
            churn(4)
        for tokens in POINTS:
            for name, (variant, cfg) in CONFIGS.items():
                case, sample = moe_case(bench, tokens, variant, cfg)
                err = None
                if state == "cached":
                    err = check_moe_point(bench, case, sample)
                    settle_allocator()  # as measure_moe does before building the point's calls
                calls, _ = bench.calls(case, sample)
                sweep = [time_calls(calls, reps=20) for _ in range(2)]
                graph = capture_graph(calls)
                for cond, n, gap in (("back_to_back", SEQ, 0.0), ("gap_3ms", GAPPED, 3e-3)):
                    for i in range(n):
                        if gap:
                            time.sleep(gap)
                        us = event_ms(graph.replay) * 1e3 / len(calls)
                        rows.append({"state": state, "tokens": tokens, "config": name, "cond": cond, "i": i,
                                     "us": us})
                del graph
                w = prepare_mxfp4(bench.w1)
                tw = getattr(w, "_tiled_deinterleaved", None)
                seq = pd.Series([r["us"] for r in rows if (r["state"], r["tokens"], r["config"]) ==
                                 (state, tokens, name)])
                summary.append({"state": state, "tokens": tokens, "config": name, "max_rel_err": err,
                                "sweep_med": [round(s["us_graph"], 1) for s in sweep],
                                "sweep_p10": [round(s["us_graph_p10"], 1) for s in sweep],
                                "seq_min": round(seq.min(), 1), "seq_med": round(seq.median(), 1),
                                "slow_share": round(float((seq > 1.05 * seq.min()).mean()), 2),
                                "w1_tiled_ptr": hex(tw.words.data_ptr()) if tw is not None else None})
                print(summary[-1], flush=True)
    rep = pd.DataFrame(rows)
    agg = rep.groupby(["state", "tokens", "config", "cond"]).us.agg(
        ["min", "median", lambda u: float((u > 1.05 * u.min()).mean())]).round(2)
    with pd.option_context("display.width", 200):
        print(agg.to_string())
    if run:
        run.finish_with("replays.csv: single CUDA-graph replays (us per layer call) per weight state, point, config "
                        "and condition; summary.csv: per state, point and config the sweep's own time_calls twice "
                        "and the replay sequence's min, median and share above 1.05x min", replays=rep,
                        summary=pd.DataFrame(summary))


if __name__ == "__main__":
    main()
