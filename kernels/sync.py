"""Device-side counters: stages of one launch that depend on each other (moe_fused), and split-K sums whose
last K slice finishes the tile (add_partial, moe_split), with the zeroed scratch both keep between calls.

A program that finishes a piece of a stage adds 1 to that piece's counter (`signal_count`); a program of a
later stage that needs it polls the counter until it reaches the count it needs (`wait_count`). This is
deadlock-free without any assumption about how many programs are resident, provided programs take their work
in ticket order (`take_ticket`): a program only ever waits for work whose ticket is smaller than its own, and a
ticket is only handed to a program that is already running, so whatever it waits for is running or done.

moe_fused's counters are never reset (moe_mma's CHAIN, two launches without shared tickets, has its last reader
zero them instead: `consume`). They count on from launch to launch, and a launch waits for its own share: the
ticket says which launch a program belongs to (ticket // tickets per launch), so a counter for a piece done
`need` times per launch is waited on until it reaches (launch + 1) * need. Every program of a stage signals,
with or without work, so the shares stay exact for any routing. Launches sharing counters must run one after
the other (one stream, or CUDA-graph replays of it); PDL keeps that order because every program takes its ticket
after griddepcontrol.wait.

Memory ordering (PTX): the signalling program's threads meet at a barrier after their stores, then one thread
adds 1 with release semantics; every thread of the waiting program polls with acquire loads, so its loads
after the wait see those stores. A wait gives up after `SPIN` polls, so that a bug shows up as a wrong result
(caught by the correctness check before any timing) rather than as a hang.
"""

from __future__ import annotations

import torch

from ._triton import INTERP, tl, triton

#: polls before a wait gives up (~0.5 s on an H100: far above any stage's time, short of a hang)
SPIN = tl.constexpr(1 << 20)


@triton.jit
def load_acquire(ptr):
    """ld.acquire.gpu of an int64 counter in every thread: later loads of the thread see whatever the signalling
    program wrote before its release (the hardware invalidates the SM's L1), and, unlike a fence, it does not
    wait for the thread's loads still in flight (a waiting program's weight tile)."""
    if INTERP:
        return tl.load(ptr, volatile=True)
    else:
        return tl.inline_asm_elementwise("ld.acquire.gpu.global.b64 $0, [$1];", "=l,l", [ptr], dtype=tl.int64,
                                         is_pure=False, pack=1)


@triton.jit
def take_ticket(ctr_ptr):
    """This program's ticket: the number of programs that took one from ctr_ptr before it (int64)."""
    return tl.atomic_add(ctr_ptr, 1, sem="relaxed")


@triton.jit
def take_item(ctr_ptr, total, grid):
    """A persistent program's next item of `total`, after a first item that was its program id: grid plus a
    ticket, so programs that finish first take more (moe_mma's TICKET1). Each program with a first item takes
    one ticket past the live ones before it stops; the one taking the launch's last ticket zeroes the counter
    for the next call (every other program is done with it by then).
    Call it inside a loop, after work, as TICKET1 does: a ticket taken first thing in a kernel (FUSE2, since
    removed) compiled on sm_90 to a branch around the warp-aggregated atomic with no BSSY/BSYNC to join it
    before the barrier that broadcasts the ticket; compute-sanitizer synccheck reported divergent threads there
    and the H100 hung (stop 56 in FINDINGS.md). synccheck finds the shipped forms clean
    (results/20261128T055210-h100-80gb-hbm3-synccheck-shipped), moe_fused's first-thing take_ticket too
    (...055735-...-synccheck-moe-tickets): whether ptxas joins the branch is its choice, so run synccheck
    (.device/memcheck.sh with TOOL=synccheck) on any new ticket site."""
    t = tl.atomic_add(ctr_ptr, 1, sem="relaxed")
    if t == tl.maximum(total - grid, 0) + tl.minimum(grid, total) - 1:
        tl.atomic_xchg(ctr_ptr, 0, sem="relaxed")
    return grid + t


@triton.jit
def signal_count(ctr_ptr):
    """Add 1 to the counter at ctr_ptr once the stores of every thread so far are visible GPU-wide: a barrier,
    then one release atomic (CUTLASS's semaphore release is the same pattern)."""
    tl.debug_barrier()
    tl.atomic_add(ctr_ptr, 1, sem="release")


@triton.jit
def wait_count(ctr_ptr, need):
    """Poll the counter at ctr_ptr with acquire loads until it reaches need (or SPIN polls have passed)."""
    n = load_acquire(ctr_ptr)
    spins = 0
    while (n < need) & (spins < SPIN):
        n = load_acquire(ctr_ptr)
        spins += 1


@triton.jit
def proxy_fence_global():
    """fence.proxy.async.global in every thread: orders the thread's generic-proxy accesses of global memory so far
    (its stores; a counter's acquire) with its later async-proxy ones (TMA copies), which acquire/release alone
    do not (PTX memory model: synchronization holds per proxy). moe_mma's CHAIN with TMA=2 needs it on both sides:
    mlp1 stores act and releases a counter, mlp2 acquires it and reads act by TMA boxes."""
    if not INTERP:
        tl.inline_asm_elementwise("fence.proxy.async.global;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def consume(ctr_ptr, done_ptr, need):
    """Count one consumer of a piece on ctr_ptr; the consumer that completes the count (need) zeroes the piece's
    counter (done_ptr) and its own, so the next call finds both at zero (moe_mma's CHAIN: counters reset by
    their last reader instead of counting on, because mlp1 and mlp2 are two launches without shared tickets)."""
    c = tl.atomic_add(ctr_ptr, 1, sem="acq_rel") + 1
    if c == need:
        tl.atomic_xchg(done_ptr, 0, sem="relaxed")
        tl.atomic_xchg(ctr_ptr, 0, sem="relaxed")


@triton.jit
def add_partial(sum_ptrs, part, mask, ctr_ptr, slices):
    """Split-K: add this K slice's fp32 partial sums `part` into sum_ptrs (relaxed atomics), then count the
    slice on ctr_ptr (a barrier, one acq_rel atomic: signal_count's pattern, never reset). Returns (last,
    total): whether this program completed the count (a multiple of `slices`) and, if so, the complete sums,
    read back while leaving zeros (an atomic exchange of the int32 words: the interpreter exchanges no
    floats), so the scratch is clean for the next call."""
    tl.atomic_add(sum_ptrs, part, mask=mask, sem="relaxed")
    tl.debug_barrier()
    done = tl.atomic_add(ctr_ptr, 1, sem="acq_rel") + 1
    tl.debug_barrier()
    last = done % slices == 0
    bits = tl.atomic_xchg(sum_ptrs.to(tl.pointer_type(tl.int32)), tl.zeros_like(part).to(tl.int32),
                          mask=tl.where(last, mask, False), sem="relaxed")
    return last, bits.to(tl.float32, bitcast=True)


SCRATCH: dict[tuple, torch.Tensor] = {}


def scratch(device: torch.device, key: tuple, n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A zeroed buffer of n elements for one launch shape (key), made on first use and then kept: counters
    that count on from call to call (moe_fused) or sums that the kernel itself zeroes again after reading them
    (moe_split), so no call pays a memset. Calls sharing one must run one after the other on one stream."""
    key = (str(device), n, dtype, *key)
    c = SCRATCH.get(key)
    if c is None:
        c = SCRATCH[key] = torch.zeros(n, dtype=dtype, device=device)
    return c
