#!/usr/bin/env bash
# Device run: Nsight Compute launch statistics (waves per SM, occupancy limits), duration and DRAM bytes of a
# moe_mma layer's mlp1 and mlp2 (the second call's: the first compiles and prepares the weights), as CSV into
# $OUT plus a short table. Question: is mlp2 at 16-128 tokens losing a partial last wave?
# call as: bash .device/ncu_waves.sh "<labkit once args>" ...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
i=0
for call in "$@"; do
  i=$((i+1))
  echo "== $call"
  ncu --clock-control none --csv --section SpeedOfLight --section LaunchStats --section Occupancy \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum -k regex:_moe_ --launch-skip 2 -c 2 \
      python3 -m labkit once $call --repeat 1 > $OUT/ncu_$i.csv 2>&1
  python3 - $OUT/ncu_$i.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
keep = ("Duration", "DRAM Throughput", "Waves Per SM", "Block Limit", "Achieved Occupancy", "Theoretical Occupancy",
        "Grid Size", "Registers Per Thread", "dram__bytes_read.sum", "gpu__time_duration.sum")
for r in rows[1:]:
    if any(k in r[12] for k in keep):
        print(f"{r[4][:22]:22s} {r[12][:40]:40s} {r[14]:>14s} {r[13]}")
PY
done
