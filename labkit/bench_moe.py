"""MoE layer and routing points for the measuring harness (same method as labkit.bench: check, then time).

One weight copy per model shape is enough to defeat L2: a replay calls the layer on several relabelings of
the same routing (expert e -> perm_c(e)), so each call touches different experts with the same load
statistics, until one replay has streamed >= 4x the L2. The floor counts only the experts a call touches.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import torch

from kernels import VARIANTS, MXFP4Tensor, Routing, moe_mxfp4, mxfp4_to_dense, route
from kernels.reference import reference_moe
from kernels.routing import route_path

from . import routing as routing_gen
from .bench import (
    ON_GPU,
    _first_line,
    _rel_err,
    add_floor,
    device,
    l2_bytes,
    random_mxfp4,
    record_failure,
    settle_allocator,
    time_calls,
    tolerance,
)

#: E, k, H, I of the MoE layer per model ("tiny" is the CPU/interpreter size)
MODELS = {"gpt-oss-120b": (128, 4, 2880, 2880), "gpt-oss-20b": (32, 4, 2880, 2880), "tiny": (8, 2, 64, 64)}


@dataclass
class MoECase:
    model: str
    tokens: int
    routing: str
    variant: str
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    config: dict = field(default_factory=dict)

    def key(self) -> dict:
        return {"op": "moe_layer", "variant": self.variant, "config": self.config, "m": self.tokens,
                "n": 2 * self.intermediate, "k": self.hidden, "experts": self.experts, "top_k": self.top_k,
                "routing": self.routing}


def _layer(E, H, I, *, seed, dev):
    g = torch.Generator(device=dev).manual_seed(seed + 7)
    w1 = random_mxfp4(2 * I, H, seed=seed, dev=dev, lead=(E,))
    w2 = random_mxfp4(H, I, seed=seed + 1, dev=dev, lead=(E,))
    b1 = (torch.randn(E, 2 * I, generator=g, device=dev) * 0.1).to(torch.bfloat16)
    b2 = (torch.randn(E, H, generator=g, device=dev) * 0.1).to(torch.bfloat16)
    return w1, b1, w2, b2


def _relabel(ids: torch.Tensor, E: int, seed: int) -> torch.Tensor:
    perm = torch.randperm(E, generator=torch.Generator().manual_seed(seed)).to(torch.int32).to(ids.device)
    return perm[ids.long()]


class TorchBf16MoE:
    """The torch bf16 baseline: dense bf16 experts through torch._grouped_mm where the build supports it,
    else a loop over experts (which reads counts on the host, so it has no CUDA-graph time)."""

    def __init__(self, w1: MXFP4Tensor, b1, w2: MXFP4Tensor, b2):
        self.w1, self.w2 = mxfp4_to_dense(w1), mxfp4_to_dense(w2)  # [E, 2I, H], [E, H, I]
        self.b1, self.b2 = b1, b2
        self.grouped = ON_GPU and hasattr(torch, "_grouped_mm") and self._grouped_works()

    def _grouped_works(self) -> bool:
        try:
            a = torch.randn(32, self.w1.shape[2], device=self.w1.device, dtype=torch.bfloat16)
            offs = torch.full((self.w1.shape[0],), 32, device=a.device, dtype=torch.int32)
            torch._grouped_mm(a, self.w1.transpose(1, 2), offs=offs)
            torch.cuda.synchronize()
            return True
        except Exception:
            return False

    def __call__(self, x, r: Routing, alpha=1.702, limit=7.0):
        from kernels.reference import swiglu_gptoss

        k = r.top_k
        xs = x[(r.sorted // k).long()]
        pos = torch.arange(xs.shape[0], device=x.device, dtype=torch.int32)
        eid = torch.searchsorted(r.offsets[1:].contiguous(), pos, right=True).long()
        if self.grouped:
            offs = r.offsets[1:].contiguous()
            h = torch._grouped_mm(xs, self.w1.transpose(1, 2), offs=offs) + self.b1[eid]
            a = swiglu_gptoss(h.float(), alpha, limit).to(torch.bfloat16)
            y = torch._grouped_mm(a, self.w2.transpose(1, 2), offs=offs) + self.b2[eid]
        else:
            y = torch.empty(xs.shape[0], self.w2.shape[1], device=x.device, dtype=torch.bfloat16)
            for e in torch.unique(eid).tolist():
                sel = eid == e
                h = xs[sel] @ self.w1[e].T + self.b1[e]
                a = swiglu_gptoss(h.float(), alpha, limit).to(torch.bfloat16)
                y[sel] = a @ self.w2[e].T + self.b2[e]
        y = y.float() * r.weights.reshape(-1)[r.sorted.long()][:, None]
        return y[r.inverse.long()].reshape(x.shape[0], k, -1).sum(1).to(torch.bfloat16)


class MoEBench:
    """One model's MoE layer weights (one copy) and its bf16 baseline, shared by every case of that model."""

    def __init__(self, model: str, *, seed: int = 4321, baseline: bool = True):
        self.model = model
        E, k, H, I = MODELS[model]
        self.E, self.k, self.H, self.I = E, k, H, I
        self.w1, self.b1, self.w2, self.b2 = _layer(E, H, I, seed=seed, dev=device())
        self.torch_bf16 = TorchBf16MoE(self.w1, self.b1, self.w2, self.b2) if baseline else None

    def expert_bytes(self) -> float:
        H, I = self.H, self.I
        return (2 * I * H + H * I) * (0.5 + 1 / 32) + (2 * I + H) * 2

    def calls(self, case: MoECase, sample) -> tuple[list, float]:
        """Callables over relabeled routings until a replay touches >= 4x L2; returns (calls, bytes touched)."""
        touched = sample.stats()["distinct_experts"] * self.expert_bytes()
        n = 1 if not ON_GPU else max(1, math.ceil(4 * l2_bytes() / max(touched, 1)))
        x = torch.randn(case.tokens, self.H, device=device()).to(torch.bfloat16)
        calls = []
        cfg = dict(case.config)
        for c in range(n):
            ids = sample.ids.to(device()) if c == 0 else _relabel(sample.ids.to(device()), self.E, seed=c)
            r = Routing.from_ids(ids, sample.weights.to(device()), self.E, validate=False)
            if case.variant == "torch_bf16":
                calls.append(lambda r=r: self.torch_bf16(x, r))
            else:
                calls.append(lambda r=r: moe_mxfp4(x, r, self.w1, self.b1, self.w2, self.b2, variant=case.variant,
                                                   **cfg))
        return calls, n * touched

    def release(self):
        self.w1 = self.w2 = self.torch_bf16 = None


def check_moe(case: MoECase, bench: MoEBench, sample, *, seed: int, check_tokens: int = 64) -> float:
    """Relative error on fresh random weights and activations (a sample of tokens) against reference_moe."""
    dev = device()
    E, H, I = bench.E, bench.H, bench.I
    w1, b1, w2, b2 = _layer(E, H, I, seed=seed * 3 + 11, dev=dev)
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(case.tokens, H, generator=g, device=dev).to(torch.bfloat16)
    ids, wts = sample.ids.to(dev), sample.weights.to(dev)
    r = Routing.from_ids(ids, wts, E)
    if case.variant == "torch_bf16":
        y = TorchBf16MoE(w1, b1, w2, b2)(x, r)
    else:
        y = moe_mxfp4(x, r, w1, b1, w2, b2, variant=case.variant, **case.config)
    rows = torch.randperm(case.tokens, generator=g, device=dev)[: min(check_tokens, case.tokens)]
    ref = reference_moe(x[rows].float(), (ids[rows], wts[rows]), w1, b1.float(), w2, b2.float())
    return _rel_err(y[rows], ref)


def point_seed(tokens: int, routing: str) -> int:
    """Seed of the routing sample a (tokens, routing) point is timed on, the same for every config there.

    Why: the time of a MoE layer follows the experts the sample touches (uniform routing, 8 tokens on
    gpt-oss-120b: 26-31 of 128), so configs timed on different samples differ by up to ~15% for no reason
    of their own, and a best-config pick or a regret over them measures the samples."""
    return zlib.crc32(f"{tokens}:{routing}".encode()) & 0x7FFFFFFF


def measure_moe(case: MoECase, bench: MoEBench, *, ceilings=None, seed: int = 0, reps: int = 20) -> dict:
    """One moe_layer point: check on fresh weights and activations (seed), then time replays over relabeled
    copies of the point's routing sample (point_seed: every config of a point sees the same one)."""
    from .roofline import moe_cost

    sample = routing_gen.generate(case.routing, case.tokens, bench.E, bench.k,
                                  seed=point_seed(case.tokens, case.routing))
    st = sample.stats()
    cost = moe_cost(case.tokens, bench.E, bench.k, bench.H, bench.I, weight="bf16" if case.variant == "torch_bf16"
                    else "mxfp4", active_experts=st["distinct_experts"])
    row = {**case.key(), "model": case.model, "status": "failed", "error": None, "bytes": cost.bytes,
           "flops": cost.flops, "distinct_experts": st["distinct_experts"], "max_per_expert": st["max_per_expert"],
           "imbalance": st["imbalance"]}
    try:
        err = check_moe(case, bench, sample, seed=seed)
        row["max_rel_err"] = err
        if not err <= tolerance(case.variant, "moe"):
            row["status"] = "incorrect"
            return row
        settle_allocator()
        calls, touched = bench.calls(case, sample)
        row["copies"] = len(calls)
        row["touched_mb_per_replay"] = touched / 1e6
        row.update(time_calls(calls, reps=reps))
        row["status"] = "ok"
    except Exception as e:  # a config that cannot compile or launch is a result too
        return record_failure(row, e)
    return add_floor(row, cost, ceilings)


def measure_route(model: str, tokens: int, *, form: str | None = None, seed: int = 0, reps: int = 20) -> dict:
    """One `route` point: top-k + softmax + bookkeeping from router logits [T, E] (device side), in the form
    route() picks, or the given one (kernels.routing.route_forms); the variant names the form."""
    E, k, H, _ = MODELS[model]
    form = form or route_path(tokens, E, k)
    row = {"op": "route", "variant": form, "config": {}, "m": tokens, "n": E, "k": H,
           "experts": E, "top_k": k, "routing": "from_logits", "model": model, "status": "failed", "error": None,
           "bytes": tokens * E * 4 + tokens * k * 8, "flops": 0.0}
    try:
        g = torch.Generator(device=device()).manual_seed(seed)
        logits = torch.randn(tokens, E, generator=g, device=device())
        r = route(logits, k, form=form)
        vals, ids = torch.topk(logits, k, dim=-1)  # the torch reference of the same routing
        ok = (torch.equal(r.ids.long(), ids) and torch.allclose(r.weights, torch.softmax(vals, -1))
              and torch.equal(r.counts.long(), torch.bincount(ids.reshape(-1), minlength=E)))
        row["max_rel_err"] = 0.0 if ok else math.inf
        if not ok:
            row["status"] = "incorrect"
            return row
        row.update(time_calls([lambda: route(logits, k, form=form)], reps=reps))
        row["status"] = "ok"
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {_first_line(e)}"
    return row


def moe_variants() -> list[str]:
    return [n for n, v in VARIANTS.items() if v.op == "moe"]
