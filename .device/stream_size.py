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
- flat_h2g: one program per 8 KB block (a [16 rows, 128 words] tile and its scale bytes), with gemv_h2g's
  arithmetic on it (h2g_step against x16) or none: what the arithmetic costs a launch of short programs;
- pair: mlp1's then mlp2's bytes as two strided launches in a row (the two weight launches of moe_h2g), against
  one strided launch over both (what a single launch could get).

call as: python3 .device/stream_size.py [$OUT/stream-size]
"""
import sys

import torch
import triton
import triton.language as tl

import kernels as K
from kernels.linear_f16 import h2g_step
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


@triton.jit
def _flat_h2g(w_ptr, s_ptr, xq_ptr, out_ptr, PLANE, SLICES, ROWS: tl.constexpr, TW: tl.constexpr, X: tl.constexpr):
    """One program per 8 KB block read as a [ROWS, TW]-word tile with its scale bytes, and gemv_h2g's arithmetic
    on it (h2g_step) against the x16 words of K slice pid % SLICES (X), or no arithmetic (an xor of the words
    and scales). Stores ROWS 4-byte results."""
    pid = tl.program_id(0)
    G: tl.constexpr = TW // 4
    word = tl.arange(0, TW)[None, :] + 0 * tl.arange(0, ROWS)[:, None]
    rg = tl.arange(0, G)
    base = pid.to(tl.int64) * ROWS
    v = tl.load(w_ptr + (base + tl.arange(0, ROWS))[:, None] * TW + word).to(tl.uint32, bitcast=True)
    sc = tl.load(s_ptr + (base + tl.arange(0, ROWS))[:, None] * G + rg[None, :])
    if X:
        acc = h2g_step(tl.zeros((ROWS, G, 1), tl.float32), v, sc, xq_ptr + (pid % SLICES) * TW + word, word, 0, PLANE,
                       G, False)
        tot = tl.sum(tl.sum(acc, axis=2), axis=1)
    else:
        tot = (tl.xor_sum(v, axis=1) ^ tl.xor_sum(sc.to(tl.uint32), axis=1)).to(tl.float32, bitcast=True)
    tl.store(out_ptr + pid * ROWS + tl.arange(0, ROWS), tot)


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
    x16, _ = K.linear_f16.x_to_f16(torch.randn(1, 2880, device="cuda").to(torch.bfloat16), planes=True)
    plane = K.linear_f16.plane_words(2880)
    for size in ("mlp1 T=1", "mlp1 T=4", "lm_head"):  # one 8 KB block per program, with gemv_h2g's arithmetic
        n_rows = SIZES[size]
        blocks = n_rows * 2880 // 8 // 2048  # [16 rows x 128 words] tiles
        bufs = [(torch.randint(-2**31, 2**31 - 1, (blocks * 2048,), device="cuda", dtype=torch.int32),
                 torch.randint(110, 140, (blocks * 16 * 32,), device="cuda", dtype=torch.uint8))
                for _ in range(copies_for(blocks * 2048 * 4))]
        for x in (False, True):
            rec("flat_h2g", size, "x16" if x else "no x", blocks * (8192 + 512),
                [lambda w=w, sc=sc, x=x, n=blocks: _flat_h2g[(n,)](w, sc, x16.view(torch.int32), out, plane, 2,
                                                                    ROWS=16, TW=128, X=x, num_warps=4)
                 for w, sc in bufs])
        del bufs
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
