#!/usr/bin/env bash
# Device run: the moe_mma_maxnreg sweep, then the moe_mma GPU tests, into $OUT/runs.tgz.
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/moe_mma_maxnreg.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
timeout ${SWEEP_S:-300} python3 -m labkit sweep moe_mma_maxnreg --out $OUT/moe-mma-maxnreg --quiet 2>&1 | tail -2
python3 -m pytest -q tests/test_moe.py -k moe_mma 2>&1 | tail -1
python3 -m labkit best $OUT/moe-mma-maxnreg 2>&1 | cut -c1-160
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
