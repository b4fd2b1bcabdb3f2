#!/usr/bin/env bash
# Device A/B of a code change that adds no option: GPU tests matching a pytest -k expression, then one sweep spec
# run alternately on this tree's code ("new") and on older copies of some of its files ("old", untracked files
# under $AB_OLD at the same relative paths), ROUNDS times, packed into $OUT/runs.tgz. Alternating separates the
# change from the drift between sweeps of one call.
# call as: LAB_GIT_COMMIT=<new sha> AB_OLD_COMMIT=<old sha> AB_OLD=<dir> bash .device/ab.sh "<pytest -k>" spec
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
tests=$1 spec=$2 new=$LAB_GIT_COMMIT
[ -n "$tests" ] && python3 -m pytest -q tests/test_linear.py tests/test_moe.py -k "$tests" 2>&1 | tail -3
source .device/ab_swap.sh
for i in $(seq 1 ${ROUNDS:-2}); do
  for tag in new old; do
    ab_use $tag
    out=$OUT/${spec//_/-}-$tag$i
    [ $tag = old ] && export LAB_GIT_COMMIT=$AB_OLD_COMMIT || export LAB_GIT_COMMIT=$new
    timeout ${SWEEP_S:-240} python3 -m labkit sweep $spec --out $out --quiet 2>&1 | tail -1
  done
done
ab_use new
for d in $OUT/*/; do echo "== $d"; python3 -m labkit best $d 2>&1 | cut -c1-150 | tail -${BEST_LINES:-24}; done
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
