#!/usr/bin/env bash
# Device run: where in the SASS one kernel's warps wait. Nsight Compute's warp-state sampling per instruction
# (SourceCounters) of the first launch matching a regex (after SKIP launches) of each `labkit once` call, kept
# as CSV in $OUT (sass_<i>.csv) with the instructions holding the most samples printed.
# call as: [SKIP=1] bash .device/sass_stalls.sh <kernel regex> "<labkit once args>" ...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
regex=$1; shift
i=0
for call in "$@"; do
  i=$((i+1))
  echo "== $call"
  ncu -f --clock-control none --section SourceCounters --section WarpStateStats -k regex:$regex -s ${SKIP:-0} -c 1 \
      -o /tmp/rep_$i python3 -m labkit once $call --repeat 1 2>&1 | grep -v "^==PROF==" | tail -2
  ncu --import /tmp/rep_$i.ncu-rep --page source --print-source sass --csv > $OUT/sass_$i.csv 2> $OUT/sass_$i.err
  python3 .device/sass_top.py $OUT/sass_$i.csv
done
