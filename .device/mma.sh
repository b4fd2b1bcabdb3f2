#!/usr/bin/env bash
# Device run: GPU tests of the linear kernels, then the linear_mma sweep into $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/mma.sh (the device copy's .git is stale)
python3 -m pytest -q -x tests/test_linear.py -k "gemv_mma" 2>&1 | tail -5
python3 -m labkit sweep linear_mma --out $OUT/linear-mma --quiet 2>&1 | tail -20
python3 -m labkit best $OUT/linear-mma 2>&1 | tail -30
