#!/usr/bin/env bash
# Device run: every kernel's GPU tests (pytest -m gpu) under compute-sanitizer at once, four processes side by
# side on the one GPU: memcheck of the linear, MoE and other kernels' tests, synccheck of the MoE tests (device
# counters, TMA rings without Triton's barriers). Each is a run folder $OUT/TOOL-NAME (memcheck.sh). Timing tests
# and the full-size model profiles are left out: the sanitizer slows kernels many times over.
# call as: LAB_GIT_COMMIT=<sha> [LIMIT=seconds] bash .device/sanitize_suite.sh
here=$(dirname "$0")
wheels=$(ls .whl/*.whl 2>/dev/null || ls .whl/slim/*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit
export LAB_SITE_READY=1 PYTEST_ADDOPTS="-m gpu"
skip="not timing and not full_size and not profiler"  # the profiler test: CUPTI takes one subscriber, the sanitizer holds it
TESTS=tests/test_linear.py bash "$here/memcheck.sh" linear "$skip" &
TESTS=tests/test_moe.py bash "$here/memcheck.sh" moe "$skip" &
TESTS="tests/test_attention_kernels.py tests/test_model_gpu.py tests/test_timeline.py" bash "$here/memcheck.sh" rest "$skip" &
TOOL=synccheck TESTS=tests/test_moe.py bash "$here/memcheck.sh" moe "$skip" &
wait
