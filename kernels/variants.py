"""Registry of kernel variants: name -> kind, launcher, parameter space and the constraints on configs.

Sweeps enumerate `Variant.configs(problem)`; `check` explains, naming the rule, why a config is ruled out.
A problem is a dict describing one call: m, n, k, and for weights scale_min/scale_max (from prepare_mxfp4)
and tiled (the weight is in tile_mxfp4's layout, which only TILED configs read); MoE problems add experts,
top_k and tokens.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

KINDS = ("gemv", "gemm", "moe")


@dataclass(frozen=True)
class Variant:
    """One kernel variant.

    fn: launcher fn(*args, **config) (signature fixed per op: see linear.py / moe.py).
    space: parameter -> candidate values a sweep tries. defaults: the config used when the caller gives none.
    rules: functions (config, problem) -> reason string when the config cannot run that problem, else None.
    """

    name: str
    kind: str
    op: str
    fn: Callable
    space: Mapping[str, tuple]
    defaults: Mapping[str, object]
    rules: tuple[Callable[[Mapping, Mapping], str | None], ...] = ()
    description: str = ""
    extra: Mapping[str, object] = field(default_factory=dict)

    def reason(self, config: Mapping, problem: Mapping) -> str | None:
        """Why this config cannot run this problem, or None if it can."""
        known = set(self.space) | set(self.defaults)
        unknown = set(config) - known
        if unknown:
            return (f"unknown parameter(s) {', '.join(sorted(unknown))} for variant {self.name!r}; "
                    f"known: {', '.join(sorted(known))}")
        if problem.get("tiled") and not config.get("TILED"):
            return ("the weight is in tile_mxfp4's layout, which only TILED=True configs read"
                    + ("" if "TILED" in self.space else f" ({self.name!r} has no TILED option)"))
        if problem.get("shuffled") and not config.get("NIB"):  # any other decode would read garbage
            return ("the weight is in shuffle_nibbles' layout, which only NIB=True configs read"
                    + ("" if "NIB" in self.space else f" ({self.name!r} has no NIB option)"))
        for rule in self.rules:
            r = rule(config, problem)
            if r:
                return r
        return None

    def check(self, config: Mapping, problem: Mapping) -> dict:
        """Full config (defaults filled in) or ValueError naming the broken rule."""
        full = {**self.defaults, **config}
        r = self.reason(full, problem)
        if r:
            raise ValueError(f"variant {self.name!r} cannot run {_fmt(problem)} with {full}: {r}")
        return full

    def iter_configs(self, problem: Mapping, space: Mapping[str, tuple] | None = None) -> Iterator[dict]:
        """The configs `configs` lists, one at a time in the same order (the first without listing them all)."""
        space = dict(space or self.space)
        keys = list(space)
        for vals in itertools.product(*(space[k] for k in keys)):
            cfg = {**self.defaults, **dict(zip(keys, vals))}
            if self.reason(cfg, problem) is None:
                yield cfg

    def configs(self, problem: Mapping, space: Mapping[str, tuple] | None = None) -> list[dict]:
        """Every config of the (given or registered) space that the rules allow for this problem.

        The registered spaces of the tensor-core variants hold millions of combinations (gemv_mma 11M, moe_mma
        ~10^12): list those through a sweep spec's grid, and draw from the whole space with `sample`."""
        return list(self.iter_configs(problem, space))

    def first(self, problem: Mapping) -> dict | None:
        """The defaults when the rules allow them for this problem, else the first allowed config (or None)."""
        if self.reason(dict(self.defaults), problem) is None:
            return dict(self.defaults)
        return next(self.iter_configs(problem), None)

    def sample(self, problem: Mapping, count: int, seed: object = 0, where: Callable[[dict], bool] | None = None,
               tries: int = 200_000) -> list[dict]:
        """Up to `count` distinct allowed configs (and `where` holds for them), drawn uniformly from the registered
        space with a seeded generator: the same list for the same seed. Why: tests and selfcheck want a few
        configs from spaces far too large to list (gemv_mma's full list takes ~40 s of rule checks per problem);
        drawing points of the product and keeping the allowed ones costs a few ms. Spaces of at most `tries`
        points are listed whole and sampled from the list, so an allowed config is never missed there."""
        if count <= 0:
            return []
        rng = random.Random(str(seed))
        ok = (lambda c: True) if where is None else where
        keys = list(self.space)
        if math.prod(len(self.space[k]) for k in keys) <= tries:
            allowed = [c for c in self.iter_configs(problem) if ok(c)]
            return rng.sample(allowed, min(count, len(allowed)))
        out, seen = [], set()
        for _ in range(tries):
            cfg = {**self.defaults, **{k: rng.choice(self.space[k]) for k in keys}}
            key = tuple(cfg[k] for k in keys)
            if key in seen:
                continue
            seen.add(key)
            if ok(cfg) and self.reason(cfg, problem) is None:
                out.append(cfg)
                if len(out) == count:
                    break
        return out


def _fmt(problem: Mapping) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in problem.items() if v is not None) + ")"


VARIANTS: dict[str, Variant] = {}


def register(v: Variant) -> Variant:
    if v.kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {v.kind!r}")
    if v.name in VARIANTS:
        raise ValueError(f"variant {v.name!r} is already registered")
    VARIANTS[v.name] = v
    return v


def variants_for(op: str) -> dict[str, Variant]:
    """The registered variants of one op ('linear' or 'moe')."""
    return {k: v for k, v in VARIANTS.items() if v.op == op}


def get_variant(name: str, op: str) -> Variant:
    known = variants_for(op)
    if name not in known:
        raise ValueError(f"variant must be 'auto' or one of {', '.join(known)}, got {name!r}")
    return known[name]


# ---- rules shared by variants ----------------------------------------------------------------------------


def rule_pow2(*params: str):
    def rule(cfg, problem):
        for p in params:
            v = cfg.get(p)
            if v is not None and (v <= 0 or v & (v - 1)):
                return f"{p}={v} must be a power of two"
        return None

    return rule


def rule_block_k_multiple_of_32(cfg, problem):
    bk = cfg.get("BLOCK_K")
    if bk is not None and bk % 32:
        return f"BLOCK_K={bk} must be a multiple of the MXFP4 block (32)"
    return None


def rule_scale_window(lo: int, hi: int):
    """Fast decodes are exact only for scale bytes in [lo, hi]; the weight's range comes from prepare_mxfp4."""

    def rule(cfg, problem):
        smin, smax = problem.get("scale_min"), problem.get("scale_max")
        if smin is not None and (smin < lo or smax > hi):
            return f"weight scale bytes {smin}..{smax} fall outside this variant's exact range {lo}..{hi}"
        return None

    return rule


def rule_scale_span(cfg, problem):
    """fp16 weights E2M1 * 2^(s - SMAX + 1) are exact only while the weight's scale bytes span <= 24 binades."""
    smin, smax = problem.get("scale_min"), problem.get("scale_max")
    if smin is not None and smax - smin > 24:
        return f"weight scale bytes {smin}..{smax} span more than the 24 binades fp16 weights hold exactly"
    return None


def rule_dot_k(cfg, problem):
    """The tensor-core decodes need at least 8 weight words per row and K tile."""
    if cfg["BLOCK_K"] < 64:
        return f"BLOCK_K={cfg['BLOCK_K']} must be at least 64 (8 words per row for the tensor-core decode)"
    return None


def rule_gemv_registers(cfg, problem):
    """CUDA-core GEMVs keep BLOCK_M * BLOCK_N * BLOCK_K/8 fp32 partial sums spread over the program's threads."""
    per_thread = cfg["BLOCK_M"] * cfg["BLOCK_N"] * cfg["BLOCK_K"] // 8 // (32 * cfg["num_warps"])
    if per_thread > 64:
        return f"accumulator needs {per_thread} registers per thread (BLOCK_M*BLOCK_N*BLOCK_K/8/threads > 64)"
    return None


def rule_mma_registers(cfg, problem):
    """The fp32 MMA accumulator tile is spread over the program's threads; past 128 per thread it spills."""
    per_thread = cfg["BLOCK_M"] * cfg["BLOCK_N"] // (32 * cfg["num_warps"])
    if per_thread > 128:
        return f"accumulator needs {per_thread} registers per thread (BLOCK_M*BLOCK_N/threads > 128)"
    return None


def rule_h2g_words(cfg, problem):
    """The h2g kernels (gemv_h2g, moe_h2g) keep a tile's weight words and their four decoded pairs in
    registers: past 16 words per thread (BLOCK_N*BLOCK_K/8/threads) the sm_90 build reaches 255 and spills.
    moe_h2g's mlp2 build (BLOCK_N2 rows, WARPS2 warps, each when set) is held to the same bounds."""
    mlp2 = cfg.get("BLOCK_N2") is not None or cfg.get("WARPS2") is not None
    for key, warps in (("BLOCK_N", cfg["num_warps"]), ("BLOCK_N2", cfg.get("WARPS2") or cfg["num_warps"])):
        if key == "BLOCK_N2" and not mlp2:
            continue
        words = (cfg.get(key) or cfg["BLOCK_N"]) * cfg["BLOCK_K"] // 8 // (32 * warps)
        if words > 16:
            return f"{words} weight words per thread ({key}*BLOCK_K/8/threads > 16) spill registers"
        if words < 1:
            return f"fewer weight words than threads ({key}*BLOCK_K/8 < 32*num_warps)"
    return None


def rule_tiled_k(cfg, problem):
    """The h2g kernels read tile_mxfp4's copy (TILED) a whole number of 128-K chunks per K tile."""
    if cfg.get("TILED") and cfg["BLOCK_K"] % 128:
        return f"TILED reads 128-K chunks: BLOCK_K={cfg['BLOCK_K']} must be a multiple of 128"
    return None


#: shared memory one H100 block may use (227 KB); a config over it fails to launch (OutOfResources)
SHARED_MEMORY_BYTES = 232448


def shared_memory_rule(x_bytes: int = 2):
    """Pipelined variants (tensor-core ones, the h2g kernels with num_stages > 1) keep num_stages copies of the
    x tile (x_bytes per value: 2 for 16-bit, 1 for w4a8_fp8's E4M3) and the W tile (packed codes and scale
    bytes) in shared memory."""

    def rule(cfg, problem):
        bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        need = cfg.get("num_stages", 1) * (bm * bk * x_bytes + bn * bk // 2 + bn * bk // 32)
        if need > SHARED_MEMORY_BYTES:
            return f"pipelined tiles need ~{need // 1024} KB of shared memory (num_stages * tiles > 227 KB)"
        return None

    return rule


rule_shared_memory = shared_memory_rule(2)


def rule_h2g_pipeline(cfg, problem):
    """num_stages > 1 makes the h2g kernels' K loop a compiler-pipelined cp.async ring; the register double
    buffer (PREFETCH) has no such loop."""
    if cfg.get("num_stages", 1) > 1 and cfg.get("PREFETCH"):
        return "PREFETCH=True has no pipelined K loop: use num_stages=1 with it"
    return rule_shared_memory(cfg, problem)
