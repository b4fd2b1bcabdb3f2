"""Device probe: does moe_mma FUSE2 finish, and with which bits? One case per subprocess (a hang costs its
timeout only): eager calls on the tests' small layer (odd_layer), printing each step's wall time and whether
FUSE2 matches the same config without it. A case is (environment, config over BASE)."""
import faulthandler
import json
import os
import subprocess
import sys
import time

BASE = dict(BLOCK_M=8, ROWS=2, ROWS2=1, CHUNKS=1, num_warps=4, WGMMA=True, STAGES=4, TILED=True, RING_W=True,
            NIB=True, CHAIN=True, EPI_EARLY=2, STEP_MAJOR=True, PERSIST1=4, MAXNREG=128)
CASES = [({}, {}), ({"LAB_PDL": "0"}, {}), ({}, {"MAXNREG": None}), ({}, {"WAIT_LATE": 2}),
         ({}, {"PERSIST1": 1}), ({}, {"EPI_EARLY": 0}), ({}, {"STEP_MAJOR": False}),
         ({"LAB_FUSE2_DEBUG": "need0"}, {}), ({"LAB_FUSE2_DEBUG": "only1"}, {}), ({"LAB_FUSE2_DEBUG": "only2"}, {})]


def one(i):
    import torch

    sys.path.insert(0, "tests")
    import kernels as K
    from test_moe import odd_layer

    t0 = time.time()
    cfg = {**BASE, **CASES[i][1]}
    dw, x, r, _ = odd_layer(29, 37, 6, torch.device("cuda"))
    y = K.moe_mxfp4(x, r, *dw, variant="moe_mma", **cfg)
    torch.cuda.synchronize()
    print(json.dumps(dict(case=i, step="reference", s=round(time.time() - t0, 2))), flush=True)
    faulthandler.dump_traceback_later(float(os.environ.get("PROBE_STACK", "25")))  # where a hang sits
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
    limit = float(os.environ.get("PROBE_TIMEOUT", "40"))
    for i in [int(c) for c in os.environ.get("PROBE_CASES", ",".join(map(str, range(len(CASES))))).split(",")]:
        print(f"case {i}: {CASES[i]}", flush=True)
        try:
            out = subprocess.run([sys.executable, __file__, str(i)], capture_output=True, text=True, timeout=limit,
                                 env={**os.environ, **CASES[i][0]})
            print(out.stdout.strip(), out.stderr.strip()[-600:], flush=True)
        except subprocess.TimeoutExpired as e:
            print(f"case {i}: timed out after {limit} s; so far: {(e.stdout or b'').decode()[-400:]}\n"
                  f"{(e.stderr or b'').decode()[-2500:]}", flush=True)
