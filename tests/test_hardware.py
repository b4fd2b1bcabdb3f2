"""GPU datasheet table, detection by device name, ceilings from datasheets, runs and measurements."""

import pytest
import torch

from labkit import hardware as hw
from labkit.runs import create_run

REQUIRED = ("h100-sxm", "h100-pcie", "h200", "a100-80gb", "b200", "gb10", "rtx-5090", "rtx-pro-6000", "mi300x")


def test_table_has_the_required_gpus_with_sane_rows():
    assert set(REQUIRED) <= set(hw.GPUS)
    for key, s in hw.GPUS.items():
        assert s.key == key and s.name and s.source and s.match
        assert s.mem_bw_gbps > 100 and s.sm_count > 0 and s.l2_bytes >= 2**20
        assert s.peak_tflops["bf16"] > 0
        # dense rates of one chip go up as precision goes down, 2x per step on these chips
        if "fp8" in s.peak_tflops:
            assert s.peak_tflops["fp8"] == pytest.approx(2 * s.peak_tflops["bf16"], rel=0.01)
        if "fp4" in s.peak_tflops:
            assert s.peak_tflops["fp4"] >= 2 * s.peak_tflops["fp8"]


def test_datasheet_figures_spot_checks():
    assert hw.get_gpu("gb10").mem_bw_gbps == 273
    assert hw.get_gpu("h100-sxm").peak_tflops == {"bf16": 989.5, "fp8": 1979.0}
    assert "fp4" not in hw.get_gpu("h200").peak_tflops and "fp8" not in hw.get_gpu("a100-80gb").peak_tflops
    assert hw.get_gpu("H100-SXM").key == "h100-sxm"    # keys are case-insensitive


def test_unknown_gpu_lists_known_keys():
    with pytest.raises(ValueError, match=r"unknown GPU 'h999'; known GPUs: h100-sxm, .*mi300x"):
        hw.get_gpu("h999")


@pytest.mark.parametrize("device_name, key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB10", "gb10"),
    ("NVIDIA GeForce RTX 5090", "rtx-5090"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000"),
    ("AMD Instinct MI300X", "mi300x"),
    ("NVIDIA H100 NVL", None),          # different datasheet: not guessed
    ("NVIDIA A100 80GB PCIe", None),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_match_gpu_by_device_name(device_name, key):
    spec = hw.match_gpu(device_name)
    assert (spec.key if spec else None) == key


def test_detect_gpu_without_a_gpu_is_none():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert hw.detect_gpu() is None


def test_datasheet_ceilings_and_meta_round_trip():
    c = hw.datasheet_ceilings(hw.get_gpu("h100-sxm"))
    assert (c.read_gbps, c.bf16_tflops, c.fp8_tflops, c.source) == (3350, 989.5, 1979.0, "datasheet")
    meta = c.as_meta()
    assert set(meta) == {"read_gbps", "bf16_tflops", "copy_gbps", "fp8_tflops", "source", "wake_ratio", "spin_cycles",
                         "bf16_tflops_sustained", "bf16_mhz", "bf16_sustained_mhz"}
    assert meta["wake_ratio"] is None and meta["spin_cycles"] is None  # nothing was timed
    assert meta["bf16_tflops_sustained"] is None
    back = hw.ceilings_from_meta(meta)
    assert (back.read_gbps, back.bf16_tflops, back.fp8_tflops, back.source) == (3350, 989.5, 1979.0, "datasheet")
    measured = hw.ceilings_from_meta({**meta, "source": "measured", "wake_ratio": 1.01, "spin_cycles": 100_000,
                                      "bf16_tflops_sustained": 684.0, "bf16_mhz": 1965.0})
    assert measured.as_meta()["wake_ratio"] == 1.01 and measured.as_meta()["spin_cycles"] == 100_000
    assert measured.bf16_tflops_sustained == 684.0 and measured.bf16_mhz == 1965.0
    assert measured.bf16_sustained_mhz is None


def test_ceilings_from_meta_rejects_a_cpu_run():
    with pytest.raises(ValueError, match="no read_gbps"):
        hw.ceilings_from_meta({"read_gbps": None, "bf16_tflops": None})


def test_measured_values_override_the_datasheet():
    sheet = hw.datasheet_ceilings(hw.get_gpu("h100-sxm"))
    c = hw.merge_ceilings({"read_gbps": 3000.0, "bf16_tflops": 679.0}, sheet)
    assert (c.read_gbps, c.bf16_tflops) == (3000.0, 679.0)
    assert c.fp8_tflops == 1979.0 and c.source == "measured+datasheet"     # fp8 not measured: datasheet
    full = hw.Ceilings(3000.0, 679.0, copy_gbps=2900.0, fp8_tflops=1200.0, l2_bytes=50 * 2**20, source="measured")
    assert hw.merge_ceilings(full, sheet).source == "measured"
    no_l2 = hw.merge_ceilings({**full.as_meta(), "l2_bytes": None}, sheet)
    assert no_l2.source == "measured" and no_l2.l2_bytes == 50 * 2**20 and no_l2.fp8_tflops == 1200.0
    assert hw.merge_ceilings(None, sheet) is sheet


def test_unknown_gpu_works_from_measured_ceilings_alone():
    c = hw.merge_ceilings({"read_gbps": 1000.0, "bf16_tflops": 100.0}, None)
    assert (c.read_gbps, c.bf16_tflops, c.source) == (1000.0, 100.0, "measured")
    with pytest.raises(ValueError, match="no ceilings"):
        hw.merge_ceilings(None, None)


def test_resolve_ceilings_from_a_run_folder(tmp_path):
    run = create_run("t", out=tmp_path / "r", ceilings={"read_gbps": 3010.0, "bf16_tflops": 680.0})
    c = hw.resolve_ceilings("h100-sxm", run_dir=run.path)
    assert (c.read_gbps, c.bf16_tflops, c.fp8_tflops) == (3010.0, 680.0, 1979.0)
    assert hw.resolve_ceilings(run_dir=run.path).source == "measured"
    cpu_run = create_run("t", out=tmp_path / "cpu")
    with pytest.raises(ValueError, match="no measured ceilings"):
        hw.resolve_ceilings("h100-sxm", run_dir=cpu_run.path)


def test_gpu_auto_without_a_gpu_is_an_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="needs a GPU.*known GPUs: h100-sxm"):
        hw.resolve_ceilings("auto")


def test_measure_ceilings_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a GPU"):
        hw.measure_ceilings(quick=True)


def test_gpu_table():
    df = hw.gpu_table()
    assert list(df["key"]) == list(hw.GPUS)
    h100 = df.set_index("key").loc["h100-sxm"]
    assert h100["ridge_flop_per_byte"] == round(989.5e3 / 3350) and h100["l2_mib"] == 50


@pytest.mark.gpu
def test_measure_ceilings_on_the_gpu():
    c = hw.measure_ceilings(quick=True)
    assert c.source == "measured" and c.read_gbps > 50 and c.copy_gbps > 50 and c.bf16_tflops > 5
    spec = hw.detect_gpu()
    if spec is not None:   # a measurement never beats the datasheet by much
        assert c.read_gbps < 1.15 * spec.mem_bw_gbps
        assert c.bf16_tflops < 1.15 * spec.peak_tflops["bf16"]
        if c.fp8_tflops is not None and "fp8" in spec.peak_tflops:
            assert c.fp8_tflops < 1.15 * spec.peak_tflops["fp8"]
    # matmuls held back to back never beat single ones by much (they run at the clock the power limit allows)
    assert 0.5 * c.bf16_tflops < c.bf16_tflops_sustained < 1.1 * c.bf16_tflops
    meta = c.as_meta()
    assert hw.ceilings_from_meta(meta).read_gbps == c.read_gbps
    assert hw.ceilings_from_meta(meta).bf16_tflops_sustained == c.bf16_tflops_sustained


@pytest.mark.gpu
def test_event_ms_times_work_after_a_host_gap_as_warm_work():
    """The spin kernel ahead of each timed call (SPIN_CYCLES) must outlast the GPU's wake-up: an H100 left idle by
    the host for 1-50 ms runs the next work 5-50% slower while its clocks ramp, and behind the old ~50 us spin a
    1 GiB sum took 497-519 us after 10-50 ms gaps against 352 warm (results/20261127T121442-h100-80gb-hbm3-idle-
    probe); with SPIN_CYCLES at 100k this test failed on the H100 (0.50-0.58 ms against 0.36)."""
    x = torch.ones(2**28, device="cuda")  # 1 GiB fp32: DRAM-bound
    assert hw.wake_ratio(lambda: x.sum()) < hw.WAKE_LIMIT
    c = hw.measure_ceilings(quick=True)
    assert c.wake_ratio is not None and c.as_meta()["spin_cycles"] == hw.SPIN_CYCLES


def test_spin_cycles_can_be_raised_for_a_slower_waking_gpu():
    import subprocess
    import sys

    code = "import labkit.hardware as h; print(h.SPIN_CYCLES)"
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "LAB_SPIN_CYCLES": "3000000"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "3000000"
