"""Named ranges around every layer and component: NVTX for Nsight, torch.profiler for the decode breakdown.

`rng("moe.mlp1")` is a shared no-op context unless ranges are enabled, so an instrumented model costs one
global lookup per range when nobody is looking. Enabled, a range is pushed in the lab's NVTX domain
("mxfp4lab", visible in Nsight Systems) and/or mirrored as a torch.profiler record_function, which is what
`labkit.model.profile` groups kernel times by.
"""

from __future__ import annotations

import contextlib

import torch

DOMAIN = "mxfp4lab"

#: Component ranges, in the order they run within a layer; "layer.N" ranges enclose them.
COMPONENTS = ("embedding", "attention", "router", "moe", "moe.mlp1", "moe.mlp2", "final_norm", "lm_head",
              "sampling")

_NULL = contextlib.nullcontext()
_ENABLED = False
_domain = None  # nvtx Domain while NVTX ranges are on
_torch = False  # mirror ranges as torch.profiler record_function
_sync = False  # synchronize the GPU at range boundaries (profiling pass: a range's kernels run inside its window)
_attrs: dict[str, object] = {}


class _Range:
    __slots__ = ("_rf", "name")

    def __init__(self, name: str):
        self.name = name
        self._rf = None

    def __enter__(self):
        if _sync:
            torch.cuda.synchronize()
        if _domain is not None:
            attrs = _attrs.get(self.name)
            if attrs is None:
                attrs = _attrs[self.name] = _domain.get_event_attributes(message=self.name)
            _domain.push_range(attrs)
        if _torch:
            self._rf = torch.profiler.record_function(self.name)
            self._rf.__enter__()
        return self

    def __exit__(self, *exc):
        if _sync:
            torch.cuda.synchronize()
        if self._rf is not None:
            self._rf.__exit__(*exc)
            self._rf = None
        if _domain is not None:
            _domain.pop_range()
        return False


def rng(name: str):
    """Context manager for a named range; a shared no-op unless ranges are enabled."""
    if not _ENABLED:
        return _NULL
    return _Range(name)


def enable(*, nvtx: bool = True, profiler: bool = True, sync: bool = False) -> None:
    """Turn ranges on: NVTX pushes in the "mxfp4lab" domain and/or torch.profiler record_functions.

    sync=True synchronizes the GPU at every range boundary: only for profiling passes that attribute kernels
    to ranges by time window (torch.profiler cannot link Triton's driver-API launches to their range).
    """
    global _ENABLED, _domain, _torch, _sync
    if nvtx:
        import nvtx as _nvtx

        _domain = _nvtx.get_domain(DOMAIN)
    else:
        _domain = None
    _torch = profiler
    _sync = bool(sync) and torch.cuda.is_available()
    _ENABLED = _domain is not None or _torch


def enabled() -> bool:
    return _ENABLED


@contextlib.contextmanager
def ranges(*, nvtx: bool = True, profiler: bool = True, sync: bool = False):
    """Enable ranges inside a with-block, restoring the previous state after."""
    prev = (_ENABLED, _domain, _torch, _sync)
    enable(nvtx=nvtx, profiler=profiler, sync=sync)
    try:
        yield
    finally:
        _restore(prev)


def _restore(state) -> None:
    global _ENABLED, _domain, _torch, _sync
    _ENABLED, _domain, _torch, _sync = state
