#!/usr/bin/env bash
# Device run: GPU tests of the decode-step kernels, the linear_bf16 sweep (the attention projections'
# GEMV against cuBLAS), then decode profiles of gpt-oss-120b and -20b without and with programmatic
# dependent launch (LAB_PDL), packed into $OUT/runs.tgz (the device returns at most 8 files).
# call as: LAB_GIT_COMMIT=<sha of the tree sent> bash .device/decode.sh [skip-sweep] [skip-tests]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
case " $* " in *" skip-tests "*) ;; *)
  python3 -m pytest -q tests/test_attention_kernels.py tests/test_linear_bf16.py tests/test_model_gpu.py tests/test_model.py -m "not slow" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
  LAB_PDL=1 python3 -m pytest -q tests/test_model_gpu.py tests/test_moe.py -m "not slow" -k "graph or match" 2>&1 | tail -2 ;;
esac
case " $* " in *" skip-sweep "*) ;; *)
  python3 -m labkit sweep linear_bf16 --out $OUT/linear-bf16 --quiet 2>&1 | tail -1
  python3 - <<'PY'
import os, pandas as pd
d = pd.read_parquet(os.environ["OUT"] + "/linear-bf16/points.parquet")
print(d.groupby("status").size().to_dict())
ok = d[d.status == "ok"]
for (n, k, m), g in ok.groupby(["n", "k", "m"]):
    cu = g[g.variant == "cublas_bf16"].us_graph.min()
    best = g[g.variant == "gemv_bf16"].sort_values("us_graph").iloc[0]
    print(f"N={n} K={k} M={m}: cublas {cu:6.2f} us  gemv_bf16 {best.us_graph:6.2f} us ({best.frac_of_floor:.0%}) {best.config}")
PY
  ;;
esac
export PROFILE_LINES=22
for pdl in 0 1; do
  for m in 120b 20b; do
    LAB_PDL=$pdl python3 -m labkit model profile --model gpt-oss-$m --prompt 512 --decode 64 --lm-head mxfp4 \
      --out $OUT/decode-gpt-oss-$m-mxfp4-pdl$pdl 2>&1 | grep -v -i warn | head -$PROFILE_LINES
  done
done
cd $OUT && tar czf runs.tgz --remove-files */ && ls -la
