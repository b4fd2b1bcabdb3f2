#!/usr/bin/env bash
# compute-sanitizer (TOOL: memcheck by default, or synccheck, racecheck, initcheck) over the GPU tests matching a
# pytest -k expression, as a run folder ($OUT/TOOL-NAME: meta.json by labkit.runs, TOOL.txt the sanitizer's and
# pytest's output, each test's outcome as it finishes, so a run cut by LIMIT still names what it checked).
# synccheck finds barriers reached by part of a warp (FUSE2's first ticket hung the H100 so).
# call as: LAB_GIT_COMMIT=<sha> [TOOL=synccheck] [TESTS="<test files>"] [LIMIT=seconds] bash .device/memcheck.sh NAME "<pytest -k expr>"
# (TESTS: tests/test_linear.py tests/test_moe.py unless given; LAB_SITE_READY=1: the wheels are installed already)
if [ -z "$LAB_SITE_READY" ]; then
  wheels=$(ls .whl/*.whl 2>/dev/null || ls .whl/slim/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels || exit
fi
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
tool=${TOOL:-memcheck}
cmd="compute-sanitizer --tool $tool python3 -m pytest -v -rf ${TESTS:-tests/test_linear.py tests/test_moe.py} -p no:cacheprovider -k \"$2\""
out=$OUT/$tool-$1
python3 -c "import sys; from labkit.runs import create_run; create_run('$tool-$1', out=sys.argv[1], command=sys.argv[2])" "$out" "$cmd"
eval "timeout ${LIMIT:-540} $cmd" > $out/$tool.txt 2>&1
echo "rc=$? (124: cut at ${LIMIT:-540} s)" >> $out/$tool.txt
echo "$tool-$1: $(grep -c ' PASSED' $out/$tool.txt) passed, $(grep -c ' FAILED' $out/$tool.txt) failed; $(grep -E 'ERROR SUMMARY' $out/$tool.txt | tail -1); $(tail -1 $out/$tool.txt)"
python3 -c "import sys; from labkit.runs import open_run; r=open_run(sys.argv[1]); r.update_meta(contents='$tool.txt: compute-sanitizer $tool of the GPU tests named in command'); r.finish()" "$out"
