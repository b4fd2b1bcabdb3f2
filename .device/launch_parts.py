"""What the small launches around a leader's main kernels cost it: the lm_head and 120b MoE leaders (checked
first) timed as the sweeps time them, then with x's fp16 conversion (x_to_f16) taken out of the replay (its
result made once, before capture, and handed back to every call) and, for the MoE, with the combine launch
taken out too. A probe of where the fixed microseconds of a short op go; the outputs of the cut-down calls are
not the op's (no combine), so it writes no points.

call as: python3 .device/launch_parts.py [OUT_DIR]   (writes launch_parts.csv and meta.json)
"""

import contextlib

from probe_points import leader_calls, timed_arms

import kernels.linear_f16 as linear_f16
import kernels.linear_mma as linear_mma
import kernels.moe as moe
import kernels.moe_mma as moe_mma
from labkit.runs import probe_run

_MODULES = (linear_f16, linear_mma, moe, moe_mma)


@contextlib.contextmanager
def cached_x_to_f16():
    """x_to_f16 returns the result it made for the same input and arguments before (no launch when replayed); a
    `zero` output (moe_mma ATOMIC's) is left as it is, not zeroed."""
    real = linear_f16.x_to_f16
    memo = {}

    def cached(x, *args, **kw):
        kw.pop("zero", None)
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


@contextlib.contextmanager
def cut_down(managers, name, calls):
    """The calls, timed with `managers` entered (None for a cut that takes out the combine of a non-MoE point)."""
    if any(m is no_combine for m in managers) and not name.startswith("moe"):
        yield None
        return
    with contextlib.ExitStack() as stack:
        for m in managers:
            stack.enter_context(m())
        yield calls


def main():
    run = probe_run("launch-parts")
    points = leader_calls(moe_tokens=(1, 8, 16), lm_head_tokens=(1, 2, 8))
    d = timed_arms(points, {cut: lambda name, calls, m=managers: cut_down(m, name, calls)
                            for cut, managers in CUTS.items()}, "cut", reps=40)
    if run:
        run.finish_with("launch_parts.csv: per leader point, round and cut (full call; x_to_f16 made once before "
                        "capture; combine not launched; neither) the sweep's time_calls result (us per call)",
                        launch_parts=d)


if __name__ == "__main__":
    main()
