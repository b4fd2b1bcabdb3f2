#!/usr/bin/env bash
# Device run: GPU tests of moe_h2g, then the moe_block_n2 sweep (mlp2's own row tile) into $OUT/runs.tgz.
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/moe_n2.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
python3 -m pytest -q tests/test_moe.py -k "h2g" 2>&1 | tail -1
python3 -m labkit sweep moe_block_n2 --out $OUT/moe-block-n2 --quiet 2>&1 | tail -1
python3 -m labkit best $OUT/moe-block-n2 2>&1 | tail -10
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
