#!/usr/bin/env bash
# Device run: Nsight Compute sections of gemv_mma on the lm_head (one profiled launch per config) into $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
S="--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis"
i=0
for spec in "4 BLOCK_M=8,ROWS=1,CHUNKS=2,PREFETCH=True,num_warps=2" "16 BLOCK_M=16,ROWS=2,CHUNKS=2,num_warps=2"; do
  set -- $spec
  i=$((i+1))
  ncu --clock-control none --csv $S -k regex:_mma_kernel -c 1 python3 -m labkit once gemv_mma --m $1 --config $2 --repeat 2 > $OUT/ncu_mma_$i.csv 2>&1
  python3 - $OUT/ncu_mma_$i.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
for r in rows[1:]:
    print(f"{r[11][:22]:22s} {r[12][:60]:60s} {r[14]:>14s} {r[13]}")
PY
done
