"""Reference ops against values computed by hand from the GPT-OSS expert math."""

import math

import pytest
import torch

import kernels as K


def sigmoid(v):
    return 1 / (1 + math.exp(-v))


def test_reference_moe_by_hand():
    # one expert, H = 2, I = 2; rows of W1 are gate0, linear0, gate1, linear1 (interleaved)
    x = torch.tensor([[1.0, 0.0]])
    w1 = torch.tensor([[[2.0, 0], [3.0, 0], [10.0, 0], [-9.0, 0]]])
    b1 = torch.zeros(1, 4)
    w2 = torch.eye(2).reshape(1, 2, 2)
    b2 = torch.tensor([[0.5, 0.0]])
    a0 = 2 * sigmoid(1.702 * 2) * (3 + 1)
    a1 = 7 * sigmoid(1.702 * 7) * (-7 + 1)  # gate clamps at 7 from above, linear at -7
    routing = (torch.tensor([[0]]), torch.tensor([[1.0]]))
    y = K.reference_moe(x, routing, w1, b1, w2, b2)
    assert y[0].tolist() == pytest.approx([a0 + 0.5, a1], rel=1e-6)
    # the limit is a parameter: with limit 20 nothing clamps
    y = K.reference_moe(x, routing, w1, b1, w2, b2, limit=20.0)
    assert y[0, 1].item() == pytest.approx(10 * sigmoid(17.02) * (-9 + 1), rel=1e-6)


def test_router_topk_then_softmax():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    ids, w = K.topk_softmax(logits, 2)
    assert ids.tolist() == [[1, 2]]
    assert w[0].tolist() == pytest.approx([math.e / (math.e + 1), 1 / (math.e + 1)])


def _layer(E=4, H=64, I=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = K.quantize_mxfp4(torch.randn(E, 2 * I, H, generator=g) * 0.1)
    w2 = K.quantize_mxfp4(torch.randn(E, H, I, generator=g) * 0.1)
    b1 = torch.randn(E, 2 * I, generator=g)
    b2 = torch.randn(E, H, generator=g)
    return w1, b1, w2, b2


def test_reference_moe_equals_sum_of_single_expert_linears():
    w1, b1, w2, b2 = _layer()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 64, generator=g)
    logits = torch.randn(5, 4, generator=g)
    y = K.reference_moe(x, logits, w1, b1, w2, b2, k=2)
    ids, wts = K.topk_softmax(logits, 2)
    expect = torch.zeros(5, 64)
    for t in range(5):
        for j in range(2):
            e = int(ids[t, j])
            h = K.reference_linear(x[t : t + 1], w1[e], b1[e])
            a = K.swiglu_gptoss(h)
            expect[t] += wts[t, j] * K.reference_linear(a, w2[e], b2[e])[0]
    assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5)


def test_duplicate_expert_ids_add_up():
    w1, b1, w2, b2 = _layer()
    x = torch.randn(1, 64)
    single = K.reference_moe(x, (torch.tensor([[2]]), torch.tensor([[1.0]])), w1, b1, w2, b2)
    dup = K.reference_moe(x, (torch.tensor([[2, 2]]), torch.tensor([[0.25, 0.5]])), w1, b1, w2, b2)
    assert torch.allclose(dup, 0.75 * single, rtol=1e-6, atol=1e-6)


def test_reference_linear_with_bias_and_layouts():
    g = torch.Generator().manual_seed(2)
    w = K.quantize_mxfp4(torch.randn(7, 96, generator=g))
    x = torch.randn(3, 96, generator=g)
    b = torch.randn(7, generator=g)
    dense = K.dequantize_mxfp4(w)
    assert torch.allclose(K.reference_linear(x, w, b), x @ dense.T + b, atol=1e-5)
    assert torch.equal(K.reference_linear(x, K.repack_mxfp4(w, "ggml"), b), K.reference_linear(x, w, b))


def test_reference_errors():
    w1, b1, w2, b2 = _layer()
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match=r"ids: expert id out of range 0\.\.3"):
        K.reference_moe(x, (torch.tensor([[0, 4], [1, 2]]), torch.ones(2, 2)), w1, b1, w2, b2)
    with pytest.raises(ValueError, match=r"k is required"):
        K.reference_moe(x, torch.randn(2, 4), w1, b1, w2, b2)
    with pytest.raises(ValueError, match=r"k must be between 1 and the number of experts 4"):
        K.reference_moe(x, torch.randn(2, 4), w1, b1, w2, b2, k=5)
    with pytest.raises(ValueError, match=r"x has H=32 but w1 has H=64"):
        K.reference_moe(torch.randn(2, 32), torch.randn(2, 4), w1, b1, w2, b2, k=2)
    with pytest.raises(ValueError, match=r"b1 must have shape \(4, 64\)"):
        K.reference_moe(x, torch.randn(2, 4), w1, b1[:, :10], w2, b2, k=2)
    with pytest.raises(ValueError, match=r"x has K=32 but w has K=96"):
        K.reference_linear(torch.randn(1, 32), K.quantize_mxfp4(torch.randn(4, 96)))
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        K.reference_linear(torch.randn(1, 96), K.quantize_mxfp4(torch.randn(4, 96)), torch.zeros(5))


@pytest.mark.parametrize("call, message", [
    (lambda x, w1, b1, w2, b2: K.reference_moe(x[0], (torch.zeros(2, 1), torch.ones(2, 1)), w1, b1, w2, b2),
     r"x must be 2-D \[T, H\], got shape \(64,\)"),
    (lambda x, w1, b1, w2, b2: K.reference_moe(x, torch.randn(2, 4), w1[0], b1, w2, b2, k=2),
     r"w1 must be \[E, 2I, H\] and w2 \[E, H, I\]"),
    (lambda x, w1, b1, w2, b2: K.reference_moe(x, torch.randn(2, 4), w1[:, :63], b1, w2, b2, k=2),
     r"the 2I dimension must be even"),
    (lambda x, w1, b1, w2, b2: K.reference_moe(x, torch.randn(2, 4), w1, b1, torch.randn(4, 64, 16), b2, k=2),
     r"w2 must have shape \(4, 64, 32\)"),
    (lambda x, w1, b1, w2, b2: K.reference_moe(x, torch.randn(2, 4), w1, b1, w2, b2[:, :8], k=2),
     r"b2 must have shape \(4, 64\)"),
    (lambda x, w1, b1, w2, b2: K.reference_moe(x, torch.randn(3, 4), w1, b1, w2, b2, k=2),
     r"routing logits must have shape \(2, 4\), got \(3, 4\)"),
    (lambda x, w1, b1, w2, b2: K.reference_moe(x, [torch.zeros(2, 1)], w1, b1, w2, b2),
     r"routing must be router logits"),
    (lambda x, w1, b1, w2, b2: K.reference_moe(x, (torch.zeros(2, 2, dtype=torch.int32), torch.ones(2, 3)),
                                               w1, b1, w2, b2),
     r"ids and weights must both have shape \(2, k\), got \(2, 2\) and \(2, 3\)"),
    (lambda x, w1, b1, w2, b2: K.topk_softmax(torch.randn(4), 1), r"logits must be 2-D \[T, E\]"),
    (lambda x, w1, b1, w2, b2: K.reference_linear(x[0], torch.randn(4, 64)), r"x must be 2-D \[M, K\]"),
    (lambda x, w1, b1, w2, b2: K.reference_linear(x, torch.randn(4, 64, 1)), r"w must be 2-D \[N, K\]"),
])
def test_reference_shape_errors_name_what_is_wrong(call, message):
    """The references check their inputs as the kernels do (DESIGN.md's contract): each bad shape or routing
    form fails with a message naming the argument and the shape it needs, not deep inside the math."""
    w1, b1, w2, b2 = _layer()
    with pytest.raises((ValueError, TypeError), match=message):
        call(torch.randn(2, 64), w1, b1, w2, b2)
