"""Does L2 keep bytes prefetched while another stream passes through it? (H200, stop 74)

The idea it checks: mlp1 of a 1-4-token MoE layer streams its weights from DRAM while mlp2's weights (17.7 MB at
one token, 35 MB at two, 70 MB at four) wait for mlp1's act; if mlp1's programs asked L2 to prefetch mlp2's
weights with an evict_last policy (cp.async.bulk.prefetch.L2 with an L2::cache_hint) and streamed their own with
evict_first, mlp2 would read from L2. Stop 41's L2PF did the prefetch without the eviction hints on the H100 and
mlp2 still read from DRAM (L2 hit rate 14.5%).

Per trial (queued behind a spin kernel, so no host launch gap is timed): L2 flushed by writing a 4x-L2 buffer, then
a stream kernel over S (its loads plain or evict_first, its programs prefetching their share of P at their start:
none, plain, or evict_last), then a read kernel over P; CUDA events around each kernel. Printed: the read's time and
rate against P read cold and P read hot (right after a first read). Usage: python3 .device/l2_hold_probe.py OUT_DIR
[write|read]: the flush writes the buffer (default: L2 then holds dirty lines) or reads it (clean lines).
"""

import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

BLOCK = 4096  # fp16 elements a load (8 KB)


@triton.jit
def _prefetch(lo_ptr, nbytes, EVICT_LAST: tl.constexpr):
    if EVICT_LAST:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; .reg .b64 pol; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
            "setp.ne.and.u32 p, $2, 0, p; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
            "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol; mov.u32 $0, 0; }",
            "=r,l,r", [lo_ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; setp.ne.and.u32 p, $2, 0, p; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [lo_ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def stream_kernel(s_ptr, n_s, out_ptr, p_ptr, p_piece, PF: tl.constexpr, EVICT: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Sum S grid-stride (loads with eviction policy EVICT); PF 1/2: first prefetch this program's p_piece
    bytes of P into L2 (2: evict_last)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if PF:
        CH: tl.constexpr = 1 << 16  # at most 64 KB an instruction
        for o in range(0, p_piece, CH):
            _prefetch(p_ptr.to(tl.pointer_type(tl.int8)) + pid.to(tl.int64) * p_piece + o,
                      tl.minimum(p_piece - o, CH), PF == 2)
    acc = tl.zeros([BLOCK], tl.float32)
    for off in range(pid * BLOCK, n_s, nprog * BLOCK):
        acc += tl.load(s_ptr + off + tl.arange(0, BLOCK), eviction_policy=EVICT).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


FLUSH = "write"


def main(out_dir: str):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    sms = props.multi_processor_count
    grid = sms * 4
    flush = torch.ones(4 * l2, dtype=torch.uint8, device="cuda")
    flush_view, flush_sum = flush.view(torch.float32), torch.empty((), device="cuda")
    sums = torch.empty(grid, dtype=torch.float32, device="cuda")
    MB = 1 << 20
    rows = []

    def run(kind, s, p, evict, pf, trials=15):
        n_p = p.numel() * 2
        piece = (n_p // grid) // 16 * 16
        t_stream, t_read = [], []
        for _ in range(trials + 2):
            torch.cuda._sleep(2_000_000)  # the GPU busy while the host queues the trial: no launch gaps timed
            if FLUSH == "write":
                flush.fill_(1)
            else:  # clean lines only: a read of the buffer
                flush_sum.copy_(flush_view.sum())
            e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            e[0].record()
            if s is not None:
                stream_kernel[(grid,)](s, s.numel(), sums, p, piece, PF=pf, EVICT=evict, BLOCK=BLOCK, num_warps=8)
            elif kind == "hot":
                stream_kernel[(grid,)](p, p.numel(), sums, p, 0, PF=0, EVICT="", BLOCK=BLOCK, num_warps=8)
            e[1].record()
            e[2].record()
            stream_kernel[(grid,)](p, p.numel(), sums, p, 0, PF=0, EVICT="", BLOCK=BLOCK, num_warps=8)
            e[3].record()
            torch.cuda.synchronize()
            t_stream.append(e[0].elapsed_time(e[1]) * 1e3)
            t_read.append(e[2].elapsed_time(e[3]) * 1e3)
        ts, tr = statistics.median(t_stream[2:]), statistics.median(t_read[2:])
        row = {"kind": kind, "s_mb": 0 if s is None else round(s.numel() * 2 / MB, 1), "p_mb": round(n_p / MB, 1),
               "evict": evict or "normal", "prefetch": ("none", "normal", "evict_last")[pf],
               "stream_us": round(ts, 2), "read_us": round(tr, 2), "read_tbs": round(n_p / tr / 1e6, 2),
               "total_us": round(ts + tr, 2), "flush": FLUSH}
        rows.append(row)
        print(row, flush=True)

    for s_mb, p_mb in ((35, 17.7), (70, 35), (141, 35), (141, 70), (307, 1)):
        p = torch.randn(int(p_mb * MB / 2) // BLOCK * BLOCK, device="cuda").half()
        s = torch.randn(int(s_mb * MB / 2) // BLOCK * BLOCK, device="cuda").half()
        run("cold", None, p, "", 0)
        run("hot", None, p, "", 0)
        for evict, pf in (("", 0), ("", 1), ("", 2), ("evict_first", 0), ("evict_first", 1), ("evict_first", 2)):
            run("stream", s, p, evict, pf)
        del p, s
    meta = {"gpu": props.name, "l2_bytes": l2, "sms": sms, "grid": grid, "torch": torch.__version__,
            "triton": triton.__version__, "method": __doc__}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    (out / "l2_hold.json").write_text(json.dumps(rows, indent=2))
    print(f"L2 {l2 / MB:.0f} MB, {sms} SMs")
    print(f"{'s_mb':>6} {'p_mb':>6} {'kind':>6} {'evict':>12} {'prefetch':>10} {'stream':>8} {'read':>8} {'TB/s':>6} "
          f"{'total':>8}")
    for r in rows:
        print(f"{r['s_mb']:>6} {r['p_mb']:>6} {r['kind']:>6} {r['evict']:>12} {r['prefetch']:>10} {r['stream_us']:>8} "
              f"{r['read_us']:>8} {r['read_tbs']:>6} {r['total_us']:>8}")


if __name__ == "__main__":
    FLUSH = sys.argv[2] if len(sys.argv) > 2 else "write"
    main(sys.argv[1])
