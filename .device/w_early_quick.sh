python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -x -q tests/test_moe.py -k "w_early_under and 5" 2>&1 | tail -4
timeout 190 python3 -m labkit sweep .device/w_early_quick.yaml --out $OUT/w-early-quick --quiet 2>&1 | tail -2
python3 -m labkit best $OUT/w-early-quick 2>&1 | cut -c1-150 | tail -5
cd $OUT && tar czf runs.tgz --remove-files */ ; ls
