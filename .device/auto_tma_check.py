"""Device check: variant="auto" on the lm_head weight in each held layout (rows, tiled, each shuffled or not) at
1-64 tokens picks the refitted tables' configs; each pick's output equals the same config with TMA, EARLY and
MAXNREG off bit for bit (they move copies and registers, not arithmetic) and the reference within the lab's
tolerance."""
import torch

import kernels as K
from kernels.linear import linear_problem
from kernels.tables import pick_linear

torch.manual_seed(0)
n, k = 201088, 2880
w = K.quantize_mxfp4(torch.randn(n, k, device="cuda") * 0.05, layout="openai")
p = K.prepare_mxfp4(w)
ref_w = K.mxfp4_to_dense(w).float()
layouts = (("rows", p), ("rows+nib", K.shuffle_nibbles(p)), ("tiled", K.tile_mxfp4(p)),
           ("tiled+nib", K.shuffle_nibbles(K.tile_mxfp4(p))))
for name, q in layouts:
    for m in (1, 2, 4, 8, 16, 32, 64):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        variant, cfg = pick_linear(linear_problem(m, q))
        y = K.mxfp4_linear(x, q, variant="auto")
        plain = {**cfg, **{o: False for o in ("TMA", "EARLY") if o in cfg}}
        if "MAXNREG" in cfg:
            plain["MAXNREG"] = None
        same = torch.equal(y, K.mxfp4_linear(x, q, variant=variant, **plain))
        ref = x.float() @ ref_w.T
        err = float((y.float() - ref).norm() / ref.norm())
        opts = {o: cfg.get(o) for o in ("TMA", "EARLY", "MAXNREG") if cfg.get(o)}
        print(f"{name:9s} m={m:2d} {variant} {opts} same_as_plain={same} rel_err={err:.2e}")
