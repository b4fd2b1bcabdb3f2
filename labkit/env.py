"""What machine and software a run is on: versions, GPU, driver, how Triton executes."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import socket
import subprocess
import sys

from . import REPO_ROOT

PACKAGES = ("torch", "triton", "numpy", "pandas", "pyarrow", "plotly", "papermill", "nvtx")


def version(pkg: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def triton_mode() -> str:
    """'interpreted' when kernels run through Triton's CPU interpreter, else 'compiled'."""
    import kernels._triton as kt

    return "interpreted" if kt.INTERPRETED else "compiled"


def gpu_info() -> dict:
    """GPU name, SM count, L2 bytes, memory, CUDA and driver versions; {'gpu': None} without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": None, "sm_count": None, "l2_bytes": None, "memory_bytes": None,
                "cuda": torch.version.cuda, "driver": None, "capability": None}
    p = torch.cuda.get_device_properties(0)
    return {
        "gpu": p.name,
        "sm_count": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "memory_bytes": p.total_memory,
        "cuda": torch.version.cuda,
        "driver": _driver_version(),
        "capability": f"{p.major}.{p.minor}",
    }


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit() -> str | None:
    """Commit of the checkout the lab runs from (with '+dirty' when it has local changes).

    A copy without git history (e.g. a working tree shipped to a GPU machine) can name it in LAB_GIT_COMMIT.
    """
    if os.environ.get("LAB_GIT_COMMIT"):
        return os.environ["LAB_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        sha = out.stdout.strip()
        if out.returncode != 0 or len(sha) != 40:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def pdl_mode() -> str:
    """Which launches use programmatic dependent launch here: "all" (LAB_PDL=1), "inner" (unset: an op's own
    later kernels, kernels._triton.pdl_launch), "off" (LAB_PDL=0 or no Hopper GPU). Runs before 7e5af77 had
    no inner mode: unset meant off."""
    from kernels import _triton

    return "all" if _triton.PDL else "inner" if _triton.INNER_PDL else "off"


def environment() -> dict:
    """Everything `labkit info` prints and every run's meta.json records about the machine."""
    info = gpu_info()
    info.update({
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "triton_mode": triton_mode(),
        "triton_interpret_env": os.environ.get("TRITON_INTERPRET"),
        "lab_pdl": os.environ.get("LAB_PDL"),  # "1": kernel launches use programmatic dependent launch
        "lab_x16_split_rows": os.environ.get("LAB_X16_SPLIT_ROWS"),  # kernels.linear_f16.SPLIT_ROWS when set
        "pdl": pdl_mode(),
        "executable": sys.executable,
    })
    for pkg in PACKAGES:
        info[pkg] = version(pkg)
    return info
