"""Host-side tables behind variant="auto": token count -> variant and config. No device sync.

LINEAR_TABLE rows are (max_m, variant, config), first row whose max_m >= M wins. If the chosen variant's
rules reject the problem (for example a weight whose scale bytes fall outside a fast decode's exact range),
the FALLBACK entries, which are exact for every input, are used instead.

The heuristic rows below are used for what no measured table covers; measured tables (per shape, plus a
default) live in kernels/tables_measured.py, written from a run folder by `labkit table write`. A GPU whose
best configs differ has its own set, kernels/tables_measured_<gpu>.py (`labkit table write --gpu <gpu>`), named
by the substrings of the device name in its GPU_MATCH: auto on that GPU reads each of its tables first and the
default set's where it has none (the H200 picks HALF at 32-256 tokens and no PERSIST1, unlike the H100:
results/20261128T104349-h200-moe-tables-h200).

A weight in tile_mxfp4's layout (problem["tiled"]) only runs TILED configs, so it has its own tables
(LINEAR_TABLES_TILED, MOE_TABLES_TILED) and its own fallback: the tensor-core variants with TILED=True.

A weight in shuffle_nibbles' layout (problem["shuffled"], rows or tiled) only runs NIB configs: it reads its
layout's NIB tables (*_NIB, derived from NIB configs alone), then its layout's plain tables with NIB=True set
on every row whose variant has the option (NIB decodes the same values in fewer instructions;
results/*-linear-mma-nib, *-moe-mma-nib measured it against the same configs without) and skips the others,
down to the mma.sync fallbacks with NIB. Large-M rows (dequant_gemm) have no NIB: keep a
weight for prefill-sized batches unshuffled.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path

from .variants import get_variant

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

#: the tiled layout's fallbacks: mma.sync tiles (every NVIDIA GPU since sm_80, and the interpreter)
LINEAR_TILED_FALLBACK = [(1 << 62, "gemv_mma", {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 1, "num_warps": 4, "TILED": True})]
MOE_TILED_FALLBACK = [(1 << 62, "moe_mma", {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 1, "num_warps": 4, "TILED": True})]
#: a shuffled row-major weight's last resort (the tiled fallbacks above take NIB as they are)
LINEAR_SHUFFLED_FALLBACK = [(1 << 62, "gemv_mma", {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 1, "num_warps": 4})]
MOE_SHUFFLED_FALLBACK = [(1 << 62, "moe_mma", {"BLOCK_M": 16, "ROWS": 1, "CHUNKS": 1, "num_warps": 4})]

LINEAR_FALLBACK = [
    (8, "gemv", {"BLOCK_M": 8, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4}),
    (1 << 62, "dot_scaled", {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4}),
]


try:  # tables derived from a GPU run by labkit.tables (absent until one was written)
    from . import tables_measured as _measured
except ImportError:  # pragma: no cover
    _measured = None


@functools.cache
def _gpu_sets() -> tuple:
    """The per-GPU measured table sets shipped in this package (modules tables_measured_<gpu>)."""
    here = [str(Path(__file__).parent)]
    names = sorted(m.name for m in pkgutil.iter_modules(here) if m.name.startswith("tables_measured_"))
    return tuple(importlib.import_module(f"{__package__}.{n}") for n in names)


def gpu_tables(device_name: str | None):
    """The measured table set auto reads first on a GPU named `device_name`: the per-GPU set whose GPU_MATCH
    substring occurs in the name, else the default set (kernels/tables_measured.py; also without a GPU)."""
    name = (device_name or "").lower()
    for mod in _gpu_sets() if name else ():
        if any(s.lower() in name for s in mod.GPU_MATCH):
            return mod
    return _measured


@functools.cache
def _device_name() -> str | None:
    """The current GPU's name (host-side, asked once), or None without one."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _keyed(name: str, key: tuple, tiled: bool = False, nib: bool = False) -> list:
    """The measured rows for this shape (or the measured default) of the weight's layout, if any: from this
    GPU's own table set where it has that table, else from the default set."""
    name += ("_TILED" if tiled else "") + ("_NIB" if nib else "")
    for mod in (gpu_tables(_device_name()), _measured):
        tables = getattr(mod, name, None) if mod else None
        if tables:
            return tables.get(key) or tables.get("default") or []
    return []


def _measured_for(name: str, key: tuple, problem: dict) -> list:
    """The measured tables a weight reads, in order: its layout's NIB tables when it is held shuffled, then its
    layout's plain tables."""
    tiled = bool(problem.get("tiled"))
    nib = _keyed(name, key, tiled, nib=True) if problem.get("shuffled") else []
    return [nib, _keyed(name, key, tiled)]


def _pick(op: str, tables, problem: dict) -> tuple[str, dict]:
    m = problem["m"]
    shuffled = bool(problem.get("shuffled"))
    for table in tables:
        for max_m, name, cfg in table:
            if m <= max_m:
                v = get_variant(name, op)
                if shuffled and "NIB" in v.space:
                    cfg = {**cfg, "NIB": True}
                if v.reason({**v.defaults, **cfg}, problem) is None:
                    return name, dict(cfg)
                break
    if shuffled:
        raise ValueError(f"no NIB {op} config can run {problem}: keep this weight unshuffled (prepare_mxfp4 or "
                         "tile_mxfp4), which the exact fallbacks read")
    if problem.get("tiled"):
        raise ValueError(f"no TILED {op} config can run {problem}: keep this weight row-major (prepare_mxfp4), "
                         "which the exact fallbacks read")
    raise ValueError(f"no {op} variant can run {problem}")  # pragma: no cover - fallbacks cover every input


def pick_linear(problem: dict) -> tuple[str, dict]:
    """(variant, config) for a linear problem {m, n, k, scale_min, scale_max}: the measured table for this
    (N, K) (or the measured default), else the heuristic table, then the exact fallbacks."""
    rest = (LINEAR_TILED_FALLBACK,) if problem.get("tiled") else (LINEAR_TABLE, LINEAR_FALLBACK,
                                                                  LINEAR_SHUFFLED_FALLBACK)
    return _pick("linear", [t for t in (*_measured_for("LINEAR_TABLES", (problem["n"], problem["k"]), problem),
                                        *rest) if t], problem)


def pick_moe(problem: dict) -> tuple[str, dict]:
    """(variant, config) for a MoE problem {m (= tokens), experts, n (= 2I), k (= H), ...}, as pick_linear."""
    rest = (MOE_TILED_FALLBACK,) if problem.get("tiled") else (MOE_TABLE, MOE_FALLBACK, MOE_SHUFFLED_FALLBACK)
    key = (problem["experts"], problem["n"], problem["k"])
    return _pick("moe", [t for t in (*_measured_for("MOE_TABLES", key, problem), *rest) if t], problem)
