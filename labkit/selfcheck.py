"""Every kernel once on small odd shapes against the reference: a quick "is this machine's build right?"
and the workload to run under `compute-sanitizer --tool memcheck`."""

from __future__ import annotations

import torch

from kernels import VARIANTS, mxfp4_linear
from kernels.linear import linear_problem
from kernels.prepare import prepare_mxfp4
from kernels.reference import reference_linear

from .bench import _rel_err, device, random_mxfp4, tolerance

#: N and K chosen to be multiples of no tile; M odd.
SHAPES = ((3, 200, 160), (1, 72, 96), (17, 40, 288))


def selfcheck_linear(configs_per_variant: int = 2, seed: int = 0) -> list[dict]:
    """Run each linear variant (defaults plus a few configs) with bias; returns rows with the error found."""
    dev = device()
    rows = []
    for si, (m, n, k) in enumerate(SHAPES):
        w = random_mxfp4(n, k, seed=seed + si, dev=dev)
        p = prepare_mxfp4(w)
        g = torch.Generator(device=dev).manual_seed(seed + 100 + si)
        x = torch.randn(m, k, generator=g, device=dev).to(torch.bfloat16)
        b = torch.randn(n, generator=g, device=dev).to(torch.bfloat16)
        ref = reference_linear(x.float(), w, b.float())
        for name, v in VARIANTS.items():
            if v.op != "linear":
                continue
            cfgs = [dict(v.defaults)] + v.sample(linear_problem(m, p), configs_per_variant - 1, seed=f"{name}{seed}")
            for cfg in cfgs:
                if v.reason(cfg, linear_problem(m, p)):
                    continue
                tol = tolerance(name)
                try:
                    err = _rel_err(mxfp4_linear(x, w, b, variant=name, **cfg), ref)
                    rows.append({"variant": name, "m": m, "n": n, "k": k, "config": cfg, "err": err, "ok": err <= tol})
                except Exception as e:  # reported in the table
                    rows.append({"variant": name, "m": m, "n": n, "k": k, "config": cfg, "err": None, "ok": False,
                                 "error": f"{type(e).__name__}: {e}"[:300]})
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return rows


def selfcheck_moe(seed: int = 0) -> list[dict]:
    """Each MoE variant (defaults) on a small layer under uniform, skewed and degenerate routings."""
    from kernels import Routing, moe_mxfp4
    from kernels.reference import reference_moe

    from . import routing as rgen
    from .bench_moe import _layer

    dev = device()
    E, H, I, k = 8, 64, 96, 2
    w1, b1, w2, b2 = _layer(E, H, I, seed=seed, dev=dev)
    rows = []
    for T in (1, 5, 33):
        x = torch.randn(T, H, generator=torch.Generator(device=dev).manual_seed(T), device=dev).to(torch.bfloat16)
        for rt in ("uniform", "hot(0.7,1)", "all_to_one", "duplicates(0.5)"):
            s = rgen.generate(rt, T, E, k, seed=T)
            r = Routing.from_ids(s.ids.to(dev), s.weights.to(dev), E)
            ref = reference_moe(x.float(), (s.ids.to(dev), s.weights.to(dev)), w1, b1.float(), w2, b2.float())
            for name, v in VARIANTS.items():
                if v.op != "moe":
                    continue
                try:
                    err = _rel_err(moe_mxfp4(x, r, w1, b1, w2, b2, variant=name), ref)
                    rows.append({"variant": name, "m": T, "n": 2 * I, "k": H, "config": rt, "err": err,
                                 "ok": err <= tolerance(name, "moe")})
                except Exception as e:
                    rows.append({"variant": name, "m": T, "n": 2 * I, "k": H, "config": rt, "err": None, "ok": False,
                                 "error": f"{type(e).__name__}: {e}"[:300]})
    for T, E in ((1, 128), (5, 32), (64, 128), (200, 32), (1000, 128)):  # route's one program and token blocks
        from kernels import route
        from kernels.reference import topk_softmax
        from kernels.routing import _bookkeeping

        lg = torch.randn(T, E, generator=torch.Generator(device=dev).manual_seed(E + T), device=dev)
        a, b = route(lg, 4), _bookkeeping(*topk_softmax(lg, 4), E)
        same = all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("ids", "counts", "offsets", "sorted", "inverse"))
        ok = same and torch.allclose(a.weights, b.weights)
        rows.append({"variant": "route", "m": T, "n": E, "k": 4, "config": {}, "err": 0.0 if ok else 1.0, "ok": ok})
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return rows
