"""What the small launches around a leader's main kernels cost it: the lm_head and 120b MoE leaders (checked
first) timed as the sweeps time them, then with x's fp16 conversion (x_to_f16) taken out of the replay (its
result made once, before capture, and handed back to every call) and, for the MoE, with the combine launch
taken out too. A probe of where the fixed microseconds of a short op go; the outputs of the cut-down calls are
not the op's (no combine), so it writes no points.

call as: python3 .device/launch_parts.py [OUT_DIR]   (writes launch_parts.csv and meta.json)
"""

import contextlib

import pandas as pd
from probe_points import leader_calls

import kernels.linear_f16 as linear_f16
import kernels.linear_mma as linear_mma
import kernels.moe as moe
import kernels.moe_mma as moe_mma
from labkit.bench import time_calls
from labkit.runs import probe_run

_MODULES = (linear_f16, linear_mma, moe, moe_mma)


@contextlib.contextmanager
def cached_x_to_f16():
    """x_to_f16 returns the result it made for the same input and arguments before (no launch when replayed)."""
    real = linear_f16.x_to_f16
    memo = {}

    def cached(x, *args, **kw):
        rows = kw.get("rows")
        key = (x.data_ptr(), tuple(x.shape), args, tuple(sorted((k, v) for k, v in kw.items() if k != "rows")),
               None if rows is None else rows.data_ptr())
        if key not in memo:
            memo[key] = real(x, *args, **kw)
        return memo[key]

    saved = [m.x_to_f16 for m in _MODULES]
    for m in _MODULES:
        m.x_to_f16 = cached
    try:
        yield
    finally:
        for m, f in zip(_MODULES, saved):
            m.x_to_f16 = f


@contextlib.contextmanager
def no_combine():
    """MoESlots.combine returns the slot rows instead of launching the combine."""
    real = moe.MoESlots.combine
    moe.MoESlots.combine = lambda self: self.rows
    try:
        yield
    finally:
        moe.MoESlots.combine = real


CUTS = {"full": (), "no x_to_f16": (cached_x_to_f16,), "no combine": (no_combine,),
        "neither": (cached_x_to_f16, no_combine)}


def main():
    run = probe_run("launch-parts")
    points = leader_calls(moe_tokens=(1, 8, 16), lm_head_tokens=(1, 2, 8))
    rows = []
    for rnd in range(2):
        for name, err, calls in points:
            for cut, managers in CUTS.items():
                if "combine" in cut and not name.startswith("moe"):
                    continue
                with contextlib.ExitStack() as stack:
                    for m in managers:
                        stack.enter_context(m())
                    r = time_calls(calls, reps=40)
                rows.append({"point": name, "max_rel_err": err, "round": rnd, "cut": cut, **r})
                print(f"{name:28s} round {rnd} {cut:12s}: {r['us_graph']:8.2f} us "
                      f"({r['us_graph_p10']:.2f}-{r['us_graph_p90']:.2f})", flush=True)
    d = pd.DataFrame(rows)
    with pd.option_context("display.width", 200):
        print(d.pivot_table(index="point", columns=["cut", "round"], values="us_graph").round(2).to_string())
    if run:
        run.finish_with("launch_parts.csv: per leader point, round and cut (full call; x_to_f16 made once before "
                        "capture; combine not launched; neither) the sweep's time_calls result (us per call)",
                        launch_parts=d)


if __name__ == "__main__":
    main()
