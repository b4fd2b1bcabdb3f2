"""Streaming probe: what read rate can a Triton kernel reach over the lm_head's bytes (201088 x 1440 B), and
which schedule gets it? Against torch.sum over the same bytes and over 1 GiB (the lab's read ceiling).

Schedules (each program xors what it reads into registers and stores one tile):
- flat B S: program p reads S consecutive blocks of B words, one contiguous run of S*B*4 bytes.
- stride B G: a persistent grid of G programs; program p reads blocks p, p+G, p+2G, ... of B words, so the
  programs in flight read neighbouring blocks at any moment.
- tile R C / stepmajor R C: R x C-word tiles, tile-contiguous per program (the TILED layout's pattern) or with
  step c of every program stored together (step-major).
Timing: the lab's method (spin kernel ahead, CUDA events, median of 20, L2 flushed before each).

call as: python3 .device/stream_probe.py [$OUT/stream]
"""
import statistics
import sys

import torch
import triton
import triton.language as tl

from labkit.hardware import event_ms
from labkit.runs import probe_run


@triton.jit
def _flat(w_ptr, out_ptr, S, B: tl.constexpr):
    pid = tl.program_id(0)
    o = tl.arange(0, B)
    acc = tl.zeros([B], tl.int32)
    base = pid * S * B  # < 2**31 words here
    for s in range(0, S):
        acc ^= tl.load(w_ptr + base + s * B + o)
    tl.store(out_ptr + pid * B + o, acc)


@triton.jit
def _stride(w_ptr, out_ptr, NB, B: tl.constexpr):
    pid = tl.program_id(0)
    g = tl.num_programs(0)
    o = tl.arange(0, B)
    acc = tl.zeros([B], tl.int32)
    for blk in range(pid, NB, g):
        acc ^= tl.load(w_ptr + blk * B + o)
    tl.store(out_ptr + pid * B + o, acc)


@triton.jit
def _tile(w_ptr, out_ptr, STEPS, ROWS: tl.constexpr, CW: tl.constexpr, STEPMAJOR: tl.constexpr):
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    r = tl.arange(0, ROWS)
    w = tl.arange(0, CW)
    acc = tl.zeros([ROWS, CW], tl.int32)
    for c in range(0, STEPS):
        if STEPMAJOR:
            blk = c * progs + pid
        else:
            blk = pid * STEPS + c
        acc ^= tl.load(w_ptr + blk * ROWS * CW + r[:, None] * CW + w[None, :])
    tl.store(out_ptr + pid * ROWS * CW + r[:, None] * CW + w[None, :], acc)


def gbps(nbytes, fn, flush):
    fn()
    ts = []
    for _ in range(20):
        flush.zero_()
        ts.append(event_ms(fn))
    ms = statistics.median(ts)
    return nbytes / (ms * 1e-3) / 1e9, ms * 1e3


def main():
    N, KW = 201088, 360
    total = N * KW
    w = torch.randint(-2**31, 2**31 - 1, (total,), device="cuda", dtype=torch.int32)
    big = torch.randn(1 << 28, device="cuda")
    flush = torch.empty(256 << 20, device="cuda", dtype=torch.int8)
    out = torch.empty(1 << 24, device="cuda", dtype=torch.int32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    run = probe_run("stream")
    rows = []

    def rec(name, params, nbytes, fn):
        try:
            g, us = gbps(nbytes, fn, flush)
        except Exception as e:  # a config that does not compile or launch: say so, go on
            print(f"{name:10s} {params:28s} failed: {type(e).__name__}: {str(e)[:80]}", flush=True)
            return
        rows.append((name, params, nbytes, us, g))
        print(f"{name:10s} {params:28s} {us:9.1f} us {g:8.0f} GB/s", flush=True)

    wf = w.view(torch.float32)
    rec("torch.sum", "lm_head bytes", total * 4, lambda: wf.sum())
    rec("torch.sum", "1 GiB", big.numel() * 4, lambda: big.sum())
    for b in (512, 1024, 2048, 4096):
        for s in (1, 4, 16):
            for warps in (4, 8):
                nprog = total // (b * s)
                rec("flat", f"B={b} S={s} warps={warps}", nprog * b * s * 4,
                    lambda b=b, s=s, warps=warps, nprog=nprog: _flat[(nprog,)](w, out, s, B=b, num_warps=warps))
    for b in (1024, 2048, 4096):
        for k in (2, 4, 8, 16, 32):
            for warps in (4, 8):
                nb = total // b
                rec("stride", f"B={b} G={k}xSM warps={warps}", nb * b * 4,
                    lambda b=b, k=k, warps=warps, nb=nb: _stride[(k * sms,)](w, out, nb, B=b, num_warps=warps))
    for r_, cw, warps in ((128, 16, 4), (128, 16, 8), (64, 32, 4), (16, 16, 1), (16, 16, 2), (32, 16, 2)):
        steps = KW // cw
        progs = min(N // r_, out.numel() // (r_ * cw))
        for sm in (False, True):
            rec("stepmajor" if sm else "tile", f"R={r_} C={cw} warps={warps}", progs * r_ * steps * cw * 4,
                lambda r_=r_, cw=cw, warps=warps, steps=steps, progs=progs, sm=sm:
                _tile[(progs,)](w, out, steps, ROWS=r_, CW=cw, STEPMAJOR=sm, num_warps=warps))
    print(f"\n{'schedule':10s} {'params':28s} {'us':>9s} {'GB/s':>8s}  (best 12)")
    for name, params, _, us, g in sorted(rows, key=lambda r: -r[4])[:12]:
        print(f"{name:10s} {params:28s} {us:9.1f} {g:8.0f}")
    if run:
        lines = ["schedule,params,bytes,us,gbps"] + [f"{a},{b},{c},{d:.2f},{e:.1f}" for a, b, c, d, e in rows]
        (run.path / "stream.csv").write_text("\n".join(lines) + "\n")
        run.update_meta(contents="stream.csv: read rate of Triton streaming schedules over the lm_head's bytes")
        run.finish()


if __name__ == "__main__":
    sys.exit(main())
