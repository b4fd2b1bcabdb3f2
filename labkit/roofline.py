"""Roofline floors: bytes and flops of the operations of a GPT-OSS step, and the least time they can take.

The floor of an operation is max(bytes / read bandwidth, flops / bf16 matmul rate) (DESIGN.md "Measuring"
step 2). Bytes are what must cross the memory bus at least once: packed weights and scales of the weights
actually touched, activations read, outputs written. Each operation reads its inputs and writes its
outputs once (no fusion across operations), so a whole step's floor is the sum of its operations' floors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .gptoss_config import GptOssConfig, get_model
from .hardware import GPUS, Ceilings, datasheet_ceilings

WEIGHT_FORMATS = ("bf16", "fp8", "mxfp4", "nvfp4")
ACT_FORMATS = ("bf16", "fp8")
KV_FORMATS = ("bf16", "fp8")
PHASES = ("decode", "prefill")
_ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


@dataclass(frozen=True)
class Cost:
    """Bytes moved and flops done by an operation (or a sum of them)."""

    bytes: float
    flops: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.bytes + other.bytes, self.flops + other.flops)

    def __radd__(self, other) -> Cost:   # so sum(costs) works
        return self if other == 0 else self + other

    def __mul__(self, times: float) -> Cost:
        return Cost(self.bytes * times, self.flops * times)

    __rmul__ = __mul__

    def intensity(self) -> float:
        """Arithmetic intensity, flops per byte."""
        if self.bytes == 0:
            return math.inf if self.flops else 0.0
        return self.flops / self.bytes


ZERO = Cost(0.0, 0.0)


def _elem_bytes(fmt: str, arg: str, allowed: Sequence[str]) -> int:
    if fmt not in allowed:
        raise ValueError(f"{arg} must be one of {', '.join(allowed)}, got {fmt!r}")
    return _ELEM_BYTES[fmt]


def _check_dims(**dims) -> None:
    for name, v in dims.items():
        if not isinstance(v, (int, float)) or v < 0 or v != int(v):
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")


def weight_bytes(n: int, k: int, fmt: str) -> float:
    """Bytes of an [n, k] weight in `fmt`, scales included.

    mxfp4: 4-bit elements plus one E8M0 byte per 32 along K; nvfp4: plus one E4M3 byte per 16 and one fp32
    per-tensor scale; fp8: one byte each (a per-tensor scale is negligible); bf16: two bytes each.
    """
    _check_dims(n=n, k=k)
    if fmt == "mxfp4":
        if k % 32:
            raise ValueError(f"k must be a multiple of 32 for mxfp4 (blocks of 32 along K), got {k}")
        return n * k / 2 + n * k / 32
    if fmt == "nvfp4":
        if k % 16:
            raise ValueError(f"k must be a multiple of 16 for nvfp4 (blocks of 16 along K), got {k}")
        return n * k / 2 + n * k / 16 + 4
    if fmt == "fp8":
        return float(n * k)
    if fmt == "bf16":
        return 2.0 * n * k
    raise ValueError(f"weight format must be one of {', '.join(WEIGHT_FORMATS)}, got {fmt!r}")


def linear_cost(m: int, n: int, k: int, *, weight: str = "mxfp4", act: str = "bf16", out: str = "bf16",
                bias: bool = False) -> Cost:
    """y[m, n] = x[m, k] @ W[n, k]^T (+ b): the weights, x read, y written, a bf16 bias; 2mnk flops."""
    _check_dims(m=m)
    nbytes = (weight_bytes(n, k, weight) + m * k * _elem_bytes(act, "act", ACT_FORMATS)
              + m * n * _elem_bytes(out, "out", tuple(_ELEM_BYTES)) + (2 * n if bias else 0))
    return Cost(float(nbytes), 2.0 * m * n * k)


def expected_active_experts(tokens: int, experts: int, top_k: int) -> float:
    """Distinct experts touched by `tokens` tokens under uniform routing: E * (1 - (1 - k/E)^T)."""
    _check_dims(tokens=tokens, experts=experts, top_k=top_k)
    if not 0 < top_k <= experts:
        raise ValueError(f"top_k must be in 1..experts ({experts}), got {top_k}")
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def _distinct_ids(expert_ids, experts: int) -> int:
    """Number of distinct expert ids in a tensor, array or (nested) list; ValueError if one is out of range."""
    if hasattr(expert_ids, "tolist"):
        expert_ids = expert_ids.tolist()
    flat, stack = set(), [expert_ids]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            flat.add(int(item))
    bad = [i for i in flat if not 0 <= i < experts]
    if bad:
        raise ValueError(f"expert_ids must be in 0..{experts - 1}, got {sorted(bad)[:5]}")
    return len(flat)


def moe_cost(tokens: int, experts: int, top_k: int, hidden: int, intermediate: int, *, weight: str = "mxfp4",
             act: str = "bf16", active_experts: float | None = None, expert_ids=None,
             bias: bool = True) -> Cost:
    """A GPT-OSS MoE layer, router excluded (DESIGN.md's "MoE layer").

    Each touched expert reads w1 [2I, H] and w2 [H, I] (+ scales, + bf16 biases); the layer reads tokens x H
    activations and writes tokens x H bf16 outputs. flops = tokens * top_k * (2*H*2I + 2*I*H).
    Touched experts: `active_experts` if given, else the distinct ids in `expert_ids`, else the uniform
    expectation (expected_active_experts).
    """
    _check_dims(tokens=tokens, hidden=hidden, intermediate=intermediate)
    if active_experts is not None and expert_ids is not None:
        raise ValueError("give active_experts or expert_ids, not both")
    if expert_ids is not None:
        active = _distinct_ids(expert_ids, experts)
    elif active_experts is not None:
        if not 0 <= active_experts <= experts:
            raise ValueError(f"active_experts must be in 0..experts ({experts}), got {active_experts}")
        active = active_experts
    else:
        active = expected_active_experts(tokens, experts, top_k)
    h, i = hidden, intermediate
    per_expert = weight_bytes(2 * i, h, weight) + weight_bytes(h, i, weight) + ((2 * i + h) * 2 if bias else 0)
    act_bytes = tokens * h * _elem_bytes(act, "act", ACT_FORMATS) + tokens * h * 2
    return Cost(active * per_expert + act_bytes, float(tokens * top_k * (2 * h * 2 * i + 2 * i * h)))


def attended_keys(context: int, window: int | None = None) -> int:
    """Keys one decode query attends to: the whole context, or the last `window` of it."""
    return context if window is None else min(context, window)


def causal_pairs(tokens: int, window: int | None = None) -> int:
    """(query, key) pairs of causal attention over `tokens` tokens, each query seeing at most `window` keys."""
    if window is None or tokens <= window:
        return tokens * (tokens + 1) // 2
    return window * (window + 1) // 2 + (tokens - window) * window


def attention_core_cost(cfg: GptOssConfig, *, batch: int, context: int, phase: str = "decode",
                        window: int | None = None, kv_dtype: str = "bf16") -> Cost:
    """Attention itself (one layer), projections excluded: q read, KV cache read and appended, output
    written, sinks read; flops 4 * head_dim * q_heads per (query, key) pair (QK^T and PV).

    decode: `batch` sequences each add one token to a cache of `context` tokens (itself included).
    prefill: `batch` prompts of `context` tokens each, causal, K and V read once (flash-attention floor).
    """
    _check_dims(batch=batch, context=context)
    kvb = _elem_bytes(kv_dtype, "kv_dtype", KV_FORMATS)
    kv_row = 2 * cfg.kv_heads * cfg.head_dim * kvb                # K and V of one token
    qo_row = 2 * cfg.attn_width * 2                               # q read and output written, bf16
    sinks = cfg.q_heads * 2
    if phase == "decode":
        keys = attended_keys(context, window)
        pairs = batch * keys
        nbytes = batch * (keys * kv_row + kv_row + qo_row) + sinks
    elif phase == "prefill":
        pairs = batch * causal_pairs(context, window)
        nbytes = batch * context * (kv_row + kv_row + qo_row) + sinks   # K/V read once, appended once
    else:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    return Cost(float(nbytes), 4.0 * cfg.head_dim * cfg.q_heads * pairs)


def norm_cost(tokens: int, hidden: int) -> Cost:
    """An RMSNorm: weight read, activations read and written (bf16). Its flops are not matmul flops: 0."""
    return Cost(float(hidden * 2 + 2 * tokens * hidden * 2), 0.0)


def embedding_cost(tokens: int, hidden: int) -> Cost:
    """Embedding lookup: one bf16 row read and written per token (not the whole table)."""
    return Cost(float(2 * tokens * hidden * 2), 0.0)


# ---- floors and the roofline ---------------------------------------------------------------------------


def floor_us(cost: Cost, ceilings: Ceilings) -> float:
    """Least time of an operation in microseconds: max(bytes / read bandwidth, flops / bf16 rate)."""
    return max(cost.bytes / (ceilings.read_gbps * 1e3), cost.flops / (ceilings.bf16_tflops * 1e6))


def bound(cost: Cost, ceilings: Ceilings) -> str:
    """'memory' or 'compute': which ceiling sets the floor."""
    return "memory" if cost.intensity() < ridge_point(ceilings) else "compute"


def ridge_point(ceilings: Ceilings) -> float:
    """Intensity (flops per byte) where the bandwidth roof meets the bf16 compute roof."""
    return ceilings.bf16_tflops * 1e3 / ceilings.read_gbps


def attainable_tflops(intensity: float, ceilings: Ceilings) -> float:
    """The roof: min(bf16 rate, intensity x read bandwidth), in TFLOP/s."""
    return min(ceilings.bf16_tflops, intensity * ceilings.read_gbps / 1e3)


def _finite(v) -> float | None:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def frac_of_floor(point: Mapping, ceilings: Ceilings) -> float | None:
    """floor / measured time for a results point (DESIGN.md "Results": bytes, flops, us_graph, status).

    None when the point is not `ok` or lacks a positive us_graph, bytes or flops.
    """
    if point.get("status", "ok") != "ok":
        return None
    us, nbytes, flops = (_finite(point.get(k)) for k in ("us_graph", "bytes", "flops"))
    if not us or us <= 0 or nbytes is None or flops is None or (nbytes <= 0 and flops <= 0):
        return None
    return floor_us(Cost(nbytes, flops), ceilings) / us


def floor_curve(cost_fn: Callable[[int], Cost], tokens: Iterable[int], ceilings: Ceilings):
    """Floor of an operation over token counts, as a DataFrame (tokens, bytes, flops, floor_us, bound)."""
    import pandas as pd

    rows = []
    for t in tokens:
        c = cost_fn(int(t))
        rows.append({"tokens": int(t), "bytes": c.bytes, "flops": c.flops, "floor_us": floor_us(c, ceilings),
                     "bound": bound(c, ceilings)})
    return pd.DataFrame(rows)


# ---- a whole GPT-OSS step ------------------------------------------------------------------------------

COMPONENTS = ("embedding", "attention", "router", "moe", "norms", "lm_head")


@dataclass
class StepEstimate:
    """Floor of one decode step (every sequence adds a token) or one prefill (every prompt processed)."""

    model: str
    phase: str
    batch: int
    context: int
    mxfp4_lm_head: bool
    kv_dtype: str
    ceilings: Ceilings
    components: dict[str, Cost]
    component_floor_us: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> Cost:
        return sum(self.components.values(), ZERO)

    @property
    def tokens_per_step(self) -> int:
        """Tokens a step produces (decode) or processes (prefill)."""
        return self.batch if self.phase == "decode" else self.batch * self.context

    @property
    def bytes_per_step(self) -> float:
        return self.total.bytes

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_step / self.tokens_per_step

    @property
    def floor_ms(self) -> float:
        """Sum of the per-operation floors (operations run one after another)."""
        return sum(self.component_floor_us.values()) / 1e3

    @property
    def tokens_per_s(self) -> float:
        """Upper bound on throughput: tokens per step / floor."""
        return self.tokens_per_step / (self.floor_ms / 1e3)

    def as_dict(self) -> dict:
        """The `labkit roofline --json` object."""
        return {
            "model": self.model, "phase": self.phase, "batch": self.batch, "context": self.context,
            "mxfp4_lm_head": self.mxfp4_lm_head, "kv_dtype": self.kv_dtype, "ceilings": self.ceilings.as_meta(),
            "bytes_per_step": self.bytes_per_step, "bytes_per_token": self.bytes_per_token,
            "tokens_per_step": self.tokens_per_step, "floor_ms": self.floor_ms, "tokens_per_s": self.tokens_per_s,
            "components": {name: {"bytes": c.bytes, "flops": c.flops, "floor_ms": self.component_floor_us[name] / 1e3}
                           for name, c in self.components.items()},
        }


def model_step(model: str | GptOssConfig, *, batch: int, context: int, phase: str = "decode",
               mxfp4_lm_head: bool = False, kv_dtype: str = "bf16", ceilings: Ceilings) -> StepEstimate:
    """Per-component bytes, flops and floor of one GPT-OSS step at `batch` sequences and `context` tokens.

    Weights: MoE MXFP4, everything else BF16 (lm_head MXFP4 with `mxfp4_lm_head`); MoE experts touched under
    uniform routing. The lm_head runs on the last position of each sequence only (what generation needs),
    in prefill too. KV cache in `kv_dtype`; sliding window on even layers.
    """
    cfg = model if isinstance(model, GptOssConfig) else get_model(model)
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    _check_dims(batch=batch, context=context)
    if batch < 1 or context < 1:
        raise ValueError(f"batch and context must be at least 1, got batch={batch}, context={context}")
    _elem_bytes(kv_dtype, "kv_dtype", KV_FORMATS)
    tokens = batch if phase == "decode" else batch * context
    h = cfg.hidden
    ops: dict[str, list[tuple[Cost, int]]] = {name: [] for name in COMPONENTS}   # (cost, times)
    ops["embedding"].append((embedding_cost(tokens, h), 1))
    qkv = linear_cost(tokens, cfg.qkv_out, h, weight="bf16", bias=True)
    out = linear_cost(tokens, h, cfg.attn_width, weight="bf16", bias=True)
    for window, layers in ((cfg.sliding_window, cfg.sliding_layers), (None, cfg.layers - cfg.sliding_layers)):
        core = attention_core_cost(cfg, batch=batch, context=context, phase=phase, window=window, kv_dtype=kv_dtype)
        ops["attention"] += [(qkv, layers), (core, layers), (out, layers)]
    ops["router"].append((linear_cost(tokens, cfg.experts, h, weight="bf16", bias=True), cfg.layers))
    ops["moe"].append((moe_cost(tokens, cfg.experts, cfg.top_k, h, cfg.intermediate), cfg.layers))
    ops["norms"].append((norm_cost(tokens, h), 2 * cfg.layers + 1))
    lm_weight = "mxfp4" if mxfp4_lm_head else "bf16"
    ops["lm_head"].append((linear_cost(batch, cfg.vocab, h, weight=lm_weight), 1))
    components = {name: sum((c * n for c, n in lst), ZERO) for name, lst in ops.items()}
    floors = {name: sum(floor_us(c, ceilings) * n for c, n in lst) for name, lst in ops.items()}
    return StepEstimate(cfg.name, phase, batch, context, mxfp4_lm_head, kv_dtype, ceilings, components, floors)


def gptoss_moe_cost(model: str | GptOssConfig, tokens: int, **kw) -> Cost:
    """moe_cost with `model`'s experts, top-k and sizes (kw: weight, act, active_experts, expert_ids)."""
    cfg = model if isinstance(model, GptOssConfig) else get_model(model)
    return moe_cost(tokens, cfg.experts, cfg.top_k, cfg.hidden, cfg.intermediate, **kw)


def gptoss_lm_head_cost(model: str | GptOssConfig, tokens: int, *, weight: str = "mxfp4", **kw) -> Cost:
    """linear_cost of `model`'s lm_head (vocab x hidden) for `tokens` rows (kw: act, out)."""
    cfg = model if isinstance(model, GptOssConfig) else get_model(model)
    return linear_cost(tokens, cfg.vocab, cfg.hidden, weight=weight, **kw)


def reference_ops(model: str = "gpt-oss-120b") -> dict[str, Cost]:
    """The operations of DESIGN.md's speed table, named, for placing on a roofline."""
    ops = {f"lm_head mxfp4 M={m}": gptoss_lm_head_cost(model, m) for m in (1, 64)}
    ops |= {f"moe {t} tok": gptoss_moe_cost(model, t) for t in (1, 64, 4096)}
    return ops


# ---- tables for notebooks and the CLI ------------------------------------------------------------------


def breakdown_table(estimates: Mapping[str, StepEstimate]):
    """One row per (configuration label, component): bytes, flops, floor_ms, share of the step."""
    import pandas as pd

    rows = []
    for label, est in estimates.items():
        for name, c in est.components.items():
            ms = est.component_floor_us[name] / 1e3
            rows.append({"config": label, "component": name, "bytes": c.bytes, "flops": c.flops, "floor_ms": ms,
                         "share": ms / est.floor_ms if est.floor_ms else 0.0})
    return pd.DataFrame(rows)


def breakdown_wide(estimates: Mapping[str, StepEstimate], value: str = "floor_ms"):
    """breakdown_table as components x configurations (in the order given) of one column, e.g. floor_ms."""
    df = breakdown_table(estimates).pivot(index="component", columns="config", values=value)
    return df.loc[list(COMPONENTS), list(estimates)]


def step_table(model: str, *, batch_sizes: Iterable[int], context: int, ceilings: Ceilings, phase: str = "decode",
               kv_dtype: str = "bf16"):
    """Per batch size and lm_head format: bytes per step and per token, floor ms and tokens/s bound."""
    import pandas as pd

    rows = []
    for b in batch_sizes:
        for mx in (False, True):
            e = model_step(model, batch=b, context=context, phase=phase, mxfp4_lm_head=mx, kv_dtype=kv_dtype,
                           ceilings=ceilings)
            rows.append({"batch": b, "lm_head": "mxfp4" if mx else "bf16", "GB_per_step": e.bytes_per_step / 1e9,
                         "MB_per_token": e.bytes_per_token / 1e6, "floor_ms": e.floor_ms,
                         "tokens_per_s": e.tokens_per_s, "moe_share": e.component_floor_us["moe"] / 1e3 / e.floor_ms})
    return pd.DataFrame(rows)


def lm_head_across_gpus(model: str = "gpt-oss-120b", *, batch: int = 1, context: int = 4096,
                        gpus: Iterable[str] | None = None):
    """The lm_head in bf16 vs MXFP4 on every datasheet GPU: ms per token and the decode tokens/s bound."""
    import pandas as pd

    rows = []
    for key in gpus or GPUS:
        ceil = datasheet_ceilings(GPUS[key])
        bf, mx = (model_step(model, batch=batch, context=context, mxfp4_lm_head=m, ceilings=ceil)
                  for m in (False, True))
        rows.append({"gpu": key, "mem_bw_gbps": ceil.read_gbps,
                     "lm_head_bf16_ms": bf.component_floor_us["lm_head"] / 1e3,
                     "lm_head_mxfp4_ms": mx.component_floor_us["lm_head"] / 1e3,
                     "step_bf16_ms": bf.floor_ms, "step_mxfp4_ms": mx.floor_ms,
                     "tokens_per_s_bf16": bf.tokens_per_s, "tokens_per_s_mxfp4": mx.tokens_per_s,
                     "speedup": bf.floor_ms / mx.floor_ms})
    return pd.DataFrame(rows)
