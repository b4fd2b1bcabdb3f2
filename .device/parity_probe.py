"""Device probe: logit and per-component parity of the kernel backends against the torch reference on the tiny
model over three weight seeds (how far near-tie routing moves the top-1 token). python3 .device/parity_probe.py"""
import pandas as pd
import torch

from labkit.model import Backends, GptOss, get_config, synthetic_weights
from labkit.model.parity import model_parity

CFG = get_config("tiny")
toks = torch.randint(0, CFG.vocab, (2, 16), generator=torch.Generator().manual_seed(0))
pd.set_option("display.width", 200)
CASES = [("triton", "bf16", "triton"), ("triton", "mxfp4", "triton"), ("torch", "bf16", "triton"),
         ("triton", "bf16", "torch")]
for attn, lm, moe in CASES:
    for seed in (0, 1, 2):
        w = synthetic_weights(CFG, seed=seed, device="cuda")
        test = GptOss(CFG, w, Backends(moe=moe, lm_head=lm, attention=attn))
        ref = GptOss(CFG, w, test.backends.reference())
        r = model_parity(ref, test, toks)
        pc = r.per_component
        worst = pc.groupby("component")["rel_err"].max().round(4).to_dict()
        print(attn, lm, moe, seed, {k: round(v, 4) for k, v in r.logits.items()}, worst)
