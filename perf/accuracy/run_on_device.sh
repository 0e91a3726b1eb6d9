#!/usr/bin/env bash
# One device call of the accuracy study for one model: install FLA from .whl/ (carried), train,
# evaluate every mode, plot; everything that comes back is written under $OUT, in six files (a call
# brings back at most eight): log_<model>.txt, <model>_train.json, accuracy_<model>_h200.json,
# accuracy_<model>_curves_h200.json, accuracy_<model>_kl_h200.png, skip_study_<model>_trained_h200.json.
#   bash perf/accuracy/run_on_device.sh gdn|mamba2 [train minutes, default 3] [evaluate args...]
#   e.g. a smoke run: bash perf/accuracy/run_on_device.sh gdn 0.5 --tokens 1024 --rows 2
#   TRAIN_PATH=hf bash ...: train.py --path (default train; see perf/accuracy/model.py)
# Set REPLAYSSM_COMMIT=<hash> in the command (the device copy has no .git).
set -euo pipefail
model=${1:?model: gdn or mamba2}; shift
minutes=${1:-3}; shift || true
OUT=${OUT:-/tmp/replayssm_out}
mkdir -p "$OUT" /tmp/acc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
export REPLAYSSM_CACHE_DIR=${REPLAYSSM_CACHE_DIR:-/tmp/replayssm_cache}
log="$OUT/log_$model.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
python3 -m perf.accuracy.train --model "$model" --minutes "$minutes" --path "${TRAIN_PATH:-train}" --out "/tmp/acc/$model.pt" 2>&1 | tee -a "$log"
cp "/tmp/acc/${model}_train.json" "$OUT/"
python3 -m perf.accuracy.evaluate --weights "/tmp/acc/$model.pt" --out-dir "$OUT" "$@" 2>&1 | tee -a "$log"
python3 -m perf.accuracy.plot "$OUT/accuracy_${model}_curves_h200.json" 2>&1 | tee -a "$log" || true
