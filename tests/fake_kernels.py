"""Stand-ins for kernels.route / moe_mxfp4 / mxfp4_linear with the DESIGN.md contract, in reference math.

They let CPU tests drive the model's triton backends through the exact calls the real kernels will get.
"""

import torch

import kernels
from kernels import dequantize_mxfp4, reference_moe, topk_softmax


class Routing:
    def __init__(self, ids, weights):
        self.ids, self.weights = ids, weights


def install(monkeypatch, calls: list | None = None) -> list:
    """Patch the three kernel names into `kernels`; returns the list the fakes record their calls in."""
    calls = [] if calls is None else calls

    def route(logits, k):
        calls.append(("route", tuple(logits.shape), k))
        return Routing(*topk_softmax(logits, k))

    def moe_mxfp4(x, routing, w1, b1, w2, b2, *, alpha=1.702, limit=7.0, variant="auto", x16=None, combine=True):
        assert isinstance(routing, Routing) and x.dtype == torch.bfloat16
        calls.append(("moe_mxfp4", tuple(x.shape), w1.shape, w2.shape, alpha, limit))
        return reference_moe(x, (routing.ids, routing.weights), w1, b1, w2, b2, alpha=alpha, limit=limit).bfloat16()

    def mxfp4_linear(x, w, bias=None, *, variant="auto", **config):
        assert x.dtype == torch.bfloat16 and x.dim() == 2
        calls.append(("mxfp4_linear", tuple(x.shape), w.shape))
        return (x.float() @ dequantize_mxfp4(w).T).bfloat16()

    for name, fn in (("route", route), ("moe_mxfp4", moe_mxfp4), ("mxfp4_linear", mxfp4_linear)):
        monkeypatch.setattr(kernels, name, fn, raising=False)
    return calls
