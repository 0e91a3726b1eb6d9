#!/usr/bin/env bash
# One device call of the accuracy study: install FLA from .whl/ (carried), then per model train,
# evaluate every mode and plot; everything that comes back is written under $OUT. One model
# writes six files (a call brings back at most eight): log_<model>.txt, <model>_train.json,
# accuracy_<model>_h200.json, accuracy_<model>_curves_h200.json, accuracy_<model>_kl_h200.png,
# skip_study_<model>_trained_h200.json.
#   bash perf/accuracy/run_on_device.sh gdn|mamba2 [train minutes, default 3] [evaluate args...]
#   e.g. a smoke run: bash perf/accuracy/run_on_device.sh gdn 0.5 --tokens 1024 --rows 2
#   both models in one call, side by side on the one GPU (each trains for the given minutes
#   while the other does, so each takes fewer steps than alone); no plot and no skip study, so
#   that the eight files fit (draw the plots here: python -m perf.accuracy.plot FILE):
#   bash perf/accuracy/run_on_device.sh both 3
#   TRAIN_PATH=hf bash ...: train.py --path (default train; see perf/accuracy/model.py)
# Set REPLAYSSM_COMMIT=<hash> in the command (the device copy has no .git).
set -euo pipefail
model=${1:?model: gdn, mamba2 or both}; shift
minutes=${1:-3}; shift || true
OUT=${OUT:-/tmp/replayssm_out}
mkdir -p "$OUT" /tmp/acc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
export REPLAYSSM_CACHE_DIR=${REPLAYSSM_CACHE_DIR:-/tmp/replayssm_cache}
trap 'tail -n 30 "$OUT"/log_*.txt' ERR  # a failed step shows its log here too

# study MODEL PLOT [evaluate args...]: train, evaluate (and plot when PLOT is 1), logging to log_MODEL.txt.
study() {
  local m=$1 plot=$2; shift 2
  local log="$OUT/log_$m.txt"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$log"
  python3 -m perf.accuracy.train --model "$m" --minutes "$minutes" --path "${TRAIN_PATH:-train}" \
    --out "/tmp/acc/$m.pt" >> "$log" 2>&1
  cp "/tmp/acc/${m}_train.json" "$OUT/"
  python3 -m perf.accuracy.evaluate --weights "/tmp/acc/$m.pt" --out-dir "$OUT" "$@" >> "$log" 2>&1
  if [[ $plot == 1 ]]; then
    python3 -m perf.accuracy.plot "$OUT/accuracy_${m}_curves_h200.json" >> "$log" 2>&1 || true
  fi
}

if [[ $model == both ]]; then
  study gdn 0 --skip-every 0 "$@" & gdn_pid=$!
  study mamba2 0 --skip-every 0 "$@" & mamba2_pid=$!
  rc=0
  wait "$gdn_pid" || rc=$?
  wait "$mamba2_pid" || rc=$?
  tail -n 12 "$OUT/log_gdn.txt" "$OUT/log_mamba2.txt"
  exit "$rc"
fi
study "$model" 1 "$@"
tail -n 16 "$OUT/log_$model.txt"
