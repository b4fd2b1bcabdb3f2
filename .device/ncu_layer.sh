#!/usr/bin/env bash
# Device run: per-kernel GPU time and DRAM bytes of one moe_h2g layer call under Nsight Compute (caches not
# flushed between kernels, so mlp2 sees what mlp1 left in L2), one CSV per config into $OUT.
# call as: bash .device/ncu_layer.sh <tokens> <model> <config> [<config> ...]   (run after the pip line)
m=$1; model=$2; shift 2
i=0
for cfg in "$@"; do
  i=$((i+1))
  ncu --cache-control none --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    -k regex:"_moe_h2g_kernel|_combine" python3 -m labkit once moe_h2g --m $m --model $model --config $cfg \
    --repeat 1 > $OUT/ncu_layer_$i.csv 2>&1
  echo "== $cfg"
  python3 - $OUT/ncu_layer_$i.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14 and r[0] != "ID"]
for r in rows:
    print(f"{r[0]:>3s} {r[4][:24]:24s} {r[12]:28s} {r[14]:>14s} {r[13]}")
PY
done
