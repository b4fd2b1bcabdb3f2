"""Device check: variant="auto" on a tiled (and a tiled + shuffled) lm_head weight at 8-64 tokens picks the TMA
configs of the refitted tables; each pick's output equals the same config without TMA bit for bit and the
reference within the lab's tolerance."""
import torch

import kernels as K
from kernels.linear import linear_problem
from kernels.tables import pick_linear

torch.manual_seed(0)
n, k = 201088, 2880
w = K.quantize_mxfp4(torch.randn(n, k, device="cuda") * 0.05, layout="openai")
p = K.prepare_mxfp4(w)
for name, q in (("tiled", K.tile_mxfp4(p)), ("tiled+nib", K.shuffle_nibbles(K.tile_mxfp4(p)))):
    for m in (8, 16, 32, 64):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        variant, cfg = pick_linear(linear_problem(m, q))
        y = K.mxfp4_linear(x, q, variant="auto")
        same = torch.equal(y, K.mxfp4_linear(x, q, variant=variant, **{**cfg, "TMA": False}))
        ref = x.float() @ K.mxfp4_to_dense(w).float().T
        err = float((y.float() - ref).norm() / ref.norm())
        print(f"{name:9s} m={m:2d} {variant} TMA={cfg.get('TMA')} same_as_cp_async={same} rel_err={err:.2e}")
