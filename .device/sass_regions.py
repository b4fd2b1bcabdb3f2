"""Split an Nsight Compute source page (CSV, SASS; .device/sass_stalls.sh's output, plain or gzipped) into runs of
consecutive instructions executed the same number of times (the prologue, the K loop, the epilogue, ...), and print
each run holding at least 1% of the warp-state samples with its opcodes and, for the largest, its stall reasons.
Call as: python3 .device/sass_regions.py FILE..."""
import collections
import csv
import gzip
import sys


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


for path in sys.argv[1:]:
    rows = list(csv.reader((gzip.open if path.endswith(".gz") else open)(path, "rt", errors="replace")))
    head = next(i for i, r in enumerate(rows) if "Source" in r)
    hdr = rows[head]
    src, samp = hdr.index("Source"), hdr.index("Warp Stall Sampling (All Samples)")
    ex = hdr.index("Instructions Executed")
    stall = [i for i, c in enumerate(hdr) if c.startswith("stall_") and "Not Issued" not in c]
    body = [r for r in rows[head + 1:] if len(r) == len(hdr)]
    total = sum(num(r[samp]) for r in body) or 1.0
    runs = []
    for i, r in enumerate(body):
        if runs and runs[-1][0] == num(r[ex]):
            runs[-1][2] = i
        else:
            runs.append([num(r[ex]), i, i])
    print(f"== {path}: {len(body)} instructions, {total:.0f} samples")
    for e, a, b in runs:
        part = body[a:b + 1]
        share = sum(num(r[samp]) for r in part) / total
        if share < 0.01:
            continue
        ops = collections.Counter(w[0].split(".")[0] for w in ([x for x in r[src].split() if not x.startswith("@")]
                                                                 for r in part) if w)
        why = collections.Counter()
        for r in part:
            for i in stall:
                why[hdr[i]] += num(r[i])
        print(f"  instructions {a}-{b} ({b - a + 1}), executed {e:.0f} times (warp-level): {share:.1%} of samples")
        print("    opcodes: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(10)))
        top = why.most_common(6)
        print("    stalls (share of all samples): " + ", ".join(f"{k[6:]} {v / total:.1%}" for k, v in top))
