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
import statistics
import sys

import pandas as pd
import torch

from labkit.model.backends import resolve_backends
from labkit.model.config import get_config
from labkit.model.graph import DecodeRunner
from labkit.model.profile import _percentile, _time_decode, load_model
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
    device = torch.device(args.device)
    backends = resolve_backends("auto", "mxfp4", "floor", device, "auto", args.layout)
    m = load_model(get_config(args.model), "synthetic", backends, device=device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, m.config.vocab, (args.batch, args.prompt), generator=g).to(device)
    cache = m.new_cache(args.batch, args.prompt + args.decode + 8)
    first = m.prefill(ids, cache).argmax(-1)
    rows, ref_ids = [], None
    settings = list(itertools.product(*choices))
    cache.reset(args.prompt)  # untimed: the first capture after the prefill ran 2-3% faster than later ones of the
    _time_decode(DecodeRunner(m, cache), first, args.decode, device)  # same setting (results/20261128T222848-...)
    for rnd in range(args.rounds):
        for values in settings:
            for (mod, attr), v in zip(flags, values, strict=True):
                setattr(mod, attr, v)
            cache.reset(args.prompt)
            runner = DecodeRunner(m, cache)
            times, gen = _time_decode(runner, first, args.decode, device)
            del runner
            ref_ids = gen if ref_ids is None else ref_ids
            row = {"round": rnd, **{attr: v for (_, attr), v in zip(flags, values, strict=True)},
                   "step_us": statistics.median(times), "step_p10": _percentile(times, 0.1),
                   "step_p90": _percentile(times, 0.9), "same_ids": gen == ref_ids}
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
