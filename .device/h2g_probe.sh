#!/usr/bin/env bash
# Device run: .device/h2g_probe.py's graph times, then its launches under ncu (time, DRAM bytes, instructions).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
python3 .device/h2g_probe.py 2>&1 | tail -20
M=gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
ncu --clock-control none --csv --metrics $M -k regex:h2g python3 .device/h2g_probe.py --ncu > $OUT/ncu.csv 2>&1
python3 - $OUT/ncu.csv <<'PY'
import csv, sys, collections
lines = open(sys.argv[1]).read().splitlines()
rows = [r for r in csv.reader(lines) if len(r) > 14 and r[0] != "ID"]
by = collections.OrderedDict()
for r in rows:
    by.setdefault(int(r[0]), {})[r[12]] = r[14]
marks = [l for l in lines if l.startswith("NCU ")]
ids = list(by)
print("launches", len(ids), "marks", len(marks))
# per mode: warm-up call (2 launches) then the measured call (2 launches)
for i, m in enumerate(marks):
    for ph, kid in zip(("mlp1", "mlp2"), ids[4 * i + 2: 4 * i + 4]):
        d = by[kid]
        print(m[4:], ph, " ".join(f"{k.split('__')[1][:24]}={d[k]}" for k in d))
PY
