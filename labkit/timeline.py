"""Program timelines of a MoE layer: which program ran when, on which SM, and how long it waited for its inputs.

`trace_layer` runs a moe_mma layer as the sweep times it (CUDA-graph replays of one pass over routings relabeled
to defeat L2, labkit.bench_moe) with kernels.trace recording every mlp1 / mlp2 program's start, the moment it got
past its PDL or CHAIN wait, its end and its SM. `summarize` turns the records into one row per launch: the ramp
before the first program streams, how long programs wait and run, how many run at once, and the drain after most
programs have ended; `stream_loss` models the weight stream over time and the time the layer loses against its
own best rate; `timeline_figure` draws the programs running and waiting over time; `fill_table` puts the programs'
run times against the tokens their tile holds (a tile's width, HALF's build, what a routing's imbalance costs).

Only WGMMA builds of moe_mma record (the kernels that take TRACE); %globaltimer needs a GPU, so the capture
needs one, while summaries and charts of a stored programs.parquet work anywhere (`labkit timeline --from`).
The records cost registers: `build_occupancy` says how many programs per SM the traced and the untraced builds
fit, since a timeline shows the traced build's occupancy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: columns of a programs table (one row per program of a traced launch)
COLUMNS = ("call", "launch", "program", "x", "y", "live", "sm", "start_us", "wait_us", "end_us")


def programs_frame(launches, call_of=None) -> pd.DataFrame:
    """kernels.trace.Launch records -> one row per program, times in us from the earliest start of its call.
    call_of: the call index of each launch (default: launches counted in pairs mlp1, mlp2 by name)."""
    rows = []
    call = -1
    for i, launch in enumerate(launches):
        if call_of is not None:
            call = call_of[i]
        elif launch.name == "mlp1" or call < 0:
            call += 1
        rec = launch.records.cpu().numpy()
        gx = launch.grid[0]
        pid = np.arange(rec.shape[0])
        rows.append(pd.DataFrame({
            "call": call, "launch": launch.name, "program": pid, "x": pid % gx, "y": pid // gx,
            "live": (rec[:, 3] & 1).astype(bool), "sm": rec[:, 3] >> 1,
            "start_ns": rec[:, 0], "wait_ns": rec[:, 1], "end_ns": rec[:, 2]}))
    df = pd.concat(rows, ignore_index=True)
    if (df[["start_ns", "wait_ns", "end_ns"]] == 0).any(axis=None):
        raise RuntimeError("some programs left no record: read the records after the traced launches ran")
    t0 = df.groupby("call")["start_ns"].transform("min")
    for col in ("start", "wait", "end"):
        df[f"{col}_us"] = (df[f"{col}_ns"] - t0) / 1e3
    return df[list(COLUMNS)]


def tile_tokens(counts, block_m: int, extra: int = 0) -> np.ndarray:
    """Tokens of each token tile of a routing whose experts hold `counts` slots, in the order the kernels number
    them (kernels.moe.tile_rows: ceil(count / BLOCK_M) tiles per expert, in expert order, the last part-filled;
    extra, moe_mma's ABSORB: a last tile of at most `extra` after a full one joins the tile before it)."""
    out = []
    for c in (int(c) for c in counts):
        tiles = [min(block_m, c - j) for j in range(0, c, block_m)]
        if extra and len(tiles) > 1 and tiles[-1] <= extra:
            tiles[-2:] = [block_m + tiles[-1]]
        out += tiles
    return np.array(out, dtype=np.int64)


def with_tile_tokens(df: pd.DataFrame, counts_per_call, block_m: int, persistent_mlp1: bool = False,
                     extra: int = 0) -> pd.DataFrame:
    """programs_frame's rows with `tokens`: what the program's token tile (y) holds in its call's routing
    (counts_per_call[call]: slots per expert; extra: ABSORB's, tile_tokens), 0 for the worst-case grid's spare
    slots, NaN for persistent mlp1 programs (each takes several tiles)."""
    tiles = [tile_tokens(c, block_m, extra) for c in counts_per_call]
    tok = np.array([t[y] if y < len(t) else 0 for t, y in zip((tiles[c] for c in df["call"]), df["y"])], dtype=float)
    if persistent_mlp1:
        tok[(df["launch"] == "mlp1").to_numpy()] = np.nan
    return df.assign(tokens=tok)


def fill_table(df: pd.DataFrame, block_m: int) -> pd.DataFrame:
    """Live programs' run time (past their wait to their end) by how full their token tile is, per launch: rows
    of tiles holding up to a quarter, a half, three quarters and all of BLOCK_M tokens (HALF runs the first two
    on its half-width build)."""
    live = df[df.live & df.tokens.notna() & (df.tokens > 0)]
    edges = [0, block_m // 4, block_m // 2, 3 * block_m // 4, block_m]
    if (live.tokens > block_m).any():  # ABSORB's tiles past BLOCK_M
        edges.append(int(live.tokens.max()))
    fill = pd.cut(live.tokens, edges, labels=[f"{a + 1}-{b}" for a, b in zip(edges, edges[1:])])
    run = live.end_us - live.wait_us
    out = run.groupby([live.launch, fill], observed=True).agg(["count", "median", lambda r: r.quantile(0.9)])
    out.columns = ["programs", "run_p50_us", "run_p90_us"]
    out = out.reset_index().rename(columns={"tokens": "tile_tokens"})
    return out.round({"run_p50_us": 2, "run_p90_us": 2})


def _running(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """How many intervals [start, end) contain each time in `at`."""
    s, e = np.sort(starts), np.sort(ends)
    return np.searchsorted(s, at, side="right") - np.searchsorted(e, at, side="right")


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (call, launch): programs (live / spare), when the first started and the last ended, how long
    live programs waited for their inputs and then ran (median, p90), how many ran at once (mean over the
    launch's span, peak, and their ratio slot_use: the share of the launch's slots that streamed), the ramp
    (first start until 90% of the peak first ran) and the drain (from the last moment 90% of the peak ran to the
    last end: the partial last wave). Times in us from the call's first program start."""
    out = []
    for (call, launch), g in df.groupby(["call", "launch"], sort=False):
        live = g[g.live]
        run = live.end_us - live.wait_us
        wait = live.wait_us - live.start_us
        first, last = g.start_us.min(), g.end_us.max()
        grid = np.linspace(first, last, 2001)
        busy = _running(live.wait_us.to_numpy(), live.end_us.to_numpy(), grid)
        high = np.flatnonzero(busy >= 0.9 * busy.max())
        out.append({
            "call": call, "launch": launch, "programs": len(g), "live": len(live), "sms": g.sm.nunique(),
            "first_start_us": round(first, 2), "first_run_us": round(live.wait_us.min(), 2),
            "last_end_us": round(last, 2), "span_us": round(last - first, 2),
            "wait_p50_us": round(wait.median(), 2), "wait_p90_us": round(wait.quantile(0.9), 2),
            "run_p50_us": round(run.median(), 2), "run_p90_us": round(run.quantile(0.9), 2),
            "spare_us": round((g[~g.live].end_us - g[~g.live].start_us).mean(), 2) if (~g.live).any() else 0.0,
            "running_mean": round(float(busy.mean()), 1), "running_peak": int(busy.max()),
            "slot_use": round(float(busy.mean() / busy.max()), 3),
            "ramp_us": round(grid[high[0]] - first, 2), "drain_us": round(last - grid[high[-1]], 2),
        })
    return pd.DataFrame(out)


def program_bytes(config: dict, hidden: int, intermediate: int) -> dict:
    """Weight bytes one mlp1 / mlp2 program of a moe_mma config streams: its rows (16 * ROWS * num_warps; mlp2's
    ROWS2 when set) times its K (mlp2's divided among SPLITK2's slices: the layer runs them with its combine or
    ATOMIC, as the timeline's calls do), at 17/32 byte a weight (an E2M1 nibble plus
    an E8M0 byte per 32). mlp2t: the half-height second mlp2 launch of TAIL2, an option measured and removed in stop
    47, kept so that its stored timelines (results/20261127T102915-h100-80gb-hbm3-moe-timeline-tail2) still
    summarize."""
    from kernels import VARIANTS

    full = {**VARIANTS["moe_mma"].defaults, **config}
    if full.get("PERSIST1"):
        raise ValueError("PERSIST1's mlp1 programs do several tiles' work each: no bytes per program")
    rows1 = 16 * full["ROWS"] * full["num_warps"]
    rows2 = 16 * (full["ROWS2"] or full["ROWS"]) * full["num_warps"]
    split = full.get("SPLITK2") or 1
    return {"mlp1": rows1 * hidden * 17 / 32, "mlp2": rows2 * intermediate * 17 / 32 / split,
            "mlp2t": rows2 // 2 * intermediate * 17 / 32}


def stream_loss(df: pd.DataFrame, bytes_by_launch: dict, points: int = 4000) -> pd.DataFrame:
    """Per call, a model of the weight stream: each live program's bytes spread evenly over its run (past its wait
    to its end) give the aggregate rate over time. Reports the bytes, the span, the mean and p90 rate (TB/s) and
    the time lost against that p90 rate (span minus bytes / p90 rate, counting only time below it), split into
    the first 10 us (the ramp) and the time after the last mlp1 program ended (mlp2's drain). An estimate: a
    program's real rate varies along its run, and where an expert holds several token tiles the bytes count each
    tile's reads of its weights (the later ones mostly from L2)."""
    out = []
    for call, d in df[df.live].groupby("call"):
        nbytes = d.launch.map(bytes_by_launch).to_numpy(dtype=float)
        rate = nbytes / (d.end_us - d.wait_us).to_numpy() / 1e6  # TB/s
        t = np.linspace(0.0, d.end_us.max(), points, endpoint=False)
        dt = t[1] - t[0]
        bw = np.zeros_like(t)
        for w, e, r in zip(d.wait_us.to_numpy(), d.end_us.to_numpy(), rate):
            bw[(t >= w) & (t < e)] += r
        p90 = float(np.percentile(bw, 90))
        lost = np.clip(1.0 - bw / p90, 0.0, None) * dt
        mlp1_end = d[d.launch == "mlp1"].end_us.max() if (d.launch == "mlp1").any() else np.inf
        out.append({"call": call, "mbytes": round(nbytes.sum() / 1e6, 1), "span_us": round(d.end_us.max(), 2),
                    "rate_mean_tbs": round(nbytes.sum() / 1e6 / d.end_us.max(), 3), "rate_p90_tbs": round(p90, 3),
                    "lost_us": round(float(lost.sum()), 2), "lost_ramp_us": round(float(lost[t < 10].sum()), 2),
                    "lost_after_mlp1_us": round(float(lost[t >= mlp1_end].sum()), 2)})
    return pd.DataFrame(out)


def occupancy(df: pd.DataFrame, call: int | None = None, points: int = 1500) -> pd.DataFrame:
    """Programs running (past their wait) and waiting (started, not yet past it) per launch over one call's time
    (default: the last call)."""
    call = df.call.max() if call is None else call
    d = df[(df.call == call) & df.live]
    t = np.linspace(0.0, d.end_us.max(), points)
    cols = {"t_us": t}
    for launch, g in d.groupby("launch", sort=False):
        cols[f"{launch} running"] = _running(g.wait_us.to_numpy(), g.end_us.to_numpy(), t)
        cols[f"{launch} waiting"] = _running(g.start_us.to_numpy(), g.wait_us.to_numpy(), t)
    return pd.DataFrame(cols)


def timeline_figure(df: pd.DataFrame, title: str, call: int | None = None):
    """A plotly figure of occupancy(): running programs solid, waiting ones dotted, one colour per launch."""
    import plotly.graph_objects as go

    occ = occupancy(df, call)
    fig = go.Figure()
    colours = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
    for i, col in enumerate(c for c in occ.columns if c.endswith("running")):
        launch = col[: -len(" running")]
        colour = colours[i % len(colours)]
        fig.add_trace(go.Scatter(x=occ.t_us, y=occ[col], name=col, line=dict(color=colour, shape="hv")))
        fig.add_trace(go.Scatter(x=occ.t_us, y=occ[f"{launch} waiting"], name=f"{launch} waiting",
                                 line=dict(color=colour, dash="dot", shape="hv")))
    fig.update_layout(title=title, xaxis_title="us from the layer's first program start",
                      yaxis_title="live programs", template="plotly_white", width=1000, height=450)
    return fig


def point_label(model: str, tokens, taken) -> str:
    """A traced layer's `point`: "MODEL TOKENS tokens", with " #2", " #3", ... for the later configs of a shape
    already among `taken` (the report summarizes per point: two configs under one label would merge)."""
    label = f"{model} {tokens} tokens"
    seen = sum(p.split(" #")[0] == label for p in taken)
    return f"{label} #{seen + 1}" if seen else label


def build_occupancy(model: str, tokens: int, config: dict, arch: int | None = None) -> pd.DataFrame:
    """Registers, shared memory and resident programs per SM of the layer's mlp1 and mlp2 builds, untraced (what the
    sweeps time) and traced (what a timeline records): kernels.trace's records cost registers, and a traced build
    that fits fewer programs per SM shows a different occupancy than the layer it stands for (gpt-oss-20b at 16
    tokens: mlp1 163 registers traced against 119, 3 programs per SM against 4, before kernels.trace stored each
    word as it happens; mlp2 still 80 against 71). Compiles both without running them (labkit.compile, for `arch` or
    this GPU); needs the CUDA toolchain's cuobjdump for registers."""
    import contextlib

    from kernels import VARIANTS
    from kernels.trace import program_trace

    from .compile import compile_moe, programs_per_sm, resource_usage
    from .gptoss_config import get_model

    c = get_model(model)
    full = {**VARIANTS["moe_mma"].defaults, **config}
    rows = []
    for traced in (False, True):
        with program_trace(device="cpu") if traced else contextlib.nullcontext():
            kernels = compile_moe("moe_mma", full, tokens, c.experts, c.top_k, 2 * c.intermediate, c.hidden, arch)
        builds = [k for name, k in kernels if name.endswith("_moe_wg_kernel")]
        for launch, k in zip(("mlp1", "mlp2"), builds):
            use = resource_usage(k)
            fit = programs_per_sm(use["regs"], use["shared"], full["num_warps"], arch or 90) if "regs" in use else None
            rows.append({"launch": launch, "traced": traced, "regs": use.get("regs"), "shared": use["shared"],
                         "programs_per_sm": fit["programs"] if fit else None})
    return pd.DataFrame(rows)


def report(df: pd.DataFrame, out, configs: dict) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame | None]:
    """A timeline run folder's tables and charts from its programs (one `point` per traced layer, read
    "MODEL TOKENS tokens", " #2" and on for a shape's later configs): summary.csv (summarize), stream.csv
    (stream_loss, for the points `configs` gives a moe_mma config of, persistent grids left out: their programs'
    bytes vary), fill.csv (fill_table, for those points where the programs carry their tile's tokens: runs
    traced before that column have none) and one chart per point. Without plotly (the GPU machine may lack it)
    the charts are skipped with a warning: `labkit timeline --from RUN_DIR` draws them where plotly is. Returns
    (summary, stream, fill; None where there is none)."""
    import importlib.util
    import warnings
    from pathlib import Path

    from kernels import VARIANTS

    from .charts import save_figure
    from .gptoss_config import get_model

    out = Path(out)
    charts = importlib.util.find_spec("plotly") is not None
    if not charts:
        warnings.warn(f"plotly is not installed: no timeline charts in {out} (its tables are written; `labkit "
                      "timeline --from` draws the charts on a machine with plotly)", stacklevel=2)
    rows, streams, fills = [], [], []
    for point, d in df.groupby("point", sort=False):
        rows.append(summarize(d).assign(point=point))
        if point in configs and not configs[point].get("PERSIST1"):
            c = get_model(point.split()[0])
            streams.append(stream_loss(d, program_bytes(configs[point], c.hidden, c.intermediate)).assign(point=point))
        if point in configs and "tokens" in d.columns:
            bm = {**VARIANTS["moe_mma"].defaults, **configs[point]}["BLOCK_M"]
            fills.append(fill_table(d, bm).assign(point=point))
        if charts:
            name = "timeline-" + "-".join(point.replace(" tokens", "").replace("#", "").split())
            save_figure(timeline_figure(d, f"{point}: moe_mma programs running and waiting"), out, name)
    summary = pd.concat(rows, ignore_index=True)
    summary.to_csv(out / "summary.csv", index=False)
    stream = pd.concat(streams, ignore_index=True) if streams else None
    if stream is not None:
        stream.to_csv(out / "stream.csv", index=False)
    fill = pd.concat(fills, ignore_index=True) if fills else None
    if fill is not None:
        fill.to_csv(out / "fill.csv", index=False)
    return summary, stream, fill


def trace_layer(model: str, tokens: int, config: dict, routing: str = "uniform", replays: int = 10):
    """Trace a moe_mma layer as the sweep times it. Returns (programs frame with each program's tile tokens,
    layer us traced, layer us untraced):
    the layer times are medians of CUDA-graph replays of the whole pass divided by its calls, so the two show
    what the records cost. Checks first that the traced pass gives the untraced pass's bits (within 1% with ATOMIC)."""
    import torch

    import kernels as K
    from kernels.trace import program_trace

    from . import routing as routing_gen
    from .bench_moe import MoEBench, MoECase, point_seed

    if not torch.cuda.is_available():
        raise RuntimeError("tracing needs a GPU (%globaltimer); `labkit timeline --from RUN_DIR` works anywhere")
    full = {**K.VARIANTS["moe_mma"].defaults, **config}
    if not full.get("WGMMA"):
        raise ValueError("only moe_mma's WGMMA builds record program timelines (config needs WGMMA=True)")
    bench = MoEBench(model, baseline=False)
    sample = routing_gen.generate(routing, tokens, bench.E, bench.k, seed=point_seed(tokens, routing))
    case = MoECase(model=model, tokens=tokens, routing=routing, variant="moe_mma", experts=bench.E, top_k=bench.k,
                   hidden=bench.H, intermediate=bench.I, config=full)
    calls, _ = bench.calls(case, sample)
    want = [c() for c in calls]  # compiles and prepares the weights
    torch.cuda.synchronize()

    def graph_us(g):
        times = []
        for _ in range(replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / len(calls))
        return float(np.median(times))

    plain = torch.cuda.CUDAGraph()
    with torch.cuda.graph(plain):
        for c in calls:
            c()
    with program_trace() as launches:
        traced = torch.cuda.CUDAGraph()
        with torch.cuda.graph(traced):
            got = [c() for c in calls]
    traced.replay()
    torch.cuda.synchronize()
    for w, g in zip(want, got):
        if full.get("ATOMIC"):  # its additions round in bf16 in whatever order they land: equal within 1%
            same = ((w.float() - g.float()).norm() / w.float().norm()).item() < 1e-2
        else:
            same = torch.equal(w, g)
        if not same:
            raise AssertionError("the traced layer's output differs from the untraced layer's")
    us_plain, us_traced = graph_us(plain), graph_us(traced)
    counts = [(r.offsets[1:] - r.offsets[:-1]).cpu().numpy() for r in bench.routings(sample)]  # calls' order
    return (with_tile_tokens(programs_frame(launches), counts, full["BLOCK_M"], bool(full.get("PERSIST1")),
                             int(full.get("ABSORB") or 0)), us_traced, us_plain)
