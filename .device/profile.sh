#!/usr/bin/env bash
# Device run: decode profiles (with the per-kernel table) of gpt-oss-120b and -20b into $OUT.
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/profile.sh [extra profile args]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
for m in 120b 20b; do
  python3 -m labkit model profile --model gpt-oss-$m --prompt 512 --decode 64 --lm-head mxfp4 "$@" \
    --out $OUT/decode-gpt-oss-$m-mxfp4 2>&1 | grep -v Warn
done
