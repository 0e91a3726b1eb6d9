#!/usr/bin/env bash
# One device call for kernel experiments: GPU tests of the working tree (and of the base tree in
# .gl/base), then A/Bs of perf/ab_device.sh against that base, then an Nsight Compute profile of
# the working tree; every phase after the first only while the call's deadline leaves it time.
# Everything lands in $OUT/all.tgz (packed after each phase, so a call cut short keeps what ran).
#
# Here, before the call: bash perf/ab_device.sh prepare REV (-> .gl/base), and in each tree
# perf/prebuild_modules.py for the tests and the A/Bs' --bench-spec (-> .gl/aot.tar.xz); carry
# .gl/base and .gl/aot.tar.xz. On the device, e.g.:
#   NEW_TESTS='tests/gpu/test_delta_verify.py -k "kda and Persistent"' \
#   BASE_TESTS='tests/gpu/test_delta_verify.py -k L32_T16' \
#   AB='kda:fp32 -- --drafts 4 8 16 --trees binary15;gdn:fp32 -- --drafts 8 --trees binary7' \
#   PROFILE='--family kda --batch 256 --draft-len 16' bash perf/verify_ab_call.sh
# LATE_TESTS: more tests of the working tree, after the A/Bs, in the time the profile leaves.
# AB: ';'-separated perf/ab_device.sh specs (BENCH=spec, RUNS=2), each followed by AB_ARGS
# (default: B = 256, lockstep, no conventional verify, per-kernel split). PROFILE: the arguments
# of perf/profile_device.sh (one verify launch, KERNEL=replay_verify_persistent). DEADLINE: the
# seconds the call may use (default 585 of the device's 600).
set -u
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
left() { echo $((${DEADLINE:-585} - $(el))); }
FINAL=${OUT:-/tmp/replayssm_out}
mkdir -p "$FINAL"
OUT=$(mktemp -d /tmp/verify_ab_call.XXXXXX)  # what the phases write, packed into $FINAL/all.tgz
export OUT
export PYTHONUNBUFFERED=1
pack() { tar -czf "$FINAL/all.tgz" -C "$OUT" .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
root=$PWD base=$PWD/.gl/base
# Each tree's prebuilt modules (unpacked once: perf/ab_device.sh serves the same folders) and JIT
# cache (ab_device.sh's, so a module either builds is built once).
declare -A aot=([new]= [base]=)
for v in new base; do
  d=$root && [[ $v == base ]] && d=$base
  [[ -f $d/.gl/aot.tar.xz ]] && aot[$v]=$(bash perf/unpack_aot.sh "$d/.gl/aot.tar.xz")
  echo "prebuilt modules, $v: $(ls "${aot[$v]:-/nonexistent}/90a" 2> /dev/null | wc -l)"
done
pytest_in() {  # tree, variant, time limit, log name, pytest args
  local tree=$1 v=$2 t=$3 log=$4
  shift 4
  (cd "$tree" && eval "PYTHONPATH=$tree REPLAYSSM_CACHE_DIR=/tmp/ab/cache_$v REPLAYSSM_AOT_DIR=${aot[$v]} timeout $t \
    python3 -m pytest -m gpu $* -q -rs -o faulthandler_timeout=60 -p no:cacheprovider" > "$OUT/$log" 2>&1)
  echo "$log: rc=$? at $(el)s"
  tail -3 "$OUT/$log"
}
if [[ -n ${NEW_TESTS:-} ]]; then
  pytest_in "$root" new "${NEW_TESTS_LIMIT:-200}" gpu_tests_new.log "$NEW_TESTS"
  pack
fi
if [[ -n ${BASE_TESTS:-} && -d $base ]]; then
  pytest_in "$base" base 90 gpu_tests_base.log "$BASE_TESTS"
  pack
fi
IFS=';' read -r -a specs <<< "${AB:-}"
n=0
for spec in "${specs[@]}"; do
  n=$((n + 1))
  if (($(left) < 120)); then
    echo "A/B $n ($spec): skipped, $(left) s left"
    continue
  fi
  mkdir -p "$OUT/ab_$n"
  # shellcheck disable=SC2086  # the spec and AB_ARGS are word lists
  (OUT=$OUT/ab_$n BENCH=spec RUNS=${RUNS:-2} timeout $(($(left) - 60)) bash perf/ab_device.sh run $spec \
    ${AB_ARGS:---batches 256 --phases lockstep --no-conventional --kernel-split} > "$OUT/ab_$n/stdout.log" 2>&1)
  echo "A/B $n ($spec): rc=$? at $(el)s"
  grep -h "round=" "$OUT/ab_$n/ab.log" 2> /dev/null | sed 's/  */ /g' | cut -c1-110
  pack
done
reserve=0 && [[ -n ${PROFILE:-} ]] && reserve=90  # the profile's share
if [[ -n ${LATE_TESTS:-} ]] && (($(left) - reserve > 40)); then
  pytest_in "$root" new $(($(left) - reserve)) gpu_tests_new_late.log "$LATE_TESTS"
  pack
fi
if [[ -n ${PROFILE:-} ]] && (($(left) > 60)); then
  mkdir -p "$OUT/profile"
  # shellcheck disable=SC2086
  (OUT=$OUT/profile REPLAYSSM_CACHE_DIR=/tmp/ab/cache_new REPLAYSSM_AOT_DIR=${aot[new]} KERNEL=${KERNEL:-replay_verify_persistent} SKIP=${SKIP:-6} \
    LAUNCHES=1 BANDWIDTH=0 timeout $(left) bash perf/profile_device.sh $PROFILE > "$OUT/profile/stdout.log" 2>&1)
  echo "profile: rc=$? at $(el)s"
  ls "$OUT/profile"
fi
pack
