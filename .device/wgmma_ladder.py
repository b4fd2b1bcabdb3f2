"""How busy can the tensor pipe be in the shape of the WGMMA K loop (gemv_mma / moe_mma with WGMMA=True)?

The prefill MoE and the 64-token lm_head run that loop at 45-65% of the bf16 matmul ceiling, latency-bound
with 8 warps per SM (Nsight Compute: results/20261124T052830-h100-80gb-hbm3-ncu-moe-wg-prefill). This probe
builds the loop up one piece at a time, on data already on chip, so each rung's cost shows as a rate:

  mma      A decoded once, each K step one wgmma group (ROWS x 8 k16 instructions) on an x slot in shared
           memory, then wait(0): the loop's MMA with its per-step drain
  mma_w1   the same with wait(1): one step's group left in flight (legal here: A never changes)
  decode   + every step decodes its A from registers (words and scale bytes varied per step)
  barrier  + the two CTA-wide syncs per step the ring loops pay (thread barrier, async-proxy fence)
  smem     + the step's words read from a shared-memory slot, as RING_W's loop reads them
  ring     the real RING_W loop (kernels.linear_mma._g_wg_program: cp.async ring for words, scale bytes and
           x), every program on the same L2-resident rows (1.6 MB of words, 3.3 MB of x): no DRAM
  ring8    the same on 8 copies of the data (program p reads copy p % 8): fewer programs on each L2 line
  ring8_nox  ring8 with x's copies masked off (the slots zero-filled, nothing read from L2): what x's
           L2 reads cost (the weights' words and scale bytes still copied every step)
  r_*      the ring loop rebuilt here with its parts switched (8 data copies): r_all as RING_W's; r_nowait
           without the wait for the step's copies (timing only: the data may be stale); r_w only words and
           scale bytes copied (x slots filled once); r_x only x copied (words filled once, scale bytes in
           registers); r_none nothing copied, scale bytes still read from their slot; r_bare nothing copied, scale
           bytes in registers (the smem rung in this loop's frame). The r_* loops run 4000 steps like the
           rungs above, over their 200 steps of data again and again (so the data stays in L2)

Each kernel runs STEPS K steps of 128 in every program of a one-wave grid (P programs per SM); the rate is
2 * BLOCK_N * BLOCK_M * 128 * STEPS * programs / time, next to the in-process cuBLAS bf16 rate (8192^3).
Timing: labkit.hardware's spin-led CUDA events around one launch after a warm-up, median of 5 (no DRAM traffic,
nothing to rotate).

call as: python3 .device/wgmma_ladder.py [$OUT/wgmma-ladder]   (--compile: build every kernel for sm_90 only;
         --only=BLOCK_M,ROWS,P[/...] and --modes=a,b,...: a subset, e.g. under Nsight Compute;
         --steps=S[,S...] --waves=W[,W...]: pairs of S steps per program (default 4000) and W waves of programs
         per launch (default 1), for the shape of real programs: a gpt-oss K of 2880 is 22.5 steps;
         --shapes=BLOCK_M,ROWS[/...] instead of SHAPES, --per-sm=P[,P...] instead of 1,2,3: e.g. the 2-8-token
         lm_head leader, --shapes=8,2 --per-sm=4)
Besides the rate against cuBLAS, each rung prints the weight stream it would sustain (weight_tbps: the MXFP4
words and scale bytes of its steps, BLOCK_N x 68 bytes per step, per second): at a few tokens the loop's work
per step, not its arithmetic rate, is what bounds it (stop 50 in FINDINGS.md).
"""
import functools
import sys

import torch

from kernels.linear_mma import gluon, row_layout, wg_layouts, wg_ring_layouts
from labkit.hardware import _median_ms

if gluon is None:
    raise SystemExit("needs Triton with Gluon (>= 3.4)")

from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from kernels.linear_mma import _g_decode_step, _g_scale_copy, _g_wg_program, _g_word_offsets

MODES = ("mma", "mma_w1", "decode", "barrier", "smem", "ring", "ring8", "ring8_nox", "r_all", "r_nowait", "r_w", "r_x",
         "r_none", "r_bare")
#: r_* modes: (copy words and scale bytes, copy x, wait for the copies, scale bytes from their slot)
R_MODES = {"r_all": (1, 1, 1, 1), "r_nowait": (1, 1, 0, 1), "r_w": (1, 0, 1, 1), "r_x": (0, 1, 1, 0),
           "r_none": (0, 0, 1, 1), "r_bare": (0, 0, 1, 0)}
RING_MODES = {"ring": (1, False), "ring8": (8, False), "ring8_nox": (8, True)}  # copies, x masked off
RING_STEPS = 200
SMAX = 127


@gluon.jit
def _ladder(w_ptr, s_ptr, out_ptr, STEPS, SMAX, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            STAGES: gl.constexpr, LW: gl.constexpr, MMA: gl.constexpr, SX: gl.constexpr, LXCP: gl.constexpr,
            SW: gl.constexpr, MODE: gl.constexpr):
    xsm = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, 128], SX)
    rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LXCP))
    rk = gl.arange(0, 128, layout=gl.SliceLayout(0, LXCP))
    xv = ((rm[:, None] * 7 + rk[None, :]) % 5).to(gl.float16) * 0.25
    for q in gl.static_range(STAGES):
        xsm.index(q).store(xv)
    rows = gl.arange(0, BLOCK_N, layout=row_layout(LW))
    wofs, sofs, group, block = _g_word_offsets(rows, 16, 1, False, LW)
    v = gl.load(w_ptr + wofs)
    s = gl.load(s_ptr + sofs)
    if MODE == 4:
        wsm = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 1, 4, 4], SW)
        for q in gl.static_range(STAGES):
            wsm.index(q).store(v ^ q)
    fence_async_shared()
    gl.thread_barrier()
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
    a = gl.convert_layout(_g_decode_step(v, s, SMAX, True), A_L, assert_trivial=True)
    for c in range(STEPS):
        if MODE >= 2:
            if MODE == 4:
                vc = wsm.index(c % STAGES).load(LW)
            else:
                vc = v ^ c
            sc = s ^ (c & 1).to(gl.uint8)
            a = gl.convert_layout(_g_decode_step(vc, sc, SMAX, True), A_L, assert_trivial=True)
        if MODE >= 3:
            gl.thread_barrier()
            fence_async_shared()
        acc = warpgroup_mma(a, xsm.index(c % STAGES).permute((1, 0)), acc, is_async=True)
        if MODE == 1:
            acc = warpgroup_mma_wait(1, deps=[acc])
        else:
            acc = warpgroup_mma_wait(0, deps=[acc])
    acc = warpgroup_mma_wait(0, deps=[acc])
    gl.store(out_ptr + gl.program_id(0), gl.sum(gl.sum(acc, 1), 0))


@gluon.jit
def _ring(w_ptr, s_ptr, x_ptr, out_ptr, K, SMAX, COPIES, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          STAGES: gl.constexpr, LW: gl.constexpr, MMA: gl.constexpr, SX: gl.constexpr, LXCP: gl.constexpr,
          SW: gl.constexpr, SS: gl.constexpr, LSC: gl.constexpr, NOX: gl.constexpr):
    copy = (gl.program_id(0) % COPIES).to(gl.int64)
    rows = gl.arange(0, BLOCK_N, layout=row_layout(LW))
    tok = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LXCP))
    xofs = (tok * K)[:, None] + gl.arange(0, 128, layout=gl.SliceLayout(0, LXCP))[None, :]
    xok = None
    if NOX:
        xok = (tok < 0)[:, None] & (xofs >= 0)
    acc = _g_wg_program(w_ptr + copy * (BLOCK_N * K // 8), s_ptr + copy * (BLOCK_N * K // 32), rows,
                        x_ptr + copy * (BLOCK_M * K), xofs, K, SMAX, BLOCK_M, BLOCK_N, 1, True, STAGES, True, LW,
                        MMA, SX, SW, SS, LSC, True, None, None, 0, False, xok=xok)
    gl.store(out_ptr + gl.program_id(0), gl.sum(gl.sum(acc, 1), 0))


@gluon.jit
def _rring(w_ptr, s_ptr, x_ptr, out_ptr, K, SMAX, STEPS, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
           STAGES: gl.constexpr, LW: gl.constexpr, MMA: gl.constexpr, SX: gl.constexpr, LXCP: gl.constexpr,
           SW: gl.constexpr, SS: gl.constexpr, LSC: gl.constexpr, CW: gl.constexpr, CX: gl.constexpr,
           WAIT: gl.constexpr, SSM: gl.constexpr):
    """RING_W's K loop (kernels.linear_mma._g_wg_ring_loop, CHUNKS=1, tiled words) with its parts switched."""
    copy = (gl.program_id(0) % 8).to(gl.int64)
    w_ptr += copy * (BLOCK_N * K // 8)
    s_ptr += copy * (BLOCK_N * K // 32)
    x_ptr += copy * (BLOCK_M * K)
    KW = K // 8
    rows = gl.arange(0, BLOCK_N, layout=row_layout(LW))
    tok = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LXCP))
    xofs = (tok * K)[:, None] + gl.arange(0, 128, layout=gl.SliceLayout(0, LXCP))[None, :]
    wofs, sofs, group, block = _g_word_offsets(rows, KW, 1, True, LW)
    scofs = _g_scale_copy(rows, KW, LSC)
    xsm = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, 128], SX)
    wsm = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 1, 4, 4], SW)
    ssm = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N // 4, 16], SS)
    s0 = gl.load(s_ptr + sofs)
    for q in gl.static_range(STAGES):  # every slot filled once, then refilled by the switched-on copies
        async_copy.async_copy_global_to_shared(wsm.index(q), w_ptr + wofs + q * 256)
        async_copy.async_copy_global_to_shared(ssm.index(q), s_ptr + scofs + q * 64)
        async_copy.async_copy_global_to_shared(xsm.index(q), x_ptr + xofs + q * 128)
        async_copy.commit_group()
    async_copy.wait_group(0)
    gl.thread_barrier()
    A_L: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
    data_steps = KW // 16
    for c in range(0, STEPS):
        if WAIT:
            async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        fence_async_shared()
        ns = (c + STAGES - 1) % STAGES
        live = c + STAGES - 1 < STEPS
        n = (c + STAGES - 1) % data_steps
        if CW:
            async_copy.async_copy_global_to_shared(wsm.index(ns), w_ptr + wofs + n * 256, mask=(group >= 0) & live)
            async_copy.async_copy_global_to_shared(ssm.index(ns), s_ptr + scofs + n * 64, mask=(scofs >= 0) & live)
        if CX:
            async_copy.async_copy_global_to_shared(xsm.index(ns), x_ptr + xofs + n * 128, mask=(xofs >= 0) & live)
        async_copy.commit_group()
        slot = c % STAGES
        v = wsm.index(slot).load(LW)
        if SSM:
            sc = ssm.index(slot).reshape([1, BLOCK_N, 4]).permute((1, 0, 2)).load(gl.SliceLayout(3, LW))
        else:
            sc = s0 ^ (c & 1).to(gl.uint8)
        w = _g_decode_step(v, sc, SMAX, True)
        acc = warpgroup_mma(gl.convert_layout(w, A_L, assert_trivial=True), xsm.index(slot).permute((1, 0)), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
    async_copy.wait_group(0)
    gl.store(out_ptr + gl.program_id(0), gl.sum(gl.sum(acc, 1), 0))


def ring_data(bm, rows, device, copies=8):
    """Random words, scale bytes and fp16 x for _ring: `copies` sets of BLOCK_N rows and BLOCK_M tokens of
    K = 128 * RING_STEPS."""
    n, k = 16 * rows * 4, 128 * RING_STEPS
    w = torch.randint(-2**31, 2**31 - 1, (copies * n * k // 8,), device=device, dtype=torch.int32)
    s = torch.randint(118, 126, (copies * n * k // 32,), device=device, dtype=torch.uint8)
    x = torch.randn(copies * bm * k, device=device).to(torch.float16)
    return w, s, x


def launch(mode, bm, rows, programs, steps, w, s, out, stages=4, nw=4, ring=None):
    LW, LXCP, MMA, SX = wg_layouts(bm, rows, 1, nw)
    SW, SS, LSC = wg_ring_layouts(bm, rows, 1, nw)
    if mode in R_MODES:
        cw, cx, wait, ssm = R_MODES[mode]
        rw, rs, rx = ring
        _rring[(programs,)](rw, rs, rx, out, 128 * RING_STEPS, SMAX, steps, BLOCK_M=bm, BLOCK_N=16 * rows * nw,
                            STAGES=stages, LW=LW, MMA=MMA, SX=SX, LXCP=LXCP, SW=SW, SS=SS, LSC=LSC, CW=cw, CX=cx,
                            WAIT=wait, SSM=ssm, num_warps=nw)
        return
    if mode in RING_MODES:
        rw, rs, rx = ring
        copies, nox = RING_MODES[mode]
        _ring[(programs,)](rw, rs, rx, out, 128 * RING_STEPS, SMAX, copies, BLOCK_M=bm, BLOCK_N=16 * rows * nw,
                           STAGES=stages, LW=LW, MMA=MMA, SX=SX, LXCP=LXCP, SW=SW, SS=SS, LSC=LSC, NOX=nox,
                           num_warps=nw)
        return
    _ladder[(programs,)](w, s, out, steps, SMAX, BLOCK_M=bm, BLOCK_N=16 * rows * nw, STAGES=stages, LW=LW, MMA=MMA,
                         SX=SX, LXCP=LXCP, SW=SW, MODE=MODES.index(mode), num_warps=nw)


SHAPES = [(64, 2), (32, 2), (64, 1), (16, 2)]  # (BLOCK_M, ROWS): the prefill and 64-token leaders' tiles first


def main():
    compile_only = "--compile" in sys.argv
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    only = [tuple(int(v) for v in o.split(",")) for o in opts["only"].split("/")] if "only" in opts else None
    modes = opts["modes"].split(",") if "modes" in opts else MODES
    shapes = [tuple(int(v) for v in sh.split(",")) for sh in opts["shapes"].split("/")] if "shapes" in opts else SHAPES
    per_sms = [int(v) for v in opts.get("per-sm", "1,2,3").split(",")]
    frames = list(zip([int(v) for v in opts.get("steps", "4000").split(",")],
                      [int(v) for v in opts.get("waves", "1").split(",")]))  # (steps per program, waves)
    reps = int(opts.get("reps", 1 if only else 5))  # one timed launch under Nsight Compute
    if compile_only:
        from labkit.compile import compile_only as co
        with co(90) as built:
            for bm, rows in SHAPES:
                n = 16 * rows * 4
                w = torch.empty((n * 16,), dtype=torch.int32, device="meta")
                s = torch.empty((n * 4,), dtype=torch.uint8, device="meta")
                out = torch.empty((264,), dtype=torch.float32, device="meta")
                for mode in MODES:
                    launch(mode, bm, rows, 264, 10, w, s, out, ring=ring_data(bm, rows, "meta"))
            from labkit.compile import main_loop_mix, resource_usage, sass_of, wgmma_hazards
            for (_name, k), (shape, mode) in zip(built, [(sh, m) for sh in SHAPES for m in MODES]):
                use = resource_usage(k)
                sass = sass_of(k)
                n, mix = main_loop_mix(sass)
                print(shape, mode, use, "loop:", n, dict(mix.most_common(6)), "hazards:", len(wgmma_hazards(sass)))
        return 0
    from labkit.runs import probe_run
    run = probe_run("wgmma-ladder") if args else None
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    cublas = 2 * 8192 ** 3 / median_ms(lambda: a @ b, reps=reps) / 1e9
    print(f"cuBLAS bf16 8192^3: {cublas:.0f} TFLOP/s")
    rows_out = []
    for steps_opt, waves in frames:
        for bm, rows in shapes:
            n = 16 * rows * 4
            w = torch.randint(-2**31, 2**31 - 1, (n * 16,), device="cuda", dtype=torch.int32)
            s = torch.randint(118, 126, (n * 4,), device="cuda", dtype=torch.uint8)
            ring = ring_data(bm, rows, "cuda")
            for per_sm in per_sms:
                if only and (bm, rows, per_sm) not in only:
                    continue
                programs = per_sm * sms * waves
                out = torch.empty((programs,), device="cuda", dtype=torch.float32)
                for mode in modes:
                    steps = RING_STEPS if mode in RING_MODES else steps_opt
                    try:
                        ms = median_ms(functools.partial(launch, mode, bm, rows, programs, steps, w, s, out,
                                                         ring=ring), reps=reps)
                    except Exception as e:  # a build that cannot run (shared memory, registers): not fatal
                        print(f"BM={bm} ROWS={rows} P={per_sm} {mode}: failed: {str(e)[:120]}")
                        continue
                    tflops = 2 * n * bm * 128 * steps * programs / ms / 1e9
                    tbps = n * 68 * steps * programs / ms / 1e9
                    rows_out.append((bm, rows, per_sm, mode, steps, programs // (per_sm * sms), ms, tflops,
                                     tflops / cublas, tbps))
                    print(f"BM={bm:3d} ROWS={rows} P={per_sm} {mode:9s} steps={steps:5d} waves={waves:4d} {ms:8.3f} "
                          f"ms {tflops:6.0f} TFLOP/s {tflops / cublas:5.2f} of cuBLAS {tbps:5.2f} TB/s of weights",
                          flush=True)
    for steps_opt, waves in frames:
        print(f"\n{steps_opt} steps per program, {waves} wave(s); fraction of cuBLAS bf16 (ring, ring8*: "
              f"{RING_STEPS} steps, one wave)")
        print("BLOCK_M ROWS per_SM  " + "  ".join(f"{m:>9s}" for m in modes))
        for bm, rows in shapes:
            for per_sm in per_sms:
                got = {r[3]: r[8] for r in rows_out if r[:3] == (bm, rows, per_sm) and r[5] == waves
                       and (r[4] == steps_opt or r[3] in RING_MODES)}
                if got:
                    print(f"{bm:7d} {rows:4d} {per_sm:6d}  "
                          + "  ".join(f"{got.get(m, float('nan')):9.2f}" for m in modes))
    if run:
        lines = ["block_m,rows,per_sm,mode,steps,waves,ms,tflops,of_cublas,weight_tbps"]
        lines += [f"{a},{b},{c},{d},{e},{f},{g:.4f},{h:.1f},{i:.3f},{j:.3f}"
                  for a, b, c, d, e, f, g, h, i, j in rows_out]
        (run.path / "wgmma_ladder.csv").write_text("\n".join(lines) + "\n")
        run.update_meta(contents="wgmma_ladder.csv: rate of the WGMMA K loop built up rung by rung",
                        cublas_bf16_tflops=cublas)
        run.finish()
    return 0


def median_ms(fn, reps=5):
    """Median of `reps` event-timed calls after one warm-up (labkit.hardware's, a spin kernel queued ahead of each
    so host launch latency stays out; the runs of 2026-11-27 timed plain event pairs, 0.2-4 ms kernels)."""
    return _median_ms(fn, reps, 1)


if __name__ == "__main__":
    sys.exit(main())
