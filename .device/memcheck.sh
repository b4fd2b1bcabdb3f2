#!/usr/bin/env bash
# compute-sanitizer (TOOL: memcheck by default, or synccheck, racecheck, initcheck) over the GPU tests matching a
# pytest -k expression, as a run folder ($OUT/TOOL-NAME: meta.json by labkit.runs, TOOL.txt the sanitizer's and
# pytest's output). synccheck finds barriers reached by part of a warp (FUSE2's first ticket hung the H100 so).
# call as: LAB_GIT_COMMIT=<sha> [TOOL=synccheck] [TESTS="<test files>"] bash .device/memcheck.sh NAME "<pytest -k expr>"
# (TESTS: tests/test_linear.py tests/test_moe.py unless given)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
tool=${TOOL:-memcheck}
cmd="compute-sanitizer --tool $tool python3 -m pytest -q ${TESTS:-tests/test_linear.py tests/test_moe.py} -p no:cacheprovider -k \"$2\""
out=$OUT/$tool-$1
python3 -c "import sys; from labkit.runs import create_run; create_run('$tool-$1', out=sys.argv[1], command=sys.argv[2])" "$out" "$cmd"
eval "$cmd" > $out/$tool.txt 2>&1
tail -4 $out/$tool.txt
python3 -c "import sys; from labkit.runs import open_run; r=open_run(sys.argv[1]); r.update_meta(contents='$tool.txt: compute-sanitizer $tool of the GPU tests named in command'); r.finish()" "$out"
