#!/bin/bash
# GPU call of 2026-11-25: the `gpu` preset's most fragile rows (C3, N=8; big) through the preset's
# own 4,000-step warmup to the paper's peak, the check 2026-11-23 ran out of device time for.
# Stand-in training side as on 2026-11-23 (no WMT14 on the device): newstest2013+2014 repeated
# 8 times (48,024 pairs); the dev set is inside it, so dev PPL measures stability, not quality.
# `bash session.sh ROW LIMIT_S`: the preset's full 10,000-step schedule, cut by `timeout`.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
row=$1 limit=$2
W=/tmp/wl; mkdir -p $W
for l in en de; do
  for i in 1 2 3 4 5 6 7 8; do cat .data/newstest/newstest2013.$l .data/newstest/newstest2014.$l; done > $W/train.$l
  cp .data/newstest/newstest2013.$l .data/newstest/newstest2014.$l $W/
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)" | tee -a $OUT/device.txt
git rev-parse --short HEAD 2>/dev/null | tee -a $OUT/device.txt
t0=$(date +%s.%N)
timeout $limit python3 -m ablate train --preset gpu --row $row --data-dir $W --no-wandb --seed 1 \
  --out $W/$row train.progress_bar=false train.val_check_interval=250 train.checkpoint_every=100000 \
  > $OUT/$row.log 2>&1
rc=$?
echo "$row: rc=$rc wall_s=$(python3 -c "print(round($(date +%s.%N)-$t0,1))")" | tee -a $OUT/summary.txt
cp $W/$row/logs/metrics.csv $OUT/$row.metrics.csv 2>/dev/null
cp $W/$row/results.json $OUT/$row.results.json 2>/dev/null
tail -5 $OUT/$row.log
