#!/usr/bin/env bash
# compute-sanitizer memcheck of GPU tests matching a pytest -k expression, as a run folder ($OUT/memcheck-NAME:
# meta.json by labkit.runs, memcheck.txt the sanitizer's and pytest's output).
# call as: LAB_GIT_COMMIT=<sha> bash .device/memcheck.sh NAME "<pytest -k expr>"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
cmd="compute-sanitizer --tool memcheck python3 -m pytest -q tests/test_linear.py tests/test_moe.py -k \"$2\""
out=$OUT/memcheck-$1
python3 -c "import sys; from labkit.runs import create_run; create_run('memcheck-$1', out=sys.argv[1], command=sys.argv[2])" "$out" "$cmd"
eval "$cmd" > $out/memcheck.txt 2>&1
tail -4 $out/memcheck.txt
python3 -c "import sys; from labkit.runs import open_run; r=open_run(sys.argv[1]); r.update_meta(contents='memcheck.txt: compute-sanitizer memcheck of the GPU tests named in command'); r.finish()" "$out"
