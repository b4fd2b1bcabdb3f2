"""How much of a short op's timed replay is the graph's start: the lm_head (307.7 MB, so one call per replay already
touches 6x the L2) is timed one call per replay, the one-token MoE layer four relabeled calls per replay. This times
the leaders (checked first) with the same calls repeated 1-8 times per replay (each call's weights are reused only
after >= 150 MB of other reads, so the L2 still holds none of them) and divides, as time_calls always does: what
a call costs in a stream of calls, like a model's layers, against what one call costs alone.

call as: python3 .device/replay_size.py [OUT_DIR]   (writes replay_size.csv and meta.json)
"""

import contextlib

from probe_points import leader_calls, timed_arms

from labkit.runs import probe_run

REPEATS = (1, 2, 4, 8)


def main():
    run = probe_run("replay-size")
    points = leader_calls(moe_tokens=(1,), lm_head_tokens=(1, 2, 8))
    d = timed_arms(points, {rep: lambda name, calls, rep=rep: contextlib.nullcontext(list(calls) * rep)
                            for rep in REPEATS}, "repeats")
    d["calls_per_replay"] = d["repeats"] * d["point"].map({name: len(calls) for name, _, calls in points})
    if run:
        run.finish_with("replay_size.csv: per leader point, round and calls per CUDA-graph replay (the point's calls "
                        "repeated), the sweep's time_calls result (us per call)", replay_size=d)


if __name__ == "__main__":
    main()
