"""GPU datasheet table, ceilings measured on the GPU at hand, and which of the two a roofline uses.

DESIGN.md "Measuring" step 1: reported speed is judged against ceilings measured in the same process.
The datasheet rows answer "how fast could this be on a GPU I do not have"; measured values override them
wherever a run has them, and an unknown GPU still works from measured ceilings alone.

Every figure below is the vendor's dense (no 2:4 sparsity) peak. Where a vendor only publishes a sparse
number the dense one is half of it; where a vendor publishes no number for a dtype, the figure is derived
from the one it does publish and the comment says so. L2 sizes are what CUDA reports
(cudaDeviceProp.l2CacheSize), because that is what buffer sizing compares against.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .clocks import ClockSampler

MiB = 2**20


@dataclass(frozen=True)
class GPUSpec:
    """One datasheet row."""

    key: str
    name: str
    mem_bw_gbps: float
    l2_bytes: int
    sm_count: int
    peak_tflops: dict = field(hash=False)   # dense TFLOP/s: "bf16", "fp8", "fp4" (only where the chip has it)
    match: tuple[str, ...] = ()             # substrings of torch.cuda.get_device_name() that identify it
    source: str = ""                        # where the figures come from, in short


_SPECS = (
    # NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100/, SXM column): 3.35 TB/s,
    # BF16 1,979 and FP8 3,958 TFLOPS "with sparsity" (dense is half); 132 SMs and 50 MB L2 from the
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper.
    GPUSpec("h100-sxm", "NVIDIA H100 SXM 80GB", 3350, 50 * MiB, 132,
            {"bf16": 989.5, "fp8": 1979.0}, ("H100 80GB HBM3", "H100 SXM"),
            "NVIDIA H100 datasheet (SXM), H100 architecture whitepaper"),
    # Same datasheet, PCIe column: 2 TB/s, BF16 1,513 / FP8 3,026 TFLOPS with sparsity; 114 SMs, 50 MB L2
    # (whitepaper).
    GPUSpec("h100-pcie", "NVIDIA H100 PCIe 80GB", 2000, 50 * MiB, 114,
            {"bf16": 756.5, "fp8": 1513.0}, ("H100 PCIe",),
            "NVIDIA H100 datasheet (PCIe), H100 architecture whitepaper"),
    # NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/, SXM column): 4.8 TB/s,
    # BF16 1,979 / FP8 3,958 TFLOPS with sparsity; same GH100 chip as H100 SXM (132 SMs, 50 MB L2).
    # An "H200 NVL" matches too: same bandwidth, but its datasheet rates are lower (BF16 1,671 sparse).
    GPUSpec("h200", "NVIDIA H200 SXM 141GB", 4800, 50 * MiB, 132,
            {"bf16": 989.5, "fp8": 1979.0}, ("H200",),
            "NVIDIA H200 datasheet (SXM)"),
    # NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100/, 80GB SXM column):
    # 2,039 GB/s, BF16 312 TFLOPS dense (624 with sparsity); no FP8. 108 SMs and 40 MB L2 from the
    # NVIDIA A100 Tensor Core GPU Architecture whitepaper.
    GPUSpec("a100-80gb", "NVIDIA A100 SXM 80GB", 2039, 40 * MiB, 108,
            {"bf16": 312.0}, ("A100-SXM4-80GB", "A100 SXM4 80GB"),
            "NVIDIA A100 datasheet (80GB SXM), A100 architecture whitepaper"),
    # NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx/, per-GPU column): 180 GB HBM3E at
    # 7.7 TB/s; FP4 18, FP8 9, FP16/BF16 4.5 PFLOPS, all "with sparsity" (dense is half). 148 SMs and a
    # 126.5 MiB L2 (132,644,864 bytes as CUDA reports it) per Chips and Cheese, "Nvidia's B200: Keeping
    # the CUDA Juggernaut Rolling". The DGX B200 datasheet's 64 TB/s over 8 GPUs (8 TB/s) is the earlier
    # 192 GB figure.
    GPUSpec("b200", "NVIDIA B200", 7700, 132_644_864, 148,
            {"bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0}, ("B200",),
            "NVIDIA HGX B200 specifications; Chips and Cheese B200 article (SMs, L2)"),
    # NVIDIA DGX Spark product page / hardware overview: 128 GB LPDDR5x at 273 GB/s, "up to 1 petaFLOP
    # FP4 AI performance" with sparsity, so 500 TFLOPS dense FP4. NVIDIA publishes no BF16/FP8 rate:
    # fp8 = fp4 / 2 and bf16 = fp4 / 4 (Blackwell tensor-core ratios with FP32 accumulation) are derived,
    # consistent with a measured 92 TFLOPS BF16 matmul (huggingface/kernels PR #283). 48 SMs and a 24 MiB
    # L2 from deviceQuery on a Spark (kubesimplify, "The DGX Spark Unpacked").
    GPUSpec("gb10", "NVIDIA GB10 (DGX Spark)", 273, 24 * MiB, 48,
            {"bf16": 125.0, "fp8": 250.0, "fp4": 500.0}, ("GB10",),
            "NVIDIA DGX Spark product page (273 GB/s, 1 PFLOP FP4 sparse); bf16/fp8 derived; deviceQuery"),
    # NVIDIA RTX Blackwell GPU Architecture whitepaper (appendix, GeForce RTX 5090): 1,792 GB/s, 170 SMs,
    # 96 MB L2; dense peak FP16/BF16 Tensor with FP32 accumulate 209.5 TFLOPS (GeForce runs FP32
    # accumulation at half rate; 419 with FP16 accumulate), FP8 with FP32 accumulate 419, FP4 1,676
    # (3,352 AI TOPS with sparsity). torch matmuls accumulate in FP32, so those are the rates listed.
    GPUSpec("rtx-5090", "NVIDIA GeForce RTX 5090", 1792, 96 * MiB, 170,
            {"bf16": 209.5, "fp8": 419.0, "fp4": 1676.0}, ("RTX 5090",),
            "NVIDIA RTX Blackwell GPU architecture whitepaper (RTX 5090)"),
    # NVIDIA RTX PRO 6000 Blackwell Workstation Edition datasheet: 96 GB GDDR7 at 1,792 GB/s, 188 SMs
    # (24,064 CUDA cores), 128 MB L2, "4000 AI TOPS" (FP4 with sparsity), so 2,000 TFLOPS dense FP4.
    # NVIDIA publishes no BF16/FP8 rate: fp8 = fp4 / 2, bf16 = fp4 / 4 (full-rate FP32 accumulation on
    # RTX PRO) are derived, consistent with a measured 417 TFLOPS BF16 matmul at 8192^3 on the Server
    # Edition (zzc0721/torch-performance-test-data issue #162). Max-Q (300 W) parts clock lower.
    GPUSpec("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", 1792, 128 * MiB, 188,
            {"bf16": 500.0, "fp8": 1000.0, "fp4": 2000.0}, ("RTX PRO 6000 Blackwell",),
            "NVIDIA RTX PRO 6000 Blackwell datasheet (4000 AI TOPS sparse FP4); bf16/fp8 derived"),
    # AMD Instinct MI300X data sheet (amd.com): 5.3 TB/s HBM3, 304 CUs, peak FP16/BF16 matrix
    # 1,307.4 TFLOPS and FP8 2,614.9 TFLOPS dense (twice that with sparsity); no FP4. The cache listed is
    # the 256 MB Infinity Cache, the last level a re-read can hit (each XCD's own L2 is only 4 MB).
    GPUSpec("mi300x", "AMD Instinct MI300X", 5300, 256 * MiB, 304,
            {"bf16": 1307.4, "fp8": 2614.9}, ("MI300X",),
            "AMD Instinct MI300X data sheet"),
)

GPUS: dict[str, GPUSpec] = {s.key: s for s in _SPECS}


def get_gpu(key: str) -> GPUSpec:
    """The datasheet row `key`; ValueError listing the known keys otherwise."""
    try:
        return GPUS[key.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown GPU {key!r}; known GPUs: {', '.join(GPUS)}") from None


def match_gpu(device_name: str) -> GPUSpec | None:
    """The row whose `match` substring occurs in `device_name` (longest match wins), or None."""
    name = device_name.lower()
    best, best_len = None, 0
    for spec in _SPECS:
        for m in spec.match:
            if m.lower() in name and len(m) > best_len:
                best, best_len = spec, len(m)
    return best


def current_device_name() -> str | None:
    """torch's name for the current GPU, or None without one."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def detect_gpu() -> GPUSpec | None:
    """The datasheet row of the current GPU; None without a GPU or for one not in the table."""
    name = current_device_name()
    return match_gpu(name) if name else None


@dataclass
class Ceilings:
    """The two (or four) rates a floor is computed against, and where they come from."""

    read_gbps: float
    bf16_tflops: float
    copy_gbps: float | None = None
    fp8_tflops: float | None = None
    l2_bytes: int | None = None
    source: str = "datasheet"     # "datasheet", "measured", or "measured+datasheet" when merged
    wake_ratio: float | None = None  # measured: wake_ratio() of the read buffer's sum, the timing's own check
    spin_cycles: int | None = None  # measured: SPIN_CYCLES when they were
    # measured: the bf16 rate of SUSTAINED_CALLS matmuls back to back, and the SM clocks (MHz) of both bf16 timings
    # (None where nvidia-smi is missing); a floor is never computed against these (SUSTAINED_CALLS says why kept)
    bf16_tflops_sustained: float | None = None
    bf16_mhz: float | None = None
    bf16_sustained_mhz: float | None = None

    def as_meta(self) -> dict:
        """The `ceilings` object of a run's meta.json."""
        return {"read_gbps": self.read_gbps, "bf16_tflops": self.bf16_tflops, "copy_gbps": self.copy_gbps,
                "fp8_tflops": self.fp8_tflops, "source": self.source, "wake_ratio": self.wake_ratio,
                "spin_cycles": self.spin_cycles, "bf16_tflops_sustained": self.bf16_tflops_sustained,
                "bf16_mhz": self.bf16_mhz, "bf16_sustained_mhz": self.bf16_sustained_mhz}


def datasheet_ceilings(spec: GPUSpec) -> Ceilings:
    """Ceilings from a datasheet row (copy bandwidth counts bytes read plus written, same peak)."""
    return Ceilings(read_gbps=spec.mem_bw_gbps, bf16_tflops=spec.peak_tflops["bf16"], copy_gbps=spec.mem_bw_gbps,
                    fp8_tflops=spec.peak_tflops.get("fp8"), l2_bytes=spec.l2_bytes, source="datasheet")


_RATES = ("read_gbps", "bf16_tflops", "copy_gbps", "fp8_tflops")
_SUSTAINED = ("bf16_tflops_sustained", "bf16_mhz", "bf16_sustained_mhz")


def _number(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def ceilings_from_meta(meta_ceilings: Mapping) -> Ceilings:
    """Ceilings from a meta.json `ceilings` object; ValueError naming a missing rate."""
    vals = {k: _number(meta_ceilings.get(k)) for k in _RATES}
    for k in ("read_gbps", "bf16_tflops"):
        if not vals[k] or vals[k] <= 0:
            raise ValueError(f"ceilings have no {k} (got {meta_ceilings.get(k)!r}); was the run made without a GPU?")
    l2 = meta_ceilings.get("l2_bytes")
    return Ceilings(**vals, l2_bytes=int(l2) if l2 else None, source=meta_ceilings.get("source") or "measured",
                    wake_ratio=_number(meta_ceilings.get("wake_ratio")), spin_cycles=meta_ceilings.get("spin_cycles"),
                    **{k: _number(meta_ceilings.get(k)) for k in _SUSTAINED})


def merge_ceilings(measured: Ceilings | Mapping | None, datasheet: Ceilings | None) -> Ceilings:
    """Measured values wherever the run has them, datasheet values for the rest."""
    if isinstance(measured, Ceilings):
        measured = {k: getattr(measured, k) for k in (*_RATES, "l2_bytes")}
    vals = {k: _number((measured or {}).get(k)) for k in _RATES}
    vals["l2_bytes"] = (measured or {}).get("l2_bytes") or None
    if not any(vals.values()):
        if datasheet is None:
            raise ValueError(f"no ceilings: give a GPU from the table ({', '.join(GPUS)}) or measured ceilings")
        return datasheet
    if datasheet is None:
        return ceilings_from_meta({**vals, "source": "measured"})
    filled = [k for k, v in vals.items() if not v and getattr(datasheet, k)]
    vals.update({k: getattr(datasheet, k) for k in filled})
    mixed = any(k in _RATES for k in filled)   # a datasheet L2 size does not make the rates less measured
    return Ceilings(**vals, source="measured+datasheet" if mixed else "measured")


def resolve_ceilings(gpu: str | GPUSpec | None = None, *, run_dir: str | Path | None = None,
                     measured: Ceilings | Mapping | None = None) -> Ceilings:
    """The ceilings a roofline uses: `gpu`'s datasheet row, overridden by measured values from `measured`
    or from the meta.json of `run_dir`. gpu="auto" is the current GPU (measured when not in the table)."""
    spec = None
    if isinstance(gpu, GPUSpec):
        spec = gpu
    elif gpu == "auto":
        name = current_device_name()
        if name is None:
            raise ValueError(f"gpu 'auto' needs a GPU and there is none; known GPUs: {', '.join(GPUS)}")
        spec = match_gpu(name)
        if spec is None and measured is None and run_dir is None:
            measured = measure_ceilings()   # not in the table: its own measured ceilings are all there is
    elif gpu:
        spec = get_gpu(gpu)
    if run_dir is not None:
        from .runs import open_run

        measured = open_run(run_dir).meta.get("ceilings") or {}
        if not any(_number(measured.get(k)) for k in _RATES):
            raise ValueError(f"run folder {run_dir} has no measured ceilings in its meta.json")
    return merge_ceilings(measured, datasheet_ceilings(spec) if spec else None)


def gpu_table():
    """The datasheet as a DataFrame: one row per GPU, with its ridge point (bf16 flops per byte)."""
    import pandas as pd

    return pd.DataFrame([{
        "key": s.key, "name": s.name, "mem_bw_gbps": s.mem_bw_gbps, "l2_mib": round(s.l2_bytes / MiB, 1),
        "sm_count": s.sm_count, "bf16_tflops": s.peak_tflops.get("bf16"), "fp8_tflops": s.peak_tflops.get("fp8"),
        "fp4_tflops": s.peak_tflops.get("fp4"),
        "ridge_flop_per_byte": round(s.peak_tflops["bf16"] * 1e3 / s.mem_bw_gbps),
        "source": s.source,
    } for s in _SPECS])


# ---- measuring (GPU only) ----------------------------------------------------------------------------------


#: GPU clock cycles of the spin kernel queued ahead of each timed call (~0.5 ms at H100 clocks). It does two jobs:
#: it outlasts the host's enqueueing of the start event and the work, so the events bracket device time only; and
#: it warms the GPU up. After a host gap of 1-50 ms an H100 runs the next work slower while its clocks ramp (the
#: gpt-oss-120b 16-token MoE layer 240 -> 253-291 us, a 1 GiB sum 352 -> 497-519 us behind 100k cycles; 240 us at
#: every gap behind 1M or 4M: results/20261127T121442-h100-80gb-hbm3-idle-probe). With the old 100k cycles (~50 us)
#: a replay that followed a host stall timed in that slow state: the two "modes" of 120b at 4-32 tokens
#: (results/20261127T121200-h100-80gb-hbm3-slow-mode: back to back never slow, after 3 ms gaps 5-20% slower, tiled
#: and row-major weights alike).
#: LAB_SPIN_CYCLES overrides it for a GPU that wakes more slowly: each run's ceilings record `wake_ratio`
#: (wake_ratio()), and the sweep warns when it is above WAKE_LIMIT.
SPIN_CYCLES = int(os.environ.get("LAB_SPIN_CYCLES") or 1_000_000)
#: The most a spin-led call timed after a host gap may take over the same call timed warm (wake_ratio) before the
#: sweep warns that its times may carry the GPU's wake-up.
WAKE_LIMIT = 1.05


def event_ms(fn, spin: bool = True) -> float:
    """Time of fn() in ms between two CUDA events. spin: a sleep kernel (SPIN_CYCLES) queued first keeps the GPU
    busy while the host enqueues the start event and fn's launches, so host launch latency stays out of the time,
    and brings the GPU's clocks back up after any host gap before it (SPIN_CYCLES says why both matter).

    Why: without it, torch.sum over 1 GiB on an H100 read 2.47-2.88 TB/s from one measurement to the next,
    with it 3.04 TB/s every time (.device/ceiling_ab.py); the lm_head at 1 token, timed as one graph replay,
    read 128 instead of 123 us (.device/spin_ab.py)."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if spin and SPIN_CYCLES:
        torch.cuda._sleep(SPIN_CYCLES)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def wake_ratio(fn, *, gap_s: float = 0.03, reps: int = 7) -> float:
    """Median spin-led time of fn() (event_ms) right after a host sleep of gap_s, over its median back to back:
    about 1 when the spin kernel ahead of each timed call outlasts the GPU's wake-up (SPIN_CYCLES says why that
    matters); fn should be DRAM-bound and take ~0.1 ms or more. GPU only."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    warm = statistics.median(event_ms(fn) for _ in range(reps))
    after_gap = []
    for _ in range(reps):
        time.sleep(gap_s)
        after_gap.append(event_ms(fn))
    return statistics.median(after_gap) / warm


def _median_ms(fn, reps: int, warmup: int) -> float:
    """Median device time of fn() in ms over `reps` spin-led, event-timed calls after `warmup` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(event_ms(fn) for _ in range(reps))


def _fp8_matmul(a, b):
    """A callable running an fp8 matmul through torch._scaled_mm, or None where it is not available."""
    import torch

    if not hasattr(torch, "_scaled_mm"):
        return None
    one = torch.ones((), device=a.device, dtype=torch.float32)
    for dtype_name in ("float8_e4m3fn", "float8_e4m3fnuz"):   # fnuz on AMD Instinct
        dtype = getattr(torch, dtype_name, None)
        if dtype is None:
            continue
        a8, b8 = a.to(dtype), b.to(dtype).t().contiguous().t()   # mat2 column-major, as _scaled_mm wants
        try:
            torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            torch.cuda.synchronize()
        except (RuntimeError, TypeError, ValueError):
            continue
        return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return None


def _bandwidth(nbytes: int, dev, g, reps: int, warmup: int) -> tuple[float, float, float]:
    """Read (torch.sum) and copy (bytes read + written) bandwidth in GB/s over a random fp32 buffer, and the sum's
    wake_ratio."""
    import torch

    x = torch.randn(nbytes // 4, device=dev, generator=g)
    y = torch.empty_like(x)
    read = nbytes / (_median_ms(lambda: x.sum(), reps, warmup) * 1e-3) / 1e9
    copy = 2 * nbytes / (_median_ms(lambda: y.copy_(x), reps, warmup) * 1e-3) / 1e9
    return read, copy, wake_ratio(lambda: x.sum(), reps=3 if reps < 10 else 7)


#: Matmuls timed back to back for `bf16_tflops_sustained` (8192^3 each: ~0.4 s on an H100 or H200). Why: the bf16
#: ceiling is the median of single spin-led calls, which run at the GPU's boost clock, while a matmul held for
#: longer runs at the clock its power limit allows: on an H200 786 TFLOP/s at 1965 MHz single, 684 at 1597 MHz for
#: 300 calls (results/20261129T003820-h200-bf16-grouped; 802 and 693 in ...034750-h200-moe-h200-held, where the
#: large-token MoE layers kept 1965-1980 MHz, 1740-1815 in stop 65's runs). The
#: floor stays DESIGN.md's (single calls); `./lab targets` shows compute-bound points against this rate beside it.
SUSTAINED_CALLS = 300


def measure_ceilings(device=None, *, quick: bool = False) -> Ceilings:
    """Measure read and copy bandwidth and the bf16 (and fp8) matmul rates on a GPU (DESIGN.md step 1).

    Bandwidth: torch.sum over (and a copy of) a random fp32 buffer at least 8x the L2, bytes moved / time.
    Matmul: 8192^3 on random data (never zeros: the tensor cores draw less power on zeros and clock
    higher). CUDA events, warm-up, median of the repetitions. quick=True: smaller and fewer, for tests.
    Also the timing's own check, `wake_ratio` of the read buffer's sum (above WAKE_LIMIT: raise LAB_SPIN_CYCLES).
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("measure_ceilings needs a GPU and torch sees none")
    dev = torch.device("cuda" if device is None else device)
    if dev.type != "cuda":
        raise RuntimeError(f"measure_ceilings needs a GPU device, got {dev}")
    with torch.cuda.device(dev):
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0
        free = torch.cuda.mem_get_info(dev)[0]
        reps, warmup = (5, 2) if quick else (20, 5)
        want = max((4 if quick else 8) * l2, (256 if quick else 1024) * MiB)
        nbytes = min(want, free // 4) // 4 * 4
        g = torch.Generator(device=dev).manual_seed(0)
        read_gbps, copy_gbps, wake = _bandwidth(nbytes, dev, g, reps, warmup)
        n = 4096 if quick else 8192
        a = torch.randn(n, n, device=dev, generator=g, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, generator=g, dtype=torch.bfloat16)
        flops = 2 * n**3
        with ClockSampler() as burst:
            bf16_tflops = flops / (_median_ms(lambda: a @ b, reps, warmup) * 1e-3) / 1e12
        calls = 10 if quick else SUSTAINED_CALLS
        c = torch.empty_like(a)

        def held_matmuls():
            for _ in range(calls):
                torch.matmul(a, b, out=c)

        with ClockSampler() as held:
            sustained = flops * calls / (event_ms(held_matmuls) * 1e-3) / 1e12
        fp8 = _fp8_matmul(a, b)
        fp8_tflops = flops / (_median_ms(fp8, reps, warmup) * 1e-3) / 1e12 if fp8 else None
    return Ceilings(read_gbps=read_gbps, bf16_tflops=bf16_tflops, copy_gbps=copy_gbps, fp8_tflops=fp8_tflops,
                    l2_bytes=l2 or None, source="measured", wake_ratio=wake, spin_cycles=SPIN_CYCLES,
                    bf16_tflops_sustained=sustained, bf16_mhz=burst.result["sm_mhz"],
                    bf16_sustained_mhz=held.result["sm_mhz"])
