#!/usr/bin/env bash
# Device run: per-kernel time, DRAM bytes and L2 hit rate of moe_h2g at 1 token with and without PREFETCH_W2.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
M=gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
base="BLOCK_M=1,BLOCK_N=16,BLOCK_K=256,num_warps=2,num_stages=3"
ncu --clock-control none --csv --metrics $M python3 .device/ncu_moe.py 1 "$base" "$base,PREFETCH_W2=True" > $OUT/ncu_moe.csv 2>&1
python3 - $OUT/ncu_moe.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
for r in rows[1:]:
    print(f"{r[0]:>3s} {r[4][:28]:28s} {r[12][:34]:34s} {r[14]:>14s} {r[13]}")
PY
