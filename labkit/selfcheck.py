"""Every kernel once on small odd shapes against the reference: a quick "is this machine's build right?"
and the workload to run under `compute-sanitizer --tool memcheck`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial

import torch

from kernels import VARIANTS, mxfp4_linear
from kernels.linear import linear_problem
from kernels.prepare import prepare_mxfp4
from kernels.reference import reference_linear

from .bench import _rel_err, device, random_mxfp4, tolerance

#: N and K chosen to be multiples of no tile; M odd.
SHAPES = ((3, 200, 160), (1, 72, 96), (17, 40, 288))


def _wanted(op: str, only: Iterable[str] | None) -> list[str]:
    """The registered variants of `op`, or those of them named in `only` (an unknown name is an error)."""
    names = [n for n, v in VARIANTS.items() if v.op == op]
    if only is None:
        return names
    unknown = set(only) - set(VARIANTS) - {"route"}
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(sorted(unknown))}; registered: {', '.join(VARIANTS)}")
    return [n for n in names if n in set(only)]


def _row(variant, m, n, k, config, call, ref, tol) -> dict:
    """One checked call: its error against the reference, or the exception it raised (reported, not raised)."""
    try:
        err = _rel_err(call(), ref)
        return {"variant": variant, "m": m, "n": n, "k": k, "config": config, "err": err, "ok": err <= tol}
    except Exception as e:  # reported in the table
        return {"variant": variant, "m": m, "n": n, "k": k, "config": config, "err": None, "ok": False,
                "error": f"{type(e).__name__}: {e}"[:300]}


def selfcheck_linear(configs_per_variant: int = 2, seed: int = 0, only: Iterable[str] | None = None) -> Iterator[dict]:
    """Each linear variant (its defaults plus configs drawn from its space) with bias on odd shapes; yields a row
    per call as it finishes, with the error found."""
    dev = device()
    names = _wanted("linear", only)
    for si, (m, n, k) in enumerate(SHAPES):
        w = random_mxfp4(n, k, seed=seed + si, dev=dev)
        problem = linear_problem(m, prepare_mxfp4(w))
        g = torch.Generator(device=dev).manual_seed(seed + 100 + si)
        x = torch.randn(m, k, generator=g, device=dev).to(torch.bfloat16)
        b = torch.randn(n, generator=g, device=dev).to(torch.bfloat16)
        ref = reference_linear(x.float(), w, b.float())
        for name in names:
            v = VARIANTS[name]
            cfgs = [dict(v.defaults)] + v.sample(problem, configs_per_variant - 1, seed=f"{name}{seed}",
                                                 where=lambda c, d=v.defaults: c != d)  # not the defaults twice
            for cfg in cfgs:
                if v.reason(cfg, problem):
                    continue
                call = partial(mxfp4_linear, x, w, b, variant=name, **cfg)
                yield _row(name, m, n, k, cfg, call, ref, tolerance(name))


def selfcheck_moe(seed: int = 0, only: Iterable[str] | None = None) -> Iterator[dict]:
    """Each MoE variant (defaults) on a small layer under uniform, skewed and degenerate routings, then `route`'s
    forms against torch's top-k; yields a row per call as it finishes."""
    from kernels import Routing, moe_mxfp4, route
    from kernels.reference import reference_moe, topk_softmax
    from kernels.routing import _bookkeeping

    from . import routing as rgen
    from .bench_moe import _layer

    dev = device()
    names = _wanted("moe", only)
    E, H, I, k = 8, 64, 96, 2
    w1, b1, w2, b2 = _layer(E, H, I, seed=seed, dev=dev)
    for T in (1, 5, 33):
        x = torch.randn(T, H, generator=torch.Generator(device=dev).manual_seed(T), device=dev).to(torch.bfloat16)
        for rt in ("uniform", "hot(0.7,1)", "all_to_one", "duplicates(0.5)"):
            s = rgen.generate(rt, T, E, k, seed=T)
            r = Routing.from_ids(s.ids.to(dev), s.weights.to(dev), E)
            ref = reference_moe(x.float(), (s.ids.to(dev), s.weights.to(dev)), w1, b1.float(), w2, b2.float())
            for name in names:
                yield _row(name, T, 2 * I, H, rt, partial(moe_mxfp4, x, r, w1, b1, w2, b2, variant=name), ref,
                           tolerance(name, "moe"))
    if only is not None and "route" not in only:
        return
    for T, E in ((1, 128), (5, 32), (64, 128), (200, 32), (1000, 128)):  # route's one program and token blocks
        lg = torch.randn(T, E, generator=torch.Generator(device=dev).manual_seed(E + T), device=dev)
        a, b = route(lg, 4), _bookkeeping(*topk_softmax(lg, 4), E)
        same = all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("ids", "counts", "offsets", "sorted", "inverse"))
        ok = same and torch.allclose(a.weights, b.weights)
        yield {"variant": "route", "m": T, "n": E, "k": 4, "config": {}, "err": 0.0 if ok else 1.0, "ok": ok}
