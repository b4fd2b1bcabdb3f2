"""Program timelines: when each program of a traced launch started, got past its wait and ended, and on which SM.

Why: at 16-256 tokens a gpt-oss-20b MoE layer streams its weights ~15% slower than a 120b layer at the same
tokens per expert, and Nsight Compute only gives whole-launch averages (2-4 waves per launch on 20b against
7-14 on 120b, results/20261124T011300-h100-80gb-hbm3-ncu-waves). A per-program record of %globaltimer shows
where a layer's time goes: the ramp before the first program streams, programs waiting on their inputs
(PDL, CHAIN counters), and the last partial wave.

Kernels that support it take `trace_ptr` and a `TRACE` constexpr (off: the same build as without it) and call
`trace_mark` at the program's start and past its wait and `trace_end` at its end, live or spare. The host side is
`program_trace()`: launches made inside it allocate a record buffer each and pass TRACE=True (compiled kernels only:
%globaltimer has no interpreter equivalent). labkit.timeline turns the records into a table and a chart.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ._triton import tl, triton

#: int64 words per program record: start ns, after-wait ns, end ns, SM id * 2 + live
WORDS = 4
_WORDS = tl.constexpr(WORDS)  # the same, readable inside kernels


@triton.jit
def clock_ns():
    """%globaltimer (ns, GPU-wide; it advances in steps of ~32 ns on sm_90)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _record(trace_ptr):
    """This program's record in a 2-D grid's buffer (program_id(0) fastest), found again at each use: nothing of
    the trace stays in registers across the program's loop."""
    return trace_ptr + (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)).to(tl.int64) * _WORDS


@triton.jit
def trace_mark(trace_ptr, word):
    """Store now into word `word` of this program's record (0 its start, 1 past its wait) when it happens: times
    held in registers until the program's end took a 20b mlp1 build from 119 to 163 registers (3 programs per SM
    instead of 4), so the timeline showed another occupancy than the timed layer's."""
    tl.store(_record(trace_ptr) + word, clock_ns())


@triton.jit
def trace_end(trace_ptr, live):
    """The record's last words: the end time (now) and the SM id * 2 + live."""
    rec = _record(trace_ptr)
    tl.store(rec + 2, clock_ns())
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(rec + 3, sm.to(tl.int64) * 2 + live.to(tl.int64))


@dataclass
class Launch:
    """One traced launch: its name (e.g. 'mlp1'), grid, and record buffer [programs, WORDS] (filled on the GPU
    when the launch runs, again at each replay of a CUDA graph that captured it)."""

    name: str
    grid: tuple
    records: torch.Tensor


_active: dict | None = None


@contextlib.contextmanager
def program_trace(device="cuda", capacity: int = 1 << 20):
    """Trace the launches of kernels that support it inside this block; yields the list of Launch they append
    (read the records after the launches ran: synchronize, or replay the captured graph first). The records
    of up to `capacity` programs come from one buffer zeroed here, on entry: a zero-fill per launch would put a
    memset between two launches and break the overlap PDL gives them (moe_mma's CHAIN lost ~15 us of a 20b
    layer that way)."""
    global _active
    pool = torch.zeros((capacity, WORDS), dtype=torch.int64, device=device)
    outer, _active = _active, {"launches": [], "pool": pool, "used": 0}
    try:
        yield _active["launches"]
    finally:
        _active = outer


def trace_args(name: str, grid: tuple, untraced: torch.Tensor) -> dict:
    """Keyword arguments for a kernel launch: the next slice of program_trace()'s record buffer and TRACE=True
    inside it, else TRACE=False with trace_ptr=untraced, any tensor of the launch (the build never touches it:
    no allocation, so no memset, on the launch path)."""
    if _active is None:
        return dict(trace_ptr=untraced, TRACE=False)
    n = 1
    for g in grid:
        n *= int(g)
    start = _active["used"]
    if start + n > len(_active["pool"]):
        raise RuntimeError(f"program_trace(capacity={len(_active['pool'])}) is full: {name} needs {n} more records")
    _active["used"] = start + n
    records = _active["pool"][start:start + n]
    _active["launches"].append(Launch(name, tuple(int(g) for g in grid), records))
    return dict(trace_ptr=records, TRACE=True)
