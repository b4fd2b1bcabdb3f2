"""Is the measured read ceiling (hardware._bandwidth: torch.sum over a 1 GiB fp32 buffer) state-dependent like
the MoE decode graph (.device/slow_state.py)? Read GB/s after 1 GiB and after 4 GiB written and freed, each
timed as now (events around one call) and with a spin kernel queued first (host latency out)."""
import statistics

import torch

from labkit.hardware import _median_ms


def churn(gb):
    b = torch.empty(int(gb * 2**30), dtype=torch.uint8, device="cuda")
    b.fill_(1)
    del b


def spin_ms(fn, reps=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


n = 1 << 30
for rep in range(3):
    for gb in (1, 4):
        torch.cuda.empty_cache()
        churn(gb)
        x = torch.randn(n // 4, device="cuda")
        plain = n / (_median_ms(x.sum, 20, 5) * 1e-3) / 1e9
        spun = n / (spin_ms(x.sum) * 1e-3) / 1e9
        print(f"rep {rep} after {gb} GiB: read {plain:7.1f} GB/s (as now), {spun:7.1f} GB/s (spin)", flush=True)
        del x  # noqa: F821
