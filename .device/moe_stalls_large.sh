#!/usr/bin/env bash
# Device run: where the 20b layer's mlp1 and mlp2 warps wait at 8192 and 512 tokens (auto's configs), and their L2
# traffic at 8192 tokens: ncu metrics, then .device/sass_stalls.sh per kernel. Call as: bash .device/moe_stalls_large.sh
# (pip line included). Extra `labkit once` configs for the metrics pass: MORE="cfg1 cfg2".
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1; O=$OUT
B=CHUNKS=1,TMA=2,WGMMA=true,RING_W=true,TILED=true,NIB=true
C8=BLOCK_M=128,ROWS=1,STAGES=2,EPI_EARLY=2,$B
C5=BLOCK_M=64,ROWS=2,STAGES=3,EPI_EARLY=1,HALF=true,MAXNREG=168,$B
M=gpu__time_duration.sum,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
M=$M,sm__inst_issued.avg.pct_of_peak_sustained_active,dram__bytes_read.sum
j=0
for c in $C8 $MORE; do
  j=$((j+1))
  ncu --clock-control none --csv --metrics $M -k regex:_moe_wg_kernel python3 -m labkit once moe_mma \
    --model gpt-oss-20b --m 8192 --config $c,$B --repeat 0 > $O/l2_8192_$j.csv 2>&1
  echo "== $c"; grep _moe_wg $O/l2_8192_$j.csv | awk -F'","' '{print $1, $13, $15}'
done
[ -n "$NO_STALLS" ] && exit
i=0
for a in "0 8192 $C8" "1 8192 $C8" "0 512 $C5" "1 512 $C5"; do
  set -- $a; i=$((i+1)); mkdir -p $O/s$i
  OUT=$O/s$i SKIP=$1 timeout 200 bash .device/sass_stalls.sh _moe_wg_kernel "moe_mma --model gpt-oss-20b --m $2 --config $3"
done
