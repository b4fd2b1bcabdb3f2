"""The default job: which notebooks it runs, with which parameters, into one run folder."""

import pytest

from labkit import quickstart as qs
from labkit.notebooks import BatchResult


def test_quickstart_runs_the_default_batch_into_one_run(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_batch(notebook, grid, *, out, progress, result):
        calls.append((notebook, grid, out))
        (out / f"{notebook}.html").write_text("<html/>")
        return result

    monkeypatch.setattr(qs, "run_batch", fake_batch)
    monkeypatch.setattr(qs, "compare_grid", lambda run: ([{}], "no committed run shares points"))
    result = qs.quickstart(out=tmp_path / "run", progress=False)
    assert isinstance(result, BatchResult) and not result.failures
    assert [c[0] for c in calls] == ["02_gemv_sweep", "03_moe_sweep", "05_compare", "01_roofline"]
    assert calls[0][1] == [{"tile": "BLOCK_N"}, {"tile": "BLOCK_K"}] and calls[1][1][0] == {"tile": "BLOCK_M"}
    assert {c[2] for c in calls} == {tmp_path / "run"}
    out = capsys.readouterr().out
    assert "HTML charts" in out and str(tmp_path / "run" / "02_gemv_sweep.html") in out


def test_interrupted_quickstart_names_the_command_that_goes_on(tmp_path, monkeypatch, capsys):
    """^C in the MoE sweep: the job re-raises (the command line exits 130) after saying which --out resumes it."""
    def fake_batch(notebook, grid, *, out, progress, result):
        if notebook == "03_moe_sweep":
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(qs, "run_batch", fake_batch)
    with pytest.raises(KeyboardInterrupt):
        qs.quickstart(out=tmp_path / "run", progress=False)
    assert f"`./lab quickstart --out {tmp_path / 'run'}` goes on from there" in capsys.readouterr().err


def test_compare_grid_uses_committed_runs_that_share_points(tmp_path, monkeypatch):
    from labkit import results

    run = tmp_path / "fresh"
    monkeypatch.setattr(results, "reference_runs", lambda r: {"linear": tmp_path / "h100-lin"})
    grid, note = qs.compare_grid(run)
    assert grid == [{"run_a": str(tmp_path / "h100-lin"), "run_b": str(run), "op": "linear"}]
    assert "linear: h100-lin" in note
    monkeypatch.setattr(results, "reference_runs", lambda r: {})
    assert qs.compare_grid(run)[0] == [{}]


@pytest.mark.slow
def test_a_cpu_run_shares_no_points_with_the_committed_runs(tmp_path):
    from labkit.results import PointStore, find_runs, reference_runs
    from labkit.runs import create_run

    if not find_runs():
        pytest.skip("no committed runs")
    run = create_run("t", out=tmp_path / "r")
    PointStore(run.path).append({"op": "linear", "variant": "gemv", "config": {}, "m": 1, "n": 200, "k": 160,
                                 "status": "ok", "us_eager": 1.0})
    assert reference_runs(run.path) == {}
