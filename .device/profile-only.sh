#!/usr/bin/env bash
# Decode profiles (with the per-kernel table) of gpt-oss-120b and -20b into $OUT (after the pip line).
for m in 120b 20b; do
  python3 -m labkit model profile --model gpt-oss-$m --prompt 512 --decode 64 --lm-head mxfp4 "$@" \
    --out $OUT/decode-gpt-oss-$m-mxfp4 2>&1 | grep -v -i warn | head -${PROFILE_LINES:-40}
done
