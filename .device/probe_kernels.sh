#!/usr/bin/env bash
# Device run: per-kernel durations, DRAM bytes and occupancy (Nsight Compute) of whole `labkit once` calls,
# every Triton kernel of the call (names starting with _), one CSV per call plus kernels.csv (each kernel's
# time, DRAM bytes and read rate) in a run folder $OUT/ncu-NAME, and a short table.
# call as: LAB_GIT_COMMIT=<sha> bash .device/probe_kernels.sh NAME "<labkit once args>" ...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
name=$1; shift
out=$OUT/ncu-$name
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size,launch__occupancy_limit_registers,sm__maximum_warps_per_active_cycle_pct
python3 -c "import sys; from labkit.runs import create_run; create_run('ncu-$name', out=sys.argv[1], command=sys.argv[2])" "$out" "ncu --clock-control none --metrics $M python3 -m labkit once <call> --repeat 1 for each of: $*"
i=0
for call in "$@"; do
  i=$((i+1))
  echo "== $call"
  ncu --clock-control none --csv --metrics $M -k regex:^_ -c ${NCU_COUNT:-8} python3 -m labkit once $call --repeat 1 > $out/kern_$i.csv 2>&1
  python3 - $out/kern_$i.csv $i "$call" $out/kernels.csv <<'PY'
import csv, os, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14 and r[0].isdigit()]  # the app's own lines skipped
by = {}
for r in rows:  # ID, ..., Kernel Name (4), Grid Size (8), Metric Name (12), Metric Unit, Metric Value (14)
    by.setdefault((int(r[0]), r[4][:40], r[8]), {})[r[12]] = float(r[14].replace(",", "") or 0)
new = not os.path.exists(sys.argv[4])
with open(sys.argv[4], "a", newline="") as f:
    w = csv.writer(f)
    if new:
        w.writerow(["call", "args", "id", "kernel", "grid", "us", "dram_mb", "tbps", "registers", "dram_pct"])
    for (kid, name, grid), m in sorted(by.items()):
        us, mb = m["gpu__time_duration.sum"] / 1e3, m["dram__bytes_read.sum"] / 1e6
        tbps = mb / us if us else 0.0
        w.writerow([sys.argv[2], sys.argv[3], kid, name, grid, f"{us:.2f}", f"{mb:.2f}", f"{tbps:.3f}",
                    int(m.get("launch__registers_per_thread", 0)),
                    m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", 0)])
        print(f"{kid:>3} {name:40s} {grid:>14s} {us:9.2f} us {mb:9.2f} MB {tbps:6.3f} TB/s")
PY
done
python3 -c "import sys; from labkit.runs import open_run; r=open_run(sys.argv[1]); r.update_meta(contents='kern_N.csv: Nsight Compute of call N; kernels.csv: per kernel time, DRAM bytes read and rate'); r.finish()" "$out"
