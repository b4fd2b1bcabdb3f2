#!/usr/bin/env bash
# Device run: GPU tests of the h2g kernels (pipelined K loops and L2 prefetch included), then the
# linear_pipeline and moe_pipeline sweeps with PDL off and on, packed into $OUT/runs.tgz (the device returns
# at most 8 files).
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/pipeline.sh ["linear moe"] ["0 1"]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -m pytest -q tests/test_linear.py tests/test_moe.py -k "h2g or pipeline" 2>&1 | tail -3
for pdl in ${2:-0 1}; do
  for op in ${1:-linear moe}; do
    LAB_PDL=$pdl python3 -m labkit sweep ${op}_pipeline --out $OUT/$op-pipeline-pdl$pdl --quiet 2>&1 | tail -1
    python3 -m labkit best $OUT/$op-pipeline-pdl$pdl 2>&1 | tail -12
  done
done
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
