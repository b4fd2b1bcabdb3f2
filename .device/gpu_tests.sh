#!/usr/bin/env bash
# Device run: tests on the GPU with each test's outcome written as it finishes ($OUT/tests-NAME.txt, pytest -v -rf),
# so a call cut short by its time limit still names what passed and what failed (a bare `pytest -q | tail` killed
# by `timeout` printed only dots: stop 72 saw one F it could not name).
# call as: [LIMIT=seconds] bash .device/gpu_tests.sh NAME "<pytest -k expr>" [test files...]
# the wheels of .whl, or of .whl/slim where only that was carried (the tree and carry together must fit in 64 MiB)
# (LAB_SITE_READY=1: gpu_suite.sh installed them already)
if [ -z "$LAB_SITE_READY" ]; then
  wheels=$(ls .whl/*.whl 2>/dev/null || ls .whl/slim/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit
fi
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1
name=$1; expr=$2; shift 2
out=$OUT/tests-$name.txt
timeout ${LIMIT:-400} python3 -m pytest -v -rf -p no:cacheprovider -k "$expr" "${@:-tests}" > $out 2>&1
echo "rc=$? (124: cut at ${LIMIT:-400} s)" >> $out
grep -E "FAILED|ERROR" $out | head -20
echo "$(grep -c ' PASSED' $out) passed, $(grep -c ' FAILED' $out) failed, $(grep -c ' SKIPPED' $out) skipped; $(tail -1 $out)"
