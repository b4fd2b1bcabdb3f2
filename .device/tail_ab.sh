#!/usr/bin/env bash
# A/B of one sweep spec on this tree's kernels/linear_mma.py against a given older copy of that file, alternating
# new, old, new, old in one call (the same machine and minutes), each sweep in its own run folder.
# call as: NEW=<sha> OLD=<sha> bash .device/tail_ab.sh <spec> <old linear_mma.py>
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
spec=$1; old=$2
cp kernels/linear_mma.py /tmp/new_linear_mma.py
for round in 1 2; do
  for side in new old; do
    if [ $side = new ]; then cp /tmp/new_linear_mma.py kernels/linear_mma.py; export LAB_GIT_COMMIT=$NEW
    else cp $old kernels/linear_mma.py; export LAB_GIT_COMMIT=$OLD; fi
    out=$OUT/${spec//_/-}-$side$round
    timeout 200 python3 -m labkit sweep $spec --out $out --quiet 2>&1 | tail -1
    python3 -m labkit best $out 2>&1 | cut -c1-110 | tail -7
  done
done
cp /tmp/new_linear_mma.py kernels/linear_mma.py
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
