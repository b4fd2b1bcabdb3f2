#!/usr/bin/env bash
# Device run: per-kernel durations, DRAM bytes and occupancy (Nsight Compute) of whole `labkit once` calls,
# every Triton kernel of the call (names starting with _), one CSV per call into $OUT plus a short table.
# call as: bash .device/probe_kernels.sh "<labkit once args>" ...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size,launch__occupancy_limit_registers,sm__maximum_warps_per_active_cycle_pct
i=0
for call in "$@"; do
  i=$((i+1))
  echo "== $call"
  ncu --clock-control none --csv --metrics $M -k regex:^_ -c ${NCU_COUNT:-8} python3 -m labkit once $call --repeat 1 > $OUT/kern_$i.csv 2>&1
  python3 - $OUT/kern_$i.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
hdr, body = rows[0], rows[1:]
ix = {h: k for k, h in enumerate(hdr)}
by = collections.OrderedDict()
for r in body:
    by.setdefault((r[ix["ID"]], r[ix["Kernel Name"]][:40]), {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
for (kid, name), m in by.items():
    print(f"{kid:>3} {name:40s} " + " ".join(f"{k.split('__')[1][:22]}={v}" for k, v in m.items()))
PY
done
