#!/usr/bin/env bash
# Device run: per kernel of one MoE layer call (x_to_f16, mlp1, mlp2, combine) under Nsight Compute: time, DRAM
# throughput, instruction issue, active warps and the tensor pipes' active cycles, so a large-token layer's gap to
# its floor can be placed in mlp1 or mlp2 and in issue, memory or tensor-core time. One CSV per call into $OUT.
# call as: bash .device/ncu_moe_pipes.sh "<labkit once args>" ...   (after the pip line)
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_issued.avg.pct_of_peak_sustained_active"
M="$M,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,sm__cycles_active.avg"
M="$M,regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active"
i=0
for call in "$@"; do
  i=$((i+1))
  echo "== $call"
  # the lab's kernels only (their names start with _): the layer's setup launches a thousand torch kernels
  ncu --clock-control none --csv --metrics "$M" -k regex:^_ python3 -m labkit once $call --repeat 0 \
    > $OUT/ncu_pipes_$i.csv 2>&1
  python3 - $OUT/ncu_pipes_$i.csv <<'PY'
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
start = next(i for i, r in enumerate(rows) if r[0] == "ID")  # ncu's own lines come first
head, body = rows[start], rows[start + 1:]
col = {n: head.index(n) for n in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
per = collections.defaultdict(dict)
for r in body:
    per[(int(r[col["ID"]]), r[col["Kernel Name"]][:40])][r[col["Metric Name"]]] = r[col["Metric Value"]]
for (i, name), m in sorted(per.items()):
    short = {k.split("__")[1].split(".")[0] + ("/" + k.split("__")[2].split(".")[0] if k.count("__") > 1 else ""): v
             for k, v in m.items()}
    print(f"{i:3d} {name:40s} " + " ".join(f"{k}={v}" for k, v in sorted(short.items())))
PY
done
