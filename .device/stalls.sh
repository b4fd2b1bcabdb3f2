#!/usr/bin/env bash
# Device run: Nsight Compute warp-state (stall reasons), scheduler and memory sections of the Triton kernels of
# `labkit once` calls: where each kernel's warps wait. One text report per call in $OUT, key lines printed.
# call as: bash .device/stalls.sh "<labkit once args>" ...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
i=0
for call in "$@"; do
  i=$((i+1))
  echo "== $call"
  ncu --clock-control none --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --section Occupancy --section SpeedOfLight -k regex:^_ -c ${NCU_COUNT:-4} python3 -m labkit once $call --repeat 1 \
      > $OUT/stalls_$i.txt 2>&1
  grep -E "^  _|Duration|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Achieved Occupancy|Stall|cycles being stalled|L1/TEX Hit|L2 Hit" $OUT/stalls_$i.txt | cut -c1-200 | head -${LINES_PER:-60}
done
