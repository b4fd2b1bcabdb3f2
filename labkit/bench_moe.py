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

from kernels import MoESlots, MXFP4Tensor, Routing, moe_mxfp4, mxfp4_to_dense, route
from kernels.moe import swiglu_rows
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


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def _with_bias_column(w: torch.Tensor, b: torch.Tensor, kp: int) -> torch.Tensor:
    """Dense [E, N, K] weights and bias [E, N] -> [E, N, kp] bf16: w, then b in column K, zeros after (kp a
    multiple of 8 keeps the GEMMs' rows 16-byte aligned)."""
    E, N, K = w.shape
    out = torch.zeros((E, N, kp), device=w.device, dtype=torch.bfloat16)
    out[:, :, :K] = w
    out[:, :, K] = b
    return out


class TorchBf16MoE:
    """The bf16 baseline: the same layer with dense bf16 experts, its two expert GEMMs through torch._grouped_mm
    (a loop over experts where the build lacks it; that loop reads the offsets on the host, so it has no
    CUDA-graph time).

    Built as a fair rival, not a strawman: each bias rides in its GEMM as one more K column (x's rows carry a 1
    there), the gate weight is folded into mlp2's input rows and bias column, the SwiGLU is one pass
    (kernels.moe.swiglu_rows) and the combine the lab's (MoESlots.combine). Its first form, the same GEMMs with
    the bias adds, SwiGLU, gate and combine as fp32 torch ops, took 7.45 ms at gpt-oss-20b's 8192 tokens on the
    H100 (results/20261122T073433-h100-80gb-hbm3-moe_gptoss); the two GEMMs alone take 2.6 ms on the H200
    (results/20261129T003820-h200-bf16-grouped)."""

    def __init__(self, w1: MXFP4Tensor, b1, w2: MXFP4Tensor, b2):
        d1 = mxfp4_to_dense(w1)  # [E, 2I, H]
        self.H = d1.shape[2]
        self.w1 = _with_bias_column(d1, b1, _pad8(self.H + 1))
        del d1
        d2 = mxfp4_to_dense(w2)  # [E, H, I]
        self.w2 = _with_bias_column(d2, b2, _pad8(d2.shape[2] + 1))
        del d2
        self.grouped = hasattr(torch, "_grouped_mm") and self._grouped_works()

    def _grouped_works(self) -> bool:
        try:
            a = torch.randn(32, self.w1.shape[2], device=self.w1.device, dtype=torch.bfloat16)
            offs = torch.full((self.w1.shape[0],), 32, device=a.device, dtype=torch.int32)
            torch._grouped_mm(a, self.w1.transpose(1, 2), offs=offs)
            if a.is_cuda:
                torch.cuda.synchronize()
            return True
        except Exception:
            return False

    def _gemm(self, a: torch.Tensor, w: torch.Tensor, r: Routing) -> torch.Tensor:
        """Expert-sorted rows a [S, K] times their experts' w [E, N, K]^T -> [S, N] bf16 (fp32 accumulation)."""
        if self.grouped:
            return torch._grouped_mm(a, w.transpose(1, 2), offs=r.offsets[1:].contiguous())
        out = torch.empty((a.shape[0], w.shape[1]), device=a.device, dtype=torch.bfloat16)
        o = r.offsets.tolist()
        for e in range(w.shape[0]):
            if o[e + 1] > o[e]:
                out[o[e]:o[e + 1]] = a[o[e]:o[e + 1]] @ w[e].T
        return out

    def __call__(self, x, r: Routing, alpha=1.702, limit=7.0):
        k, H = r.top_k, self.H
        xa = torch.zeros((x.shape[0], self.w1.shape[2]), device=x.device, dtype=torch.bfloat16)
        xa[:, :H] = x
        xa[:, H] = 1.0
        h = self._gemm(xa[(r.sorted // k).long()], self.w1, r)  # [S, 2I], b1 included
        a = swiglu_rows(h, r.weights.reshape(-1)[r.sorted.long()], self.w2.shape[2], alpha, limit)
        y = self._gemm(a, self.w2, r)  # [S, H]: gate * (act W2^T + b2)
        return MoESlots(y, r.inverse, k).combine()


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

    def touched_bytes(self, sample) -> float:
        """The expert bytes one call on `sample` reads (its distinct experts')."""
        return sample.stats()["distinct_experts"] * self.expert_bytes()

    def routings(self, sample) -> list[Routing]:
        """The sample and relabeled copies of it (other experts, same counts) until a pass over them touches
        >= 4x L2: the routings of calls(), in its order."""
        n = 1 if not ON_GPU else max(1, math.ceil(4 * l2_bytes() / max(self.touched_bytes(sample), 1)))
        out = []
        for c in range(n):
            ids = sample.ids.to(device()) if c == 0 else _relabel(sample.ids.to(device()), self.E, seed=c)
            out.append(Routing.from_ids(ids, sample.weights.to(device()), self.E, validate=False))
        return out

    def calls(self, case: MoECase, sample) -> tuple[list, float]:
        """Callables over routings() (one pass defeats L2); returns (calls, bytes touched)."""
        routings = self.routings(sample)
        x = torch.randn(case.tokens, self.H, device=device()).to(torch.bfloat16)
        calls = []
        cfg = dict(case.config)
        for r in routings:
            if case.variant == "torch_bf16":
                calls.append(lambda r=r: self.torch_bf16(x, r))
            else:
                calls.append(lambda r=r: moe_mxfp4(x, r, self.w1, self.b1, self.w2, self.b2, variant=case.variant,
                                                   **cfg))
        return calls, len(routings) * self.touched_bytes(sample)

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
