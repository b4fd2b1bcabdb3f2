"""Summarize Nsight Compute's per-instruction source page (CSV, SASS): total warp-state samples by opcode and
the instructions holding the most samples, with their stall columns."""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head = next((i for i, r in enumerate(rows) if any("Source" == c for c in r)), None)
if head is None:
    print("no header found; first lines:")
    for r in rows[:8]:
        print(",".join(r)[:300])
    sys.exit()
hdr = rows[head]
src = hdr.index("Source")
samp = next((i for i, c in enumerate(hdr) if c.startswith("Warp Stall Sampling (All")), None)
if samp is None:
    samp = next(i for i, c in enumerate(hdr) if "Sampl" in c)
body = [r for r in rows[head + 1:] if len(r) == len(hdr)]


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


total = sum(num(r[samp]) for r in body) or 1.0
ops = collections.Counter()
for r in body:
    words = [w for w in r[src].split() if not w.startswith("@")]  # drop the predicate (@P0, @!PT)
    ops[words[0].split(".")[0] if words else "?"] += num(r[samp])
print(f"{len(body)} instructions, {total:.0f} samples; by opcode:")
print("  " + ", ".join(f"{k} {v / total:.1%}" for k, v in ops.most_common(16)))
stall_cols = [i for i, c in enumerate(hdr) if c.startswith("stall_") and "Not Issued" not in c]
for r in sorted(body, key=lambda r: -num(r[samp]))[:40]:
    extra = sorted(((num(r[i]), hdr[i]) for i in stall_cols), reverse=True)[:3]
    print(f"{num(r[samp]) / total:6.1%}  {r[src][:70]:70s} " + " ".join(f"{n}={v:.0f}" for v, n in extra if v))
