#!/usr/bin/env bash
# Device run: GPT-OSS decode profiles (batch 1, 512-token prompt, 64 decode steps, MXFP4 lm_head) with the MXFP4
# weights held row-major and tiled, packed into $OUT/runs.tgz.
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/layout_profile.sh [model ...]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
for m in ${*:-120b 20b}; do
  for layout in rows tiled; do
    timeout 280 python3 -m labkit model profile --model gpt-oss-$m --prompt 512 --decode 64 --lm-head mxfp4 \
      --layout $layout --out $OUT/decode-gpt-oss-$m-mxfp4-$layout 2>&1 | grep -v -i warn | head -${PROFILE_LINES:-14}
  done
done
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
