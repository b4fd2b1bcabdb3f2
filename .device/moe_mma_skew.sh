#!/usr/bin/env bash
# Device run: the moe_mma_skew sweep, then Nsight Compute on moe_mma's two launches at two token counts, into
# $OUT/runs.tgz. call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/moe_mma_skew.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
timeout ${SWEEP_S:-300} python3 -m labkit sweep moe_mma_skew --out $OUT/moe-mma-skew --quiet 2>&1 | tail -2
mkdir -p $OUT/ncu-moe-mma
S="--section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis"
i=0
for spec in "gpt-oss-120b 64 BLOCK_M=8,CHUNKS=4,ROWS=1,num_warps=4" "gpt-oss-20b 512 BLOCK_M=32,CHUNKS=1,ROWS=2,num_warps=4"; do
  set -- $spec
  i=$((i+1))
  f=$OUT/ncu-moe-mma/ncu_$1_t$2.csv
  timeout 120 ncu --clock-control none --csv $S -k regex:_moe_mma_kernel -c 2 python3 -m labkit once moe_mma --model $1 --m $2 --config $3 --repeat 1 > $f 2>&1
  python3 - $f <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
keep = ("Duration", "DRAM Throughput", "Memory Throughput", "Issued Warp", "No Eligible", "Achieved Active Warps",
        "Registers Per", "Theoretical Occupancy", "Warp Cycles Per Issued", "Compute (SM) Throughput", "L2 Cache Throughput")
for r in rows[1:]:
    if any(k in r[12] for k in keep):
        print(f"{r[4][:3]} {r[12][:40]:40s} {r[14]:>16s} {r[13]}")
PY
done
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
