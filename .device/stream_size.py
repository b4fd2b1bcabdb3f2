"""Streaming rate against the bytes one launch reads: what a MoE decode layer (two weight launches of 17.6 and
35.2 MB at one token of gpt-oss-120b, 70.5 and 141 MB at four) could reach if each launch streamed like the
best Triton read schedules or like gemv_h2g on a dense weight of the same bytes.

Every figure is the lab's method (labkit.bench.time_calls): CUDA-graph replays over rotating copies (>= 4x the
L2 per replay), median per call. Schedules (each program xors what it reads and stores one tile):
- flat B: one program per block of B int32 words;
- stride B G: a persistent grid of G programs per SM, program p reads blocks p, p + G, ...;
- gemv_h2g: the lab's M = 1 GEMV (the lm_head's best config) on a dense [rows, 2880] MXFP4 weight, one program
  per 16-row tile or (PERSIST=P) P programs per SM striding over the tiles, row-major or TILED (each tile's
  16 rows one contiguous run);
- pair: mlp1's then mlp2's bytes as two strided launches in a row (the two weight launches of moe_h2g), against
  one strided launch over both (what a single launch could get).

call as: python3 .device/stream_size.py [$OUT/stream-size]
"""
import sys

import torch
import triton
import triton.language as tl

import kernels as K
from labkit.bench import time_calls
from labkit.runs import probe_run

L2 = 50 << 20
ROW = 2880 // 2 + 2880 // 32  # bytes per weight row: codes and scales
SIZES = {"mlp2 T=1": 4 * 2880, "mlp1 T=1": 4 * 5760, "layer T=1": 4 * 8640, "mlp2 T=4": 16 * 2880,
         "mlp1 T=4": 16 * 5760, "layer T=4": 16 * 8640, "lm_head": 201088}  # weight rows of K = 2880


@triton.jit
def _flat(w_ptr, out_ptr, B: tl.constexpr):
    pid = tl.program_id(0)
    o = tl.arange(0, B)
    v = tl.load(w_ptr + pid.to(tl.int64) * B + o)
    tl.store(out_ptr + pid, tl.xor_sum(v, axis=0))  # 4 bytes written per block read


@triton.jit
def _stride(w_ptr, out_ptr, NB, B: tl.constexpr):
    pid = tl.program_id(0)
    o = tl.arange(0, B)
    acc = tl.zeros([B], tl.int32)
    for blk in range(pid, NB, tl.num_programs(0)):
        acc ^= tl.load(w_ptr + blk.to(tl.int64) * B + o)
    tl.store(out_ptr + pid * B + o, acc)


def copies_for(nbytes):
    return max(2, -(-4 * L2 // nbytes))


def main():
    run = probe_run("stream-size")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(4096 * 4096, device="cuda", dtype=torch.int32)
    rows = []

    def rec(name, size, params, nbytes, calls):
        r = time_calls(calls, reps=30)
        us = r["us_graph"]
        rows.append((name, size, params, nbytes, us, nbytes / us / 1e3))
        print(f"{name:9s} {size:10s} {params:18s} {nbytes / 1e6:7.1f} MB {us:8.1f} us {nbytes / us / 1e3:6.0f} GB/s",
              flush=True)

    for size, n_rows in SIZES.items():
        words = n_rows * ROW // 4 // 4096 * 4096
        bufs = [torch.randint(-2**31, 2**31 - 1, (words,), device="cuda", dtype=torch.int32)
                for _ in range(copies_for(words * 4))]
        for b in (2048, 4096):
            rec("flat", size, f"B={b}", words * 4,
                [lambda w=w, n=words // b, b=b: _flat[(n,)](w, out, B=b, num_warps=4) for w in bufs])
        for b, g in ((2048, 4), (4096, 2)):
            rec("stride", size, f"B={b} G={g}xSM", words * 4,
                [lambda w=w, n=words // b, b=b, g=g: _stride[(g * sms,)](w, out, n, B=b, num_warps=4)
                 for w in bufs])
        del bufs
        ws = [K.prepare_mxfp4(K.quantize_mxfp4(torch.randn(n_rows, 2880, device="cuda") * 0.05))
              for _ in range(copies_for(n_rows * ROW))]
        x = torch.randn(1, 2880, device="cuda").to(torch.bfloat16)
        cfg = {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 1024, "num_warps": 4, "PREFETCH": True}
        for persist, tiled in ((0, False), (4, False), (0, True), (4, True)):
            c = {**cfg, "PERSIST": persist, "TILED": tiled}
            rec("gemv_h2g", size, f"P={persist}{' TILED' if tiled else ''}", n_rows * ROW,
                [lambda w=w, x=x, c=c: K.mxfp4_linear(x, w, variant="gemv_h2g", **c) for w in ws])
        del ws
    for t in (1, 4):  # moe_h2g's two weight launches as two flat launches, against one launch over both
        w1 = 4 * t * 5760 * ROW // 4 // 2048 * 2048
        w2 = 4 * t * 2880 * ROW // 4 // 2048 * 2048
        bufs = [(torch.randint(-2**31, 2**31 - 1, (w1,), device="cuda", dtype=torch.int32),
                 torch.randint(-2**31, 2**31 - 1, (w2,), device="cuda", dtype=torch.int32))
                for _ in range(copies_for((w1 + w2) * 4))]

        def two(a, b, n1=w1 // 2048, n2=w2 // 2048):
            _stride[(4 * sms,)](a, out, n1, B=2048, num_warps=4)
            _stride[(4 * sms,)](b, out, n2, B=2048, num_warps=4)

        rec("pair", f"layer T={t}", "2 launches", (w1 + w2) * 4, [lambda a=a, b=b: two(a, b) for a, b in bufs])
        del bufs
        one = [torch.randint(-2**31, 2**31 - 1, (w1 + w2,), device="cuda", dtype=torch.int32)
               for _ in range(copies_for((w1 + w2) * 4))]
        rec("pair", f"layer T={t}", "1 launch", (w1 + w2) * 4,
            [lambda w=w, n=(w1 + w2) // 2048: _stride[(4 * sms,)](w, out, n, B=2048, num_warps=4) for w in one])
        del one
    if run:
        lines = ["schedule,size,params,bytes,us,gbps"]
        lines += [f"{a},{b},{c},{d},{e:.2f},{f:.1f}" for a, b, c, d, e, f in rows]
        (run.path / "stream_size.csv").write_text("\n".join(lines) + "\n")
        run.update_meta(contents="stream_size.csv: read rate against bytes per launch (lab timing method)")
        run.finish()


if __name__ == "__main__":
    sys.exit(main())
