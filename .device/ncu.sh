#!/usr/bin/env bash
# Device run: Nsight Compute sections of one kernel (first launch matching a regex) per `labkit once` call, as
# CSV into $OUT plus a short table. call as: bash .device/ncu.sh <kernel regex> "<labkit once args>" ...
# e.g. bash .device/ncu.sh _wg_kernel "gemv_mma --m 64 --config BLOCK_M=64,ROWS=1,WGMMA=True,STAGES=3,TILED=True"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
S="--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
M="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active"
regex=$1; shift
i=0
for call in "$@"; do
  i=$((i+1))
  echo "== $call"
  ncu --clock-control none --csv $S $M -k regex:$regex -c 1 python3 -m labkit once $call --repeat 1 > $OUT/ncu_$i.csv 2>&1
  python3 - $OUT/ncu_$i.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
keep = ("Duration", "Throughput", "Registers", "Achieved Occupancy", "Stall", "Issued", "Eligible", "Pipe",
        "Block Limit", "Shared Memory Configuration Size", "Executed Ipc", "Waves", "stalled", "pipe_tensor")
for r in rows[1:]:
    if any(k in r[12] for k in keep) and not (r[12].startswith("smsp__average_warps") and float(r[14] or 0) < 0.05):
        print(f"{r[12][:58]:58s} {r[14]:>14s} {r[13]}")
PY
done
