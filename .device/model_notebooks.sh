#!/usr/bin/env bash
# Device run: the model notebooks at full size through `labkit batch` (papermill), then decode profiles of the
# current code; each into its own run folder under $OUT, packed as $OUT/runs.tgz (the device returns 8 files).
#   04_model_run   gpt-oss-20b, rows+nib weights (the Hopper decode leader): decode profile, parity of the
#                  kernels and of W4A8 against the reference, the lm_head study
#   06_divergence  gpt-oss-20b, the kernels (b=kernels) against the reference, and the fault table
#   profiles       gpt-oss-120b and -20b at batch 1 (rows+nib), 120b at batch 8 (tiled+nib)
# Carry .whl/slim and the plotly wheel (charts); call as:
#   cp .whl/slim/*.whl .whl/ && LAB_GIT_COMMIT=<sha of the tree sent> bash .device/model_notebooks.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
cat > /tmp/grid04.yaml <<'YAML'
- {model: gpt-oss-20b, layout: rows+nib, prompt: 512, decode: 64}
YAML
cat > /tmp/grid06.yaml <<'YAML'
- {model: gpt-oss-20b, a: ref, b: kernels, seq: 32}
YAML
step() { echo "== $1 ($(date +%T))"; shift; timeout "${STEP_LIMIT:-240}" "$@" 2>&1 | grep -v -i warn | tail -${LINES_SHOWN:-25}; }
step "04_model_run 20b" python3 -m labkit batch 04_model_run --grid /tmp/grid04.yaml --out $OUT/model-run-20b --quiet
step "06_divergence 20b" python3 -m labkit batch 06_divergence --grid /tmp/grid06.yaml --out $OUT/divergence-20b --quiet
for spec in "120b rows+nib 1" "20b rows+nib 1" "120b tiled+nib 8"; do
  set -- $spec
  name=decode-gpt-oss-$1-${2/+/-}-b$3
  step "$name" python3 -m labkit model profile --model gpt-oss-$1 --layout $2 --batch $3 --prompt 512 --decode 64 \
    --out $OUT/$name
done
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
