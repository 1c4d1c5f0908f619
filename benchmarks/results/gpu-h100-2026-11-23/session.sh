#!/bin/bash
# GPU calls of 2026-11-23: the `gpu` preset's own cost on WMT-length sentences, end to end
# (start-up, compilation, training, validation, beam-4 decoding of all of newstest2013).
# WMT14's training side is not on the device (no internet): the stand-in trains on
# newstest2013+2014 repeated 8 times (48,024 pairs, WMT's sentence lengths; for cost only, the
# dev set is inside it). `bash session.sh base` or `bash session.sh big`.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
part=$1
W=/tmp/wl; mkdir -p $W
for l in en de; do
  for i in 1 2 3 4 5 6 7 8; do cat .data/newstest/newstest2013.$l .data/newstest/newstest2014.$l; done > $W/train.$l
  cp .data/newstest/newstest2013.$l .data/newstest/newstest2014.$l $W/
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)" | tee -a $OUT/device.txt
run() {  # run NAME ROW TIMEOUT ARGS...: one `ablate train` of the gpu preset, timed from the shell
  local name=$1 row=$2 limit=$3; shift 3
  local t0=$(date +%s.%N)
  TORCH_LOGS=recompiles timeout $limit python3 -m ablate train --preset gpu --row $row --data-dir $W \
    --no-wandb --seed 1 --out $W/$name train.progress_bar=false "$@" > $OUT/$name.log 2>&1
  local rc=$?
  echo "$name: rc=$rc wall_s=$(python3 -c "print(round($(date +%s.%N)-$t0,1))")" | tee -a $OUT/summary.txt
  cp $W/$name/results.json $OUT/$name.results.json 2>/dev/null
  cp $W/$name/metrics.csv $OUT/$name.metrics.csv 2>/dev/null || cp $W/$name/logs/metrics.csv $OUT/$name.metrics.csv 2>/dev/null
}
case $part in
  base)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $OUT/test_gpu.log 2>&1
    echo "test_gpu: rc=$?" | tee -a $OUT/summary.txt; tail -3 $OUT/test_gpu.log
    run base base 400 --max-steps 1200 train.val_check_interval=600 ;;
  big)
    run big big 520 --max-steps 400 train.val_check_interval=400 ;;
  lr)  # three base runs at once, the preset's full 10,000-step schedule (compiled), cut at 470 s:
       # is the base row stable through its warmup peak at other peak rates / warmups?
    for v in "half 0.5 1000" "quarter 0.25 1000" "paperwarmup 1.0 4000"; do
      set -- $v
      run lr-$1 base 470 train.lr_scale=$2 train.warmup_steps=$3 train.val_check_interval=250 &
      sleep 2
    done
    wait ;;
  fragile)  # big and C3 (N=8) at once, the paper's peak rate, eager, through the warmup peak
    for row in big C3; do
      timeout 320 python3 -m ablate train --preset gpu --row $row --data-dir $W --no-wandb --seed 1 \
        --out $OUT/$row --max-steps 1200 train.lr_scale=0.5 train.val_check_interval=250 \
        train.checkpoint_every=100000 train.progress_bar=false > $OUT/$row.log 2>&1 &
    done
    wait ;;
  compiled)  # base alone, compiled (auto: >= 2,000 steps), the paper's peak rate: steady rate, graphs
    run compiled base 420 --max-steps 2000 train.lr_scale=0.5 train.val_check_interval=1000 ;;
esac
grep -h -iE "recompil" $OUT/*.log | head -20
cat $OUT/summary.txt
