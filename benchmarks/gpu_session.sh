#!/bin/bash
# One prepared GPU session (issue #40): everything a lent H100/H200 should measure, in priority
# order, inside one call's time, so that a session spends its device time measuring.
#
#   bash benchmarks/gpu_session.sh [SECONDS]          # on the GPU machine; SECONDS: the whole call (default 520)
#   DEVICE=cpu bash benchmarks/gpu_session.sh 240     # the same steps at tiny sizes on a CPU (its test)
#
# Steps, each cut to what is left (a step that no longer fits is skipped and said so in summary.txt):
#   1. profile: where the compiled base and big steps (and the eager base step, if time is left)
#      spend their time (gpu_round --profile), the figures the issue's "what stands in the way" needs;
#   2. generation: greedy and beam 4 against Hugging Face `generate` on the same model;
#   3. startup: where `ablate train`'s start-up goes, a table's first run and its next (the cache);
#   4. tests/test_gpu.py (not the CUDA-graph case): no host sync in the step per variant, beam
#      search's reads per step, the one-graph case;
#   5. gpu_round: the variants the earlier rounds left, CUDA graphs last (it ended a process once).
# Output ($OUT, default /tmp/gpu-session): summary.txt, device.txt, each step's markdown table,
# and session.tgz with every log, JSON and profile (the device tool brings back at most 8 files).
# Needs no optuna, wandb, corpus or network. The startup step runs `ablate train`, which needs
# omegaconf: carry its wheel in .whl/ (git-ignored), made once with
#   pip download --no-deps -d .whl omegaconf==2.4.0
# and installed here when the machine lacks it (without it that step fails alone).
set -u
OUT=${OUT:-/tmp/gpu-session}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
W=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
deadline=$(( $(date +%s) + ${1:-520} ))
left() { echo $(( deadline - $(date +%s) )); }
min() { echo $(( $1 < $2 ? $1 : $2 )); }
max() { echo $(( $1 > $2 ? $1 : $2 )); }

if [ "$DEVICE" = cpu ]; then
  QUICK=(--quick --threads 1)
  PROFILE_STEPS="tiny:eager;tiny:compiled"
  REST_STEPS="tiny:eager, fused QKV;tiny:compiled, buckets 8, CUDA graphs"
else
  QUICK=()
  # compiled first (each compiles for 70-90 s on an H200); eager base last, if the budget leaves room
  PROFILE_STEPS="wmt-base-37k:compiled;wmt-big-37k:compiled;wmt-base-37k:eager"
  REST_STEPS="wmt-base-37k:eager;wmt-base-37k:compiled, buckets 8;wmt-base-37k:compiled, loss chunks 8;\
wmt-big-37k:compiled, all: flash, fused QKV, loss chunks 8;wmt-base-37k:compiled, buckets 8, CUDA graphs"
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

step profile 330 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only gpu_round --profile \
  --budget-s "$(max 10 "$(min 280 $(( $(left) - 60 )))")" --out "$W/profile" --steps "$PROFILE_STEPS"
step generation 150 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only generation --out "$W/generation"
step startup 120 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only startup --out "$W/startup"
step test_gpu 150 python3 -m pytest -q -p no:cacheprovider -rxXs tests/test_gpu.py -k "not graphs"
step gpu_round 600 python3 -m benchmarks --device "$DEVICE" "${QUICK[@]}" --only gpu_round \
  --budget-s "$(max 10 $(( $(left) - 75 )))" --out "$W/gpu_round" --steps "$REST_STEPS"

for name in profile gpu_round generation startup; do
  [ -f "$W/$name/results.md" ] && cp "$W/$name/results.md" "$OUT/$name.md"
done
tar czf "$OUT/session.tgz" -C "$W" .
rm -rf "$W"
