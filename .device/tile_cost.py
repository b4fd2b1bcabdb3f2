"""What tile_mxfp4 (the TILED option's one-time layout change) costs on the GPU: milliseconds and bytes for the
lm_head weight and one gpt-oss MoE layer's w1 (de-interleaved) and w2, median of 5 fresh preparations.

call as: python3 .device/tile_cost.py [$OUT/tile-cost]   (writes tile_cost.csv and meta.json there)
"""
import sys
import time

import torch

import kernels as K
from kernels.prepare import tile_mxfp4
from labkit.runs import probe_run


def _weight(shape):
    blocks = torch.randint(0, 256, (*shape[:-1], shape[-1] // 32, 16), device="cuda", dtype=torch.uint8)
    scales = torch.randint(118, 125, (*shape[:-1], shape[-1] // 32), device="cuda", dtype=torch.uint8)
    return K.prepare_mxfp4(K.from_openai(blocks, scales))


def main():
    run = probe_run("tile-cost")
    lines = ["weight,shape,deinterleave,ms,mb_in,mb_out"]
    for name, shape, de in [("lm_head", (201088, 2880), False), ("gpt-oss-120b w1", (128, 5760, 2880), True),
                            ("gpt-oss-120b w2", (128, 2880, 2880), False), ("gpt-oss-20b w1", (32, 5760, 2880), True)]:
        ts = []
        for _ in range(5):
            p = _weight(shape)
            torch.cuda.synchronize()
            t = time.perf_counter()
            q = tile_mxfp4(p, deinterleave=de)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t) * 1e3)
        mb_in = (p.words.numel() * 4 + p.scales.numel()) / 1e6
        mb_out = (q.words.numel() * 4 + q.scales.numel()) / 1e6
        ts.sort()
        print(f"{name:18s} {str(shape):18s} {ts[2]:8.2f} ms  {mb_in:8.1f} MB -> {mb_out:8.1f} MB", flush=True)
        lines.append(f"{name},{'x'.join(map(str, shape))},{de},{ts[2]:.3f},{mb_in:.1f},{mb_out:.1f}")
        del p, q
    if run:
        (run.path / "tile_cost.csv").write_text("\n".join(lines) + "\n")
        run.update_meta(contents="tile_cost.csv: tile_mxfp4 time (median of 5) and bytes before/after, per weight")
        run.finish()


if __name__ == "__main__":
    sys.exit(main())
