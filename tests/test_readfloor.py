"""The plain-read floor: the reader reads every word, points are picked by their floor's term, and targets
show each best time over the read time of its bytes."""

import math

import pandas as pd
import pytest
import torch

from labkit import readfloor
from labkit.cli import main
from labkit.readfloor import FILE, MOE_SHARES, measure, memory_bound, read_call, read_us, split_words
from labkit.runs import create_run
from labkit.targets import TARGETS, Target, judge, markdown
from tests.test_targets import GPU, LM_HEAD, _lm_head, _run


def test_read_call_sums_every_tile(device):
    """Each program sums its own tile, the last one partial: so every word is loaded (none is dead code)."""
    g = torch.Generator().manual_seed(0)
    words = torch.randint(-1000, 1000, (5 * 256 + 37,), generator=g, dtype=torch.int32).to(device)
    sums = read_call(words, block=256, warps=4)()
    want = torch.nn.functional.pad(words.cpu(), (0, 256 - 37)).view(-1, 256).sum(1).to(torch.int32)
    assert torch.equal(sums.cpu(), want)


def test_read_call_wants_one_dimensional_int32():
    with pytest.raises(ValueError, match="1-D int32"):
        read_call(torch.zeros(8, dtype=torch.float32))
    with pytest.raises(ValueError, match="1-D int32"):
        read_call(torch.zeros(2, 8, dtype=torch.int32))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message")
def test_read_us_and_the_cli_need_a_gpu(capsys):
    with pytest.raises(RuntimeError, match="GPU"):
        read_us(1 << 20)
    assert main(["readfloor"]) == 2
    assert "GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_read_us_on_the_gpu():
    """64 MB read like a sweep point: a plausible rate (well above PCIe, below the datasheet's HBM), in one
    launch and in two."""
    for shares in ((1.0,), MOE_SHARES):
        t = read_us(64 << 20, shares=shares, reps=10)
        assert t["copies"] >= 2 and t["read_p10"] <= t["read_us"] <= t["read_p90"]
        assert 500 < t["read_gbps"] < 5000


def test_split_words_cuts_consecutive_parts_that_add_up():
    assert split_words(10, MOE_SHARES) == [6, 4] and split_words(7, (1.0,)) == [7]
    assert sum(split_words(52957440 // 4, MOE_SHARES)) == 52957440 // 4


def test_measure_reads_moe_points_in_one_launch_and_in_two(monkeypatch):
    calls = []

    def fake_read_us(nbytes, *, shares=(1.0,), reps=40):
        calls.append((nbytes, shares))
        return {"read_us": 10.0 * len(shares), "read_p10": 9.0, "read_p90": 11.0, "read_gbps": 1.0, "copies": 2}

    monkeypatch.setattr(readfloor, "read_us", fake_read_us)
    pts = pd.DataFrame({"problem": ["lm_head", "gpt-oss-20b"], "m": [1, 1], "bytes": [3e8, 5e7]})
    seen = []
    df = measure(pts, seen.append)
    assert calls == [(300000000, (1.0,)), (50000000, (1.0,)), (50000000, MOE_SHARES)]
    assert list(zip(df.problem, df.launches, df.read_us)) == [("lm_head", 1, 10.0), ("gpt-oss-20b", 1, 10.0),
                                                              ("gpt-oss-20b", 2, 20.0)]
    assert len(seen) == 3 and list(df.columns) == readfloor.COLUMNS


def _judged(rows):
    df = pd.DataFrame(rows)
    df.attrs["ceilings"] = {GPU: {"read_gbps": 3000.0, "bf16_tflops": 800.0}}
    return df


def test_memory_bound_keeps_points_whose_floor_is_the_bytes_term():
    # 3e8 bytes: 100 us at 3 TB/s; 8e10 flops: 100 us at 800 TFLOP/s (a tie counts as bytes-bound)
    j = _judged([{"problem": "lm_head", "m": 1, "bytes": 3e8, "flops": 1e9, "us": 110.0, "run_id": "a"},
                 {"problem": "lm_head", "m": 1, "bytes": 3e8, "flops": 1e9, "us": 110.0, "run_id": "a"},
                 {"problem": "lm_head", "m": 2048, "bytes": 3e8, "flops": 1e13, "us": 3000.0, "run_id": "b"},
                 {"problem": "qkv", "m": 64, "bytes": 3e8, "flops": 8e10, "us": 120.0, "run_id": "c"},
                 {"problem": "moe", "m": 8, "bytes": None, "flops": None, "us": None, "run_id": None}])
    got = memory_bound(j)
    assert list(zip(got["problem"], got["m"])) == [("lm_head", 1), ("qkv", 64)]


def _read_run(tmp_path, name, rows, gpu=GPU):
    run = create_run(name, out=tmp_path / name)
    run.update_meta(gpu=gpu)
    pd.DataFrame(rows).to_csv(run.path / FILE, index=False)
    return run.path


def test_targets_show_best_time_over_the_read_time(tmp_path):
    a = _run(tmp_path, "a", [_lm_head(1, 110.0), _lm_head(2, 120.0)], read_gbps=3000.0)
    # the read run measured 3.1e8 bytes at 3100 GB/s; the point holds 3e8 bytes: its read takes 96.8 us
    r = _read_run(tmp_path, "r", [{"problem": "lm_head", "m": 1, "bytes": 3.1e8, "read_us": 100.0,
                                   "read_gbps": 3100.0}])
    out = judge([a, r], targets=[LM_HEAD]).set_index("m")
    assert out.attrs["read_run"] == "r"
    assert out.loc[1, "x_read"] == pytest.approx(110.0 / (3.0e8 / 3100e9 * 1e6))
    # the goal's time (90% of the 100 us floor at 3 TB/s: 111.1 us) over the same read
    assert out.loc[1, "x_goal"] == pytest.approx((100.0 / 0.9) / (3.0e8 / 3100e9 * 1e6))
    assert math.isnan(out.loc[2, "x_read"]) and math.isnan(out.loc[2, "x_goal"])  # no read measured at 2 tokens
    assert main(["targets", "--runs", str(a), str(r)]) == 1  # prints the column (and lm_head 4, 8 unmeasured)


def test_x_goal_only_for_floor_targets(tmp_path):
    """A target against cuBLAS has no floor time to ask of a read: its x_goal stays NaN even where a read run
    measured the point, while the same point under a floor target gets one."""
    floor_t = Target("floor", 4, "linear", ("lm_head",), (2048,), "frac_of_floor", 0.5)
    cublas_t = Target("cublas", 4, "linear", ("lm_head",), (2048,), "vs_bf16", 0.7)
    a = _run(tmp_path, "a", [_lm_head(2048, 400.0, variant="dequant_gemm"),
                              _lm_head(2048, 300.0, variant="cublas_bf16")], read_gbps=3000.0)
    r = _read_run(tmp_path, "r", [{"problem": "lm_head", "m": 2048, "bytes": 3e8, "read_us": 100.0,
                                   "read_gbps": 3000.0}])
    out = judge([a, r], targets=[floor_t, cublas_t]).set_index("target")
    assert out.loc["floor", "x_read"] == pytest.approx(4.0) == out.loc["cublas", "x_read"]
    assert out.loc["floor", "x_goal"] == pytest.approx(4.0 * out.loc["floor", "value"] / 0.5)
    assert math.isnan(out.loc["cublas", "x_goal"])
    assert "| 4.000 |" in markdown(out.reset_index())


def test_targets_take_the_newest_read_run_of_their_gpu_and_the_probes_one_launch_rows(tmp_path):
    a = _run(tmp_path, "a", [_lm_head(1, 110.0)], read_gbps=3000.0)
    old = _read_run(tmp_path, "r1", [{"problem": "lm_head", "m": 1, "bytes": 3e8, "read_us": 100.0,
                                      "read_gbps": 3000.0}])
    probe = _read_run(tmp_path, "r2", [
        {"problem": "lm_head", "m": 1, "bytes": 3e8, "launches": 1, "reader": "tile 2048x4B nw4", "read_us": 90.0,
         "read_gbps": 3333.3},
        {"problem": "lm_head", "m": 1, "bytes": 3e8, "launches": 1, "reader": "tile 4096x4B nw8", "read_us": 96.0,
         "read_gbps": 3125.0}])
    other_gpu = _read_run(tmp_path, "r3", [{"problem": "lm_head", "m": 1, "bytes": 3e8, "read_us": 50.0,
                                            "read_gbps": 6000.0}], gpu="NVIDIA B200")
    out = judge([a, old, probe, other_gpu], targets=[LM_HEAD])
    assert out.attrs["read_run"] == "r2"
    assert out.set_index("m").loc[1, "x_read"] == pytest.approx(110.0 / 96.0)
    two = _read_run(tmp_path, "r4", [  # `./lab readfloor`'s own rows: launches, no reader; x_read takes the one
        {"problem": "lm_head", "m": 1, "bytes": 3e8, "launches": 2, "read_us": 80.0, "read_gbps": 3750.0},
        {"problem": "lm_head", "m": 1, "bytes": 3e8, "launches": 1, "read_us": 88.0, "read_gbps": 3e8 / 88e3}])
    out = judge([a, probe, two], targets=[LM_HEAD])
    assert out.attrs["read_run"] == "r4" and out.set_index("m").loc[1, "x_read"] == pytest.approx(110.0 / 88.0)


def test_targets_without_a_read_run_have_no_x_read(tmp_path):
    a = _run(tmp_path, "a", [_lm_head(1, 110.0)], read_gbps=3000.0)
    out = judge([a], targets=TARGETS[:1])
    assert out.attrs["read_run"] is None and out["x_read"].isna().all() and out["x_goal"].isna().all()
    assert out.attrs["read2_run"] is None and out["bare2"].isna().all()


def test_bare2_is_the_two_launch_read_as_a_fraction_of_the_floor(tmp_path, capsys):
    """bare2 = floor / (the point's bytes read in two launches): 100 us of floor (3e8 bytes at 3 TB/s) over a
    120 us two-launch read is 83.3%, whatever the kernel's own time; x_read stays on the one-launch row, and the
    newest run holding two-launch rows counts even when a newer one holds only one-launch rows."""
    a = _run(tmp_path, "a", [_lm_head(1, 110.0)], read_gbps=3000.0)
    both = _read_run(tmp_path, "r1", [
        {"problem": "lm_head", "m": 1, "bytes": 3e8, "launches": 1, "read_us": 96.0, "read_gbps": 3e8 / 96e3},
        {"problem": "lm_head", "m": 1, "bytes": 3e8, "launches": 2, "read_us": 120.0, "read_gbps": 3e8 / 120e3}])
    one = _read_run(tmp_path, "r2", [{"problem": "lm_head", "m": 1, "bytes": 3e8, "read_us": 98.0,
                                      "read_gbps": 3e8 / 98e3}])
    out = judge([a, both, one], targets=[LM_HEAD])
    row = out.set_index("m").loc[1]
    assert out.attrs["read_run"] == "r2" and out.attrs["read2_run"] == "r1"
    assert row["x_read"] == pytest.approx(110.0 / 98.0) and row["bare2"] == pytest.approx(100.0 / 120.0)
    assert main(["targets", "--runs", str(a), str(both), str(one)]) == 1
    text = capsys.readouterr().out
    assert "bare2: a plain read" in text and "83.3%" in text
