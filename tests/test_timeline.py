"""Program timelines (kernels.trace, labkit.timeline): the record plumbing and the summary arithmetic on the CPU,
the records themselves on the GPU."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

import kernels as K
from kernels import trace
from labkit import timeline
from tests.test_moe import odd_layer


def _launch(name, grid, recs):
    """A Launch whose records are given as (start, wait, end, sm, live) in ns."""
    words = torch.tensor([[s, w, e, sm * 2 + live] for s, w, e, sm, live in recs], dtype=torch.int64)
    return trace.Launch(name, grid, words)


def test_trace_args_pass_a_buffer_per_launch_only_inside_program_trace():
    any_tensor = torch.zeros(3, dtype=torch.int32)
    off = trace.trace_args("mlp1", (3, 2), any_tensor)
    assert off["TRACE"] is False and off["trace_ptr"] is any_tensor
    with trace.program_trace("cpu", capacity=20) as launches:
        on = trace.trace_args("mlp1", (3, 2), any_tensor)
        two = trace.trace_args("mlp2", (5, 2), any_tensor)
        with pytest.raises(RuntimeError, match="is full"):
            trace.trace_args("mlp1", (3, 2), any_tensor)
    assert on["TRACE"] is True and on["trace_ptr"].shape == (6, trace.WORDS)
    assert two["trace_ptr"].shape == (10, trace.WORDS)
    two["trace_ptr"].fill_(1)  # slices of one buffer, apart: no memset between launches, nothing shared
    assert on["trace_ptr"].sum() == 0
    assert [(lc.name, lc.grid) for lc in launches] == [("mlp1", (3, 2)), ("mlp2", (5, 2))]
    assert trace.trace_args("mlp1", (3, 2), any_tensor)["TRACE"] is False  # the block ended


def test_summary_of_known_programs():
    """Two calls of mlp1 (grid 2 x 2: three live programs and one spare) and mlp2 (one program): the frame's
    times are us from each call's first start, and the summary's waits, runs, occupancy and tail are the ones
    these records imply."""
    base = 10_000_000
    calls = []
    for c in range(2):
        t = base + c * 1_000_000
        calls.append(_launch("mlp1", (2, 2), [(t, t + 1000, t + 11000, 0, 1), (t, t + 2000, t + 12000, 1, 1),
                                              (t + 500, t + 500, t + 900, 2, 0),
                                              (t + 1000, t + 3000, t + 23000, 0, 1)]))
        calls.append(_launch("mlp2", (1, 1), [(t + 5000, t + 23000, t + 30000, 1, 1)]))
    df = timeline.programs_frame(calls)
    assert list(df.columns) == list(timeline.COLUMNS)
    assert sorted(df.call.unique()) == [0, 1]
    one = df[df.call == 1]
    assert one.start_us.min() == 0 and one.end_us.max() == 30.0
    assert list(one[one.launch == "mlp1"].x) == [0, 1, 0, 1] and list(one[one.launch == "mlp1"].y) == [0, 0, 1, 1]
    s = timeline.summarize(df)
    m1 = s[(s.call == 1) & (s.launch == "mlp1")].iloc[0]
    assert (m1.programs, m1.live, m1.sms) == (4, 3, 3)
    assert m1.first_start_us == 0 and m1.first_run_us == 1.0 and m1.last_end_us == 23.0
    assert m1.wait_p50_us == 2.0 and m1.run_p50_us == 10.0 and m1.spare_us == 0.4
    assert m1.running_peak == 3  # all three from 3 to 11 us, then one until 23
    assert m1.ramp_us == pytest.approx(3.0, abs=0.05) and m1.drain_us == pytest.approx(12.0, abs=0.05)
    assert m1.slot_use == pytest.approx((10 + 10 + 20) / 23 / 3, abs=0.01)
    m2 = s[(s.call == 1) & (s.launch == "mlp2")].iloc[0]
    assert m2.wait_p50_us == 18.0 and m2.run_p50_us == 7.0
    assert m2.ramp_us == pytest.approx(18.0, abs=0.05) and m2.drain_us == pytest.approx(0.0, abs=0.05)
    occ = timeline.occupancy(df)
    at = occ.iloc[(occ.t_us - 6.0).abs().argmin()]
    assert at["mlp1 running"] == 3 and at["mlp2 waiting"] == 1 and at["mlp2 running"] == 0


def test_stream_loss_of_known_programs():
    """Two mlp1 programs of 1 MB over 0-10 us, then one mlp2 program of 1 MB over 10-20 us: the modeled rate is 0.2
    then 0.1 TB/s, p90 0.2, so 3 MB would take 15 us at it and 5 us are lost, all of them after mlp1's last program
    ended; none in the ramp."""
    t = 5_000_000
    df = timeline.programs_frame([_launch("mlp1", (2, 1), [(t, t, t + 10000, 0, 1), (t, t, t + 10000, 1, 1)]),
                                  _launch("mlp2", (1, 1), [(t + 2000, t + 10000, t + 20000, 0, 1)])])
    s = timeline.stream_loss(df, {"mlp1": 1e6, "mlp2": 1e6}).iloc[0]
    assert s.span_us == 20 and s.mbytes == 3.0 and s.rate_p90_tbs == 0.2 and s.rate_mean_tbs == 0.15
    assert s.lost_us == pytest.approx(5.0, abs=0.01) and s.lost_after_mlp1_us == pytest.approx(5.0, abs=0.01)
    assert s.lost_ramp_us == pytest.approx(0.0, abs=0.01)


def test_program_bytes_follow_the_config():
    """mlp1 programs stream 16 * ROWS * num_warps rows of K = hidden, mlp2's ROWS2 rows when set (TAIL2's mlp2t
    half of them), 17/32 byte each; SPLITK2's mlp2 programs a slice of that K (with ATOMIC or without);
    persistent grids have no such figure and are refused."""
    b = timeline.program_bytes({"ROWS": 2, "ROWS2": 1, "num_warps": 4}, 2880, 2880)
    assert b == {"mlp1": 128 * 2880 * 17 / 32, "mlp2": 64 * 2880 * 17 / 32, "mlp2t": 32 * 2880 * 17 / 32}
    assert timeline.program_bytes({"ROWS": 1, "num_warps": 4}, 64, 32)["mlp2"] == 64 * 32 * 17 / 32
    split = {"ROWS": 1, "num_warps": 4, "SPLITK2": 2}
    assert timeline.program_bytes({**split, "ATOMIC": True}, 64, 32)["mlp2"] == 32 * 32 * 17 / 32
    assert timeline.program_bytes(split, 64, 32)["mlp2"] == 32 * 32 * 17 / 32  # slices stored apart
    with pytest.raises(ValueError, match="no bytes per program"):  # a persistent program does several tiles
        timeline.program_bytes({"ROWS": 1, "num_warps": 4, "PERSIST1": 4}, 64, 32)


def test_programs_frame_refuses_unwritten_records():
    with pytest.raises(RuntimeError, match="no record"):
        timeline.programs_frame([_launch("mlp1", (2, 1), [(5, 6, 7, 0, 1), (0, 0, 0, 0, 0)])])


def test_tile_tokens_number_tiles_as_the_kernels_do():
    """Tiles in expert order, ceil(count / BLOCK_M) per expert, the last part-filled; an empty expert has none.
    Programs get their tile's tokens per call (0 on spare slots, NaN for persistent mlp1), and fill_table puts
    their run times in quarters of BLOCK_M."""
    assert timeline.tile_tokens([5, 0, 17, 8], 8).tolist() == [5, 8, 8, 1, 8]
    assert timeline.tile_tokens([], 8).tolist() == []
    t = 1_000_000
    recs = [(t, t + 1000 * (i + 1), t + 1000 * (i + 1) + 2000 * (i + 1), i, 1) for i in range(5)]
    recs.append((t, t, t + 100, 5, 0))  # a spare slot
    calls = [_launch(name, (1, 6), recs) for name in ("mlp1", "mlp2", "mlp1", "mlp2")]
    df = timeline.with_tile_tokens(timeline.programs_frame(calls), [[5, 0, 17, 8], [8, 8, 8, 6, 0]], 8)
    assert df[df.call == 0].tokens.tolist()[:6] == [5, 8, 8, 1, 8, 0]
    assert df[df.call == 1].tokens.tolist()[:6] == [8, 8, 8, 6, 0, 0]
    assert ((df.tokens > 0) == df.live).sum() == len(df) - 2  # call 1's fifth program holds no tile but ran live
    pers = timeline.with_tile_tokens(timeline.programs_frame(calls), [[5, 0, 17, 8]] * 2, 8, persistent_mlp1=True)
    assert pers[pers.launch == "mlp1"].tokens.isna().all() and pers[pers.launch == "mlp2"].tokens.notna().all()
    f = timeline.fill_table(df, 8)
    one = f[(f.launch == "mlp1") & (f.tile_tokens == "7-8")].iloc[0]
    # tiles of 7-8 tokens: programs 1, 2, 4 of call 0 (run 4, 6, 10 us) and 0, 1, 2 of call 1 (2, 4, 6 us)
    assert one.programs == 6 and one.run_p50_us == 5.0
    assert set(f.tile_tokens.astype(str)) == {"1-2", "5-6", "7-8"}


def test_point_labels_keep_configs_of_one_shape_apart():
    """Each traced config gets its own point, so the report never merges two configs of one shape."""
    taken = []
    for model, tokens in (("gpt-oss-20b", 16), ("gpt-oss-20b", 16), ("gpt-oss-120b", 16), ("gpt-oss-20b", 16)):
        taken.append(timeline.point_label(model, tokens, taken))
    assert taken == ["gpt-oss-20b 16 tokens", "gpt-oss-20b 16 tokens #2", "gpt-oss-120b 16 tokens",
                     "gpt-oss-20b 16 tokens #3"]


def test_timeline_cli_from_a_stored_run(tmp_path):
    """`labkit timeline --from` summarizes a stored programs.parquet per point and writes summary.csv and a chart
    per point (a shape's second config its own), and fill.csv where the programs carry their tile's tokens."""
    t = 7_000_000
    mlp1 = _launch("mlp1", (2, 1), [(t, t + 1000, t + 5000, 0, 1), (t, t + 2000, t + 9000, 1, 1)])
    df = timeline.programs_frame([mlp1, _launch("mlp2", (1, 1), [(t + 3000, t + 9000, t + 12000, 0, 1)])])
    df = timeline.with_tile_tokens(df, [[3]], 16)
    pd.concat([df.assign(point="gpt-oss-20b 16 tokens"), df.assign(point="gpt-oss-20b 16 tokens #2")]).to_parquet(
        tmp_path / "programs.parquet", index=False)
    pd.DataFrame({"point": ["gpt-oss-20b 16 tokens", "gpt-oss-20b 16 tokens #2"],
                  "config": ["WGMMA=true,ROWS=2,ROWS2=1"] * 2, "us_traced": [13.0] * 2,
                  "us_untraced": [12.5] * 2}).to_csv(tmp_path / "layer_us.csv", index=False)
    out = subprocess.run([sys.executable, "-m", "labkit", "timeline", "--from", str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout
    assert "mlp2" in out and "gpt-oss-20b 16 tokens" in out
    s = pd.read_csv(tmp_path / "summary.csv")
    assert list(s.launch) == ["mlp1", "mlp2"] * 2 and s.last_end_us.max() == 12.0
    for chart in ("timeline-gpt-oss-20b-16.html", "timeline-gpt-oss-20b-16-2.html"):
        assert (tmp_path / chart).is_file(), chart
    stream = pd.read_csv(tmp_path / "stream.csv")
    assert stream.mbytes[0] == round((2 * 128 + 64) * 2880 * 17 / 32 / 1e6, 1) and "weight stream" in out
    fill = pd.read_csv(tmp_path / "fill.csv")  # BLOCK_M 16 (the default): 3 tokens fill a tile's first quarter
    assert set(fill.tile_tokens) == {"1-4"} and fill.programs.sum() == 2 * 3 and "tile fill" in out
    bad = subprocess.run([sys.executable, "-m", "labkit", "timeline"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--point" in bad.stderr
    (tmp_path / "programs.parquet").unlink()
    bad = subprocess.run([sys.executable, "-m", "labkit", "timeline", "--from", str(tmp_path)], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "holds no programs.parquet" in bad.stderr


def test_report_without_plotly_writes_its_tables(tmp_path, monkeypatch):
    """The GPU machine may lack plotly: report() then writes summary.csv and the other tables, warns that the
    charts are skipped, and draws none (a traced run used to end in an ImportError after its data was stored)."""
    import importlib.util

    t = 7_000_000
    df = timeline.programs_frame([_launch("mlp1", (2, 1), [(t, t + 1000, t + 5000, 0, 1), (t, t, t + 9000, 1, 1)])])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    with pytest.warns(UserWarning, match="plotly is not installed"):
        summary, _, _ = timeline.report(df.assign(point="gpt-oss-20b 16 tokens"), tmp_path, {})
    assert list(summary.launch) == ["mlp1"] and (tmp_path / "summary.csv").is_file()
    assert not list(tmp_path.glob("*.html"))


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [{"CHAIN": True, "ROWS2": 1}, {"TMA": 2, "BLOCK_M": 64, "MAXNREG": 168}])
def test_traced_moe_mma_records_every_program(extra):
    """Inside program_trace a WGMMA moe_mma layer records each mlp1 and mlp2 program once: as many live
    programs as the routing's token tiles times the column tiles, start <= past-wait <= end, SM ids below the
    GPU's count, and the untraced layer's bits."""
    dev = torch.device("cuda")
    dw, x, r, _ = odd_layer(29, 37, 6, dev)
    cfg = {"BLOCK_M": 8, "ROWS": 2, "CHUNKS": 1, "num_warps": 4, "WGMMA": True, "STAGES": 3, "TILED": True,
           "NIB": True, "RING_W": True, "EPI_EARLY": 1, **extra}
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)
    with trace.program_trace() as launches:
        yt = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)
    torch.cuda.synchronize()
    assert torch.equal(y, yt)
    assert [lc.name for lc in launches] == ["mlp1", "mlp2"]
    counts = (r.offsets[1:] - r.offsets[:-1]).cpu()
    tiles = int(((counts + cfg["BLOCK_M"] - 1) // cfg["BLOCK_M"]).sum())
    df = timeline.programs_frame(launches)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for lc in launches:
        d = df[df.launch == lc.name]
        assert len(d) == lc.grid[0] * lc.grid[1]
        assert d.live.sum() == tiles * lc.grid[0]
        assert (d.start_us <= d.wait_us).all() and (d.wait_us <= d.end_us).all()
        assert d.sm.between(0, sms - 1).all()
    # the host's tile numbering (with_tile_tokens) gives tokens to exactly the programs that found a tile
    tok = timeline.with_tile_tokens(df, [counts.numpy()], cfg["BLOCK_M"])
    assert ((tok.tokens > 0) == tok.live).all()


def test_build_occupancy_compares_the_traced_build_with_the_timed_one():
    """build_occupancy compiles a config's mlp1 and mlp2 untraced and traced and counts programs per SM from
    their registers: gpt-oss-20b's 2-token SPLITK2 build takes 80 registers untraced (6 programs per SM) and
    more traced. Gluon kernels compile with the GPU machine's Triton (3.6) only, so elsewhere this is skipped."""
    code = ("import json; from labkit.timeline import build_occupancy; print(build_occupancy('gpt-oss-20b', 2, "
            "dict(CHUNKS=1, num_warps=4, WGMMA=True, TILED=True, RING_W=True, NIB=True, STAGES=4, BLOCK_M=8, "
            "ROWS=1, CHAIN=True, EPI_EARLY=2, XSKIP=True, STEP_MAJOR=True, ATOMIC=True, SPLITK2=4), arch=90)"
            ".to_json(orient='records'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "TRITON_INTERPRET": "0"})
    if out.returncode != 0 and "CompilationError" in out.stderr:
        pytest.skip("Gluon kernels compile with the GPU machine's Triton only")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {(r["launch"], r["traced"]): r for r in json.loads(out.stdout.splitlines()[-1])}
    assert set(rows) == {("mlp1", False), ("mlp1", True), ("mlp2", False), ("mlp2", True)}
    assert rows["mlp1", False]["regs"] == 80 and rows["mlp1", False]["programs_per_sm"] == 6
    assert rows["mlp1", True]["regs"] >= rows["mlp1", False]["regs"]
    assert all(r["shared"] == 25856 for r in rows.values())
