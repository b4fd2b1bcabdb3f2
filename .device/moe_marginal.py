"""What each launch of a moe_mma (or decode moe_h2g) layer adds to the layer, in context: CUDA-graph times
(labkit.bench.time_calls, the sweep's method, same routing sample and relabelings) of the layer's chain with
stages left out, each stage launched as run_moe_mma launches it (PDL inside the chain, CHAIN counters):

  full      x_to_f16 -> mlp1 -> mlp2 -> combine   (the moe_layer op)
  no_x      mlp1 -> mlp2 -> combine               (x16 made outside the graph)
  no_comb   x_to_f16 -> mlp1 -> mlp2
  core      mlp1 -> mlp2
  mlp1      mlp1 alone
  mlp2      mlp2 alone (act made outside the graph)

(moe_h2g: full, no_x, no_comb and core only, through its launcher's x16 and combine arguments.)

Question: how much of the ~16 us that a 120b layer at 16-256 tokens spends beyond streaming its weights at
2.9 TB/s (fit over the committed sweeps) is x_to_f16 and the combine, i.e. what would folding them into mlp1 and
mlp2 buy? Checks nothing: the stages are the ones the GPU tests check; this only times them.

call as: python3 .device/moe_marginal.py [$OUT/moe-marginal]   (writes marginal.csv and meta.json there)
"""
import sys

import torch

import kernels as K
from kernels import moe_mma as MM
from kernels._triton import pdl_scope
from kernels.linear_f16 import x_to_f16
from kernels.moe import MoESlots, act16_scale, moe_problem, tile_slots
from kernels.sync import scratch
from labkit import routing as routing_gen
from labkit.bench import device as dev
from labkit.bench import settle_allocator, time_calls
from labkit.bench_moe import MoEBench, _relabel, point_seed
from labkit.runs import probe_run

WG = dict(CHUNKS=1, num_warps=4, WGMMA=True, STAGES=4, TILED=True, RING_W=True, NIB=True)
#: (model, tokens, the config the sweeps found best for the whole layer)
H2G1 = dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=16, BLOCK_N2=8, NIB=True, num_stages=1, num_warps=4)
H2G4 = dict(BLOCK_K=512, BLOCK_M=1, BLOCK_N=16, num_stages=1, num_warps=2)
POINTS = [("gpt-oss-120b", 1, H2G1), ("gpt-oss-120b", 4, H2G4), ("gpt-oss-20b", 1, H2G1),
          ("gpt-oss-120b", 16, dict(WG, BLOCK_M=8, ROWS=1, CHAIN=True)),
          ("gpt-oss-120b", 32, dict(WG, BLOCK_M=8, ROWS=2, CHAIN=True)),
          ("gpt-oss-120b", 256, dict(WG, BLOCK_M=16, ROWS=2, CHAIN=True)),
          ("gpt-oss-20b", 16, dict(WG, BLOCK_M=8, ROWS=2, CHAIN=True)),
          ("gpt-oss-20b", 64, dict(WG, BLOCK_M=16, ROWS=2, CHAIN=True)),
          ("gpt-oss-20b", 512, dict(WG, BLOCK_M=32, ROWS=2, CHAIN=False))]
STAGES = ("full", "no_x", "no_comb", "core", "mlp1", "mlp2")


def chains(bench, tokens, cfg):
    """{stage set: [one callable per relabeled routing]} for one config (run_moe_mma's body, stages optional)."""
    sample = routing_gen.generate("uniform", tokens, bench.E, bench.k, seed=point_seed(tokens, "uniform"))
    ids = sample.ids.to(dev())
    p1, p2 = K.prepare_mxfp4(bench.w1), K.prepare_mxfp4(bench.w2)
    x = torch.randn(tokens, bench.H, device=dev()).to(torch.bfloat16)
    step = 128 * cfg.get("CHUNKS", 1)
    scale = act16_scale(7.0)
    variant = "moe_mma" if "ROWS" in cfg else "moe_h2g"
    full = {**K.VARIANTS[variant].defaults, **cfg}
    out = {s: [] for s in STAGES}
    rs = [K.Routing.from_ids(ids if i == 0 else _relabel(ids, bench.E, seed=i), sample.weights.to(dev()), bench.E,
                             validate=False) for i in range(6)]
    problem = moe_problem(tokens, rs[0], p1, p2)
    assert K.VARIANTS[variant].reason(full, problem) is None
    if variant == "moe_h2g":  # its launcher takes x16 (made outside the graph) and combine=False itself
        fn, x16 = K.VARIANTS[variant].fn, x_to_f16(x, planes=True)
        for r in rs:
            for s, kw in (("full", {}), ("no_x", {"x16": x16}), ("no_comb", {"combine": False}),
                          ("core", {"x16": x16, "combine": False})):
                out[s].append(lambda r=r, kw=kw: fn(x, r, p1, bench.b1, p2, bench.b2, 1.702, 7.0, **kw, **full))
        return {s: c for s, c in out.items() if c}, sample.stats()["distinct_experts"]
    for r in rs:
        S = r.sorted.numel()
        xq0, xs0 = x_to_f16(x, pad=step, logical=True)
        act = torch.zeros((S, -(-bench.I // step) * step), device=dev(), dtype=torch.float16)
        y = torch.zeros((S, bench.H), device=dev(), dtype=torch.bfloat16)
        chain = scratch(x.device, ("moe_mma_chain",), 2 * tile_slots(r, cfg["BLOCK_M"])) if cfg["CHAIN"] else None

        def run(with_x, m1, m2, comb, r=r, act=act, y=y, chain=chain, xq0=xq0, xs0=xs0):
            xq, xs = x_to_f16(x, pad=step, logical=True) if with_x else (xq0, xs0)
            need = 0
            if m1:  # the chain's first launch waits for the previous call to end (no PDL), as x_to_f16 does
                with pdl_scope(with_x):
                    need = MM._launch(1, xq, xs, r, p1, bench.b1, act, act.shape[1], 1.702, 7.0, scale, full,
                                      chain if m2 else None)
            if m2:  # alone: no counters to wait on, no PDL
                with pdl_scope(m1):
                    MM._launch(2, act, xs, r, p2, bench.b2, y, bench.H, 1.702, 7.0, scale, full,
                               chain if m1 else None, need)
            if comb:
                MoESlots(y, r.inverse, r.top_k).combine()

        for s, flags in (("full", (1, 1, 1, 1)), ("no_x", (0, 1, 1, 1)), ("no_comb", (1, 1, 1, 0)),
                         ("core", (0, 1, 1, 0)), ("mlp1", (0, 1, 0, 0)), ("mlp2", (0, 0, 1, 0))):
            out[s].append(lambda f=flags, run=run: run(*f))
    return out, sample.stats()["distinct_experts"]


def main():
    run = probe_run("moe-marginal")
    lines = ["model,tokens,config,experts,stage,us,p10,p90"]
    summary = []
    bench = None
    for model, tokens, cfg in POINTS:
        if bench is None or bench.model != model:
            bench = None
            torch.cuda.empty_cache()
            bench = MoEBench(model, baseline=False)
        calls, experts = chains(bench, tokens, cfg)
        us = {}
        for s in calls:
            settle_allocator()
            t = time_calls(calls[s], reps=15)
            kind = "graph" if t["us_graph"] is not None else "eager"  # eager: the CPU interpreter
            us[s] = t[f"us_{kind}"]
            lines.append(f"{model},{tokens},\"{cfg}\",{experts},{s},{us[s]:.2f},{t[f'us_{kind}_p10']:.2f},"
                         f"{t[f'us_{kind}_p90']:.2f}")
        summary.append(f"{model:13s} {tokens:4d} ({experts:3d} experts)  " + "  ".join(f"{s} {us[s]:7.1f}"
                                                                                      for s in us)
                       + f"   x adds {us['full'] - us['no_x']:5.1f}, combine adds {us['full'] - us['no_comb']:5.1f}")
        print(summary[-1], flush=True)
        if run:
            (run.path / "marginal.csv").write_text("\n".join(lines) + "\n")
    if run:
        run.update_meta(contents="marginal.csv: CUDA-graph us per call of a MoE layer's launch chain with stages left "
                                 "out (full, no_x, no_comb, core = mlp1 + mlp2; moe_mma also mlp1, mlp2 alone) at the "
                                 "sweeps' best moe_mma (16-512 tokens) and moe_h2g (1-4 tokens) configs, on the "
                                 "sweep's routing sample and relabelings")
        run.finish()
    print("\n".join(summary))


if __name__ == "__main__":
    sys.exit(main())
