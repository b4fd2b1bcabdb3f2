"""Named, seeded routing generators for MoE sweeps and notebooks, with load-balance statistics.

Each generator returns expert ids [T, k] (int32) and gate weights [T, k] (softmax of random logits over the
k choices, as GPT-OSS's router produces). Names are strings a sweep spec can carry:

  uniform            each token picks k distinct experts uniformly
  zipf(s)            k distinct experts per token, expert r drawn with probability ~ 1 / (r + 1)^s
  hot(f,n_hot)       a fraction f of all assignments goes to n_hot hot experts, the rest spreads uniformly
  all_to_one         every slot of every token on expert 0 (the same expert k times per token)
  duplicates(p)      uniform, but each slot after the first repeats the token's previous expert with probability p
  from_logits        router logits = random hidden states x random router weights, then top-k (kernels.route)
  balanced           every expert takes T * k / E assignments (one more for the first T * k % E): uniform's
                     load with none of its chance imbalance, the best case a tile table can be fitted to
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

KINDS = ("uniform", "zipf", "hot", "all_to_one", "duplicates", "from_logits", "balanced")


@dataclass
class RoutingSample:
    name: str
    ids: torch.Tensor  # [T, k] int32
    weights: torch.Tensor  # [T, k] float32
    num_experts: int

    def stats(self) -> dict:
        """max/mean tokens per expert (over experts touched and over all experts) and distinct experts."""
        counts = torch.bincount(self.ids.reshape(-1).long().cpu(), minlength=self.num_experts)
        touched = int((counts > 0).sum())
        mean_all = counts.float().mean().item()
        return {"routing": self.name, "tokens": self.ids.shape[0], "top_k": self.ids.shape[1],
                "experts": self.num_experts, "distinct_experts": touched, "max_per_expert": int(counts.max()),
                "mean_per_expert": mean_all, "imbalance": (counts.max().item() / mean_all) if mean_all else 0.0,
                "mean_per_touched": counts.sum().item() / max(touched, 1)}


def parse(name: str) -> tuple[str, list[float]]:
    """'hot(0.5,4)' -> ('hot', [0.5, 4.0]); bare names have no arguments."""
    m = re.fullmatch(r"\s*([a-z_]+)\s*(?:\((.*)\))?\s*", name)
    if not m or m.group(1) not in KINDS:
        raise ValueError(f"routing must be one of {', '.join(KINDS)} (with arguments where they take them), "
                         f"got {name!r}")
    args = [float(a) for a in m.group(2).split(",")] if m.group(2) else []
    return m.group(1), args


def _distinct(probs: torch.Tensor, T: int, k: int, g: torch.Generator) -> torch.Tensor:
    """k distinct experts per token, drawn without replacement with the given probabilities."""
    return torch.multinomial(probs.expand(T, -1), k, replacement=False, generator=g).to(torch.int32)


def generate(name: str, tokens: int, experts: int, top_k: int, *, seed: int = 0, device=None) -> RoutingSample:
    """Ids and gate weights for `tokens` tokens under the named routing (deterministic by seed)."""
    kind, args = parse(name)
    if top_k > experts and kind not in ("all_to_one", "duplicates"):
        raise ValueError(f"top_k={top_k} exceeds experts={experts}")
    g = torch.Generator().manual_seed(seed)
    T, E, k = tokens, experts, top_k
    if kind == "uniform":
        ids = _distinct(torch.ones(E), T, k, g)
    elif kind == "zipf":
        s = args[0] if args else 1.2
        probs = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** s
        perm = torch.randperm(E, generator=g)  # which expert is popular is itself random
        ids = perm[_distinct(probs.float(), T, k, g).long()].to(torch.int32)
    elif kind == "hot":
        f = args[0] if args else 0.5
        n_hot = int(args[1]) if len(args) > 1 else 4
        if not 0 <= f <= 1 or not 1 <= n_hot <= E:
            raise ValueError(f"hot(f, n_hot) needs 0 <= f <= 1 and 1 <= n_hot <= {E}, got {f}, {n_hot}")
        # choose per-expert probabilities so hot experts receive fraction f of assignments in expectation
        probs = torch.full((E,), (1 - f) / max(E - n_hot, 1))
        probs[:n_hot] = f / n_hot
        ids = _distinct(probs.clamp_min(1e-9), T, k, g)
    elif kind == "all_to_one":
        ids = torch.zeros(T, k, dtype=torch.int32)
    elif kind == "balanced":  # slot j of the T * k takes expert j mod E: k consecutive ones per token are distinct
        order = torch.randperm(E, generator=g)  # which experts get the extra assignment is random
        ids = order[torch.arange(T * k).remainder(E)].reshape(T, k)[torch.randperm(T, generator=g)].to(torch.int32)
    elif kind == "duplicates":
        p = args[0] if args else 0.25
        ids = _distinct(torch.ones(E), T, k, g)
        rep = torch.rand(T, k, generator=g) < p
        for j in range(1, k):
            ids[:, j] = torch.where(rep[:, j], ids[:, j - 1], ids[:, j])
    else:  # from_logits
        from kernels import route

        H = 64
        x = torch.randn(T, H, generator=g)
        w = torch.randn(E, H, generator=g) / H**0.5
        r = route(x @ w.T, k)
        return RoutingSample(name, r.ids.to(device or "cpu"), r.weights.to(device or "cpu"), E)
    weights = torch.softmax(torch.randn(T, k, generator=g), dim=-1)
    return RoutingSample(name, ids.to(device or "cpu"), weights.to(device or "cpu"), E)
