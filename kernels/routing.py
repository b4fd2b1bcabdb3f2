"""MoE routing on the device: top-k, softmax over the k selected (GPT-OSS order), and the bookkeeping the
grouped kernels need, all with fixed shapes and no host sync, so a captured graph replays any routing.

Slots are the T*k (token, choice) pairs, numbered t*k + j. Grouped kernels walk slots sorted by expert:
  counts[e]   slots routed to expert e          offsets[e] = sum of counts before e   (offsets[E] = T*k)
  sorted[i]   the slot at position i of the expert-sorted order (stable: ascending slot within an expert)
  inverse[s]  the position of slot s in that order (the combine reads each token's k rows through it)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._triton import INTERPRETED, pdl_enter, pdl_launch, tl, triton
from .formats import _check_tensor
from .reference import topk_softmax

#: the most tokens route's one-program form takes (top-k, softmax, counting sort in one Triton program)
FUSED_MAX_TOKENS = 64
#: route() picks the one-program form while its tile (tokens and experts padded to powers of two) holds at most
#: this many logits and sorts at most FUSED_ROUTE_SLOTS slots, else three launches over token blocks. On the
#: H200 (results/20261128T200301-h200-route-forms-a, …200340-…-b) one program ran 16 tokens of E = 128 in 8.3 us
#: against 9.2 for the blocks, 24-32 tokens in 12.5-13.5 against 9.4-9.6; 32 tokens of E = 32 in 6.0 against
#: 6.8, 48-64 in 11.4-11.6 against 7.0-7.1 (the 256-slot sort); 1-8 tokens 3.6-6.4 against 6.7-9.2 (the blocks'
#: three launches).
FUSED_ROUTE_LOGITS = 2048
FUSED_ROUTE_SLOTS = 128
#: most token blocks of route's multi-program form (beyond FUSED_MAX_TOKENS): one program scans their counts
BLOCKS_MAX = 128


@dataclass(frozen=True)
class Routing:
    """Device-side routing of T tokens to k of E experts (see the module docstring for the fields)."""

    ids: torch.Tensor  # [T, k] int32
    weights: torch.Tensor  # [T, k] float32
    counts: torch.Tensor  # [E] int32
    offsets: torch.Tensor  # [E + 1] int32
    sorted: torch.Tensor  # [T * k] int32
    inverse: torch.Tensor  # [T * k] int32
    num_experts: int

    @property
    def tokens(self) -> int:
        return self.ids.shape[0]

    @property
    def top_k(self) -> int:
        return self.ids.shape[1]

    @classmethod
    def from_ids(cls, ids: torch.Tensor, weights: torch.Tensor, num_experts: int, *, validate: bool = True) -> Routing:
        """Routing from explicit expert ids [T, k] and gate weights [T, k] (the same expert twice for one
        token is allowed). validate=True checks ids are in 0..E-1, which reads them on the host: pass
        False inside graph capture."""
        _check_tensor("ids", ids, (torch.int32, torch.int64, torch.int16, torch.uint8))
        _check_tensor("weights", weights, (torch.float32, torch.bfloat16, torch.float16))
        if ids.dim() != 2 or tuple(weights.shape) != tuple(ids.shape):
            raise ValueError(f"ids and weights must both be [T, k], got {tuple(ids.shape)} and {tuple(weights.shape)}")
        if not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
        if validate and ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= num_experts:
                raise ValueError(f"ids: expert id out of range 0..{num_experts - 1} (min {lo}, max {hi})")
        return _bookkeeping(ids.to(torch.int32), weights.to(torch.float32), num_experts)


def _bookkeeping(ids: torch.Tensor, weights: torch.Tensor, E: int) -> Routing:
    ids, weights = ids.contiguous(), weights.contiguous()
    flat = ids.reshape(-1)
    S = flat.numel()
    counts = torch.zeros(E, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(0, flat.long(), torch.ones_like(flat))
    offsets = torch.zeros(E + 1, dtype=torch.int32, device=ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    # stable sort by expert: key = expert * S + slot is unique, so any sort is stable on it
    key = flat.long() * max(S, 1) + torch.arange(S, device=ids.device)
    order = torch.argsort(key).to(torch.int32)
    inverse = torch.empty(S, dtype=torch.int32, device=ids.device)
    inverse[order.long()] = torch.arange(S, dtype=torch.int32, device=ids.device)
    return Routing(ids, weights, counts, offsets, order, inverse, E)


@triton.jit
def _topk_softmax_block(logits_ptr, ids_ptr, w_ptr, t0, T, E, stride_t, K: tl.constexpr, KP: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """Tokens t0 .. t0 + BLOCK_T - 1 (those below T): top-K (descending, lowest index on ties), softmax over the
    K, ids and weights stored. Returns (ids [BLOCK_T, KP], their mask)."""
    rt = t0 + tl.arange(0, BLOCK_T)
    re = tl.arange(0, BLOCK_E)
    rj = tl.arange(0, KP)
    tm = rt < T
    lg = tl.load(logits_ptr + rt[:, None].to(tl.int64) * stride_t + re[None, :],
                 mask=tm[:, None] & (re < E)[None, :], other=float("-inf")).to(tl.float32)
    ids = tl.zeros((BLOCK_T, KP), tl.int32)
    vals = tl.full((BLOCK_T, KP), float("-inf"), tl.float32)
    for j in tl.static_range(K):
        m = tl.max(lg, axis=1)
        a = tl.argmax(lg, axis=1, tie_break_left=True).to(tl.int32)
        ids = tl.where(rj[None, :] == j, a[:, None], ids)
        vals = tl.where(rj[None, :] == j, m[:, None], vals)
        lg = tl.where(re[None, :] == a[:, None], float("-inf"), lg)
    top = tl.where(tm, tl.max(vals, axis=1), 0.0)  # padded tokens: keep their (unstored) math finite
    ex = tl.where((rj[None, :] < K) & tm[:, None], tl.exp(vals - top[:, None]), 0.0)
    den = tl.zeros((BLOCK_T,), tl.float32)
    for j in tl.static_range(K):  # in order j = 0, 1, ...: the same sum whatever the layout (num_warps, tile)
        den += tl.sum(tl.where(rj[None, :] == j, ex, 0.0), axis=1)
    w = ex / tl.maximum(den, 1e-30)[:, None]
    jm = tm[:, None] & (rj < K)[None, :]
    tl.store(ids_ptr + rt[:, None] * K + rj[None, :], ids, mask=jm)
    tl.store(w_ptr + rt[:, None] * K + rj[None, :], w, mask=jm)
    return ids, jm


@triton.jit
def _route_fused_kernel(logits_ptr, ids_ptr, w_ptr, counts_ptr, offs_ptr, sorted_ptr, inv_ptr, T, E, stride_t,
                        K: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program: _topk_softmax_block, and a counting sort of the T*K slots by expert (stable: the sort key
    is expert * S_pad + slot)."""
    pdl_enter()
    ids, jm = _topk_softmax_block(logits_ptr, ids_ptr, w_ptr, 0, T, E, stride_t, K, KP, BLOCK_T, BLOCK_E)
    re = tl.arange(0, BLOCK_E)
    S_PAD: tl.constexpr = BLOCK_T * KP
    slot = tl.arange(0, BLOCK_T)[:, None] * K + tl.arange(0, KP)[None, :]
    key = tl.where(jm, ids * S_PAD + slot, 2147483647)
    key = tl.sort(tl.reshape(key, (S_PAD,)))
    flat_ids = tl.reshape(tl.where(jm, ids, 0), (S_PAD,))
    counts = tl.histogram(flat_ids, BLOCK_E, mask=tl.reshape(jm, (S_PAD,)))
    em = re < E
    tl.store(counts_ptr + re, counts, mask=em)
    tl.store(offs_ptr + 1 + re, tl.cumsum(counts, 0), mask=em)
    tl.store(offs_ptr + re, 0, mask=re == 0)
    rp = tl.arange(0, S_PAD)
    valid = key != 2147483647
    s_sorted = key % S_PAD
    tl.store(sorted_ptr + rp, s_sorted, mask=valid)
    tl.store(inv_ptr + s_sorted, rp, mask=valid)


@triton.jit
def _route_topk_kernel(logits_ptr, ids_ptr, w_ptr, hist_ptr, T, E, stride_t, K: tl.constexpr, KP: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """Block b of BLOCK_T tokens: _topk_softmax_block, and the block's count per expert into hist[b]."""
    pdl_enter()
    b = tl.program_id(0)
    ids, jm = _topk_softmax_block(logits_ptr, ids_ptr, w_ptr, b * BLOCK_T, T, E, stride_t, K, KP, BLOCK_T, BLOCK_E)
    S_BLK: tl.constexpr = BLOCK_T * KP
    counts = tl.histogram(tl.reshape(tl.where(jm, ids, 0), (S_BLK,)), BLOCK_E, mask=tl.reshape(jm, (S_BLK,)))
    tl.store(hist_ptr + b * BLOCK_E + tl.arange(0, BLOCK_E), counts)


@triton.jit
def _route_scan_kernel(hist_ptr, counts_ptr, offs_ptr, NB, E, BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr):
    """One program over the blocks' counts hist[NB, E]: counts, offsets, and in place of hist[b, e] where block
    b's slots of expert e start in the sorted order, less where they start in the block's own sorted order
    (the block's counts of experts below e), so that _route_place_kernel adds a slot's position in its block."""
    pdl_enter()
    rb = tl.arange(0, BLOCK_B)
    re = tl.arange(0, BLOCK_E)
    hp = hist_ptr + rb[:, None] * BLOCK_E + re[None, :]
    bm = (rb < NB)[:, None]
    h = tl.load(hp, mask=bm, other=0)
    counts = tl.sum(h, axis=0)
    ends = tl.cumsum(counts, 0)
    em = re < E
    tl.store(counts_ptr + re, counts, mask=em)
    tl.store(offs_ptr + 1 + re, ends, mask=em)
    tl.store(offs_ptr + re, 0, mask=re == 0)
    start = (ends - counts)[None, :] + tl.cumsum(h, 0) - h  # expert e's start, plus earlier blocks' e slots
    in_block = tl.cumsum(h, 1) - h  # the block's slots of experts below e
    tl.store(hp, start - in_block, mask=bm)


@triton.jit
def _route_place_kernel(ids_ptr, base_ptr, sorted_ptr, inv_ptr, T, K: tl.constexpr, KP: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    """Block b: its slots sorted by (expert, slot), each placed at base[b, expert] + its position in that order."""
    pdl_enter()
    b = tl.program_id(0)
    rt = tl.arange(0, BLOCK_T)
    rj = tl.arange(0, KP)
    jm = ((b * BLOCK_T + rt) < T)[:, None] & (rj < K)[None, :]
    ids = tl.load(ids_ptr + (b * BLOCK_T + rt)[:, None] * K + rj[None, :], mask=jm, other=0)
    S_BLK: tl.constexpr = BLOCK_T * KP
    local = rt[:, None] * KP + rj[None, :]
    key = tl.sort(tl.reshape(tl.where(jm, ids * S_BLK + local, 2147483647), (S_BLK,)))
    valid = key != 2147483647
    e = tl.where(valid, key // S_BLK, 0)
    ls = key % S_BLK
    slot = (b * BLOCK_T + ls // KP) * K + ls % KP
    pos = tl.load(base_ptr + b * BLOCK_E + e, mask=valid, other=0) + tl.arange(0, S_BLK)
    tl.store(sorted_ptr + pos, slot, mask=valid)
    tl.store(inv_ptr + slot, pos, mask=valid)


def fused_route_warps(T: int, E: int) -> int:
    """Warps of route's one-program form for T tokens of E experts: one per 128 logits of its padded tile, 1 to
    8. On the H200 (.device/route_warps.py; results/20261128T203701-h200-route-warps-t1, …203736-…-e32-all):
    256 logits 3.9 us on 1-2 warps against 4.1-4.6 on 4, 512 4.3 on 4 against 4.8-5.3, 1024 5.3 on 8 against
    6.1 on 4; up to 128 logits within 0.3 us whatever the warps."""
    logits = max(2, triton.next_power_of_2(T)) * max(2, triton.next_power_of_2(E))
    return min(8, max(1, logits // 128))


def _routing_buffers(T: int, E: int, k: int, device) -> Routing:
    """Uninitialized Routing tensors for T tokens, k of E experts (what the route kernels fill)."""
    i32 = dict(device=device, dtype=torch.int32)
    return Routing(torch.empty((T, k), **i32), torch.empty((T, k), device=device, dtype=torch.float32),
                   torch.empty(E, **i32), torch.empty(E + 1, **i32), torch.empty(T * k, **i32),
                   torch.empty(T * k, **i32), E)


def _route_fused(logits: torch.Tensor, k: int, num_warps: int | None = None) -> Routing:
    T, E = logits.shape
    if num_warps is None:
        num_warps = fused_route_warps(T, E)
    r = _routing_buffers(T, E, k, logits.device)
    _route_fused_kernel[(1,)](logits, r.ids, r.weights, r.counts, r.offsets, r.sorted, r.inverse, T, E,
                              logits.stride(0), K=k, KP=triton.next_power_of_2(k),
                              BLOCK_T=max(2, triton.next_power_of_2(T)), BLOCK_E=max(2, triton.next_power_of_2(E)),
                              num_warps=num_warps, **pdl_launch())
    return r


def _blocks_launch(T: int, E: int) -> dict | None:
    """_route_topk/_place_kernel's token block for T tokens of E experts: at least 16 tokens, few enough
    blocks (BLOCKS_MAX) for one program to scan their counts; None where a block's logits or the scan would
    not fit one program's registers (E above 256, or T above 32768 at E = 128)."""
    block_e = max(2, triton.next_power_of_2(E))
    block_t = max(16, triton.next_power_of_2(triton.cdiv(T, BLOCKS_MAX)))
    if block_t * block_e > 32768 or BLOCKS_MAX * block_e > 32768:
        return None
    return {"BLOCK_T": block_t, "BLOCK_E": block_e}


def _route_blocks(logits: torch.Tensor, k: int, blocks: dict) -> Routing:
    T, E = logits.shape
    r = _routing_buffers(T, E, k, logits.device)
    nb = triton.cdiv(T, blocks["BLOCK_T"])
    hist = torch.empty((nb, blocks["BLOCK_E"]), device=logits.device, dtype=torch.int32)
    kp = triton.next_power_of_2(k)
    _route_topk_kernel[(nb,)](logits, r.ids, r.weights, hist, T, E, logits.stride(0), K=k, KP=kp, **blocks,
                              num_warps=4, **pdl_launch())
    _route_scan_kernel[(1,)](hist, r.counts, r.offsets, nb, E, BLOCK_B=max(2, triton.next_power_of_2(nb)),
                             BLOCK_E=blocks["BLOCK_E"], num_warps=8, **pdl_launch())
    _route_place_kernel[(nb,)](r.ids, hist, r.sorted, r.inverse, T, K=k, KP=kp, **blocks, num_warps=4,
                               **pdl_launch())
    return r


#: route's forms: one program, three launches over token blocks, torch's top-k and sort
ROUTE_FORMS = ("fused", "blocks", "torch")


def route_forms(T: int, E: int, k: int, on_device: bool = True) -> list[str]:
    """The forms route() can take for logits [T, E] on the GPU (or in the interpreter); on_device=False: CPU
    logits on a machine with a GPU, which only torch takes."""
    if not (0 < T and 1 <= k <= E <= 1024 and on_device):
        return ["torch"]
    return [f for f, fits in (("fused", T <= FUSED_MAX_TOKENS), ("blocks", _blocks_launch(T, E) is not None),
                              ("torch", True)) if fits]


def route_path(T: int, E: int, k: int, on_device: bool = True) -> str:
    """The form route() picks: "fused" while its padded tile stays within FUSED_ROUTE_LOGITS logits and
    FUSED_ROUTE_SLOTS sorted slots, else "blocks" where it fits, else "torch"."""
    forms = route_forms(T, E, k, on_device)
    if "fused" in forms and "blocks" in forms:
        bt, ep, kp = (max(2, triton.next_power_of_2(v)) for v in (T, E, k))
        if bt * ep > FUSED_ROUTE_LOGITS or bt * kp > FUSED_ROUTE_SLOTS:
            forms.remove("fused")
    return forms[0]


def route(logits: torch.Tensor, k: int, *, form: str | None = None) -> Routing:
    """GPT-OSS routing: top-k of router logits [T, E] (descending, lowest index on ties), softmax over the k,
    then bookkeeping.

    Fixed launch shapes and no host reads: safe to capture in a CUDA graph. For a few tokens (route_path) it
    is a single Triton program; beyond that three launches over blocks of tokens (top-k and each block's
    counts per expert; one program scanning those counts; each block placing its slots), and where even that
    does not fit (E above 256), or for CPU logits on a machine with a GPU, torch's top-k and sort kernels.
    form ("fused", "blocks", "torch") forces one of them where it applies (route_forms), to measure or test it.
    """
    T, E = logits.shape if logits.dim() == 2 else (0, 0)
    on_device = logits.is_cuda or INTERPRETED  # CPU logits on a GPU machine: torch
    if form is None:
        form = route_path(T, E, k, on_device)
    elif form not in route_forms(T, E, k, on_device):
        raise ValueError(f"route form {form!r} does not apply to logits {tuple(logits.shape)} with k={k} on "
                         f"{logits.device.type}: it takes {route_forms(T, E, k, on_device)} (of {ROUTE_FORMS})")
    if form != "torch":
        _check_tensor("logits", logits, (torch.float32, torch.bfloat16, torch.float16))
        if form == "fused":
            return _route_fused(logits.contiguous(), k)
        return _route_blocks(logits.contiguous(), k, _blocks_launch(T, E))
    ids, weights = topk_softmax(logits, k)
    return _bookkeeping(ids, weights, logits.shape[1])
