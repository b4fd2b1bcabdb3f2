#!/usr/bin/env bash
# Device A/B of a code change on whole-model decode profiles, as .device/ab.sh does for sweeps: older copies of
# some files (untracked, under $AB_OLD at the same relative paths) swapped in and out, ROUNDS rounds of "old"
# then "new", each a `labkit model profile` with the given arguments, run folders $OUT/NAME-old1, -new1, ...
# call as: LAB_GIT_COMMIT=<new sha> AB_OLD_COMMIT=<old sha> AB_OLD=<dir> bash .device/decode_ab.sh NAME <profile args>
export PYTHONUNBUFFERED=1
name=$1; shift
new=$LAB_GIT_COMMIT
source .device/ab_swap.sh
for i in $(seq 1 ${ROUNDS:-2}); do
  for tag in old new; do
    ab_use $tag
    [ $tag = old ] && export LAB_GIT_COMMIT=$AB_OLD_COMMIT || export LAB_GIT_COMMIT=$new
    timeout ${PROFILE_S:-150} python3 -m labkit model profile "$@" --out $OUT/$name-$tag$i 2>&1 \
      | grep -E "step|tok/s" | head -2 | sed "s/^/$tag$i: /"
  done
done
ab_use new
export LAB_GIT_COMMIT=$new
