"""Compile Triton kernels without running them.

Two uses:
  * `precompile(tasks)`: before a sweep, compile every config in parallel worker processes so the timed
    process only loads kernels from Triton's on-disk cache (a sweep has hundreds of configs; compiling them
    one by one in the measuring process would cost minutes of GPU time).
  * `static_report(...)` / `labkit sass`: registers, spills, shared memory and the main loop's instruction
    mix of a variant config, for any CUDA target, on any machine (a machine without a GPU included):
    "read what costs no device time" before spending it.

Both run the variant's own launcher on shape-only (meta) tensors with Triton's JIT switched to warm-up,
so the kernels compiled are exactly the ones a real call would use.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path


@contextlib.contextmanager
def compile_only(arch: int | None = None):
    """Inside: every Triton launch compiles (for `arch`, default the current GPU or sm_90) and returns
    without running. Yields the list of (kernel name, CompiledKernel) compiled so far."""
    os.environ.setdefault("TRITON_INTERPRET", "0")
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    compiled: list = []
    fake = None
    import torch

    if arch is not None or not torch.cuda.is_available():
        target = GPUTarget("cuda", arch or 90, 32)

        class _CompileOnlyDriver:
            def get_current_device(self):
                return 0

            def get_current_stream(self, device=None):
                return 0

            def get_current_target(self):
                return target

            def get_device_interface(self):
                return torch.cuda

        fake = _CompileOnlyDriver()
        previous = getattr(driver, "_active", None)
        driver.set_active(fake)
    orig = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        k = orig(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self._fn_name, k))
        return k

    JITFunction.run = run
    try:
        yield compiled
    finally:
        JITFunction.run = orig
        if fake is not None:
            driver._active = previous  # None: the default driver is found again on next use


def meta_linear_args(m: int, n: int, k: int, bias: bool = False):
    """Shape-only stand-ins for (x, prepared weight, bias) of a linear call: no memory, same specialization."""
    import torch

    from kernels.prepare import PreparedMXFP4

    dev = "meta"
    blocks = torch.empty((n, k // 2), device=dev, dtype=torch.uint8)
    p = PreparedMXFP4(blocks, torch.empty((n, k // 8), device=dev, dtype=torch.int32),
                      torch.empty((n, k // 32), device=dev, dtype=torch.uint8), (n, k), 120, 124)
    x = torch.empty((m, k), device=dev, dtype=torch.bfloat16)
    b = torch.empty((n,), device=dev, dtype=torch.bfloat16) if bias else None
    return x, p, b


def compile_linear(variant: str, config: dict, m: int, n: int, k: int, bias: bool = False, arch: int | None = None):
    """Compile (not run) one linear variant config; returns [(kernel name, CompiledKernel)]."""
    from kernels import VARIANTS

    v = VARIANTS[variant]
    x, p, b = meta_linear_args(m, n, k, bias)
    with compile_only(arch) as compiled:
        v.fn(x, p, b, **{**v.defaults, **config})
    return list(compiled)


def meta_moe_args(tokens: int, experts: int, top_k: int, n: int, k: int):
    """Shape-only stand-ins for (x, routing, w1, b1, w2, b2) of a MoE call with w1 [E, n, k], w2 [E, k, n/2]."""
    import torch

    from kernels.prepare import PreparedMXFP4
    from kernels.routing import Routing

    dev, S = "meta", tokens * top_k

    def prep(nn, kk):
        return PreparedMXFP4(torch.empty((experts, nn, kk // 2), device=dev, dtype=torch.uint8),
                             torch.empty((experts, nn, kk // 8), device=dev, dtype=torch.int32),
                             torch.empty((experts, nn, kk // 32), device=dev, dtype=torch.uint8), (experts, nn, kk),
                             120, 124)

    i32 = dict(device=dev, dtype=torch.int32)
    r = Routing(torch.empty((tokens, top_k), **i32), torch.empty((tokens, top_k), device=dev, dtype=torch.float32),
                torch.empty((experts,), **i32), torch.empty((experts + 1,), **i32), torch.empty((S,), **i32),
                torch.empty((S,), **i32), experts)
    x = torch.empty((tokens, k), device=dev, dtype=torch.bfloat16)
    b1 = torch.empty((experts, n), device=dev, dtype=torch.bfloat16)
    b2 = torch.empty((experts, k), device=dev, dtype=torch.bfloat16)
    return x, r, prep(n, k), b1, prep(k, n // 2), b2


def compile_moe(variant: str, config: dict, tokens: int, experts: int, top_k: int, n: int, k: int,
                arch: int | None = None):
    """Compile (not run) one MoE variant config; returns [(kernel name, CompiledKernel)]."""
    from kernels import VARIANTS

    v = VARIANTS[variant]
    x, r, p1, b1, p2, b2 = meta_moe_args(tokens, experts, top_k, n, k)
    with compile_only(arch) as compiled:
        v.fn(x, r, p1, b1, p2, b2, 1.702, 7.0, **{**v.defaults, **config})
    return list(compiled)


def _task(task: dict) -> dict:
    t = time.perf_counter()
    try:
        if task.get("op") == "moe":
            compile_moe(task["variant"], task["config"], task["m"], task["experts"], task["top_k"], task["n"],
                        task["k"], task.get("arch"))
        else:
            compile_linear(task["variant"], task["config"], task["m"], task["n"], task["k"], task.get("bias", False),
                           task.get("arch"))
        return {**task, "ok": True, "error": None, "seconds": time.perf_counter() - t}
    except Exception as e:  # reported, the sweep records the failure when it runs the point
        msg = str(e).strip().splitlines()
        return {**task, "ok": False, "error": f"{type(e).__name__}: {msg[-1] if msg else ''}"[:500],
                "seconds": time.perf_counter() - t}


def _specialization(task: dict) -> tuple:
    """Tasks that compile to the same kernels (Triton specializes ints on ==1 and %16)."""
    def cls(v):
        return "1" if v == 1 else ("16" if v % 16 == 0 else "x")

    return (task.get("op", "linear"), task["variant"], tuple(sorted(task["config"].items())), cls(task["m"]),
            cls(task["n"]), cls(task["k"]), task.get("bias", False), task.get("experts"), task.get("top_k"))


def _this_arch() -> int | None:
    """This machine's GPU compute capability as 90, 100, ... (None without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def precompile(tasks: list[dict], workers: int | None = None, progress: bool = True) -> list[dict]:
    """Compile every distinct task in parallel processes (fills Triton's on-disk cache); returns results."""
    from tqdm import tqdm

    arch = _this_arch()
    unique = {}
    for t in tasks:
        unique.setdefault(_specialization(t), {**t, "arch": arch})
    todo = list(unique.values())
    workers = workers or max(1, min(len(todo), (os.cpu_count() or 2) - 1))
    results = []
    if not todo:
        return results
    import multiprocessing as mp

    ex = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    try:
        futs = [ex.submit(_task, t) for t in todo]
        for f in tqdm(as_completed(futs), total=len(futs), desc="compiling", disable=not progress, unit="kernel"):
            results.append(f.result())
    except KeyboardInterrupt:  # ^C: drop the queued compiles instead of waiting minutes for them
        ex.shutdown(wait=False, cancel_futures=True)
        raise
    ex.shutdown()
    return results


# ---- static reports ------------------------------------------------------------------------------------------


def _nvidia_tool(name: str) -> str | None:
    import triton

    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return str(p) if p.exists() else shutil.which(name)


def sass_of(kernel) -> str:
    """Disassembly (SASS) of a compiled Triton kernel, via nvdisasm."""
    nvd = _nvidia_tool("nvdisasm")
    if nvd is None:
        raise FileNotFoundError("nvdisasm not found (it ships with Triton's NVIDIA backend or the CUDA toolkit)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([nvd, "-c", f.name], capture_output=True, text=True, check=True).stdout


def resource_usage(kernel) -> dict:
    """Registers, stack, local memory (spills) and shared memory of a compiled kernel."""
    out = {"shared": kernel.metadata.shared}
    tool = _nvidia_tool("cuobjdump")
    if tool:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            txt = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", txt)
        if m:
            out.update(regs=int(m.group(1)), stack=int(m.group(2)), local=int(m.group(4)))
    return out


#: per-SM limits by compute capability (CUDA C++ Programming Guide, "Technical Specifications per Compute
#: Capability"): registers, shared memory (bytes), resident blocks, resident warps; each block also holds
#: 1 KB of shared memory the runtime reserves (cudaDevAttrReservedSharedMemoryPerBlock)
SM_LIMITS = {80: (65536, 164 * 1024, 32, 64), 90: (65536, 228 * 1024, 32, 64)}


def programs_per_sm(regs: int, shared: int, num_warps: int, arch: int = 90) -> dict | None:
    """Resident programs per SM of a build and what bounds them (registers per thread rounded up to the
    allocation's 8, shared memory plus the reserved KB, warps, blocks); None for an arch not in SM_LIMITS.
    Why: a memory-bound K loop gains from every program more per SM (gemv_mma's TMA build at 32 tokens: 128
    registers against 141, 4 programs per SM against 3, 2% faster)."""
    if arch not in SM_LIMITS:
        return None
    reg_sm, smem_sm, blocks, warps = SM_LIMITS[arch]
    by = {"registers": reg_sm // (-(-regs // 8) * 8 * 32 * num_warps),
          "shared memory": smem_sm // (shared + 1024), "warps": warps // num_warps, "blocks": blocks}
    n = min(by.values())
    return {"programs": n, "limited_by": [k for k, v in by.items() if v == n]}


#: a tensor-core instruction: sm_90 wgmma (HGMMA fp16/bf16, QGMMA fp8, IGMMA int8) or mma.sync (HMMA, IMMA)
_TENSOR_CORE = re.compile(r"\b([HQI]GMMA|HMMA|IMMA)\.[\w.]+")


def tensor_core_ops(sass: str) -> dict[str, int]:
    """Tensor-core instructions of a kernel by full name (shape and operand types, e.g.
    QGMMA.64x128x32.F32.E4M3.E4M3): which MMA a compiled variant really runs (Triton's tl.dot_scaled on sm_90
    upcasts e4m3 and e2m1 to bf16 for an HGMMA...BF16)."""
    return dict(collections.Counter(m.group(0) for m in _TENSOR_CORE.finditer(sass)))


def main_loop_mix(sass: str) -> tuple[int, collections.Counter]:
    """Instruction count and opcode histogram of the K loop in SASS: the largest loop holding a tensor-core
    instruction (HGMMA, QGMMA, HMMA), else the largest loop; spans holding an EXIT are not loops of the body. Why: an
    epilogue loop (moe_mma mlp1 zeroing its padding columns) can outgrow a short K loop, and ptxas places an
    mbarrier wait's retry after the epilogue, branching back into the K loop (gemv_mma TMA)."""
    instrs, labels = _instructions(sass)
    loops = _body_loops(instrs, labels)
    mma = [lp for lp in loops if any(_TENSOR_CORE.search(ins) for ins in instrs[lp[0]:lp[1] + 1])]
    start, end = max(mma or loops, key=lambda lp: lp[1] - lp[0], default=(0, -1))
    mix = collections.Counter(_unpredicated(ins).split()[0].split(".")[0] for ins in instrs[start:end + 1])
    return end + 1 - start, mix


def mma_loops(sass: str) -> list[dict]:
    """Every innermost loop holding a tensor-core instruction (EXIT spans excluded, as main_loop_mix), in address
    order: its first instruction's index, instructions per pass, CTA barriers (BAR.SYNC), mbarrier waits, TMA
    copies and tensor-core instructions by shape. Why: a kernel with several K loops (moe_mma's HALF build, an
    ABSORB tile's loop beside the plain one) has no single main loop, and comparing two builds loop by loop is
    how a change in one of them shows (the ABSORB build's plain loop: 389 against 383 instructions)."""
    instrs, labels = _instructions(sass)
    loops = {lp for lp in _body_loops(instrs, labels)
             if any(_TENSOR_CORE.search(ins) for ins in instrs[lp[0]:lp[1] + 1])}
    inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    out = []
    for a, b in sorted(inner):
        body = [_unpredicated(ins) for ins in instrs[a:b + 1]]
        out.append({"first": a, "instructions": b + 1 - a,
                    "bar_sync": sum(ins.startswith("BAR.SYNC") for ins in body),
                    "mbarrier_waits": sum(ins.startswith("SYNCS.PHASECHK") for ins in body),
                    "tma_copies": sum(ins.startswith("UTMALDG") for ins in body),
                    "tensor_core": dict(collections.Counter(m.group(0) for ins in body
                                                            for m in _TENSOR_CORE.finditer(ins)))})
    return out


def _instructions(sass: str) -> tuple[list[str], dict[str, int]]:
    """SASS instruction texts in address order and each label's index."""
    labels, instrs = {}, []
    for line in sass.splitlines():
        lab = re.match(r"^\.(L_x_\d+):", line.strip())
        if lab:
            labels[lab.group(1)] = len(instrs)
        ins = re.match(r"^\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if ins:
            instrs.append(ins.group(1))
    return instrs, labels


def _loops(instrs: list[str], labels: dict[str, int]) -> list[tuple[int, int]]:
    """(first, last) instruction index of every loop: a branch back to an earlier label."""
    out = []
    for i, ins in enumerate(instrs):
        br = re.search(r"BRA\s+(?:\S+\s+)?`?\(?\.(L_x_\d+)", ins)
        if br and br.group(1) in labels and labels[br.group(1)] <= i:
            out.append((labels[br.group(1)], i))
    return out


def _body_loops(instrs: list[str], labels: dict[str, int]) -> list[tuple[int, int]]:
    """_loops without the spans holding an EXIT (an mbarrier retry placed after the epilogue that branches back
    into the K loop: not a loop of the body)."""
    return [lp for lp in _loops(instrs, labels)
            if not any(re.search(r"\bEXIT\b", ins) for ins in instrs[lp[0]:lp[1] + 1])]


def _unpredicated(ins: str) -> str:
    """The instruction without its @P / @!UP guard."""
    return re.sub(r"^@!?U?P\w+\s+", "", ins)


_NO_DEST = ("ST", "STS", "STG", "STL", "RED", "ATOM", "HGMMA", "QGMMA", "BRA", "BAR", "WARPGROUP", "DEPBAR", "LDGSTS",
            "LDGDEPBAR", "EXIT", "RET", "ISETP", "FSETP", "HSETP2", "PLOP3", "R2UR", "WARPSYNC", "NOP", "MEMBAR",
            "FENCE", "SYNCS", "CCTL", "ERRBAR", "BSSY", "BSYNC", "CALL", "UTMALDG", "UTMASTG")


def _written(ins: str) -> set[int]:
    """General registers an instruction writes (its first operand; .64 / .128 forms write 2 / 4)."""
    parts = _unpredicated(ins).split(None, 1)
    if len(parts) < 2 or parts[0].split(".")[0] in _NO_DEST:
        return set()
    m = re.fullmatch(r"R(\d+)(\.\w+)?", parts[1].split(",")[0].strip())
    if not m:
        return set()
    width = 4 if ".128" in parts[0] else 2 if ".64" in parts[0] else 1
    return set(range(int(m.group(1)), int(m.group(1)) + width))


def wgmma_hazards(sass: str) -> list[str]:
    """Instructions that overwrite a register an in-flight wgmma may still read as its A operand.

    For each group of HGMMAs with A in registers (WARPGROUP.ARRIVE .. the HGMMA carrying gsb0), walk forward
    in address order, around the loop holding the group, until a WARPGROUP.DEPBAR.LE gsb0, n retires it
    (n <= groups issued since), and report every write to its A registers on the way. Branches inside the
    loop are not followed (both sides are walked in address order), which is conservative for writes."""
    instrs, labels = _instructions(sass)
    loops = _loops(instrs, labels)
    found = []
    for idx, ins in enumerate(instrs):
        if not re.search(r"\b[HQ]GMMA", ins) or "gsb0" not in ins:
            continue
        a_regs, j = set(), idx
        while j >= 0 and "WARPGROUP.ARRIVE" not in instrs[j]:
            ops = instrs[j].split(None, 1)
            if re.match(r"[HQ]GMMA", ops[0]):
                m = re.fullmatch(r"R(\d+)", ops[1].split(",")[1].strip())
                if m:
                    a_regs |= set(range(int(m.group(1)), int(m.group(1)) + 4))
            j -= 1
        if not a_regs:
            continue
        loop = min((lp for lp in loops if lp[0] <= idx <= lp[1]), key=lambda lp: lp[1] - lp[0], default=None)
        pending, k = 0, idx + 1
        for _ in range(len(instrs)):
            if loop and k > loop[1]:
                k = loop[0]
            if k >= len(instrs):
                break
            t = _unpredicated(instrs[k])
            if t.startswith("WARPGROUP.DEPBAR.LE") and int(t.split(",")[-1], 16) <= pending:
                break
            if re.match(r"[HQ]GMMA", t) and "gsb0" in t:
                pending += 1
            bad = _written(instrs[k]) & a_regs
            if bad:
                found.append(f"{instrs[k]} overwrites R{min(bad)} of the wgmma group at {instrs[idx]}")
            k += 1
    return found


def static_report(variant: str, config: dict, m: int, n: int, k: int, arch: int | None = None,
                  model: str = "gpt-oss-120b") -> list[dict]:
    """Per compiled kernel of one call: resources and main-loop instruction mix (per thread). A linear variant
    is compiled for [m, k] x [n, k]; a MoE variant for m tokens of `model`'s layer (n and k unused)."""
    from kernels import VARIANTS

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(sorted(VARIANTS))}")
    if VARIANTS[variant].kind == "moe":
        from .gptoss_config import get_model

        c = get_model(model)
        kernels = compile_moe(variant, config, m, c.experts, c.top_k, 2 * c.intermediate, c.hidden, arch=arch)
    else:
        kernels = compile_linear(variant, config, m, n, k, arch=arch)
    target = arch or _this_arch() or 90  # what compile_only built for
    rows = []
    for name, kern in kernels:
        if kern is None:
            continue
        sass = sass_of(kern)
        loop, mix = main_loop_mix(sass)
        res = resource_usage(kern)
        occ = programs_per_sm(res["regs"], res["shared"], kern.metadata.num_warps, target) if "regs" in res else None
        rows.append({"kernel": name.split(".")[-1], **res, "loop_instructions": loop,
                     "num_warps": kern.metadata.num_warps, "per_sm": occ, "mix": dict(mix.most_common(12)),
                     "tensor_core": tensor_core_ops(sass), "mma_loops": mma_loops(sass),
                     "wgmma_hazards": wgmma_hazards(sass)})
    return rows
