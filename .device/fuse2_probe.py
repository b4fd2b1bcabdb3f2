"""Device probe: does moe_mma FUSE2 finish, and with the two-launch layer's bits? One config per subprocess
(a hang costs its timeout only): eager calls on the tests' small layer (odd_layer), printing each call's wall
time and whether it matches the same config without FUSE2."""
import json
import subprocess
import sys
import time

BASE = dict(BLOCK_M=8, ROWS=2, ROWS2=1, CHUNKS=1, num_warps=4, WGMMA=True, STAGES=4, TILED=True, RING_W=True,
            NIB=True, CHAIN=True, EPI_EARLY=2, STEP_MAJOR=True, PERSIST1=4, MAXNREG=128)
CASES = [dict(), dict(WAIT_LATE=2), dict(ROWS2=None), dict(ATOMIC=True, SPLITK2=2, WAIT_LATE=2), dict(EPI_EARLY=0)]


def one(i):
    import torch

    sys.path.insert(0, "tests")
    import kernels as K
    from test_moe import odd_layer

    cfg = {**BASE, **CASES[i]}
    dw, x, r, _ = odd_layer(29, 37, 6, torch.device("cuda"))
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)
    torch.cuda.synchronize()
    for rep in range(3):
        t = time.time()
        got = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg, FUSE2=True)
        torch.cuda.synchronize()
        d = (got.float() - y.float()).abs().max().item()
        print(json.dumps(dict(case=i, rep=rep, s=round(time.time() - t, 4), max_abs=d,
                              equal=bool(torch.equal(got, y)))), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        one(int(sys.argv[1]))
        sys.exit()
    for i in range(len(CASES)):
        try:
            out = subprocess.run([sys.executable, __file__, str(i)], capture_output=True, text=True, timeout=60)
            print(out.stdout.strip() or out.stderr.strip()[-800:], flush=True)
        except subprocess.TimeoutExpired:
            print(f"case {i}: timed out after 60 s", flush=True)
