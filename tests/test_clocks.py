"""labkit.clocks: what the timing harness records of the GPU's clock and power beside each point."""

import os
import stat
import time

import pytest

from labkit import clocks


def test_summary_of_samples():
    """Mean and lowest SM clock, mean power and the fraction of samples held down by a capping reason (SW power
    cap 0x4 here; 0x1, idle, is not one); lines that do not parse are skipped, none at all gives None."""
    lines = ["1755, 612.5, 0x0000000000000004\n", "1980, 301.5, 0x0000000000000000\n", "[N/A], 1, 0x0\n",
             "1500, 700.0\n", "1620, 650.0, 0x0000000000000001\n"]
    s = clocks.summarize(lines)
    assert s == {"sm_mhz": round((1755 + 1980 + 1620) / 3, 1), "sm_mhz_min": 1620.0,
                 "power_w": round((612.5 + 301.5 + 650.0) / 3, 1), "clock_capped": round(1 / 3, 3)}
    assert clocks.summarize([]) == dict.fromkeys(clocks.COLUMNS)


@pytest.fixture
def fresh_monitor(monkeypatch):
    monkeypatch.setattr(clocks._Monitor, "_instance", None)
    monkeypatch.setattr(clocks._Monitor, "_failed", False)
    yield
    inst = clocks._Monitor._instance
    if inst is not None:
        inst.proc.terminate()


def test_sampler_reads_a_looping_nvidia_smi(tmp_path, monkeypatch, fresh_monitor):
    """ClockSampler reads nvidia-smi's loop mode (a stand-in script printing a sample every 10 ms): a block
    shorter than the interval still gets the first sample after it; a second block shares the one process."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nwhile true; do echo '1710, 640.25, 0x0000000000000004'; sleep 0.01; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with clocks.ClockSampler(interval_ms=10) as c:
        pass
    assert c.result == {"sm_mhz": 1710.0, "sm_mhz_min": 1710.0, "power_w": 640.2, "clock_capped": 1.0}
    first = clocks._Monitor._instance
    with clocks.ClockSampler(interval_ms=10) as c2:
        time.sleep(0.1)
    assert c2.result["sm_mhz"] == 1710.0 and clocks._Monitor._instance is first


def test_sampler_without_nvidia_smi_records_none(tmp_path, monkeypatch, fresh_monitor):
    """Without nvidia-smi (a CPU machine) the columns are None and nothing fails."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with clocks.ClockSampler() as c:
        pass
    assert c.result == dict.fromkeys(clocks.COLUMNS)
