#!/usr/bin/env bash
# Fills the git-ignored .whl/slim with .whl's wheels less the large ones sweeps, tests and ncu never import
# (plotly, debugpy, jedi, nvtx: 22 of 27 MB). Since results/ passed ~40 MB the working tree and a carried .whl no
# longer fit the device tool's 64 MiB; carry [".whl/slim"] instead (.device/gpu_tests.sh installs from it; other
# scripts want `cp .whl/slim/*.whl .whl/` first). Notebooks on the device need the full .whl (plotly).
set -e
cd "$(dirname "$0")/.."
[ -n "$(ls .whl/*.whl 2>/dev/null)" ] || bash ../shared/device/wheels.sh
mkdir -p .whl/slim
for f in .whl/*.whl; do
  case $f in *plotly*|*debugpy*|*jedi*|*nvtx*) ;; *) cp "$f" .whl/slim/ ;; esac
done
du -sh .whl/slim
