"""Results store: appends are durable, keys identify points, many runs read as one frame."""

import pandas as pd
import pytest

from labkit.results import KEY_COLUMNS, POINT_COLUMNS, PointStore, point_key, read_runs
from labkit.runs import create_run


def _point(**kw):
    p = {"op": "linear", "variant": "gemv", "config": {"BLOCK_N": 64}, "m": 1, "n": 128, "k": 64,
         "routing": None, "status": "ok", "us_graph": 3.0}
    p.update(kw)
    return p


def test_append_and_resume_keys(tmp_path):
    run = create_run("t", out=tmp_path / "r1", parameters={"a": 1})
    store = PointStore(run.path)
    store.append(_point())
    store.append([_point(m=2), _point(m=4, status="incorrect", max_rel_err=0.5)])
    df = store.read()
    assert list(df.columns[: len(POINT_COLUMNS)]) == POINT_COLUMNS
    assert df["m"].tolist() == [1, 2, 4]
    assert point_key(_point(m=2, config={"BLOCK_N": 64})) in store.done_keys()
    assert point_key(_point(m=8)) not in store.done_keys()
    # key order inside a config does not matter
    assert point_key(_point(config={"a": 1, "b": 2})) == point_key(_point(config={"b": 2, "a": 1}))
    assert not (run.path / "points.parquet.tmp").exists()


def test_bad_status_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="status must be one of ok, incorrect, failed"):
        PointStore(tmp_path).append(_point(status="fast"))


def test_read_runs_adds_run_columns(tmp_path):
    for name in ("a", "b"):
        run = create_run(name, out=tmp_path / name)
        PointStore(run.path).append(_point(variant=name))
    df = read_runs([tmp_path / "a", tmp_path / "b"])
    assert set(df["run_id"]) == {"a", "b"} and "gpu" in df.columns
    assert isinstance(df, pd.DataFrame) and set(KEY_COLUMNS) <= set(df.columns)
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        read_runs([tmp_path / "missing"])
