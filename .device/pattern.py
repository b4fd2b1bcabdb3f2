"""Access-pattern probe: read bandwidth of the lm_head weight (201088 rows of 1440 B) when each program streams
ROWS rows in steps of CW words per row (the register/ring kernels' pattern: rows 1440 B apart) against the same
bytes stored tile-contiguous (each step of a program one contiguous ROWS * CW * 4-byte block). Prints GB/s
(median of 20 launches, L2 flushed before each) and, given a folder, writes pattern.csv and meta.json there.

call as: python3 .device/pattern.py [$OUT/pattern]
"""
import functools
import sys

import torch
import triton
import triton.language as tl

from labkit.runs import probe_run


@triton.jit
def _probe(w_ptr, out_ptr, KW, STEPS, ROWS: tl.constexpr, CW: tl.constexpr, TILED: tl.constexpr):
    pid = tl.program_id(0)
    r = tl.arange(0, ROWS)
    w = tl.arange(0, CW)
    acc = tl.zeros([ROWS, CW], tl.int32)
    for c in range(0, STEPS):
        if TILED:
            offs = pid.to(tl.int64) * ROWS * KW + c * ROWS * CW + r[:, None] * CW + w[None, :]
        else:
            offs = (pid * ROWS + r).to(tl.int64)[:, None] * KW + c * CW + w[None, :]
        acc ^= tl.load(w_ptr + offs)
    tl.store(out_ptr + pid * ROWS * CW + r[:, None] * CW + w[None, :], acc)


def main():
    N, KW = 201088, 360
    w = torch.randint(-2**31, 2**31 - 1, (N * KW,), device="cuda", dtype=torch.int32)
    flush = torch.empty(256 << 20, device="cuda", dtype=torch.int8)
    run = probe_run("pattern")
    lines = ["rows,bytes_per_row_step,num_stages,num_warps,rowwise_gbps,tiled_gbps"]
    print(f"{'rows':>5} {'bytes/row/step':>15} {'stages':>6} {'warps':>5} {'rowwise GB/s':>13} {'tiled GB/s':>11}")
    for rows, cw, stages, warps in [(128, 16, 1, 4), (128, 16, 3, 4), (128, 32, 1, 4), (128, 32, 3, 4),
                                    (64, 64, 1, 4), (64, 64, 3, 4), (32, 128, 3, 4), (64, 16, 3, 2),
                                    (128, 16, 4, 8), (64, 32, 4, 4)]:
        steps = KW // cw
        progs = N // rows
        out = torch.empty(progs * rows * cw, device="cuda", dtype=torch.int32)
        nbytes = progs * rows * steps * cw * 4
        res = []
        for tiled in (False, True):
            run = functools.partial(_probe[(progs,)], w, out, KW, steps, ROWS=rows, CW=cw, TILED=tiled,
                                    num_stages=stages, num_warps=warps)
            run()
            ts = []
            for _ in range(20):
                flush.zero_()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                run()
                b.record()
                torch.cuda.synchronize()
                ts.append(a.elapsed_time(b))
            ts.sort()
            res.append(nbytes / (ts[len(ts) // 2] * 1e-3) / 1e9)
        print(f"{rows:5d} {cw * 4:15d} {stages:6d} {warps:5d} {res[0]:13.0f} {res[1]:11.0f}", flush=True)
        lines.append(f"{rows},{cw * 4},{stages},{warps},{res[0]:.1f},{res[1]:.1f}")
    if run:
        (run.path / "pattern.csv").write_text("\n".join(lines) + "\n")
        run.update_meta(contents="pattern.csv: read GB/s of the lm_head weight, row-strided vs tile-contiguous steps")
        run.finish()


if __name__ == "__main__":
    sys.exit(main())
