"""Does the longer spin kernel ahead of each timed replay (labkit.hardware.SPIN_CYCLES, 100k -> 1M cycles in stop 48)
change what short replays measure? The one-token lm_head and MoE layers replay in 27-110 us, far shorter than a
0.5 ms spin that keeps one SM busy while the others idle. Each leader (checked against its reference first) is timed
as the sweep times it (time_calls, 25 replays) behind 100k, 1M and 4M cycles, in two alternating rounds.

call as: python3 .device/spin_length.py [OUT_DIR]   (writes spin.csv and meta.json)
"""

import pandas as pd

import labkit.hardware as hardware
from labkit import routing as routing_gen
from labkit.bench import TOL, LinearBench, LinearCase, check_linear, time_calls
from labkit.bench_moe import TOL_MOE, MoEBench, MoECase, check_moe, point_seed
from labkit.runs import probe_run

LM = (201088, 2880)
LINEAR = [(1, "gemv_h2g", dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=4, EARLY=True, MAXNREG=72, NIB=True, PREFETCH=True,
                               num_stages=1, num_warps=1)),
          (8, "gemv_mma", dict(BLOCK_M=8, CHUNKS=1, EARLY=True, NIB=True, RING_W=True, ROWS=2, STAGES=3, TILED=True,
                               TMA=2, WGMMA=True, num_warps=4))]
WG = dict(CHUNKS=1, NIB=True, RING_W=True, STAGES=4, TILED=True, WGMMA=True, num_warps=4, BLOCK_M=8, CHAIN=True)
MOE = [(1, "moe_h2g", dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=4, BLOCK_N2=4, EARLY=2, NIB=True, PREFETCH=True,
                           num_stages=1, num_warps=1)),
       (8, "moe_mma", dict(WG, ROWS=2, ROWS2=1, EPI_EARLY=2)),
       (16, "moe_mma", dict(WG, ROWS=1, EPI_EARLY=1, XSKIP=True))]
SPINS = (100_000, 1_000_000, 4_000_000)


def main():
    run = probe_run("spin-length")
    points = []
    lb = LinearBench(*LM, max_m=8)
    for m, variant, cfg in LINEAR:
        case = LinearCase("lm_head", m, *LM, variant, cfg)
        err = check_linear(case, seed=0)
        if not err <= TOL:
            raise RuntimeError(f"lm_head {m} {variant}: relative error {err:.3g}")
        points.append((f"lm_head m={m} {variant}", err, lb.calls(case)))
    mb = MoEBench("gpt-oss-120b", baseline=False)
    for t, variant, cfg in MOE:
        case = MoECase(model=mb.model, tokens=t, routing="uniform", variant=variant, experts=mb.E, top_k=mb.k,
                       hidden=mb.H, intermediate=mb.I, config=cfg)
        sample = routing_gen.generate("uniform", t, mb.E, mb.k, seed=point_seed(t, "uniform"))
        err = check_moe(case, mb, sample, seed=0)
        if not err <= TOL_MOE:
            raise RuntimeError(f"moe 120b {t} {variant}: relative error {err:.3g}")
        points.append((f"moe 120b T={t} {variant}", err, mb.calls(case, sample)[0]))
    rows = []
    for rnd in range(2):
        for name, err, calls in points:
            for spin in SPINS:
                hardware.SPIN_CYCLES = spin
                r = time_calls(calls, reps=25)
                rows.append({"point": name, "max_rel_err": err, "round": rnd, "spin_cycles": spin, **r})
                print(f"{name:32s} round {rnd} spin {spin:>9,d}: {r['us_graph']:8.1f} us "
                      f"({r['us_graph_p10']:.1f}-{r['us_graph_p90']:.1f}) {r['sm_mhz']} MHz", flush=True)
    d = pd.DataFrame(rows)
    with pd.option_context("display.width", 200):
        print(d.pivot_table(index="point", columns=["spin_cycles", "round"], values="us_graph").round(1).to_string())
    if run:
        d.to_csv(run.path / "spin.csv", index=False)
        run.update_meta(contents="spin.csv: per leader point, round and spin length (cycles of the sleep kernel "
                                 "queued ahead of each timed replay), the sweep's time_calls result")
        run.finish()


if __name__ == "__main__":
    main()
