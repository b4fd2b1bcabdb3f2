#!/usr/bin/env bash
# Device run: every test marked gpu (111 at 71e7b8f), in three pytest processes side by side on the one GPU: the
# MoE tests, the linear tests and the rest, each written to $OUT/tests-NAME.txt as it finishes (gpu_tests.sh).
# About 4 minutes on an H200 (results/20261129T224623-h200-gpu-tests-all: 248, 166 and 78 s).
# call as: [LIMIT=seconds] bash .device/gpu_suite.sh
here=$(dirname "$0")
if [ -z "$LAB_SITE_READY" ]; then  # installed once here: three pip runs into one folder could clash
  wheels=$(ls .whl/*.whl 2>/dev/null || ls .whl/slim/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit
fi
export LAB_SITE_READY=1 PYTEST_ADDOPTS="-m gpu"
rest=$(ls tests/test_*.py | grep -v -e '/test_moe.py$' -e '/test_linear.py$')
bash "$here/gpu_tests.sh" moe "" tests/test_moe.py > "$OUT/sum-moe.txt" 2>&1 &
bash "$here/gpu_tests.sh" linear "" tests/test_linear.py > "$OUT/sum-linear.txt" 2>&1 &
bash "$here/gpu_tests.sh" rest "" $rest > "$OUT/sum-rest.txt" 2>&1 &
wait  # (a wait loop on `pgrep -f pytest` matched the calling shell's own command line and never ended)
for g in moe linear rest; do echo "$g: $(tail -1 "$OUT/sum-$g.txt")"; grep -E "FAILED|ERROR" "$OUT/sum-$g.txt"; done
rm -f "$OUT"/sum-*.txt
