#!/usr/bin/env bash
# Device run: GPU tests of the decode-step kernels, then decode profiles of gpt-oss-120b and -20b with both
# lm_head settings (the model launches with PDL on Hopper unless LAB_PDL=0), packed into $OUT/runs.tgz
# (the device returns at most 8 files). Optional first argument "sweep": the linear_bf16 sweep first.
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/decode.sh [sweep]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
python3 -m pytest -q tests/test_attention_kernels.py tests/test_linear_bf16.py tests/test_model_gpu.py tests/test_model.py -m "not slow" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
LAB_PDL=1 python3 -m pytest -q tests/test_moe.py tests/test_linear.py -m "not slow" -k "graph or match or precomputed" 2>&1 | tail -2
if [ "$1" = sweep ]; then
  python3 -m labkit sweep linear_bf16 --out $OUT/linear-bf16 --quiet 2>&1 | tail -1
fi
for head in mxfp4 bf16; do
  for m in 120b 20b; do
    python3 -m labkit model profile --model gpt-oss-$m --prompt 512 --decode 64 --lm-head $head \
      --out $OUT/decode-gpt-oss-$m-$head 2>&1 | grep -v -i warn | head -${PROFILE_LINES:-22}
  done
done
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
