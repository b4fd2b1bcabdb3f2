#!/usr/bin/env bash
# Device run: GPU tests of moe_mma, then the moe_mma sweep into $OUT/runs.tgz (a sweep cut short keeps its points).
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/moe_mma.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
python3 -m pytest -q tests/test_moe.py -k "moe_mma" 2>&1 | tail -3
timeout ${SWEEP_S:-420} python3 -m labkit sweep moe_mma --out $OUT/moe-mma --quiet 2>&1 | tail -2
python3 -m labkit best $OUT/moe-mma 2>&1 | grep -v "^ *moe_layer.*torch" | tail -24
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
