#!/usr/bin/env bash
# Device run: GPU tests matching a pytest -k expression, then each named sweep spec with its best-config table,
# packed into $OUT/runs.tgz (the device returns at most 8 files; a sweep cut short by SWEEP_S keeps its points).
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/sweep.sh "<pytest -k expr>" spec [spec ...]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
tests=$1; shift
[ -n "$tests" ] && python3 -m pytest -q tests/test_linear.py tests/test_moe.py -k "$tests" 2>&1 | tail -3
for spec in "$@"; do
  out=$OUT/${spec//_/-}
  timeout ${SWEEP_S:-420} python3 -m labkit sweep $spec --out $out --quiet 2>&1 | tail -2
  python3 -m labkit best $out 2>&1 | cut -c1-170 | tail -${BEST_LINES:-30}
done
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
