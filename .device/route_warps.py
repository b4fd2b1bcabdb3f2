"""route's one-program form (kernels.routing._route_fused) at 1, 2, 4 and 8 warps for 1-32 tokens of E = 128
and 32 (k = 4): each checked bit for bit against the token-block form first, then timed as the route sweeps
time it (labkit.bench.time_calls: CUDA-graph replays). A probe for fused_route_warps; it writes no points.

call as: python3 .device/route_warps.py [OUT_DIR [--experts E ...] [--tokens T ...] [--warps W ...]]
(writes route_warps.csv, row by row, and meta.json). Each (tokens bucket, E, warps) compiles once: ~10 s a
config on a fresh machine.
"""

import argparse
import sys

import pandas as pd
import torch

from kernels.routing import _route_fused, route
from labkit.bench import time_calls
from labkit.runs import probe_run

FIELDS = ("ids", "weights", "counts", "offsets", "sorted", "inverse")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--experts", type=int, nargs="+", default=[128, 32])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    args = p.parse_args(sys.argv[2:])
    run = probe_run("route-warps")
    rows = []
    for E in args.experts:
        for T in args.tokens:
            lg = torch.randn(T, E, generator=torch.Generator(device="cuda").manual_seed(T + E), device="cuda")
            ref = route(lg, 4, form="blocks")
            for nw in args.warps:
                r = _route_fused(lg, 4, num_warps=nw)
                ok = all(torch.equal(getattr(r, f), getattr(ref, f)) for f in FIELDS)
                t = time_calls([lambda lg=lg, nw=nw: _route_fused(lg, 4, num_warps=nw)], reps=20) if ok else {}
                rows.append({"experts": E, "tokens": T, "num_warps": nw, "ok": ok, "us_graph": t.get("us_graph"),
                             "us_graph_p10": t.get("us_graph_p10"), "us_graph_p90": t.get("us_graph_p90")})
                print(rows[-1], flush=True)
                if run:  # row by row: a killed probe keeps what it measured
                    pd.DataFrame(rows).to_csv(run.path / "route_warps.csv", index=False)
    d = pd.DataFrame(rows)
    print(d.pivot_table(index=["experts", "tokens"], columns="num_warps", values="us_graph").round(2).to_string())
    if run:
        run.finish_with("route_warps.csv: per E, tokens and num_warps, whether the one-program route matched the "
                        "token-block form bit for bit and its time_calls result (us per call)", route_warps=d)


if __name__ == "__main__":
    main()
