#!/usr/bin/env bash
# Device run: GPU tests of the decode-step kernels, the linear_bf16 sweep (the attention projections'
# GEMV against cuBLAS), then the decode profiles of gpt-oss-120b and -20b, all into $OUT.
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/decode.sh [skip-sweep]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
python3 -m pytest -q tests/test_attention_kernels.py tests/test_linear_bf16.py tests/test_model_gpu.py tests/test_model.py -m "not slow" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
if [ "$1" != skip-sweep ]; then
  python3 -m labkit sweep linear_bf16 --out $OUT/linear-bf16 --quiet 2>&1 | tail -3
  python3 -m labkit best $OUT/linear-bf16 2>&1 | tail -20
fi
bash .device/profile-only.sh
