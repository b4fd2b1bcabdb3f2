"""Where a moe_mma layer's time goes, phase by phase: CUDA-graph times (labkit.bench.time_calls, the sweep's
method) of mlp1 alone and mlp2 alone for every config of a grid, and of the whole layer, x_to_f16 and the
combine at the config a sweep found best, on the routing sample and relabeled copies the sweep times.
Question: would mlp1 and mlp2 pick different configs if each could have its own? Checks nothing: the phases
are the ones the GPU tests check; this only times them.

call as: python3 .device/moe_stages.py [$OUT/moe-stages]   (writes stages.csv and meta.json there)
"""
import ast
import sys

import torch

import kernels as K
from kernels import moe_mma as MM
from kernels.linear_f16 import x_to_f16
from kernels.moe import MoESlots, act16_scale, moe_problem
from labkit import routing as routing_gen
from labkit.bench import ON_GPU, settle_allocator, time_calls
from labkit.bench import device as dev
from labkit.bench_moe import MoEBench, MoECase, _relabel, point_seed
from labkit.compile import precompile
from labkit.runs import probe_run

WG = dict(ROWS=2, CHUNKS=1, num_warps=4, WGMMA=True, STAGES=4, TILED=True, RING_W=True, NIB=True)
SYNC8 = dict(BLOCK_M=8, ROWS=1, CHUNKS=1, num_warps=4, TILED=True, NIB=True)
#: (model, tokens, the config the sweeps found best for the whole layer)
POINTS = [("gpt-oss-20b", 16, SYNC8), ("gpt-oss-20b", 64, dict(WG, BLOCK_M=16, STAGES=3)),
          ("gpt-oss-20b", 256, dict(WG, BLOCK_M=32)), ("gpt-oss-120b", 16, SYNC8),
          ("gpt-oss-120b", 128, dict(WG, BLOCK_M=16))]
GRID = [{"BLOCK_M": (8, 16), "ROWS": (1, 2), "CHUNKS": (1, 2), "PREFETCH": (False, True), "num_warps": (4, 8),
         "TILED": (True,), "NIB": (True,)},
        {"BLOCK_M": (16, 32, 64), "ROWS": (1, 2), "CHUNKS": (1,), "num_warps": (4, 8), "WGMMA": (True,),
         "STAGES": (3, 4), "TILED": (True,), "RING_W": (True,), "NIB": (True,)}]


def routings(bench, tokens):
    sample = routing_gen.generate("uniform", tokens, bench.E, bench.k, seed=point_seed(tokens, "uniform"))
    case = MoECase(bench.model, tokens, "uniform", "moe_mma", bench.E, bench.k, bench.H, bench.I, SYNC8)
    n = len(bench.calls(case, sample)[0])
    ids = sample.ids.to(dev())
    return sample, [K.Routing.from_ids(ids if i == 0 else _relabel(ids, bench.E, seed=i), sample.weights.to(dev()),
                                       bench.E, validate=False) for i in range(n)]


def phase_calls(bench, rs, tokens, c):
    """{"x_to_f16", "mlp1", "mlp2", "combine": [one callable per routing]} for config c."""
    p1, p2 = K.prepare_mxfp4(bench.w1), K.prepare_mxfp4(bench.w2)
    x = torch.randn(tokens, bench.H, device=dev()).to(torch.bfloat16)
    step = 128 * c["CHUNKS"]
    scale = act16_scale(7.0)
    out = {"x_to_f16": [], "mlp1": [], "mlp2": [], "combine": []}
    for r in rs:
        S = r.sorted.numel()
        xq, xs = x_to_f16(x, pad=step, logical=c["WGMMA"])
        act = torch.zeros((S, -(-bench.I // step) * step if c["WGMMA"] else bench.I), device=dev(),
                          dtype=torch.float16)
        y = torch.zeros((S, bench.H), device=dev(), dtype=torch.bfloat16)
        out["x_to_f16"].append(lambda: x_to_f16(x, pad=step, logical=c["WGMMA"]))
        out["mlp1"].append(lambda r=r, xq=xq, xs=xs, a=act: MM._launch(
            1, xq, xs, r, p1, bench.b1, a, a.shape[1], 1.702, 7.0, scale, c))
        out["mlp2"].append(lambda r=r, xs=xs, a=act, y=y: MM._launch(
            2, a, xs, r, p2, bench.b2, y, bench.H, 1.702, 7.0, scale, c))
        out["combine"].append(lambda r=r, y=y: MoESlots(y, r.inverse, r.top_k).combine())
    return out


def timed(calls):
    settle_allocator()
    t = time_calls(calls, reps=10)
    return t["us_graph"] if t["us_graph"] is not None else t["us_eager"]


def main():
    run = probe_run("moe-stages")
    v = K.VARIANTS["moe_mma"]
    lines = ["model,tokens,config,stage,us"]
    summary = []
    bench = None
    for model, tokens, best in POINTS:
        if bench is None or bench.model != model:
            bench = None
            torch.cuda.empty_cache()
            bench = MoEBench(model, baseline=False)
        sample, rs = routings(bench, tokens)
        problem = moe_problem(tokens, rs[0], K.prepare_mxfp4(bench.w1), K.prepare_mxfp4(bench.w2))
        cfgs = [c for space in GRID for c in v.configs(problem, space) if c["BLOCK_M"] <= 2 * tokens]
        if ON_GPU:
            precompile([{"op": "moe", "variant": "moe_mma", "config": c, "m": tokens, "experts": bench.E,
                         "top_k": bench.k, "n": 2 * bench.I, "k": bench.H} for c in cfgs], progress=False)
        case = MoECase(model, tokens, "uniform", "moe_mma", bench.E, bench.k, bench.H, bench.I, best)
        layer = timed(bench.calls(case, sample)[0])
        parts = phase_calls(bench, rs, tokens, v.check(best, problem))
        fixed = {s: timed(parts[s]) for s in ("x_to_f16", "combine")}
        for s, us in [("layer", layer), *fixed.items()]:
            lines.append(f"{model},{tokens},\"{best}\",{s},{us:.2f}")
        phases = {}
        for c in cfgs:
            calls = phase_calls(bench, rs, tokens, c)
            phases[str(c)] = (timed(calls["mlp1"]), timed(calls["mlp2"]))
            for s, us in zip(("mlp1", "mlp2"), phases[str(c)]):
                lines.append(f"{model},{tokens},\"{c}\",{s},{us:.2f}")
        b1 = min(phases.items(), key=lambda kv: kv[1][0])
        b2 = min(phases.items(), key=lambda kv: kv[1][1])
        same = min(phases.items(), key=lambda kv: sum(kv[1]))
        summary.append(f"{model:13s} {tokens:5d} layer {layer:7.1f} (x {fixed['x_to_f16']:.1f}, combine "
                       f"{fixed['combine']:.1f})  best same config {sum(same[1]):7.1f} = {same[1][0]:.1f} + "
                       f"{same[1][1]:.1f}  best apart {b1[1][0] + b2[1][1]:7.1f} = {b1[1][0]:.1f} + "
                       f"{b2[1][1]:.1f}\n    same  {short(same[0])}\n    mlp1  {short(b1[0])}\n"
                       f"    mlp2  {short(b2[0])}")
        print(summary[-1], flush=True)
        if run:
            (run.path / "stages.csv").write_text("\n".join(lines) + "\n")
    if run:
        run.update_meta(contents="stages.csv: CUDA-graph us per call of moe_mma's mlp1 and mlp2 alone over a "
                                 "config grid, and of the layer, x_to_f16 and combine at the sweeps' best config "
                                 "(same routing sample and relabelings as the sweep)")
        run.finish()
    print("\n".join(summary))


def short(cfg: str) -> str:
    c = ast.literal_eval(cfg)
    keep = ("BLOCK_M", "ROWS", "CHUNKS", "PREFETCH", "num_warps", "WGMMA", "STAGES")
    return " ".join(f"{k}={c[k]}" for k in keep if c.get(k) not in (None, False, 0))


if __name__ == "__main__":
    sys.exit(main())
