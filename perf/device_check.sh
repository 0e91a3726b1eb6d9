#!/usr/bin/env bash
# One device call: GPU test suite + benchmarks, everything written under $OUT.
#   bash perf/device_check.sh [tests|bench|spec|sanitize|all] [bench args, e.g. --family gdn --batches 1 64 256]
#   (bench: perf/bench_decode.py; spec: perf/bench_spec.py; sanitize: perf/sanitize_driver.py under
#    compute-sanitizer memcheck, racecheck and synccheck, or TOOLS="racecheck"; all: tests + bench)
#   TESTS="tests/gpu/test_mamba2_verify.py" bash perf/device_check.sh tests   (a subset of the suite)
set -uo pipefail
what=${1:-all}; shift || true
OUT=${OUT:-/tmp/replayssm_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export REPLAYSSM_CACHE_DIR=${REPLAYSSM_CACHE_DIR:-/tmp/replayssm_cache}
# the device copy has no .git: pass REPLAYSSM_COMMIT=<hash> in the command
export REPLAYSSM_COMMIT=${REPLAYSSM_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
# optional peers carried as wheels (.whl, ignored by git): FLA for the cross-check tests
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
# modules built here beforehand (perf/prebuild_modules.py; carry .gl/aot.tar.xz): served where
# they match this tree's sources, so the suite's pre-warm compiles only what they lack
if [[ -f .gl/aot.tar.xz ]]; then
  aot=$(bash perf/unpack_aot.sh .gl/aot.tar.xz) \
    && export REPLAYSSM_AOT_DIR=$aot${REPLAYSSM_AOT_DIR:+:$REPLAYSSM_AOT_DIR} \
    && echo "prebuilt modules: $(ls "$aot/90a" | wc -l) from .gl/aot.tar.xz (REPLAYSSM_AOT_DIR)"
fi
rc=0
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -m gpu ${TESTS:-tests/gpu} -q -rs --durations=15 -o faulthandler_timeout=60 --junitxml="$OUT/gpu_tests.xml" -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}
fi
if [[ $what == bench || $what == all ]]; then
  python3 perf/bench_decode.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
  [[ $rc == 0 ]] && rc=${PIPESTATUS[0]}
fi
if [[ $what == spec ]]; then
  python3 perf/bench_spec.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_spec.log"
  [[ $rc == 0 ]] && rc=${PIPESTATUS[0]}
fi
if [[ $what == sanitize ]]; then
  python3 perf/sanitize_driver.py 2>&1 | tee "$OUT/sanitize_warmup.log"  # JIT-compiles outside the tools
  [[ $rc == 0 ]] && rc=${PIPESTATUS[0]}
  for tool in ${TOOLS:-memcheck racecheck synccheck}; do
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool $tool --error-exitcode 3 \
      python3 perf/sanitize_driver.py 2>&1 | tee "$OUT/sanitize_$tool.log" | tail -4
    t=${PIPESTATUS[0]}; echo "compute-sanitizer $tool: exit $t"
    [[ $rc == 0 ]] && rc=$t
  done
fi
exit $rc
