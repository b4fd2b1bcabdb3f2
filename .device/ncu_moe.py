"""Nsight Compute helper: run moe_h2g at T tokens (gpt-oss-120b shapes, uniform routing) with the configs
given as arguments (NAME=VALUE,... each), 3 calls each on different experts, so ncu can time every kernel.
    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum python3 .device/ncu_moe.py T cfg1 [cfg2 ...]"""
import sys

import torch

import kernels as K
from labkit import routing as rgen
from labkit.bench_moe import _layer, _relabel

T = int(sys.argv[1])
E, k, H, I = 128, 4, 2880, 2880
w1, b1, w2, b2 = _layer(E, H, I, seed=1, dev="cuda")
x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
sample = rgen.generate("uniform", T, E, k, seed=T)
for spec in sys.argv[2:]:
    cfg = {kv.split("=")[0]: eval(kv.split("=")[1]) for kv in spec.split(",")}
    for c in range(3):
        ids = _relabel(sample.ids.cuda(), E, seed=c + 1)
        r = K.Routing.from_ids(ids, sample.weights.cuda(), E, validate=False)
        K.moe_mxfp4(x, r, w1, b1, w2, b2, variant="moe_h2g", **cfg)
    torch.cuda.synchronize()
    print("ran", spec, flush=True)
