"""Where the 20b decode MoE leaders' microseconds go, beyond their main kernels' streaming: (1) the leaders timed
as the sweeps time them, then with x_to_f16 taken out of the replay (its result made once before capture; with
ATOMIC the layer output is then not zeroed, so those outputs are not the op's and no points are written); (2) the
16/32-token leaders on layers of H = I = 2816 / 2880 / 2944 (22, 22.5, 23 chunks of 128), checked first, to price
the zero-padded half chunk that K = 2880 leaves in every program's last step (the cp.async rings skip reading
its padding; the step's decode and wgmma work stays whole).

call as: python3 .device/moe_parts.py [OUT_DIR]   (writes moe_parts.csv and meta.json into a probe run folder)
"""

import contextlib

from launch_parts import cached_x_to_f16
from probe_points import checked_moe_calls, timed_arms

from labkit import bench_moe
from labkit.bench_moe import MoEBench
from labkit.runs import probe_run

LEAD16 = dict(ATOMIC=True, BLOCK_M=8, CHAIN=True, CHUNKS=1, EPI_EARLY=2, MAXNREG=128, NIB=True, PERSIST1=4,
              RING_W=True, ROWS=2, ROWS2=1, SPLITK2=2, STAGES=4, STEP_MAJOR=True, TILED=True, WAIT_LATE=2,
              WGMMA=True, num_warps=4)
LEAD32 = dict(LEAD16, MAXNREG2=80)
H2G = dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=4, BLOCK_N2=4, EARLY=2, NIB=True, PREFETCH=True, num_stages=1,
           num_warps=1)
LEADERS = {1: ("moe_h2g", H2G), 2: ("moe_h2g", dict(H2G, MAXNREG=64)), 16: ("moe_mma", LEAD16),
           32: ("moe_mma", LEAD32)}


@contextlib.contextmanager
def plain(name, calls):
    yield calls


@contextlib.contextmanager
def no_x16(name, calls):
    if "H=" in name and "H=2880" not in name:
        yield None
        return
    with cached_x_to_f16():
        yield calls


def main():
    run = probe_run("moe-parts")
    points = []
    for h in (2880, 2816, 2944):
        model = "gpt-oss-20b" if h == 2880 else f"k{h}"
        bench_moe.MODELS.setdefault(model, (32, 4, h, h))
        mb = MoEBench(model, baseline=False)
        for t in ((1, 2, 16, 32) if h == 2880 else (16, 32)):
            variant, cfg = LEADERS[t]
            err, calls = checked_moe_calls(mb, t, variant, cfg)
            gb = mb.expert_bytes()
            points.append((f"20b H={h} T={t} {variant}", err, calls))
            print(f"H={h} T={t}: expert bytes {gb / 1e6:.3f} MB, rel err {err:.3g}", flush=True)
    timed_arms(points, {"full": plain, "no x_to_f16": no_x16}, "cut", reps=40, store=(
        run, "moe_parts", "moe_parts.csv: per point (20b-shaped layers of H = I = 2816 / 2880 / 2944, the leaders "
        "of 1-32 tokens), round and cut (full call; x_to_f16 made once before capture, the ATOMIC output left "
        "unzeroed) the sweep's time_calls result (us per call)"))


if __name__ == "__main__":
    main()
