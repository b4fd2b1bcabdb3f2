"""What a layer without x_to_f16's launch could gain, honestly: the 20b decode leaders timed as the sweeps time
them ("full"), with x_to_f16's result made once before capture and mlp1 still PDL-launched behind the layer
before ("no x16, pdl": stop 57's cut, which lets mlp1's routing reads and first weight copies overlap the previous
layer's mlp2, an overlap one call of the op never gets), and with mlp1 launched without PDL as the op's first
kernel would be ("no x16, first"): the bound on folding the conversion into mlp1. The cut arms skip zeroing the
ATOMIC output, so their outputs are not the op's and only times are written.

call as: python3 .device/x_fuse_bound.py OUT_DIR   (writes x_fuse_bound.csv into a probe run folder)
"""

import contextlib

from launch_parts import cached_x_to_f16
from moe_parts import no_x16, plain
from probe_points import checked_moe_calls, timed_arms

from kernels import moe_mma
from labkit.bench_moe import MoEBench
from labkit.runs import probe_run

LEAD = dict(ATOMIC=True, BLOCK_M=8, CHAIN=True, CHUNKS=1, EPI_EARLY=2, MAXNREG=128, MAXNREG2=80, NIB=True,
            PERSIST1=4, RING_W=True, ROWS=2, ROWS2=1, SPLITK2=2, STAGES=4, STEP_MAJOR=True, TAIL=True, TILED=True,
            WAIT_LATE=2, WGMMA=True, num_warps=4)
LEAD64 = dict(ATOMIC=True, BLOCK_M=16, CHAIN=True, CHUNKS=1, EPI_EARLY=1, HALF=True, NIB=True, RING_W=True, ROWS=2,
              SPLITK2=2, STAGES=4, STEP_MAJOR=True, TILED=True, WGMMA=True, num_warps=4)


@contextlib.contextmanager
def no_x16_first(name, calls):
    """mlp1 launched as the op's first kernel: no PDL, so nothing of it starts before the layer before ends."""
    real = moe_mma._launch

    def launch(phase, *a, **kw):
        if phase != 1:
            return real(phase, *a, **kw)
        saved = moe_mma.pdl_launch
        moe_mma.pdl_launch = lambda inner=False: {}
        try:
            return real(phase, *a, **kw)
        finally:
            moe_mma.pdl_launch = saved

    moe_mma._launch = launch
    try:
        with cached_x_to_f16():
            yield calls
    finally:
        moe_mma._launch = real


def main():
    run = probe_run("x-fuse-bound")
    mb = MoEBench("gpt-oss-20b", baseline=False)
    points = [(f"20b T={t} moe_mma", *checked_moe_calls(mb, t, "moe_mma", LEAD64 if t == 64 else LEAD))
              for t in (8, 16, 32, 64)]
    arms = {"full": plain, "no x16, pdl": no_x16, "no x16, first": no_x16_first}
    timed_arms(points, arms, "arm", rounds=3, reps=40, store=(
        run, "x_fuse_bound", "x_fuse_bound.csv: per 20b point and round, the leader's time_calls result (us per "
        "call) full, with x_to_f16 cut and mlp1 PDL-launched, and with it cut and mlp1 launched first (no PDL)"))


if __name__ == "__main__":
    main()
