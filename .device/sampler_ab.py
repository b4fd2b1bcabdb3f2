"""Does labkit.clocks' nvidia-smi loop disturb what it watches? Since it runs beside every timed point (stop 47),
more 120b 4-32-token points have a p90 8% or more above their p10 (4 of 116 in results/20261127T081004-h100-80gb-
hbm3-moe-tables, 13-21 in the runs after it). This times three short leaders (checked against reference_moe first)
as the sweep does (time_calls, 25 replays) in rounds: without the loop (the sampler replaced by a no-op), with it
sampling every 20 ms, then with it stopped again.

call as: python3 .device/sampler_ab.py [OUT_DIR]   (writes sampler.csv and meta.json)
"""

import contextlib

import pandas as pd
from probe_points import WG8, checked_moe_calls

import labkit.bench as lb
import labkit.clocks as clocks
from labkit.bench_moe import MoEBench
from labkit.runs import probe_run

POINTS = [("gpt-oss-120b", 4, "moe_mma", dict(WG8, ROWS=2, XSKIP=True)),
          ("gpt-oss-120b", 8, "moe_mma", dict(WG8, ROWS=2, ROWS2=1, EPI_EARLY=2)),
          ("gpt-oss-20b", 8, "moe_mma", dict(WG8, ROWS=2, ROWS2=1, EPI_EARLY=2, XSKIP=True))]
ROUNDS = 4


class _Off(contextlib.AbstractContextManager):
    """The sampler's stand-in: no nvidia-smi loop, no columns."""

    def __init__(self, *a, **k):
        self.result = dict.fromkeys(clocks.COLUMNS)

    def __exit__(self, *exc):
        return False


def main():
    run = probe_run("sampler-ab")
    calls_of = []
    bench = None
    for model, t, variant, cfg in POINTS:
        if bench is None or bench.model != model:
            bench = MoEBench(model, baseline=False)
        calls_of.append((f"{model} {t} tokens", *checked_moe_calls(bench, t, variant, cfg)))
    rows = []
    for phase in ("off_before", "on_20ms", "off_after"):
        if phase == "off_before" or phase == "off_after":
            lb.ClockSampler = _Off
            if clocks._Monitor._instance is not None:
                clocks._Monitor._instance.proc.terminate()
                clocks._Monitor._instance.proc.wait()
        else:
            lb.ClockSampler = clocks.ClockSampler
        for rnd in range(ROUNDS):
            for name, err, calls in calls_of:
                r = lb.time_calls(calls, reps=25)
                rows.append({"phase": phase, "round": rnd, "point": name, "max_rel_err": err, **r})
                print(f"{phase:10s} {rnd} {name:24s} {r['us_graph']:7.1f} ({r['us_graph_p10']:.1f}-"
                      f"{r['us_graph_p90']:.1f})", flush=True)
    d = pd.DataFrame(rows)
    d["p90_over_p10"] = d.us_graph_p90 / d.us_graph_p10
    with pd.option_context("display.width", 200):
        print(d.groupby(["point", "phase"], sort=False).agg(median=("us_graph", "median"),
                                                            p90_over_p10_max=("p90_over_p10", "max"),
                                                            p90_over_p10_mean=("p90_over_p10", "mean")).round(3)
              .to_string())
    if run:
        run.finish_with("sampler.csv: per phase (nvidia-smi loop off, on at 20 ms, off again), round and point, the "
                        "sweep's time_calls result", sampler=d)


if __name__ == "__main__":
    main()
