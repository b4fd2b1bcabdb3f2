"""Host-side tables behind variant="auto": token count -> variant and config. No device sync.

LINEAR_TABLE rows are (max_m, variant, config), first row whose max_m >= M wins. If the chosen variant's
rules reject the problem (for example a weight whose scale bytes fall outside a fast decode's exact range),
the FALLBACK entries, which are exact for every input, are used instead.

SOURCE names the run the table was derived from ("heuristic" until a GPU sweep replaced it; labkit
regenerates this file from a run folder).
"""

from __future__ import annotations

from .variants import get_variant

SOURCE = "heuristic (no GPU measurement yet)"

LINEAR_TABLE = [
    (1, "gemv", {"BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4}),
    (2, "gemv", {"BLOCK_M": 2, "BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4}),
    (64, "gemv_tc", {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4}),
    (1 << 62, "mma", {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8}),
]

#: MoE: rows keyed by tokens T (routing is device-side, so T is all the host knows).
MOE_TABLE = [
    (8, "moe_gemv", {"BLOCK_M": 4, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4}),
    (1 << 62, "moe_tc", {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4}),
]
MOE_FALLBACK = [(1 << 62, "moe_gemv", {"BLOCK_M": 8, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4})]

LINEAR_FALLBACK = [
    (8, "gemv", {"BLOCK_M": 8, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4}),
    (1 << 62, "dot_scaled", {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4}),
]


def _pick(op: str, tables, problem: dict) -> tuple[str, dict]:
    m = problem["m"]
    for table in tables:
        for max_m, name, cfg in table:
            if m <= max_m:
                v = get_variant(name, op)
                if v.reason({**v.defaults, **cfg}, problem) is None:
                    return name, dict(cfg)
                break
    raise ValueError(f"no {op} variant can run {problem}")  # pragma: no cover - fallbacks cover every input


def pick_linear(problem: dict) -> tuple[str, dict]:
    """(variant, config) for a linear problem {m, n, k, scale_min, scale_max} from the host-side table."""
    return _pick("linear", (LINEAR_TABLE, LINEAR_FALLBACK), problem)


def pick_moe(problem: dict) -> tuple[str, dict]:
    """(variant, config) for a MoE problem {m (= tokens), experts, top_k, ...} from the host-side table."""
    return _pick("moe", (MOE_TABLE, MOE_FALLBACK), problem)
