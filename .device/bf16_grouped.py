"""What the large-token MoE targets ask, against what bf16 weights reach on the same GPU: for gpt-oss's MoE at 512-8192
tokens (uniform routing, the sweeps' samples), (1) the layer's two expert GEMMs alone with bf16 weights
(torch._grouped_mm over the expert-sorted rows: no gather, bias, SwiGLU or combine), checked per expert against an
fp32 matmul first; (2) the config `variant="auto"` takes with tiled+nib weights, the whole layer, checked against
reference_moe first; both timed as the sweeps time them (labkit.bench.time_calls), two rounds. Also the bf16
ceiling's own 8192^3 matmul, timed as measure_ceilings times it (median of single spin-led calls) and sustained (300
calls back to back, one event pair), each with the SM clock nvidia-smi saw: the MoE at 4096-8192 tokens runs seconds
at a power cap.

call as: python3 .device/bf16_grouped.py [OUT_DIR] [--models ...] [--tokens ...]
(writes bf16_grouped.csv, ceiling_clock.csv and meta.json into a probe run folder)
"""

import argparse
import contextlib
import statistics

import pandas as pd
import torch
from probe_points import checked_moe_calls, timed_arms

import kernels as K
from kernels.tables import pick_moe
from labkit import routing as routing_gen
from labkit.bench_moe import MODELS, MoEBench, point_seed
from labkit.clocks import ClockSampler
from labkit.hardware import event_ms, measure_ceilings
from labkit.roofline import moe_cost
from labkit.runs import probe_run


def bf16_experts(model: str, dev: str = "cuda"):
    """Random bf16 expert weights w1 [E, 2I, H], w2 [E, H, I] of a model's shapes (one copy per model)."""
    E, k, H, I = MODELS[model]
    g = torch.Generator(device=dev).manual_seed(7)
    w1 = (torch.randn(E, 2 * I, H, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    return w1, w2


def grouped_gemm_calls(model: str, tokens: int, w1, w2) -> tuple[float, list, dict]:
    """(worst relative error over three experts, [the two grouped GEMMs as one call], point facts)."""
    E, k, H, I = MODELS[model]
    dev = w1.device
    sample = routing_gen.generate("uniform", tokens, E, k, seed=point_seed(tokens, "uniform"))
    r = K.Routing.from_ids(sample.ids.to(dev), sample.weights.to(dev), E)
    offs = r.offsets[1:].contiguous()
    g = torch.Generator(device=dev).manual_seed(tokens)
    S = tokens * k
    xs = torch.randn(S, H, device=dev, generator=g).to(torch.bfloat16)
    act = torch.randn(S, I, device=dev, generator=g).to(torch.bfloat16)
    w1t, w2t = w1.transpose(1, 2), w2.transpose(1, 2)
    h = torch._grouped_mm(xs, w1t, offs=offs)
    y = torch._grouped_mm(act, w2t, offs=offs)
    o = r.offsets.cpu().tolist()
    err = 0.0
    for e in sorted(set(sample.ids.flatten().tolist()))[:3]:
        lo, hi = o[e], o[e + 1]
        for got, a, w in ((h, xs, w1), (y, act, w2)):
            ref = a[lo:hi].float() @ w[e].float().T
            err = max(err, ((got[lo:hi].float() - ref).norm() / ref.norm()).item())
    if not err <= 1e-2:
        raise RuntimeError(f"{model} {tokens} tokens: grouped bf16 GEMMs off by {err:.3g}")
    cost = moe_cost(tokens, E, k, H, I, active_experts=sample.stats()["distinct_experts"])

    def call():
        torch._grouped_mm(xs, w1t, offs=offs)
        torch._grouped_mm(act, w2t, offs=offs)
    return err, [call], {"flops": cost.flops, "mxfp4_bytes": cost.bytes}


def ceiling_clock(n: int = 8192, sustained: int = 300) -> list[dict]:
    """The 8192^3 bf16 matmul: measure_ceilings' way (median of 20 single spin-led calls) and `sustained` calls
    back to back, each with the SM clock and power seen meanwhile."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", generator=g, dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", generator=g, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    rows = []
    with ClockSampler() as c:
        ms = statistics.median(event_ms(lambda: a @ b) for _ in range(20))
    rows.append({"mode": "single calls (measure_ceilings)", "ms_per_call": ms, "tflops": 2 * n**3 / ms / 1e9,
                 **c.result})
    with ClockSampler() as c:
        ms = event_ms(lambda: [a @ b for _ in range(sustained)]) / sustained
    rows.append({"mode": f"{sustained} calls back to back", "ms_per_call": ms, "tflops": 2 * n**3 / ms / 1e9,
                 **c.result})
    for r in rows:
        print(r, flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", nargs="?")
    p.add_argument("--models", nargs="+", default=["gpt-oss-20b", "gpt-oss-120b"])
    p.add_argument("--tokens", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192])
    args = p.parse_args()
    run = probe_run("bf16-grouped")
    ceil = measure_ceilings()
    clocks = ceiling_clock()
    points, facts = [], {}
    for model in args.models:
        mb = MoEBench(model, baseline=False)
        w1, w2 = bf16_experts(model)
        for t in args.tokens:
            err, calls, f = grouped_gemm_calls(model, t, w1, w2)
            points.append((f"{model} T={t} bf16 GEMMs", err, calls))
            facts[points[-1][0]] = dict(f, model=model, tokens=t, arm="bf16 grouped GEMMs only")
            E, k, H, I = MODELS[model]
            name, cfg = pick_moe({"op": "moe", "m": t, "tokens": t, "experts": E, "top_k": k, "n": 2 * I, "k": H,
                                  "scale_min": 118, "scale_max": 124, "tiled": True, "shuffled": True})
            err, calls = checked_moe_calls(mb, t, name, cfg)
            points.append((f"{model} T={t} mxfp4 auto", err, calls))
            facts[points[-1][0]] = dict(f, model=model, tokens=t, arm="moe_mxfp4 auto (tiled+nib), whole layer")
            print(f"{model} T={t}: bf16 GEMMs checked, {name} {cfg} rel err {err:.3g}", flush=True)
    d = timed_arms(points, {"plain": lambda name, calls: contextlib.nullcontext(calls)}, "arm_", reps=20)
    d = d.assign(**{c: d.point.map(lambda p, c=c: facts[p][c]) for c in ("model", "tokens", "arm", "flops",
                                                                         "mxfp4_bytes")})
    d["tflops"] = d.flops / d.us_graph / 1e6
    d["frac_of_bf16_ceiling"] = d.tflops / ceil.bf16_tflops
    floor_us = [max(b / ceil.read_gbps / 1e3, f / ceil.bf16_tflops / 1e6) for b, f in zip(d.mxfp4_bytes, d.flops)]
    d["frac_of_mxfp4_floor"] = pd.Series(floor_us, index=d.index) / d.us_graph
    with pd.option_context("display.width", 200):
        print(d.groupby(["model", "tokens", "arm"])[["us_graph", "tflops", "frac_of_mxfp4_floor", "sm_mhz"]]
              .median().round(3).to_string())
    if run:
        run.update_meta(parameters=vars(args), ceilings=ceil.as_meta())
        run.finish_with(
            "bf16_grouped.csv: per point (model, tokens, arm) and round, time_calls' columns (us per call, SM "
            "clock), tflops, frac_of_bf16_ceiling and frac_of_mxfp4_floor (the MoE layer's floor as ./lab targets "
            "judges it, from this run's ceilings); arm 'bf16 grouped GEMMs only' is the two expert GEMMs alone on "
            "bf16 weights (torch._grouped_mm), 'moe_mxfp4 auto (tiled+nib), whole layer' the lab's layer in the "
            "config auto takes. ceiling_clock.csv: "
            "the 8192^3 bf16 matmul as measure_ceilings times it and sustained, with clocks.",
            bf16_grouped=d, ceiling_clock=pd.DataFrame(clocks))


if __name__ == "__main__":
    main()
