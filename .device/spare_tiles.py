"""What moe_mma's spare programs cost: the token-tile grid is sized for the worst routing (kernels.moe.tile_slots)
and every program past the routing's real tiles loads the offsets, scans them and exits. At 120b 32 tokens
(BLOCK_M=8, 45 column tiles) the old bound cdiv(S, BLOCK_M) + min(E, S) made ~2900 of ~6500 mlp1 programs spare.
Times the layer (CUDA graphs over the sweep's routing sample and relabelings, labkit.bench.time_calls) with
  old      the old bound
  tight    tile_slots as shipped: floor((S + min(E, S) * (BLOCK_M - 1)) / BLOCK_M), the exact worst case
  exact    exactly the routing's tiles (read on the host: a probe only; a layer cannot know it without a sync)
checking that all agree bit for bit first. (Its run at edb8289, results/20261127T061335-h100-80gb-hbm3-spare-tiles,
also timed moe_mma's SPARE_FIRST, since removed: spare programs first, exiting before their PDL wait.)

call as: python3 .device/spare_tiles.py [OUT_DIR]   (writes spare_tiles.csv and meta.json there)
"""
import sys

import torch

import kernels as K
from kernels import moe_mma as MM
from labkit import routing as routing_gen
from labkit.bench import settle_allocator, time_calls
from labkit.bench_moe import MoEBench, _relabel, point_seed
from labkit.runs import probe_run

WG = dict(CHUNKS=1, num_warps=4, WGMMA=True, STAGES=4, TILED=True, RING_W=True, NIB=True)
C8 = dict(WG, BLOCK_M=8, ROWS=2, ROWS2=1, CHAIN=True, EPI_EARLY=2)
C16 = dict(WG, BLOCK_M=16, ROWS=2, CHAIN=True, EPI_EARLY=1)
T64 = dict(WG, BLOCK_M=64, ROWS=2, STAGES=3, MAXNREG=168, EPI_EARLY=1, TMA=2)
POINTS = [("gpt-oss-120b", 16, C8), ("gpt-oss-120b", 32, C8), ("gpt-oss-120b", 64, C8), ("gpt-oss-120b", 256, C16),
          ("gpt-oss-20b", 16, C8), ("gpt-oss-20b", 64, C16), ("gpt-oss-20b", 256, T64)]
shipped = MM.tile_slots
exact = {}


def old(r, bm):
    S = r.sorted.numel()
    return -(-S // bm) + min(r.num_experts, S)


def real(r, bm):
    return exact[(id(r), bm)]


def layer_calls(x, rs, p1, p2, bench, full):
    """One layer call per routing, as the sweep's moe_layer op makes them."""
    return [lambda r=r: MM.run_moe_mma(x, r, p1, bench.b1, p2, bench.b2, 1.702, 7.0, **full) for r in rs]


def main():
    run = probe_run("spare-tiles")
    lines = ["model,tokens,grid,tiles,us,p10,p90"]
    bench = None
    for model, tokens, cfg in POINTS:
        if bench is None or bench.model != model:
            bench = None
            torch.cuda.empty_cache()
            bench = MoEBench(model, baseline=False)
        full = {**K.VARIANTS["moe_mma"].defaults, **cfg}
        sample = routing_gen.generate("uniform", tokens, bench.E, bench.k, seed=point_seed(tokens, "uniform"))
        ids = sample.ids.cuda()
        p1, p2 = K.prepare_mxfp4(bench.w1), K.prepare_mxfp4(bench.w2)
        x = torch.randn(tokens, bench.H, device="cuda").to(torch.bfloat16)
        rs = [K.Routing.from_ids(ids if i == 0 else _relabel(ids, bench.E, seed=i), sample.weights.cuda(), bench.E,
                                 validate=False) for i in range(6)]
        bm = cfg["BLOCK_M"]
        for r in rs:
            counts = (r.offsets[1:] - r.offsets[:-1]).cpu()
            exact[(id(r), bm)] = int(((counts + bm - 1) // bm).sum())
        ref = None
        for name, fn in (("old", old), ("tight", shipped), ("exact", real)):
            MM.tile_slots = fn
            calls = layer_calls(x, rs, p1, p2, bench, full)
            got = calls[0]()
            ref = got if ref is None else ref
            assert torch.equal(got, ref), (model, tokens, name)
            settle_allocator()
            t = time_calls(calls, reps=20)
            lines.append(f"{model},{tokens},{name},{fn(rs[0], bm)},{t['us_graph']:.2f},{t['us_graph_p10']:.2f},"
                         f"{t['us_graph_p90']:.2f}")
            print(lines[-1], flush=True)
        MM.tile_slots = shipped
        if run:
            (run.path / "spare_tiles.csv").write_text("\n".join(lines) + "\n")
    if run:
        run.update_meta(contents="spare_tiles.csv: CUDA-graph us per moe_mma layer call with the token-tile grid "
                                 "bounds old, tight (shipped) and exact (host-read), at "
                                 "the sweeps' leader configs")
        run.finish()
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
