#!/usr/bin/env bash
# Device run: GPU tests of the model's kernels, then decode profiles (with the per-kernel table) of
# gpt-oss-120b and -20b into $OUT.
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/profile.sh [extra profile args]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
python3 -m pytest -q -x tests/test_attention_kernels.py tests/test_model_gpu.py tests/test_model.py -m "not slow" 2>&1 | tail -4
for m in 120b 20b; do
  python3 -m labkit model profile --model gpt-oss-$m --prompt 512 --decode 64 --lm-head mxfp4 "$@" \
    --out $OUT/decode-gpt-oss-$m-mxfp4 2>&1 | grep -v -i warn
done
