"""Read rate of long programs against where their steps lie: does a weight layout in which the programs running
together read neighbouring memory stream faster than one in which each program reads its own region?

The MoE kernels at 16-256 tokens stream at 2.45-2.8 TB/s per launch (results/20261124T092214-h100-80gb-hbm3-moe-
marginal), short one-block programs at 3.08 (results/20261123T165831-h100-80gb-hbm3-stream-size). Each program
here (a persistent grid of 2, 3 or 8 programs per SM, each taking every G-th tile; moe_mma runs 2-3 per SM)
reads a tile's S steps of one 8 KB block (a moe_mma step: 128 weight rows x 64 bytes) through a cp.async ring
and xors them; the blocks of tile p, step c lie at:
- program: (p * S + c) * 8 KB                      (each tile's steps one contiguous run)
- groups16: p * S * 8 KB + g * S * 1 KB + c * 1 KB  (tile_mxfp4: 8 runs of 16 rows, 1 KB per step each)
- chunk:   (c * P + p) * 8 KB                      (step c of all tiles together: neighbours read neighbours)
- flat:    one program per block (the short-program reference).
Then, tile-contiguous with 4 slots and 32 warps (at most 2 programs per SM): persistent against one tile per
program (moe_mma's grid: each program's ring filled anew after a CTA launch), each with and without an
epilogue of 500 dependent multiply-adds per tile before the next tile's first copies.
Every figure is the lab's method (labkit.bench.time_calls: CUDA-graph replays over rotating copies, >= 4x the
L2 per replay, median per call).

call as: python3 .device/layout_stream.py [$OUT/layout-stream]
"""
import sys

import torch
import triton
import triton.language as tl

from labkit.bench import time_calls
from labkit.runs import probe_run

L2 = 50 << 20
B = 2048  # int32 words per block: 8 KB
LAYOUTS = {"program": 0, "groups16": 1, "chunk": 2}


@triton.jit
def _long(w_ptr, out_ptr, S, P, B: tl.constexpr, LAYOUT: tl.constexpr, STAGES: tl.constexpr, EPI: tl.constexpr = 0):
    """G programs (the grid) take tiles q, q + G, ... of P; a tile is S steps of one B-word block each (a ring of
    STAGES - 1 blocks in flight: Triton's cp.async pipeline). 32-bit offsets: P * S * B < 2^31 here."""
    o = tl.arange(0, B)
    acc = tl.zeros([B], tl.int32)
    for p in range(tl.program_id(0), P, tl.num_programs(0)):
        for c in tl.range(0, S, num_stages=STAGES):
            if LAYOUT == 0:
                offs = (p * S + c) * B + o
            elif LAYOUT == 1:  # 8 groups of 16 rows: group g's 256 words of step c
                offs = p * S * B + (o // 256) * (S * 256) + c * 256 + o % 256
            else:
                offs = (c * P + p) * B + o
            acc ^= tl.load(w_ptr + offs)
        if EPI:  # a tile's epilogue: EPI dependent multiply-adds per element before the next tile's copies
            f = acc.to(tl.float32)
            for _ in range(EPI):
                f = f * 1.0001 + 1.0
            acc ^= f.to(tl.int32)
    tl.store(out_ptr + tl.program_id(0) * B + o, acc)


@triton.jit
def _flat(w_ptr, out_ptr, B: tl.constexpr):
    pid = tl.program_id(0)
    o = tl.arange(0, B)
    v = tl.load(w_ptr + pid.to(tl.int64) * B + o)
    tl.store(out_ptr + pid, tl.xor_sum(v, axis=0))


def main():
    run = probe_run("layout-stream")
    rows = []
    out = torch.empty(1 << 26, device="cuda", dtype=torch.int32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (name, programs, steps): 120b mlp1 at 16 / 256 tokens (49 / 128 experts x 45 row tiles of 128 x 2880), mlp2
    for name, P, S in (("mlp1 T=16", 49 * 45, 23), ("mlp2 T=16", 49 * 23, 23), ("mlp1 T=256", 128 * 45, 23)):
        nbytes = P * S * B * 4
        bufs = [torch.randint(-2**31, 2**31 - 1, (P * S * B,), device="cuda", dtype=torch.int32)
                for _ in range(max(2, -(-4 * L2 // nbytes)))]
        for lay, code in LAYOUTS.items():
            for stages, per_sm in ((3, 2), (4, 2), (3, 3), (3, 8)):
                g = per_sm * sms
                r = time_calls([lambda w=w, P=P, S=S, code=code, stages=stages, g=g: _long[(g,)](
                    w, out, S, P, B=B, LAYOUT=code, STAGES=stages, num_warps=4) for w in bufs], reps=20)
                rows.append((name, lay, stages, per_sm, nbytes, r["us_graph"]))
                print(f"{name:10s} {lay:9s} stages {stages} programs/SM {per_sm}  {r['us_graph']:8.1f} us "
                      f"{nbytes / r['us_graph'] / 1e3:6.0f} GB/s", flush=True)
        for per_sm, epi in ((2, 0), (2, 500), (0, 0), (0, 500)):  # 32 warps: at most 2 programs per SM
            g = per_sm * sms if per_sm else P  # 0: one tile per program, as moe_mma's grid
            r = time_calls([lambda w=w, P=P, S=S, g=g, epi=epi: _long[(g,)](
                w, out, S, P, B=B, LAYOUT=0, STAGES=4, EPI=epi, num_warps=32) for w in bufs], reps=20)
            lay = f"program {'persistent' if per_sm else 'per tile'} epi {epi}"
            rows.append((name, lay, 4, 2, nbytes, r["us_graph"]))
            print(f"{name:10s} {lay:30s} 32 warps  {r['us_graph']:8.1f} us {nbytes / r['us_graph'] / 1e3:6.0f} GB/s",
                  flush=True)
        r = time_calls([lambda w=w, n=P * S: _flat[(n,)](w, out, B=B, num_warps=4) for w in bufs], reps=20)
        rows.append((name, "flat", 1, 0, nbytes, r["us_graph"]))
        print(f"{name:10s} flat                      {r['us_graph']:8.1f} us {nbytes / r['us_graph'] / 1e3:6.0f} GB/s",
              flush=True)
        del bufs
    if run:
        lines = ["size,layout,stages,programs_per_sm,bytes,us,gbps"]
        lines += [f"{a},{b},{c},{d},{e},{f:.2f},{e / f / 1e3:.1f}" for a, b, c, d, e, f in rows]
        (run.path / "layout_stream.csv").write_text("\n".join(lines) + "\n")
        run.update_meta(contents="layout_stream.csv: read rate of long programs (S steps of 8 KB) by where their "
                                 "steps lie (program-major, tile_mxfp4's 16-row groups, chunk-major across programs) "
                                 "and of one-block programs (lab timing method)")
        run.finish()


if __name__ == "__main__":
    sys.exit(main())
