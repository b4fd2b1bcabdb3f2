"""Shared test setup: kernels run through the Triton interpreter unless a CUDA GPU is present."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (runs on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """Where kernels run in this test session: the GPU if present, else the CPU (interpreter)."""
    return torch.device("cuda" if HAS_GPU else "cpu")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (./lab test): one worker per core on the CPU; a single worker with a GPU (one device, and
    GPU tests that time or race kernels want it to themselves)."""
    return 1 if HAS_GPU else None
