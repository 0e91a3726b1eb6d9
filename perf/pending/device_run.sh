#!/usr/bin/env bash
# One device call for the one-launch GDN/KDA read-copy verify (perf/pending/README.md): GPU tests,
# memcheck, the spec bench of this tree (new) and of the base tree in .gl/base (perf/ab_device.sh
# prepare 901647b), racecheck, each only if the deadline leaves room. Each tree's prebuilt modules
# come from its own .gl/aot*.tar.xz (perf/prebuild_modules.py, python -m replayssm.aot), as in
# perf/ab_device.sh. Carry .gl.
#   C=<commit> DEADLINE=560 bash .gl/device_run.sh    (STEPS="test memcheck new base racecheck")
set -uo pipefail
C=${C:-worktree}; DEADLINE=${DEADLINE:-560}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 REPLAYSSM_COMMIT=$C
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
mkdir -p /tmp/aot_new /tmp/aot_base
for f in .gl/aot*.tar.xz; do tar -xJf "$f" -C /tmp/aot_new; done
for f in .gl/base/.gl/aot*.tar.xz; do [[ -f $f ]] && tar -xJf "$f" -C /tmp/aot_base; done
el "unpacked: new $(ls /tmp/aot_new/90a | wc -l) modules, base $(ls /tmp/aot_base/90a 2>/dev/null | wc -l)"
for step in ${STEPS:-test memcheck new base racecheck}; do
  l=$(left)
  case $step in
  test)
    REPLAYSSM_CACHE_DIR=/tmp/cache_new REPLAYSSM_AOT_DIR=/tmp/aot_new timeout $(( l < ${TTL:-260} ? l : ${TTL:-260} )) \
      python3 -m pytest -m gpu tests/gpu/test_delta_verify.py tests/gpu/test_decay_skip_verify.py ${TK:+-k "$TK"} \
      -q -rs --durations=10 -o faulthandler_timeout=120 -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
    el "tests rc $?: $(tail -1 "$OUT/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20 ;;
  memcheck|racecheck)
    (( l < 45 )) && { el "no time for $step"; continue; }
    REPLAYSSM_CACHE_DIR=/tmp/cache_new REPLAYSSM_AOT_DIR=/tmp/aot_new PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
      timeout $(( l - 5 < ${STL:-100} ? l - 5 : ${STL:-100} )) compute-sanitizer --tool $step --error-exitcode 3 \
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_delta_verify.py \
      -k "TestDeltaPersistentVerifyReadCopy and fp8 and chain_random" > "$OUT/sanitize_$step.log" 2>&1
    el "sanitizer $step rc $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitize_$step.log" | tail -2 | tr '\n' ' ')" ;;
  new|base)
    (( l < 60 )) && { el "no time for bench $step"; continue; }
    if [[ $step == new ]]; then d=$PWD; c=$C; else d=$PWD/.gl/base; c=$(cat "$d/COMMIT"); fi
    (cd "$d" && PYTHONPATH=$d REPLAYSSM_CACHE_DIR=/tmp/cache_$step REPLAYSSM_AOT_DIR=/tmp/aot_$step REPLAYSSM_COMMIT=$c \
      timeout $(( l - 5 < ${BTL:-150} ? l - 5 : ${BTL:-150} )) python3 perf/bench_spec.py --families ${FAM:-gdn kda} \
      --batches 256 --drafts 4 8 --trees tree4 binary7 --read-dtype float8_e4m3fn --verify-kernels persistent \
      --phases lockstep staggered --kernel-split --reps ${REPS:-15} --name spec_exact_flush_$step --out "$OUT") \
      > "$OUT/bench_$step.log" 2>&1
    el "bench $step rc $?"; grep -vE "^\s*$" "$OUT/bench_$step.log" | tail -${BTAIL:-24} ;;
  esac
done
el done
