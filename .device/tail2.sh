#!/usr/bin/env bash
# Stop 47: timelines of TAIL2 leaders, then the moe_mma_tail2 sweep with its GPU tests (sweep.sh packs $OUT).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
base=CHUNKS=1,num_warps=4,WGMMA=true,TILED=true,RING_W=true,NIB=true,STAGES=4,ROWS=2,CHAIN=true
timeout 150 python3 -m labkit timeline --out $OUT/moe-timeline-tail2 \
  --point gpt-oss-120b 256 $base,BLOCK_M=16,EPI_EARLY=1 --point gpt-oss-120b 256 $base,BLOCK_M=16,EPI_EARLY=1,TAIL2=4 \
  --point gpt-oss-120b 256 $base,BLOCK_M=16,EPI_EARLY=1,TAIL2=8 --point gpt-oss-120b 32 $base,BLOCK_M=8,EPI_EARLY=2,TAIL2=4 \
  2>&1 | tail -25
SWEEP_S=${SWEEP_S:-380} bash .device/sweep.sh "half_height or tma_under_graphs or chain_is_bit" moe_mma_tail2
