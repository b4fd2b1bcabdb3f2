"""What a kernel that only read its bytes would take: each judged point's plain-read time, measured.

DESIGN.md's floor divides a point's bytes by the read ceiling (torch.sum over 1 GiB). Two things it does not
count, measured on the H100 (results/20261127T200057-h100-80gb-hbm3-read-ceiling):
- a plain Triton read streams faster than torch.sum: 3.16 against 3.04 TB/s over 1 GiB;
- at a point's own size a kernel pays its launch, ramp and drain: 53 MB (gpt-oss MoE, one token) read in
  19.2 us, 2.75 TB/s; the lm_head's 308 MB in 99.6 us, 3.10 TB/s.
So `measure` times `read_call` (one Triton program per 16 KB tile, summing it) over exactly each point's bytes,
the way the sweeps time kernels (bench.time_calls: CUDA-graph replays over copies rotated past 4x the L2), and
`labkit.targets` shows each best time over the read time of its bytes (`x_read`): how far a kernel is from
merely reading its weights once, launches included. `./lab readfloor` measures the judged points on this GPU.

A MoE layer's point is also read in two launches, one after the other, of mlp1's 2/3 and mlp2's 1/3 of the bytes
(rows with `launches` 2): what a layer takes that streams mlp2's weights only once mlp1 is done, as every layer
whose mlp2 reads its weights after the launch boundary or a wait for mlp1 does. On the H100 one token read
19.2 us in one launch and 21.0 in two (results/20261127T200057-h100-80gb-hbm3-read-ceiling).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from kernels._triton import tl, triton

from .results import run_meta

#: int32 words per program (16 KB): the fastest tile of the probe's three (2048, 4096, 8192) over 1 GiB
TILE = 4096
WARPS = 8
#: the file a read-floor run holds, and the columns `measure` writes to it
FILE = "read_floor.csv"
COLUMNS = ["problem", "m", "bytes", "launches", "read_us", "read_p10", "read_p90", "read_gbps", "copies"]
#: the problems read in two launches as well, and each launch's share of the bytes (mlp1's W1 is [2 I, H], W2 [H, I])
MOE_PROBLEMS = ("gpt-oss-120b", "gpt-oss-20b")
MOE_SHARES = (2 / 3, 1 / 3)


@triton.jit
def _tile_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Program p sums words [p * BLOCK, (p + 1) * BLOCK) of x (int32, wrapping) into out[p]."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + pid, tl.sum(v, axis=0))


def read_call(words, block: int = TILE, warps: int = WARPS) -> Callable[[], object]:
    """A call that reads the 1-D int32 tensor `words` once (each program one `block`-word tile, summed into a
    small output so no load is dead code); returns the per-tile sums it last wrote."""
    import torch

    if words.dtype != torch.int32 or words.dim() != 1:
        raise ValueError(f"words must be a 1-D int32 tensor, got {words.dtype} of shape {tuple(words.shape)}")
    n = words.numel()
    tiles = triton.cdiv(n, block)
    out = torch.empty(tiles, device=words.device, dtype=torch.int32)

    def call():
        _tile_sum[(tiles,)](words, out, n, BLOCK=block, num_warps=warps)
        return out

    return call


def split_words(words: int, shares: tuple[float, ...]) -> list[int]:
    """`words` cut into len(shares) consecutive parts in those proportions (the last takes the rounding)."""
    parts = [int(words * s) for s in shares[:-1]]
    return [*parts, words - sum(parts)]


def read_us(nbytes: int, *, shares: tuple[float, ...] = (1.0,), reps: int = 40) -> dict:
    """Time of reading `nbytes` once with read_call, timed like a sweep point (GPU only): us_graph median, p10,
    p90 per read over `copies` distinct buffers rotated so that a replay touches at least 4x the L2. `shares`:
    the read as that many launches one after the other, each over its share of the bytes."""
    import torch

    from .bench import time_calls

    if not torch.cuda.is_available():
        raise RuntimeError("a read floor is measured on a GPU, and torch sees none")
    words = max(1, int(nbytes) // 4)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or 0
    copies = max(2, math.ceil(4 * l2 / (4 * words)))
    bufs = [torch.randint(0, 1 << 20, (words,), device="cuda", dtype=torch.int32) for _ in range(copies)]

    def launches(buf):
        calls = [read_call(part) for part in buf.split(split_words(words, shares))]
        return calls[0] if len(calls) == 1 else lambda: [c() for c in calls]

    t = time_calls([launches(b) for b in bufs], reps=reps)
    del bufs
    torch.cuda.empty_cache()
    return {"read_us": t["us_graph"], "read_p10": t["us_graph_p10"], "read_p90": t["us_graph_p90"],
            "read_gbps": nbytes / t["us_graph"] / 1e3, "copies": copies}


def memory_bound(judged: pd.DataFrame) -> pd.DataFrame:
    """The judged points (labkit.targets.judge) whose floor is the bytes term, one row per (problem, m)."""
    ceil = judged.attrs["ceilings"]
    bw = max(c["read_gbps"] for c in ceil.values()) * 1e9
    rate = max(c["bf16_tflops"] for c in ceil.values()) * 1e12
    pts = judged[judged["bytes"].notna()]
    pts = pts[pts["bytes"] / bw >= pts["flops"] / rate]
    return pts.drop_duplicates(["problem", "m"])[["problem", "m", "bytes", "us", "run_id"]].reset_index(drop=True)


def measure(points: pd.DataFrame, progress: Callable[[dict], None] | None = None) -> pd.DataFrame:
    """read_us of each point's bytes (columns problem, m, bytes): a DataFrame of COLUMNS, a row per point in one
    launch and, for a MoE layer's, one more in two (MOE_SHARES)."""
    rows = []
    for p in points.to_dict("records"):
        for shares in ((1.0,), MOE_SHARES) if p["problem"] in MOE_PROBLEMS else ((1.0,),):
            rows.append({"problem": p["problem"], "m": int(p["m"]), "bytes": int(p["bytes"]), "launches": len(shares),
                         **read_us(int(p["bytes"]), shares=shares)})
            if progress:
                progress(rows[-1])
    return pd.DataFrame(rows, columns=COLUMNS)


def newest(paths: Iterable[Path], gpus: Iterable[str], launches: int = 1) -> tuple[str, pd.DataFrame] | None:
    """The newest run among `paths` holding FILE rows in `launches` launches measured on one of `gpus`, as (run
    id, those rows), else None (a table without a launches column holds one-launch rows; of the device probe's,
    .device/read_ceiling.py, with several readers, read_call's tile counts)."""
    gpus = set(gpus)
    for p in sorted((Path(p) for p in paths), key=lambda p: p.name, reverse=True):
        if not (p / FILE).is_file() or run_meta(p).get("gpu") not in gpus:
            continue
        df = pd.read_csv(p / FILE)
        df = df[df["launches"] == launches] if "launches" in df else df if launches == 1 else df.iloc[:0]
        if "reader" in df:
            df = df[df["reader"] == f"tile {TILE}x4B nw{WARPS}"]
        if len(df):
            return p.name, df[["problem", "m", "bytes", "read_us", "read_gbps"]]
    return None
