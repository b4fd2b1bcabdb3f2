"""The measuring harness (DESIGN.md "Measuring"): correctness first, then CUDA-graph timing against the floor.

For every point: fresh random inputs are checked against the fp32 reference (a wrong config is stored as
`incorrect` and never timed); then the call is timed as CUDA-graph replays (median, p10, p90 of >= 20
replays after warm-up) over enough distinct weight copies that one replay touches >= 4x the L2, divided
by the number of copies; eager time is recorded too. Floors use the ceilings measured at the start of the
run. Without a GPU the same code runs through the Triton interpreter at small shapes: timings are then
wall-clock interpreter seconds (column `timing` = "interpreter"), with no floor.
"""

from __future__ import annotations

import math
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kernels import MXFP4Tensor, from_openai, mxfp4_linear, mxfp4_to_dense, prepare_mxfp4
from kernels.reference import reference_linear

from .clocks import COLUMNS as CLOCK_COLUMNS
from .clocks import ClockSampler
from .hardware import event_ms

ON_GPU = torch.cuda.is_available()
DEFAULT_L2_BYTES = 50 * 2**20

#: relative error allowed against the fp32 reference: bf16 output rounding is ~2^-9 per element, so a norm-wise
#: error above 1e-2 means a wrong result, not rounding. Lossy variants (MXFP8 activations) get their own bound
#: and report the error they reach as their accuracy cost.
TOL = 1e-2
TOL_LOSSY = 8e-2
#: ... and against reference_moe, whose kernels keep two bf16 intermediates (SwiGLU output, mlp2 rows): with
#: the interpreter's truncating bf16 casts ~9e-3 on CPU, far below the >= 1e-1 of any real bug
TOL_MOE = 2e-2


def tolerance(variant: str, op: str = "linear") -> float:
    """The relative error a variant's point may reach and still count as correct: TOL (linear) or TOL_MOE,
    TOL_LOSSY for a variant that quantizes the activations (results.lossy)."""
    from .results import lossy

    return TOL_LOSSY if lossy(variant) else (TOL if op == "linear" else TOL_MOE)


def device() -> torch.device:
    return torch.device("cuda" if ON_GPU else "cpu")


def l2_bytes() -> int:
    if ON_GPU:
        return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", DEFAULT_L2_BYTES) or DEFAULT_L2_BYTES
    return DEFAULT_L2_BYTES


def copies_for(bytes_per_call: float, l2: int | None = None) -> int:
    """Distinct weight copies so one replay over all of them touches >= 4x the L2 (one in the interpreter,
    which has no cache to defeat)."""
    if not ON_GPU and l2 is None:
        return 1
    return max(1, math.ceil(4 * (l2 or l2_bytes()) / max(bytes_per_call, 1)))


def random_mxfp4(n: int, k: int, *, seed: int, dev=None, lead: tuple[int, ...] = ()) -> MXFP4Tensor:
    """Random MXFP4 weight made directly from bytes (no dense copy): codes uniform, scale bytes 118..124
    (|w| up to ~0.2, like trained weights), deterministic by seed."""
    dev = dev or device()
    g = torch.Generator(device=dev).manual_seed(seed)
    blocks = torch.randint(0, 256, (*lead, n, k // 32, 16), generator=g, device=dev, dtype=torch.uint8)
    scales = torch.randint(118, 125, (*lead, n, k // 32), generator=g, device=dev, dtype=torch.uint8)
    return from_openai(blocks, scales)


# ---- timing ------------------------------------------------------------------------------------------------


def _percentile(vals: Sequence[float], q: float) -> float:
    s = sorted(vals)
    idx = min(len(s) - 1, max(0, round(q * (len(s) - 1))))
    return s[idx]


#: Bytes allocated, written and freed right before each point's buffers are made (settle_allocator).
SETTLE_BYTES = 1 << 30


def settle_allocator() -> None:
    """Put the GPU memory in the same state before every point's buffers are made: free blocks handed back to
    the driver, then SETTLE_BYTES allocated, written and freed.

    Why: on an H100 the same MoE decode graph (gpt-oss-120b, 8 tokens) replays in 179 us or in 203 us, for
    row-major and tiled weights alike, depending only on the last large allocation made before its buffers:
    1 GiB written and freed -> 179 us, 4 GiB -> 203 us, every time (.device/slow_state.py). A point's check
    allocates fresh weights (and, for TILED configs, their tiled copies: ~3 GiB more), so without this step
    each config was timed in whichever state its own check left, which read as a 12% layout gap at decode.
    It does not control the state fully: sweeps still time the tiled 120b configs at 2-8 tokens in the slow
    state in some runs (results/20261123T105807-...-moe-regret-uniform), the row-major ones never. That remaining
    slow state was not the allocator's: tiled copies made again, after a settle or a 4 GiB churn, replay back to back
    at the same speed, and any config (row-major too) is 5-20% slower after a host gap of a few ms, which the
    spin kernel ahead of each replay now covers (labkit.hardware.SPIN_CYCLES)."""
    if ON_GPU:
        torch.cuda.empty_cache()
        buf = torch.empty(SETTLE_BYTES, dtype=torch.uint8, device="cuda")
        buf.fill_(1)
        del buf
        torch.cuda.synchronize()


def capture_graph(calls: Sequence[Callable[[], object]], *, warmup: int = 3):
    """A CUDA graph of one pass over `calls` (which have run before: compiled, allocator warm), replayed `warmup`
    times and synchronized, ready to time (GPU only)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def time_calls(calls: Sequence[Callable[[], object]], *, reps: int = 25, warmup: int = 3) -> dict:
    """Time one pass over `calls` (e.g. the same op on rotating weight copies), per call.

    GPU: CUDA-graph replays of the whole pass (median, p10, p90) and eager passes (median), each divided
    by len(calls), with the SM clock and power nvidia-smi saw during the replays (labkit.clocks: sm_mhz,
    sm_mhz_min, power_w, clock_capped; None where it cannot be read). CPU: wall-clock eager passes through the
    interpreter only. Eager p10/p90 are kept too, so runs without graph times still carry a noise band for
    comparing them.
    """
    n = len(calls)
    if not ON_GPU:
        times = []
        for _ in range(max(1, min(reps, 3))):
            t = time.perf_counter()
            for c in calls:
                c()
            times.append((time.perf_counter() - t) * 1e6 / n)
        return {"us_graph": None, "us_graph_p10": None, "us_graph_p90": None, "us_eager": statistics.median(times),
                "us_eager_p10": _percentile(times, 0.1), "us_eager_p90": _percentile(times, 0.9),
                "timing": "interpreter", **dict.fromkeys(CLOCK_COLUMNS)}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture: compiles, allocator, cuBLAS handles
        for _ in range(2):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    def timed(fn, spin: bool = False) -> float:
        return event_ms(fn, spin) * 1e3 / n

    def eager_pass():
        for c in calls:
            c()

    eager = [timed(eager_pass) for _ in range(max(5, reps // 3))]
    graph = capture_graph(calls, warmup=warmup)
    with ClockSampler() as clocks:  # the SM clock and power while the replays ran (labkit.clocks: why)
        reps_t = [timed(graph.replay, spin=True) for _ in range(reps)]
    del graph
    return {"us_graph": statistics.median(reps_t), "us_graph_p10": _percentile(reps_t, 0.1),
            "us_graph_p90": _percentile(reps_t, 0.9), "us_eager": statistics.median(eager),
            "us_eager_p10": _percentile(eager, 0.1), "us_eager_p90": _percentile(eager, 0.9), "timing": "cuda_graph",
            **clocks.result}


# ---- linear points -------------------------------------------------------------------------------------------


@dataclass
class LinearCase:
    """One point: a linear shape at M tokens through one variant config (or a baseline)."""

    shape: str
    m: int
    n: int
    k: int
    variant: str
    config: dict = field(default_factory=dict)
    bias: bool = False

    def key(self) -> dict:
        return {"op": "linear", "variant": self.variant, "config": self.config, "m": self.m, "n": self.n,
                "k": self.k, "experts": None, "top_k": None, "routing": None}


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.float()
    if not torch.isfinite(y).all():
        return math.inf
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


#: baselines that read the weight in bf16 (a dequantized copy of the case's MXFP4 weight)
BF16_WEIGHT = ("cublas_bf16", "gemv_bf16")


def _linear_fn(case: LinearCase) -> Callable:
    """f(x, w (MXFP4Tensor or prepared), w_dense or None, bias) -> y for the case's variant or baseline."""
    if case.variant == "cublas_bf16":
        return lambda x, w, wd, b: torch.nn.functional.linear(x, wd, b)
    if case.variant == "gemv_bf16":
        from kernels.linear_bf16 import gemv_bf16

        return lambda x, w, wd, b: gemv_bf16(x, wd, b, **case.config)
    if case.variant == "dequant_matmul":
        return lambda x, w, wd, b: torch.nn.functional.linear(x, mxfp4_to_dense(w), b)
    cfg = dict(case.config)
    return lambda x, w, wd, b: mxfp4_linear(x, w, b, variant=case.variant, **cfg)


def check_linear(case: LinearCase, *, seed: int, check_rows: int = 2048) -> float:
    """Relative error of the case on fresh random data against the fp32 reference (a sample of output rows)."""
    dev = device()
    w = random_mxfp4(case.n, case.k, seed=seed, dev=dev)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    x = torch.randn(case.m, case.k, generator=g, device=dev).to(torch.bfloat16)
    b = torch.randn(case.n, generator=g, device=dev).to(torch.bfloat16) if case.bias else None
    wd = mxfp4_to_dense(w) if case.variant in BF16_WEIGHT else None
    y = _linear_fn(case)(x, w, wd, b)
    rows = torch.randperm(case.n, generator=g, device=dev)[: min(check_rows, case.n)]
    sub = MXFP4Tensor(w.blocks[rows], w.scales[rows], "openai", (len(rows), case.k))
    ref = reference_linear(x.float(), sub, b[rows] if b is not None else None)
    err = _rel_err(y[:, rows], ref)
    del w, wd, y
    return err


class LinearBench:
    """Weights for one linear shape (rotating copies), shared by every case of that shape."""

    def __init__(self, n: int, k: int, *, seed: int = 1234, max_m: int = 1):
        self.n, self.k = n, k
        dev = device()
        mx_bytes = n * k // 2 + n * k // 32
        self.mx = [random_mxfp4(n, k, seed=seed + i, dev=dev) for i in range(copies_for(mx_bytes))]
        t = time.perf_counter()
        self.prepared = [prepare_mxfp4(w) for w in self.mx]
        if ON_GPU:
            torch.cuda.synchronize()
        self.prepare_us = (time.perf_counter() - t) * 1e6 / len(self.mx)
        self._dense: list[torch.Tensor] | None = None
        g = torch.Generator(device=dev).manual_seed(seed)
        self.x_all = torch.randn(max_m, k, generator=g, device=dev).to(torch.bfloat16)
        self.bias = torch.randn(n, generator=g, device=dev).to(torch.bfloat16)

    def dense(self) -> list[torch.Tensor]:
        """bf16 copies for the bf16 baselines (enough of them for their own 4x-L2 rotation)."""
        if self._dense is None:
            want = copies_for(self.n * self.k * 2)
            self._dense = [mxfp4_to_dense(self.mx[i % len(self.mx)]) for i in range(want)]
        return self._dense

    def calls(self, case: LinearCase) -> list[Callable]:
        fn = _linear_fn(case)
        x = self.x_all[: case.m]
        b = self.bias if case.bias else None
        if case.variant in BF16_WEIGHT:
            return [lambda wd=wd: fn(x, None, wd, b) for wd in self.dense()]
        return [lambda w=w: fn(x, w, None, b) for w in self.mx]

    def release(self):
        self.mx = self.prepared = self._dense = None


def measure_linear(case: LinearCase, bench: LinearBench, *, ceilings=None, seed: int = 0, reps: int = 25) -> dict:
    """One point row (DESIGN.md schema): check, then time; failures and wrong results are recorded, not raised."""
    from .results import lossy as is_lossy
    from .roofline import linear_cost

    lossy = is_lossy(case.variant)
    weight_fmt = "bf16" if case.variant in BF16_WEIGHT else "mxfp4"
    cost = linear_cost(case.m, case.n, case.k, weight=weight_fmt, act="bf16", out="bf16", bias=case.bias)
    row = {**case.key(), "shape": case.shape, "bias": case.bias, "bytes": cost.bytes, "flops": cost.flops,
           "status": "failed", "error": None, "prepare_us": bench.prepare_us, "lossy": lossy}
    try:
        err = check_linear(case, seed=seed)
        row["max_rel_err"] = err
        if not err <= tolerance(case.variant):
            row["status"] = "incorrect"
            return row
        settle_allocator()
        calls = bench.calls(case)
        row["copies"] = len(calls)
        row.update(time_calls(calls, reps=reps))
        row["status"] = "ok"
    except Exception as e:  # a config that cannot compile or launch is a result too
        return record_failure(row, e)
    return add_floor(row, cost, ceilings)


def record_failure(row: dict, e: Exception) -> dict:
    """Store why a point failed (first line and a short traceback) and keep the sweep going."""
    row["status"] = "failed"
    row["error"] = f"{type(e).__name__}: {_first_line(e)}"
    row["traceback"] = traceback.format_exc(limit=3)[-2000:]
    if ON_GPU:
        torch.cuda.synchronize()
    return row


def add_floor(row: dict, cost, ceilings) -> dict:
    """Floor, fraction of the floor and achieved rates of a timed point (GPU runs with measured ceilings)."""
    from .roofline import floor_us, frac_of_floor

    if ceilings is not None and row.get("us_graph"):
        row["floor_us"] = floor_us(cost, ceilings)
        row["frac_of_floor"] = frac_of_floor(row, ceilings)
        row["gbps"] = cost.bytes / row["us_graph"] / 1e3
        row["tflops"] = cost.flops / row["us_graph"] / 1e6
    return row


def _first_line(e: Exception) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:400]
