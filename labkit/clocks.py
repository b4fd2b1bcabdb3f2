"""The GPU's SM clock and power while a point is timed, so that a reader can tell a slower kernel from a slower GPU.

Why: at large token counts the MoE layer runs an H100 at its 700 W limit; the driver then lowers the SM clock
(clock-event reason "SW power cap"), and single CUDA-graph replays of one config spread over two modes about 100 MHz
and 5% apart, the slow replays being the ones at the lower clock (20b at 8192 tokens: correlation -0.69 to -0.78
between replay time and SM clock; 120b at 32 tokens: 1980 MHz throughout;
results/20261127T103603-h100-80gb-hbm3-clock-probe). A median then lands in either mode, and two configs timed
minutes apart can differ by the GPU's state rather than by their code.

`ClockSampler` reads `nvidia-smi` in its loop mode (every 20 ms) beside the timed replays and summarizes what it saw:
mean and lowest SM clock, mean power, and the fraction of samples with a capping reason active. Where nvidia-smi
is missing or fails (a CPU machine, a container without it), the summary is all None and timing goes on.
"""

from __future__ import annotations

import atexit
import bisect
import shutil
import subprocess
import threading
import time

#: nvidia-smi fields sampled, in this order
FIELDS = ("clocks.sm", "power.draw", "clocks_event_reasons.active")
#: clock-event reason bits that mean the clock was held down: SW power cap, HW slowdown, SW thermal, HW thermal,
#: HW power brake (nvidia-smi -q -d PERFORMANCE; NVML's nvmlClocksEventReason* constants)
CAPPING = 0x04 | 0x08 | 0x20 | 0x40 | 0x80
#: the columns a summary adds to a point
COLUMNS = ("sm_mhz", "sm_mhz_min", "power_w", "clock_capped")


def summarize(lines) -> dict:
    """nvidia-smi CSV lines (FIELDS, no header, no units) -> {sm_mhz, sm_mhz_min, power_w, clock_capped}: mean and
    lowest SM clock (MHz), mean power (W), fraction of samples with a CAPPING reason; None for each without data.
    Lines that do not parse (a "[N/A]" field, a partial line) are skipped."""
    clocks, powers, capped = [], [], []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        try:
            clock, power, reasons = float(parts[0]), float(parts[1]), int(parts[2], 16)
        except ValueError:
            continue
        clocks.append(clock)
        powers.append(power)
        capped.append(bool(reasons & CAPPING))
    if not clocks:
        return dict.fromkeys(COLUMNS)
    return {"sm_mhz": round(sum(clocks) / len(clocks), 1), "sm_mhz_min": min(clocks),
            "power_w": round(sum(powers) / len(powers), 1), "clock_capped": round(sum(capped) / len(capped), 3)}


class ClockSampler:
    """Context manager: the samples nvidia-smi took while the block ran (at least the first one after it, for
    blocks shorter than the sampling interval); `.result` then holds summarize()'s dict. One nvidia-smi process,
    started on first use, samples every `interval_ms` for the rest of the process (a sweep's points share it)."""

    def __init__(self, interval_ms: int = 20):
        self.interval_ms = interval_ms
        self.result = dict.fromkeys(COLUMNS)
        self._t0 = 0.0

    def __enter__(self):
        self._monitor = _Monitor.get(self.interval_ms)
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        if self._monitor is not None:
            self.result = summarize(self._monitor.lines_between(self._t0, time.monotonic()))
        return False


class _Monitor:
    """The one nvidia-smi loop of this process and its host-stamped lines."""

    _instance: _Monitor | None = None
    _failed = False

    @classmethod
    def get(cls, interval_ms: int) -> _Monitor | None:
        if cls._instance is None and not cls._failed:
            exe = shutil.which("nvidia-smi")
            try:
                cls._instance = cls(exe, interval_ms) if exe else None
            except OSError:
                cls._instance = None
            cls._failed = cls._instance is None
        return cls._instance

    def __init__(self, exe: str, interval_ms: int):
        cmd = [exe, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits", "-lms", str(interval_ms)]
        gpu = _torch_gpu_id()
        if gpu is not None:
            cmd += ["-i", gpu]
        self.interval = interval_ms / 1e3
        self.times: list[float] = []  # host stamps, ascending, and their lines
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        atexit.register(self.proc.terminate)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)  # the line before its stamp: a reader that sees the stamp sees the line
            self.times.append(time.monotonic())

    def lines_between(self, t0: float, t1: float) -> list[str]:
        """Lines stamped in [t0, t1], else the first one after t1 (waiting up to a few intervals for it)."""
        deadline = t1 + 5 * self.interval + 0.5  # nvidia-smi's first sample comes a few hundred ms after its start
        while True:
            n = len(self.times)
            lo, hi = bisect.bisect_left(self.times, t0, 0, n), bisect.bisect_right(self.times, t1, 0, n)
            if hi > lo:
                return self.lines[lo:hi]
            if hi < n:
                return self.lines[hi:hi + 1]
            if time.monotonic() > deadline or self.proc.poll() is not None:
                return []
            time.sleep(self.interval / 4)


def _torch_gpu_id() -> str | None:
    """nvidia-smi's id of torch's current GPU (its UUID, which CUDA_VISIBLE_DEVICES renumbering does not change)."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    except Exception:  # noqa: BLE001  (no CUDA, or a torch without .uuid: sample whatever nvidia-smi shows first)
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
