"""How much of a short op's timed replay is the graph's start: the lm_head (307.7 MB, so one call per replay already
touches 6x the L2) is timed one call per replay, the one-token MoE layer four relabeled calls per replay. This times
the leaders (checked first) with the same calls repeated 1-8 times per replay (each call's weights are reused only
after >= 150 MB of other reads, so the L2 still holds none of them) and divides, as time_calls always does: what
a call costs in a stream of calls, like a model's layers, against what one call costs alone.

call as: python3 .device/replay_size.py [OUT_DIR]   (writes replay_size.csv and meta.json)
"""

import pandas as pd
from probe_points import leader_calls

from labkit.bench import time_calls
from labkit.runs import probe_run

REPEATS = (1, 2, 4, 8)


def main():
    run = probe_run("replay-size")
    points = leader_calls(moe_tokens=(1,), lm_head_tokens=(1, 2, 8))
    rows = []
    for rnd in range(2):
        for name, err, calls in points:
            for rep in REPEATS:
                r = time_calls(list(calls) * rep, reps=25)
                rows.append({"point": name, "max_rel_err": err, "round": rnd, "calls_per_replay": len(calls) * rep,
                             **r})
                print(f"{name:28s} round {rnd} {len(calls) * rep:3d} calls/replay: {r['us_graph']:8.1f} us per call "
                      f"({r['us_graph_p10']:.1f}-{r['us_graph_p90']:.1f})", flush=True)
    d = pd.DataFrame(rows)
    with pd.option_context("display.width", 200):
        print(d.pivot_table(index="point", columns=["calls_per_replay", "round"], values="us_graph").round(1)
              .to_string())
    if run:
        run.finish_with("replay_size.csv: per leader point, round and calls per CUDA-graph replay (the point's calls "
                        "repeated), the sweep's time_calls result (us per call)", replay_size=d)


if __name__ == "__main__":
    main()
