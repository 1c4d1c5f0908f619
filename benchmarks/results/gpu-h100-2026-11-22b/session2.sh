#!/bin/bash
# Second GPU call of 2026-11-22 (commit in README): big row end to end, recompile reasons of the
# compiled base run, profiles of the eager and compiled bare step at vocab 37,000.
set -u
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1
W=/tmp/s2; mkdir -p $W/dev
head -500 .data/newstest/newstest2013.en > $W/dev/dev.en; head -500 .data/newstest/newstest2013.de > $W/dev/dev.de
for l in en de; do for i in 1 2 3 4 5 6 7 8; do cat .data/newstest/newstest2013.$l .data/newstest/newstest2014.$l; done > $W/train.$l; done
common="--data files data.train_src=$W/train.en data.train_tgt=$W/train.de data.valid_src=$W/dev/dev.en data.valid_tgt=$W/dev/dev.de data.vocab_size=37000 data.max_tokens=25000 --no-wandb --seed 1 --accelerator gpu train.val_check_interval=100000 train.checkpoint_every=100000 train.warmup_steps=4000 train.progress_bar=false eval.decode_test=false eval.beam_size=1"
big="model.n_layers=6 model.d_model=1024 model.d_ff=4096 model.n_heads=16 model.dropout=0.3"
base="model.n_layers=6 model.d_model=512 model.d_ff=2048 model.n_heads=8"
echo "== big eager"; timeout 150 python3 -m ablate train --out $W/big-eager $common $big --max-steps 120 train.compile=false train.log_every_n_steps=15 > $W/big-eager.log 2>&1; tail -3 $W/big-eager.log
python3 -c "import json;r=json.load(open('$W/big-eager/results.json'));print(json.dumps({k:r[k] for k in ('params','steady_tokens_per_s','startup_s','first_step_s','train_time_s','padding_share')}))"
echo "== base compiled, recompile reasons"; TORCH_LOGS=recompiles,graph_breaks timeout 200 python3 -m ablate train --out $W/base-comp $common $base --max-steps 100 train.compile=true train.log_every_n_steps=10 > $W/base-comp.log 2>&1
grep -iE "recompil|graph break|guard|triggered" $W/base-comp.log | head -40
python3 -c "import json;r=json.load(open('$W/base-comp/results.json'));print(json.dumps({k:r[k] for k in ('steady_tokens_per_s','startup_s','first_step_s','train_time_s','compiled_graphs')}))"
cp $W/base-comp.log $OUT/base-comp.log
grep -E "^[0-9]|step" $W/base-comp/logs/metrics.csv | head -0
echo "== profile eager"; timeout 90 python3 benchmarks/results/gpu-h100-2026-11-22b/profile_step.py eager 2>&1 | grep -v Warn | tee $OUT/profile_eager.txt | head -50
echo "== profile compiled"; timeout 140 python3 benchmarks/results/gpu-h100-2026-11-22b/profile_step.py compiled 2>&1 | grep -v Warn | tee $OUT/profile_compiled.txt | head -50
