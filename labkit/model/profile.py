"""Decode profile of the GPT-OSS model: load, prefill, TTFT, decode tok/s and where decode time goes.

Speed: on a GPU with graph-safe backends each decode step is a CUDA-graph replay timed with CUDA events
(median of every step, p10/p90 kept), and eager steps are timed too; on a CPU (or with the eager-only torch
MoE) only eager steps are timed. Breakdown: a few eager decode steps under torch.profiler with the model's
ranges on; every op's own kernel time (GPU) or own CPU time (CPU) is charged to the innermost enclosing
component range, so the shares mirror what Nsight shows for the NVTX ranges. The MoE share is stated
against the seeds' gate: < 10% stop, 10-30% modest, > 30% worthwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from .backends import Backends, resolve_backends
from .config import ModelConfig, get_config
from .diverge import FLIP_TOL
from .graph import DecodeRunner
from .loaders import load_weights
from .model import GptOss
from .nvtx_ranges import COMPONENTS, ranges

#: Top-level components of the breakdown (sub-ranges such as moe.mlp1 roll up into their parent).
TOP_COMPONENTS = ("embedding", "attention", "router", "moe", "final_norm", "lm_head", "sampling", "other")
#: Relative error of a layer-0 component above which a kernel backend is recorded as incorrect against its
#: torch reference. Parity is judged on layer 0: the kernel backends keep bf16 intermediates where the torch
#: reference keeps fp32 (~0.3% per component on the H100, ~1.4% for the tiny model's attention), and that
#: drift flips near-tie top-k choices in deep random-weight models, after which layers legitimately differ
#: (`labkit model diverge ref kernels` shows the first flip). Even layer 0's own router flips a few tokens
#: once a batch holds hundreds (2 of 256 in the tiny model at batch 8, an "incorrect" 120b batch-8 profile
#: on the H200 before this rule), so the router, MoE and residual are judged over the tokens whose experts
#: agree, and the flipped tokens are counted: more than PARITY_FLIP_TOL of them is a wrong router, not a tie.
#: Final-logit metrics are reported alongside.
PARITY_LAYER0_TOL = 0.02
#: Share of layer-0 tokens allowed to pick other experts than the reference (near ties; see above).
PARITY_FLIP_TOL = FLIP_TOL


def moe_verdict(share: float) -> str:
    """The seeds' gate on the MoE fraction of decode time."""
    if share < 0.10:
        return "stop: MoE is under 10% of decode time; a faster MoE kernel cannot pay off"
    if share <= 0.30:
        return "modest: MoE is 10-30% of decode time; a faster MoE kernel helps a little"
    return "worthwhile: MoE is over 30% of decode time; a faster MoE kernel pays off"


def _component_of(evt) -> tuple[str, str]:
    """(top-level component, innermost range) enclosing a profiler event; ('other', '') outside any range."""
    p = evt.cpu_parent
    while p is not None:
        if p.name in COMPONENTS:
            return p.name.split(".")[0], p.name
        p = p.cpu_parent
    return "other", ""


def _kernel_events(events):
    """(innermost component range or None, kernel name, us) for every GPU kernel, memcpy and memset.

    A kernel belongs to the innermost component range whose window contains its start. The profiling pass
    synchronizes at range boundaries (ranges(sync=True)), so a range's kernels run inside its window. Windows,
    not launch links, because torch.profiler does not link Triton's driver-API launches (cuLaunchKernelEx) to
    the range around them (seen on the H100: the launch event sits in its range with no device time, the
    kernel has no parent).
    """
    windows = sorted(((e.time_range.start, e.time_range.end, e.name) for e in events
                      if e.device_type == torch.autograd.DeviceType.CPU and e.name in COMPONENTS),
                     key=lambda w: w[1] - w[0])  # innermost (shortest) first
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU or e.name in COMPONENTS or e.name.startswith(
                ("layer.", "ProfilerStep")):
            continue  # CPU events, and the GPU-side copies of range annotations
        start = e.time_range.start
        yield next((w[2] for w in windows if w[0] <= start <= w[1]), None), e.name, e.time_range.elapsed_us()


def kernel_table(events, *, steps: int = 1) -> pd.DataFrame:
    """Every GPU kernel of a profiled decode step: its range, launches and us per step, slowest first.

    This is the answer to "which launch is slow": the component breakdown says where time goes, this says
    which kernel spends it (a cuBLAS GEMV, a norm, a routing launch) and how many launches a step makes.
    """
    acc: dict[tuple[str, str], list] = {}
    for name, kernel, us in _kernel_events(events):
        a = acc.setdefault((name or "other", kernel), [0, 0.0])
        a[0] += 1
        a[1] += us
    rows = [{"range": r, "kernel": k, "launches": n / steps, "us": us / steps, "us_per_launch": us / n}
            for (r, k), (n, us) in acc.items()]
    df = pd.DataFrame(rows, columns=["range", "kernel", "launches", "us", "us_per_launch"])
    return df.sort_values("us", ascending=False, ignore_index=True)


def component_breakdown(events, *, steps: int = 1, device_time: bool = False) -> pd.DataFrame:
    """Time per step charged to each component range from torch.profiler events (prof.events()).

    device_time: every GPU kernel (and memcpy/memset) is charged to its range as `_kernel_events` finds it.
    Without device_time, ops' own CPU time is charged to the range enclosing them; range markers' own time
    is instrumentation overhead and is not.
    """
    totals: dict[tuple[str, str], float] = {}
    if device_time:
        for name, _, us in _kernel_events(events):
            key = (name.split(".")[0], name) if name else ("other", "")
            totals[key] = totals.get(key, 0.0) + us
    else:
        for evt in events:
            if evt.device_type != torch.autograd.DeviceType.CPU:
                continue
            if evt.name in COMPONENTS or evt.name.startswith(("layer.", "ProfilerStep")):
                continue
            t = evt.self_cpu_time_total
            if t > 0:
                key = _component_of(evt)
                totals[key] = totals.get(key, 0.0) + t
    rows = [{"component": c, "range": r or c, "us": us / steps} for (c, r), us in totals.items()]
    df = pd.DataFrame(rows, columns=["component", "range", "us"])
    total = df["us"].sum()
    df["share"] = df["us"] / total if total > 0 else 0.0
    order = {c: i for i, c in enumerate(TOP_COMPONENTS)}
    return df.sort_values(["component", "range"], key=lambda s: s.map(order) if s.name == "component" else s,
                          ignore_index=True)


def by_component(breakdown: pd.DataFrame) -> pd.DataFrame:
    """The breakdown summed per top-level component, in TOP_COMPONENTS order (missing ones as zero)."""
    g = breakdown.groupby("component")[["us", "share"]].sum()
    return g.reindex(TOP_COMPONENTS, fill_value=0.0).reset_index()


def roofline_estimate(config: ModelConfig, batch: int, context: int, lm_head: str) -> dict | None:
    """The floor of one decode step (labkit.roofline.model_step) under ceilings measured on this GPU, or None.

    Returns {"components": {name: floor_us}, "floor_us": total, "tokens_per_s": ..., "bytes": ...,
    "flops": ..., "ceilings": {...}}. None on a CPU, where GPU ceilings do not apply.
    """
    if not torch.cuda.is_available():
        return None
    try:
        from labkit import hardware, roofline
    except ImportError:
        return None
    ceilings = hardware.measure_ceilings()
    est = roofline.model_step(config.name, batch=batch, context=context, phase="decode",
                              mxfp4_lm_head=lm_head in ("mxfp4", "mxfp4-torch"), ceilings=ceilings)
    total = est.total
    return {"components": dict(est.component_floor_us), "floor_us": est.floor_ms * 1e3,
            "tokens_per_s": est.tokens_per_s, "bytes": total.bytes, "flops": total.flops,
            "ceilings": ceilings.as_meta()}


@dataclass
class ProfileResult:
    model: str
    weights: str
    device: str
    backends: Backends
    batch: int
    prompt: int
    decode: int
    graph: bool
    load_s: float
    prefill_ms: float
    ttft_ms: float
    step_us: float  # median decode step (graph replay where graph, else eager)
    step_us_p10: float
    step_us_p90: float
    eager_step_us: float
    tok_s: float
    peak_mem_gb: float | None
    breakdown: pd.DataFrame
    moe_share: float
    verdict: str
    roofline: dict | None
    status: str
    max_rel_err: float | None
    parity: dict | None
    generated: list = field(default_factory=list)  # greedy ids of the first sequence
    kernels: pd.DataFrame | None = None  # kernel_table of the profiled steps (GPU only)
    pdl: bool = False  # the model's kernels launched with programmatic dependent launch (GptOss.pdl)

    @property
    def frac_of_roofline(self) -> float | None:
        return self.roofline["floor_us"] / self.step_us if self.roofline else None

    def summary(self) -> str:
        lines = [
            (f"{self.model} ({self.weights} weights) on {self.device}, {self.backends.label()}, batch {self.batch}, "
             f"prompt {self.prompt}, decode {self.decode}{' (CUDA graph)' if self.graph else ' (eager)'}"
             f"{', PDL' if self.pdl else ''}"),
            f"  load {self.load_s:.2f} s, prefill {self.prefill_ms:.1f} ms, TTFT {self.ttft_ms:.1f} ms",
            (f"  decode {self.step_us:.0f} us/step (p10 {self.step_us_p10:.0f}, p90 {self.step_us_p90:.0f}), "
             f"{self.tok_s:.1f} tok/s; eager {self.eager_step_us:.0f} us/step"),
        ]
        if self.peak_mem_gb is not None:
            lines.append(f"  peak GPU memory {self.peak_mem_gb:.1f} GB")
        if self.roofline:
            lines.append(f"  roofline {self.roofline['tokens_per_s']:.1f} tok/s: measured is "
                         f"{self.frac_of_roofline:.0%} of it")
        else:
            lines.append("  roofline: not available here")
        for r in by_component(self.breakdown).itertuples():
            if r.us > 0:
                lines.append(f"  {r.component:<11} {r.us:10.1f} us/step  {r.share:6.1%}")
        lines.append(f"  MoE share {self.moe_share:.1%}: {self.verdict}")
        if self.kernels is not None and len(self.kernels):
            k = self.kernels
            busy = float(k["us"].sum())
            lines.append(f"  {k['launches'].sum():.0f} launches per step, {busy:.0f} us of kernel time "
                         f"(eager profile); the slowest:")
            for r in k.head(12).itertuples():
                lines.append(f"    {r.us:8.1f} us  {r.launches:5.0f} x {r.us_per_launch:6.2f} us  {r.range:<10} "
                             f"{r.kernel[:70]}")
        if self.parity:
            lines.append(f"  parity vs torch reference: rel. err {self.max_rel_err:.2e}, "
                         f"top-1 {self.parity['top1_agree']:.0%}; layer 0: largest component error "
                         f"{self.parity['layer0_max_rel_err']:.2e} (limit {PARITY_LAYER0_TOL}), "
                         f"{self.parity['layer0_flipped']} of {self.parity['layer0_tokens']} tokens routed "
                         f"elsewhere ({self.parity['layer0_flipped_share']:.1%}, limit {PARITY_FLIP_TOL:.0%}) "
                         f"-> {self.status}")
        return "\n".join(lines)

    def point(self) -> dict:
        """The run's points.parquet row (op decode_step)."""
        floor = self.roofline["floor_us"] if self.roofline else None
        return {
            "op": "decode_step", "variant": self.backends.label(), "config": {
                "model": self.model, "weights": self.weights, "prompt": self.prompt, "decode": self.decode,
                "batch": self.batch, "graph": self.graph, "pdl": self.pdl},
            "m": self.batch, "n": None, "k": None, "experts": get_config(self.model).experts,
            "top_k": get_config(self.model).top_k, "routing": "model", "status": self.status, "error": None,
            "us_graph": self.step_us if self.graph else None,
            "us_graph_p10": self.step_us_p10 if self.graph else None,
            "us_graph_p90": self.step_us_p90 if self.graph else None,
            "us_eager": self.eager_step_us,
            "bytes": self.roofline["bytes"] if self.roofline else None,
            "flops": self.roofline["flops"] if self.roofline else None,
            "floor_us": floor, "frac_of_floor": self.frac_of_roofline,
            "max_rel_err": self.max_rel_err,
            "model": self.model, "weights": self.weights, "device": self.device, "prompt": self.prompt,
            "decode": self.decode, "tok_s": self.tok_s, "prefill_ms": self.prefill_ms, "ttft_ms": self.ttft_ms,
            "load_s": self.load_s, "peak_mem_gb": self.peak_mem_gb, "moe_share": self.moe_share,
            "moe_verdict": self.verdict,
            "roofline_tok_s": self.roofline["tokens_per_s"] if self.roofline else None,
        }

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("breakdown", "backends", "kernels")}
        d["backends"] = asdict(self.backends)
        d["breakdown"] = self.breakdown.to_dict("records")
        d["by_component"] = by_component(self.breakdown).to_dict("records")
        d["frac_of_roofline"] = self.frac_of_roofline
        d["kernels"] = self.kernels.to_dict("records") if self.kernels is not None else None
        return d


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def load_model(model: str | ModelConfig, weights: str, backends: Backends, *, seed: int = 0, device=None) -> GptOss:
    """A model with synthetic weights ('synthetic') or a checkpoint path on `device`. The model owns the
    loaded weights, so a layout other than "rows" replaces the row-major experts in place (one copy held)."""
    cfg = get_config(model)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return GptOss(cfg, load_weights(cfg, weights, seed=seed, device=device), backends, own_weights=True)


@torch.inference_mode()
def profile_decode(model: str = "tiny", *, weights: str = "synthetic", batch: int = 1, prompt: int = 512,
                   decode: int = 64, moe: str = "auto", lm_head: str = "auto", rounding: str = "floor",
                   seed: int = 0, device=None, profile_steps: int = 3, nvtx: bool = False,
                   check: bool = True, attention: str = "auto", layout: str = "rows",
                   lm_head_layout: str = "") -> ProfileResult:
    """Load, prefill `prompt` tokens, decode `decode` tokens greedily; measure and break down decode time.

    layout: weight layout of the MXFP4 kernels, "rows", "tiled", "rows+nib" or "tiled+nib" (Backends.layout),
    to measure end to end what a layout buys; lm_head_layout: the mxfp4 lm_head's own ("" follows layout), since
    the lm_head's fastest decode layout need not be the experts'."""
    for name, v in (("batch", batch), ("prompt", prompt), ("decode", decode), ("profile_steps", profile_steps)):
        if v < 1:
            raise ValueError(f"{name} must be at least 1, got {v}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    backends = resolve_backends(moe, lm_head, rounding, device, attention, layout, lm_head_layout)
    cfg = get_config(model)
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)

    _sync(device)
    t0 = time.perf_counter()
    m = load_model(cfg, weights, backends, seed=seed, device=device)
    _sync(device)
    load_s = time.perf_counter() - t0

    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, cfg.vocab, (batch, prompt), generator=g)
    warmup = 2
    cache = m.new_cache(batch, prompt + decode + warmup + profile_steps + 2)
    with ranges(nvtx=True, profiler=False) if nvtx else contextlib.nullcontext():
        # prefill: one warm-up (compiles kernels), then timed runs from an empty cache
        m.prefill(prompt_ids.to(device), cache)
        prefill_ms, ttft_ms = [], []
        for _ in range(3):
            cache.reset()
            _sync(device)
            t0 = time.perf_counter()
            logits = m.prefill(prompt_ids.to(device), cache)
            _sync(device)
            t1 = time.perf_counter()
            first = logits.argmax(-1)
            first_host = first.cpu()
            t2 = time.perf_counter()
            prefill_ms.append((t1 - t0) * 1e3)
            ttft_ms.append((t2 - t0) * 1e3)

        runner = DecodeRunner(m, cache, warmup=warmup)
        step_us, generated = _time_decode(runner, first, decode, device)
        cache.reset(prompt)
        eager = runner if not runner.use_graph else DecodeRunner(m, cache, use_graph=False)
        eager_us, _ = _time_decode(eager, first, min(decode, 8), device)
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if gpu else None

    cache.reset(prompt)
    eager = DecodeRunner(m, cache, use_graph=False)
    eager.tokens.copy_(first)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    with ranges(nvtx=nvtx, profiler=True, sync=gpu), torch.profiler.profile(activities=activities) as prof:
        for _ in range(profile_steps):
            eager.step()
        _sync(device)
    breakdown = component_breakdown(prof.events(), steps=profile_steps, device_time=gpu)
    kernels = kernel_table(prof.events(), steps=profile_steps) if gpu else None
    moe_share = float(breakdown.loc[breakdown["component"] == "moe", "share"].sum())

    status, rel, parity = "ok", None, None
    reference = backends.reference()
    if check and reference != dataclasses.replace(backends, layout="rows", lm_head_layout=""):  # torch ignores layouts
        parity = _parity_check(m, reference, prompt_ids[:, : min(prompt, 32)])
        rel = parity["rel_err"]
        status = parity_status(parity)

    step_med = statistics.median(step_us)
    return ProfileResult(
        model=cfg.name, weights=weights if weights == "synthetic" else str(weights), device=_device_name(device),
        backends=backends, batch=batch, prompt=prompt, decode=decode, graph=runner.use_graph, load_s=load_s,
        prefill_ms=statistics.median(prefill_ms), ttft_ms=statistics.median(ttft_ms), step_us=step_med,
        step_us_p10=_percentile(step_us, 0.1), step_us_p90=_percentile(step_us, 0.9),
        eager_step_us=statistics.median(eager_us), tok_s=batch * 1e6 / step_med, peak_mem_gb=peak,
        breakdown=breakdown, moe_share=moe_share, verdict=moe_verdict(moe_share),
        roofline=roofline_estimate(cfg, batch, prompt + decode // 2, backends.lm_head) if gpu else None,
        status=status,
        max_rel_err=rel, parity=parity, generated=[int(first_host[0])] + generated, kernels=kernels,
        pdl=m.pdl)


def _time_decode(runner: DecodeRunner, first: torch.Tensor, steps: int, device) -> tuple[list[float], list[int]]:
    """Per-step times (us) of `steps` decode steps after `first`, and the first sequence's ids."""
    runner.tokens.copy_(first.view(-1))
    if runner.use_graph:
        runner.capture()
    out = torch.empty(steps, runner.cache.batch, dtype=torch.int64, device=runner.model.device)
    cuda = device.type == "cuda"
    marks = []
    for i in range(steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            runner.step()
            end.record()
            marks.append((start, end))
        else:
            t0 = time.perf_counter()
            runner.step()
            marks.append((time.perf_counter() - t0) * 1e6)
        out[i].copy_(runner.tokens)
    if cuda:
        torch.cuda.synchronize(device)
    times = [s.elapsed_time(e) * 1e3 for s, e in marks] if cuda else marks
    return times, out[:, 0].tolist()


def _parity_check(model: GptOss, reference: Backends, tokens: torch.Tensor) -> dict:
    """The profiled backends vs their torch reference (same weights) on a short prompt: parity_summary. With
    layout "tiled" the reference shares the tiled experts (no second copy) and reads them one expert at a time."""
    return parity_summary(GptOss(model.config, model.weights, reference), model, tokens)


def parity_summary(reference: GptOss, model: GptOss, tokens: torch.Tensor) -> dict:
    """Final-logit metrics of model against reference on tokens [B, T], plus what parity_status judges: the
    largest relative error of any layer-0 component over the tokens whose layer-0 experts agree, and how many
    tokens (and what share) picked other experts there."""
    from .parity import model_parity

    report = model_parity(reference, model, tokens)
    layer0 = report.per_component[report.per_component["layer"] == 0]
    router = layer0[(layer0["component"] == "router") & layer0["flipped"].notna()]
    return {**report.logits,
            "layer0_max_rel_err": float(layer0["rel_err_agreed"].max()) if len(layer0) else 0.0,
            "layer0_flipped": int(router["flipped"].sum()), "layer0_tokens": tokens.numel(),
            "layer0_flipped_share": float(router["flipped_share"].sum())}


def parity_status(summary: dict) -> str:
    """'ok' or 'incorrect' for a parity_summary (PARITY_LAYER0_TOL, PARITY_FLIP_TOL)."""
    ok = summary["layer0_max_rel_err"] <= PARITY_LAYER0_TOL and summary["layer0_flipped_share"] <= PARITY_FLIP_TOL
    return "ok" if ok else "incorrect"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


# --------------------------------------------------------------------------------------------------------
# Storing and charting


def breakdown_chart(result: ProfileResult):
    """Measured time per decode step of each component next to its roofline floor (when known)."""
    import plotly.graph_objects as go

    comp = by_component(result.breakdown)
    comp = comp[comp["us"] > 0]
    unit = "GPU kernel" if result.device != "cpu" else "CPU op"
    fig = go.Figure(go.Bar(x=comp["component"], y=comp["us"], name=f"measured ({unit} time)",
                           text=comp["share"].map(lambda s: f"{s:.0%}"), textposition="outside"))
    if result.roofline:
        floors = result.roofline["components"]
        names = list(dict.fromkeys([*comp["component"], *floors]))
        fig.add_trace(go.Bar(x=names, y=[floors.get(n) for n in names], name="roofline floor"))
    fig.update_layout(barmode="group", yaxis_title="us per decode step",
                      title=f"{result.model} decode, {result.backends.label()}, batch {result.batch}: "
                            f"MoE {result.moe_share:.0%} ({result.verdict.split(':')[0]})")
    return fig


def store_profile(result: ProfileResult, out: str | Path | None = None, command: str | None = None) -> Path:
    """A run folder with the decode_step point, profile.json (breakdown included) and the chart."""
    from ..charts import save_figure
    from ..results import PointStore
    from ..runs import create_run, write_json_atomic

    params = {k: v for k, v in result.to_json().items() if k in ("model", "weights", "batch", "prompt", "decode",
                                                                   "backends", "graph", "pdl")}
    ceilings = result.roofline.get("ceilings") if result.roofline else None
    run = create_run(f"model-profile-{result.model}", parameters=params, out=out, command=command, ceilings=ceilings)
    PointStore(run.path).append(result.point())
    write_json_atomic(run.path / "profile.json", result.to_json())
    save_figure(breakdown_chart(result), run.path, "decode_breakdown")
    run.finish()
    return run.path


def load_profile(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / "profile.json").read_text())


def short_kernel(name: str, width: int = 60) -> str:
    """A kernel's name without its C++ return type and argument list, at most `width` characters."""
    short = name if name.startswith("Memcpy") else \
        name.removeprefix("void ").replace("(anonymous namespace)::", "").split("(")[0]
    return short if len(short) <= width else short[:width - 3] + "..."


def compare_profiles(a: dict, b: dict, *, kernels: int = 12) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two decode profiles (load_profile's dicts), B against A: (components, kernels), each with us per decode
    step in A and B, B - A and B / A. A step's time says whether a change won; these say where: a component
    or kernel only one side has (a launch fused away or added) shows a blank on the other. Kernels are the
    `kernels` with the largest |B - A|, by name."""
    def side(rows, key, value):  # names that shorten alike add up
        out = {}
        for r in rows:
            out[r[key]] = out.get(r[key], 0.0) + r[value]
        return out

    def table(key, value, rows_a, rows_b):
        ta, tb = side(rows_a, key, value), side(rows_b, key, value)
        names = list(dict.fromkeys([*ta, *tb]))
        t = pd.DataFrame({key: names, "A us": [ta.get(n) for n in names], "B us": [tb.get(n) for n in names]},
                         dtype=object)
        t[["A us", "B us"]] = t[["A us", "B us"]].astype(float)
        t["B-A us"] = t["B us"].fillna(0.0) - t["A us"].fillna(0.0)
        t["B/A"] = t["B us"] / t["A us"]
        return t

    comp = table("component", "us", *([*p.get("breakdown", []), {"component": "step", "us": p.get("step_us")}]
                                     for p in (a, b)))
    ker = table("kernel", "us", *([{**r, "kernel": short_kernel(r["kernel"])} for r in p.get("kernels", [])]
                                  for p in (a, b)))
    ker = ker.reindex(ker["B-A us"].abs().sort_values(ascending=False).index).head(kernels).reset_index(drop=True)
    return comp, ker
