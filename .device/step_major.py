"""Does the order the lm_head's weight bytes lie in cost read rate? A plain-read probe of gemv_mma's pattern.

call as: python3 .device/step_major.py [OUT_DIR]   (writes step_major.csv and meta.json)

gemv_mma's TMA ring reads, per program (128 rows = 8 groups of 16) and K step, one 1 KB block of each group:
in tile_mxfp4's layout a group's chunks are contiguous, so a step's 8 KB lie in 8 pieces 23 KB apart and the
programs running together read 184 KB apart. A step-major layout ([chunk][group][1 KB]) would make a step's 8 KB
one piece and neighbouring programs' pieces neighbours. Each reader below reads the lm_head's 308 MB of words
once, 1571 programs x 23 steps x 8 KB, summing (labkit.readfloor's timing: graph replays over rotated copies):
  tiled      program p, step c: 8 pieces of 1 KB at p * 184 KB + g * 23 KB + c * 1 KB (tile_mxfp4's order)
  step-major program p, step c: 8 KB at c * (1571 * 8 KB) + p * 8 KB
  tile       readfloor.read_call (16 KB tiles in address order), the reference
with the step loop pipelined num_stages deep (cp.async ring in shared memory, as the GEMV's ring)."""
import sys

import pandas as pd
import torch
import triton
import triton.language as tl

from labkit.bench import time_calls
from labkit.readfloor import read_call
from labkit.runs import probe_run

N, K = 201088, 2880
GROUPS = 8            # 16-row groups per program (128 rows)
STEPS = 23            # 128-K chunks (K = 2880 rounded up)
BLOCK_W = 256         # int32 words per group and chunk (1 KB)
PROGRAMS = triton.cdiv(N, 16 * GROUPS)


@triton.jit
def _steps_sum(x_ptr, out_ptr, STEPS: tl.constexpr, GROUPS: tl.constexpr, BLOCK_W: tl.constexpr,
               STEP_MAJOR: tl.constexpr, STAGES: tl.constexpr):
    p = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, GROUPS)[:, None]
    w = tl.arange(0, BLOCK_W)[None, :]
    acc = tl.zeros([GROUPS, BLOCK_W], tl.int32)
    for c in tl.range(0, STEPS, num_stages=STAGES):
        if STEP_MAJOR:
            offs = (c * tl.num_programs(0) + p) * (GROUPS * BLOCK_W) + g * BLOCK_W + w
        else:
            offs = p * (GROUPS * STEPS * BLOCK_W) + g * (STEPS * BLOCK_W) + c * BLOCK_W + w
        acc += tl.load(x_ptr + offs)
    tl.store(out_ptr + p, tl.sum(tl.sum(acc, axis=1), axis=0))


def main():
    run = probe_run("step-major")
    words = PROGRAMS * GROUPS * STEPS * BLOCK_W
    copies = [torch.randint(0, 1 << 20, (words,), device="cuda", dtype=torch.int32) for _ in range(2)]
    out = torch.empty(PROGRAMS, device="cuda", dtype=torch.int32)
    rows = []
    for rnd in range(3):
        t = time_calls([read_call(x) for x in copies], reps=40)
        rows.append({"round": rnd, "reader": "tile 16 KB", "stages": None, "warps": 8, "us": t["us_graph"],
                     "p10": t["us_graph_p10"], "p90": t["us_graph_p90"]})
        for step_major in (False, True):
            for stages in (2, 3, 4):
                for warps in (4, 8):
                    calls = [lambda x=x, sm=step_major, s=stages, nw=warps: _steps_sum[(PROGRAMS,)](
                        x, out, STEPS, GROUPS, BLOCK_W, sm, s, num_warps=nw) for x in copies]
                    t = time_calls(calls, reps=40)
                    # every word read once: the programs' int32 sums add up to the buffer's (both mod 2^32)
                    total = (out.to(torch.int64).sum() - copies[-1].to(torch.int64).sum()).item()
                    assert total % 2**32 == 0, (step_major, stages, warps)
                    rows.append({"round": rnd, "reader": "step-major" if step_major else "tiled", "stages": stages,
                                 "warps": warps, "us": t["us_graph"], "p10": t["us_graph_p10"],
                                 "p90": t["us_graph_p90"]})
                    print(f"round {rnd} {rows[-1]['reader']:10s} stages {stages} nw {warps}: {t['us_graph']:7.1f} us",
                          flush=True)
    df = pd.DataFrame(rows)
    df["gbps"] = words * 4 / df["us"] / 1e3
    print(df.groupby(["reader", "stages", "warps"], dropna=False)["us"].agg(["min", "median", "max"]).round(1)
          .to_string())
    if run:
        run.finish_with("step_major.csv: us and GB/s of reading the lm_head's 308 MB of words once in gemv_mma's "
                        "per-program step pattern, in tile_mxfp4's order and step-major, against 16 KB tiles in "
                        "address order; three rounds", step_major=df)


if __name__ == "__main__":
    sys.exit(main())
