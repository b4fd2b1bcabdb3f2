"""Why does the first decode graph captured after the prefill run 2-3% faster than later captures of the same
model (results/20261128T222848-h200-decode-flags-120b-attn-b)? This captures the same step again and again
from the same cache position and first token: `--plain` times in a row, then `--emptied` more each after
torch.cuda.empty_cache() (the caching allocator's free blocks returned, so the new graph's buffers land afresh),
then `--rested` more each after `--rest` seconds idle, recording the allocator's reserved bytes, where a small
probe tensor allocated just before the capture lands, and the SM clock and power while the steps ran
(labkit.clocks).

call as: python3 .device/capture_modes.py OUT_DIR [--model gpt-oss-120b] [--plain 4] [--emptied 4] [--rested 0]
(writes capture_modes.csv and meta.json)
"""

import argparse
import sys
import time

import pandas as pd
import torch
from probe_decode import prefilled, timed_capture

from labkit.clocks import ClockSampler
from labkit.runs import probe_run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--model", default="gpt-oss-120b")
    p.add_argument("--plain", type=int, default=4)
    p.add_argument("--emptied", type=int, default=4)
    p.add_argument("--rested", type=int, default=0, help="then this many captures, each after --rest s idle")
    p.add_argument("--rest", type=float, default=3.0)
    args = p.parse_args()
    run = probe_run("capture-modes")
    m, cache, first = prefilled(args.model)
    device = m.device
    rows, ref = [], None
    modes = ["plain"] * args.plain + ["emptied"] * args.emptied + ["rested"] * args.rested
    for i, mode in enumerate(modes):
        if mode == "emptied":
            torch.cuda.empty_cache()
        if mode == "rested":
            time.sleep(args.rest)
        probe = torch.empty(1, device=device)  # where the allocator puts the next small block
        with ClockSampler() as clk:
            step, gen = timed_capture(m, cache, first, 512, 64)
        ref = gen if ref is None else ref
        rows.append({"capture": i, "mode": mode, **step, "same_ids": gen == ref,
                     "probe_addr_mod_2m": probe.data_ptr() % (1 << 21),
                     "reserved_mb": torch.cuda.memory_reserved(device) / 2**20, **clk.result})
        print(rows[-1], flush=True)
        del probe
    d = pd.DataFrame(rows)
    if run:
        run.update_meta(parameters=vars(args))
        run.finish_with("capture_modes.csv: per capture of the same decode step (in order; 'emptied' after "
                        "torch.cuda.empty_cache()), the graph step's median, p10, p90 (us), whether its ids equal "
                        "the first capture's, a small probe tensor's address mod 2 MiB, the allocator's "
                        "reserved MiB and labkit.clocks' columns while the steps ran", capture_modes=d)


if __name__ == "__main__":
    sys.exit(main())
