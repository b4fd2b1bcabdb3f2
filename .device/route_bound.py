"""What could folding `route` into the MoE launches gain in the decode step? An upper bound: the decode graph
captured as usual, then with every layer after the first reusing layer 0's Routing, so one route launch per step
instead of one per layer (the ids are then wrong: timing only). Rounds alternate the two captures from the same
cache position and first token after an untimed pass (as .device/decode_flags.py).

call as: python3 .device/route_bound.py OUT_DIR [--model gpt-oss-120b] [--rounds 3]
(writes route_bound.csv and meta.json)
"""

import argparse
import sys

import pandas as pd
from probe_decode import prefilled, timed_capture

from labkit.runs import probe_run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--model", default="gpt-oss-120b")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script (tiny model, eager)")
    args = p.parse_args()
    run = probe_run("route-bound")
    m, cache, first = prefilled(args.model, device=args.device)
    L = m.config.layers
    route, state = m.moe.route, {"calls": 0, "first": None}

    def reuse_first(logits, c):
        if state["calls"] % L == 0:
            state["first"] = route(logits, c)
        state["calls"] += 1
        return state["first"]

    timed_capture(m, cache, first, 512, 64)  # untimed first capture
    rows = []
    for rnd in range(args.rounds):
        for mode in ("per_layer", "layer0_only"):
            m.moe.route = route if mode == "per_layer" else reuse_first
            state["calls"] = 0
            step, _ = timed_capture(m, cache, first, 512, 64)
            rows.append({"round": rnd, "route": mode, **step})
            print(rows[-1], flush=True)
    d = pd.DataFrame(rows)
    print(d.groupby("route").step_us.agg(["median", "min", "max"]).round(1))
    if run:
        run.update_meta(parameters=vars(args))
        run.finish_with("route_bound.csv: per round, the graph decode step (median, p10, p90 us) with a route launch "
                        "per layer, and with every layer reusing layer 0's Routing (one launch a step; wrong ids)",
                        route_bound=d)


if __name__ == "__main__":
    sys.exit(main())
