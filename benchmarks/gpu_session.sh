#!/bin/bash
# One prepared GPU session (issue #40): everything a lent H100/H200 should measure, in priority
# order, inside one call's time, so that a session spends its device time measuring.
#
#   bash benchmarks/gpu_session.sh [SECONDS]          # on the GPU machine; SECONDS: the whole call (default 520)
#   DEVICE=cpu bash benchmarks/gpu_session.sh 240     # the same steps at tiny sizes on a CPU (its test)
#
# Steps, each cut to what is left (a step that no longer fits is skipped and said so in summary.txt):
#   0. end_to_end: what a user gets (issue #62): `ablate train` compiled, base and big at 37K pieces and
#      25K tokens, through the real data path on a WMT-length stand-in (newstest2013+2014 repeated),
#      then the bare compiled step of the same model on the same batches, in the same process: the
#      harness's share and each MFU from one run (end_to_end's --steps CASE:compiled);
#   1. attention_shapes: what a batch shape not met before costs each attention kernel, training and
#      decoding (PyTorch puts cuDNN first on sm90, and cuDNN builds a plan per new shape; a run with
#      exact lengths meets ~1,200 shapes in its first epoch); its rule decides model.attention_backend's
#      default, so it runs first (~1-2 minutes; not yet measured on a GPU);
#   2. test_gpu: tests/test_gpu.py's one-graph case (source widths of every alignment compile once)
#      under --runxfail, so that its failure prints the guards (it still failed on an H200 on
#      2026-11-27, with the round's base model building one graph), beam search's reads per step,
#      and decoding through CUDA graphs against the growing caches;
#   3. generation: greedy and beam 4 against Hugging Face `generate` on the same model, with and
#      without CUDA graphs (`eval.cuda_graphs`, not yet timed on a GPU; without them it was
#      measured on an H200 on 2026-11-27: ~150 s with its training);
#   4. gpu_round: the eager and compiled base (the reference and the figure to beat), the compiled
#      base with its residual stream in bf16 (model.residual_bf16: the norm/dropout/residual kernels'
#      bytes: 29% of the compiled base step on an H200, gpu-h200-2026-11-27; not yet measured), then CUDA
#      graphs at 4K tokens' host-bound steps (they ended a process once: that variant now runs in a
#      process of its own, so a crash is its row and the round goes on), then what earlier rounds left,
#      and last the compiled base under max-autotune (matmul epilogues fused; its own process too);
#   5. startup: where `ablate train`'s start-up goes, a table's first run and its next (the cache;
#      the next run has not been reached on a GPU);
#   6. test_gpu_sync: no host sync in the step, per variant (13 variants passed on an H200 on 2026-11-27);
#   7. profile: where the compiled base and big steps (and the eager base step) spend their time
#      (gpu_round --profile; measured on an H200 on 2026-11-27, so last).
# Output ($OUT, default /tmp/gpu-session): summary.txt, device.txt, five benchmarks' markdown tables
# (startup's only in the archive), and session.tgz with every log, JSON and profile: 8 files, what the
# device tool brings back at most. Needs no optuna, wandb or network. Carry three git-ignored things the
# GPU machine lacks:
#   .whl/ : omegaconf's wheel, for `ablate train` (the startup step), made once with
#           pip download --no-deps -d .whl omegaconf==2.4.0
#   local-data/de-en.gz : the Ding dictionary the generation step trains its model on, made once with
#           mkdir -p local-data && gzip -9 -c /usr/share/trans/de-en > local-data/de-en.gz
#   local-data/newstest/ : newstest2013 and 2014 (.en, .de), the end-to-end step's WMT-length text, made
#           once with  mkdir -p local-data/newstest && cp ../shared/data/newstest/newstest201[34].* local-data/newstest/
# Each is installed when the machine lacks it (without it, that step fails alone).
set -u
OUT=${OUT:-/tmp/gpu-session}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
W=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
deadline=$(( $(date +%s) + ${1:-520} ))
left() { local s=$(( deadline - $(date +%s) )); echo $(( s > 0 ? s : 0 )); }  # past the deadline: 0, not negative
min() { echo $(( $1 < $2 ? $1 : $2 )); }
max() { echo $(( $1 > $2 ? $1 : $2 )); }

if [ "$DEVICE" = cpu ]; then
  QUICK=(--quick --threads 1)
  E2E=(--steps "quick:compiled")
  PROFILE_STEPS="tiny:eager;tiny:compiled"
  REST_STEPS="tiny:eager, fused QKV;tiny:compiled, buckets 8, CUDA graphs"
else
  QUICK=()
  E2E=(--cases wmt-base-37k,wmt-big-37k --steps "wmt-base-37k:compiled;wmt-big-37k:compiled" --newstest-dir local-data/newstest)
  # compiled first (each compiles for 70-90 s on an H200); the round's eager base is the loss reference
  PROFILE_STEPS="wmt-base-37k:compiled;wmt-big-37k:compiled;wmt-base-37k:eager"
  REST_STEPS="wmt-base-37k:eager;wmt-base-37k:compiled;wmt-base-37k:compiled, residual bf16;\
wmt-base-37k:compiled, buckets 8, CUDA graphs;\
wmt-base-37k:compiled, loss chunks 8;wmt-base-37k:compiled, buckets 8;\
wmt-big-37k:compiled, all: flash, fused QKV, loss chunks 8;wmt-base-37k:compiled, max-autotune"
fi

# step NAME SECONDS_WANTED COMMAND...: runs COMMAND under a timeout of what is wanted or left,
# its output in $W/NAME.log; a line per step in summary.txt
step() {
  local name=$1 want=$2; shift 2
  local limit; limit=$(min "$want" $(( $(left) - 15 )))
  if [ "$limit" -lt 30 ]; then
    echo "$name: skipped, $(left) s left" | tee -a "$OUT/summary.txt"; return
  fi
  local t0; t0=$(date +%s)
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - t0 )) s (limit $limit s)" | tee -a "$OUT/summary.txt"
  tail -3 "$W/$name.log"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
  python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)"
  git rev-parse --short HEAD 2>/dev/null; } > "$OUT/device.txt"
cat "$OUT/device.txt"
: > "$OUT/summary.txt"
python3 -c "import omegaconf" 2>/dev/null || { [ -d .whl ] && python3 -m pip install -q --no-index --find-links .whl omegaconf; } \
  || echo "omegaconf: not installed (carry .whl); the startup step will fail" | tee -a "$OUT/summary.txt"
DING=$(python3 -c "from lightning_modules.config import DataConfig; print(DataConfig().ding_path)")
[ -f "$DING" ] || { [ -f local-data/de-en.gz ] && mkdir -p "$(dirname "$DING")" && gunzip -c local-data/de-en.gz > "$DING"; } \
  || echo "Ding: not installed (carry local-data/de-en.gz); the generation step will fail" | tee -a "$OUT/summary.txt"

PYTEST=(python3 -m pytest -q -p no:cacheprovider -rxXs --show-capture=no --tb=short tests/test_gpu.py)
step end_to_end 330 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only end_to_end "${E2E[@]}" \
  --out "$W/end_to_end"
step attention_shapes 150 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only attention_shapes \
  --out "$W/attention_shapes"
step test_gpu 150 "${PYTEST[@]}" --runxfail -k "one_graph or beam_search or cuda_graphs"
step generation 230 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only generation --out "$W/generation"
step gpu_round 260 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only gpu_round \
  --budget-s "$(max 10 "$(min 245 $(( $(left) - 30 )))")" --out "$W/gpu_round" --steps "$REST_STEPS"
step startup 180 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only startup --out "$W/startup"
step test_gpu_sync 300 "${PYTEST[@]}" -k "synchronise and not graphs"
step profile 330 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only gpu_round --profile \
  --budget-s "$(max 10 "$(min 315 $(( $(left) - 30 )))")" --out "$W/profile" --steps "$PROFILE_STEPS"

for name in end_to_end attention_shapes profile gpu_round generation; do
  [ -f "$W/$name/results.md" ] && cp "$W/$name/results.md" "$OUT/$name.md"
done
tar czf "$OUT/session.tgz" -C "$W" .
rm -rf "$W"
