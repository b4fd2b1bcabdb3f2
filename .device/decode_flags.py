"""In-process A/B of module flags on the graph decode step: one model, loaded and prefilled once; for every
setting of the flags (all combinations), in alternating rounds, the decode graph is captured afresh and
`--decode` steps are timed from the same cache position and first token (labkit.model.profile's timing). The
flags named here are meant to change launches, not bits, so every setting's generated ids must equal the
first setting's: a mismatch is printed and stored (`same_ids`).

call as: python3 .device/decode_flags.py OUT_DIR [--model gpt-oss-120b] [--layout rows+nib] [--batch 1]
         [--prompt 512] [--decode 64] [--rounds 3] --flags module:ATTR[=v1,v2,...] ...
(writes decode_flags.csv, row by row, and meta.json; the step is the median of the timed steps)
"""

import argparse
import ast
import importlib
import itertools
import sys

import pandas as pd
from probe_decode import prefilled, timed_capture

from labkit.runs import probe_run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--model", default="gpt-oss-120b")
    p.add_argument("--layout", default="rows+nib")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script (tiny model, eager)")
    p.add_argument("--flags", nargs="+", required=True, help="module:ATTR (False, True) or module:ATTR=v1,v2")
    args = p.parse_args()
    run = probe_run("decode-flags")
    if run:
        run.update_meta(parameters=vars(args))
    flags, choices = [], []
    for f in args.flags:  # module:ATTR (False, True) or module:ATTR=v1,v2,... (Python literals)
        name, _, vals = f.partition("=")
        flags.append((importlib.import_module(name.split(":")[0]), name.split(":")[1]))
        choices.append([ast.literal_eval(v) for v in vals.split(",")] if vals else [False, True])
    m, cache, first = prefilled(args.model, args.layout, args.batch, args.prompt, args.decode, args.device)
    rows, ref_ids = [], None
    settings = list(itertools.product(*choices))
    # untimed: the first capture after the prefill runs faster than later ones (results/20261128T224008-...)
    timed_capture(m, cache, first, args.prompt, args.decode)
    for rnd in range(args.rounds):
        for values in settings:
            for (mod, attr), v in zip(flags, values, strict=True):
                setattr(mod, attr, v)
            step, gen = timed_capture(m, cache, first, args.prompt, args.decode)
            ref_ids = gen if ref_ids is None else ref_ids
            row = {"round": rnd, **{attr: v for (_, attr), v in zip(flags, values, strict=True)}, **step,
                   "same_ids": gen == ref_ids}
            rows.append(row)
            print(row, flush=True)
            if run:
                pd.DataFrame(rows).to_csv(run.path / "decode_flags.csv", index=False)
    d = pd.DataFrame(rows)
    print(d.groupby([a for _, a in flags]).agg(step_us=("step_us", "median"), lo=("step_us", "min"),
                                               hi=("step_us", "max"), same_ids=("same_ids", "all")).round(1))
    if run:
        run.finish_with("decode_flags.csv: per round and flag setting, the graph decode step's median, p10 and p90 "
                        "(us) over the timed steps and whether its ids equal the first setting's",
                        decode_flags=d)


if __name__ == "__main__":
    sys.exit(main())
