"""Points the device probes time, each checked against its reference first (as the sweeps check every point), the
leaders several probes share, and the loop that times them under a probe's arms (timed_arms). Imported by the
probes in this folder (`python3 .device/<probe>.py` puts it on the path)."""

import pandas as pd

import kernels as K
from labkit import routing as routing_gen
from labkit.bench import LinearBench, LinearCase, check_linear, time_calls, tolerance
from labkit.bench_moe import MoEBench, MoECase, check_moe, point_seed

LM_HEAD = (201088, 2880)
_MMA = dict(BLOCK_M=8, CHUNKS=1, EARLY=True, NIB=True, RING_W=True, ROWS=2, STAGES=3, TILED=True, TMA=2, WGMMA=True,
            num_warps=4)
#: the lm_head leaders: (tokens, variant, config)
LM_HEAD_LEADERS = {1: ("gemv_h2g", dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=4, EARLY=True, MAXNREG=72, NIB=True,
                                        PREFETCH=True, num_stages=1, num_warps=1)),
                   2: ("gemv_mma", _MMA), 8: ("gemv_mma", _MMA)}
#: moe_mma's tiled WGMMA ring with CHAIN at 8-token tiles, the base of the 4-32-token leaders
WG8 = dict(CHUNKS=1, NIB=True, RING_W=True, STAGES=4, TILED=True, WGMMA=True, num_warps=4, BLOCK_M=8, CHAIN=True)
#: the gpt-oss-120b MoE leaders at 1, 8 and 16 tokens: (variant, config)
MOE_120B_LEADERS = {1: ("moe_h2g", dict(BLOCK_K=1024, BLOCK_M=1, BLOCK_N=4, BLOCK_N2=4, EARLY=2, NIB=True,
                                        PREFETCH=True, num_stages=1, num_warps=1)),
                    8: ("moe_mma", dict(WG8, ROWS=2, ROWS2=1, EPI_EARLY=2)),
                    16: ("moe_mma", dict(WG8, ROWS=1, EPI_EARLY=1, XSKIP=True))}


def moe_case(bench: MoEBench, tokens: int, variant: str, cfg: dict):
    """(case, sample) of a uniform-routing point: the config completed with its variant's defaults, the routing
    sample every config of the point is timed on (point_seed)."""
    case = MoECase(model=bench.model, tokens=tokens, routing="uniform", variant=variant, experts=bench.E,
                   top_k=bench.k, hidden=bench.H, intermediate=bench.I, config={**K.VARIANTS[variant].defaults, **cfg})
    return case, routing_gen.generate("uniform", tokens, bench.E, bench.k, seed=point_seed(tokens, "uniform"))


def check_moe_point(bench: MoEBench, case: MoECase, sample) -> float:
    """check_moe's relative error; RuntimeError if the point is wrong (a probe times only correct configs)."""
    err = check_moe(case, bench, sample, seed=0)
    if not err <= tolerance(case.variant, "moe"):
        raise RuntimeError(f"{case.model} {case.tokens} tokens {case.variant} {case.config}: relative error "
                           f"{err:.3g} against reference_moe")
    return err


def checked_moe_calls(bench: MoEBench, tokens: int, variant: str, cfg: dict) -> tuple[float, list]:
    """(relative error, the sweep's layer calls) of a uniform-routing point, checked first."""
    case, sample = moe_case(bench, tokens, variant, cfg)
    err = check_moe_point(bench, case, sample)
    return err, bench.calls(case, sample)[0]


def checked_lm_head_calls(bench: LinearBench, m: int, variant: str, cfg: dict) -> tuple[float, list]:
    """(relative error, the sweep's calls) of an lm_head point, checked against reference_linear first."""
    case = LinearCase("lm_head", m, *LM_HEAD, variant, cfg)
    err = check_linear(case, seed=0)
    if not err <= tolerance(variant):
        raise RuntimeError(f"lm_head {m} tokens {variant} {cfg}: relative error {err:.3g}")
    return err, bench.calls(case)


def leader_calls(moe_tokens=(1, 8, 16), lm_head_tokens=(1, 2, 8)) -> list[tuple[str, float, list]]:
    """(name, relative error, calls) of the shared lm_head and 120b MoE leaders, each checked first."""
    points = []
    lb = LinearBench(*LM_HEAD, max_m=max(lm_head_tokens))
    for m in lm_head_tokens:
        variant, cfg = LM_HEAD_LEADERS[m]
        points.append((f"lm_head m={m} {variant}", *checked_lm_head_calls(lb, m, variant, cfg)))
    mb = MoEBench("gpt-oss-120b", baseline=False)
    for t in moe_tokens:
        variant, cfg = MOE_120B_LEADERS[t]
        points.append((f"moe 120b T={t} {variant}", *checked_moe_calls(mb, t, variant, cfg)))
    return points


def timed_arms(points, arms: dict, column: str, *, rounds: int = 2, reps: int = 25, store=None) -> pd.DataFrame:
    """Each point's calls timed as the sweeps time them (time_calls) under every arm, the arms taking turns for
    `rounds` rounds: rows of (point, max_rel_err, round, `column` = the arm's label, time_calls' columns), a line
    printed per timing and the pivot of us_graph printed last. arms: label -> function(point name, calls) giving
    a context manager that yields the calls to time under that arm (None: the arm does not apply there).
    store (run or None, name, contents): the rows written as name.csv into the probe's run folder, which then
    finishes (labkit.runs.Run.finish_with)."""
    rows = []
    for rnd in range(rounds):
        for name, err, calls in points:
            for label, arm in arms.items():
                with arm(name, calls) as timed:
                    if timed is None:
                        continue
                    r = time_calls(timed, reps=reps)
                rows.append({"point": name, "max_rel_err": err, "round": rnd, column: label, **r})
                print(f"{name:32s} round {rnd} {column} {label!s:>12}: {r['us_graph']:8.2f} us "
                      f"({r['us_graph_p10']:.2f}-{r['us_graph_p90']:.2f}) {r['sm_mhz']} MHz", flush=True)
    d = pd.DataFrame(rows)
    with pd.option_context("display.width", 200):
        print(d.pivot_table(index="point", columns=[column, "round"], values="us_graph").round(2).to_string())
    if store is not None and store[0] is not None:
        run, name, contents = store
        run.finish_with(contents, **{name: d})
    return d
