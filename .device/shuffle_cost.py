"""Time kernels.shuffle_nibbles (the NIB copy made once at load time) on the GPU for the lm_head weight and a
gpt-oss-120b mlp1 weight (rows and tiled), after a warm-up call on a small weight; prints one line each."""
import time
from functools import partial

import torch

import kernels as K


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def weight(shape):
    blocks = torch.randint(0, 256, (*shape[:-1], shape[-1] // 32, 16), dtype=torch.uint8, device="cuda")
    scales = torch.randint(118, 124, (*shape[:-1], shape[-1] // 32), dtype=torch.uint8, device="cuda")
    return K.MXFP4Tensor(blocks, scales, "openai", shape)


K.shuffle_nibbles(weight((64, 2880)))
for name, shape in (("lm_head", (201088, 2880)), ("gpt-oss-120b w1", (128, 5760, 2880))):
    w = weight(shape)
    p = K.prepare_mxfp4(w)
    _, dt = timed(partial(K.shuffle_nibbles, p))
    tp = K.tile_mxfp4(p)
    _, dtt = timed(partial(K.shuffle_nibbles, tp))
    print(f"shuffle_nibbles {name} {tuple(shape)}: {p.words.numel() * 4 / 1e6:.0f} MB of words, rows {dt * 1e3:.1f} ms,"
          f" tiled {dtt * 1e3:.1f} ms")
