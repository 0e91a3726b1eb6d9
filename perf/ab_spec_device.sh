#!/usr/bin/env bash
# A/B of the speculative verify on the device: perf/bench_spec.py run for several source trees one
# after the other in one call (same machine, same clocks), each with its own prebuilt modules,
# repeated RUNS times, then optionally GPU tests of the working tree. All rows go to ONE result
# file, $OUT/ab_spec.json (every row tagged `variant`, `variant_commit` and `run`), so that the
# call's file limit never drops a variant.
#
# Here (no GPU), per base tree:
#   bash perf/ab_device.sh prepare 8ee4014 && mv .gl/base .gl/b1          # the tree (ignored)
#   (cd .gl/b1 && python perf/prebuild_modules.py --bench-spec "--families gdn --drafts 8" --out .gl/aot)
#   python perf/prebuild_modules.py --bench-spec "--families gdn --drafts 8" --out .gl/aot_bench   # this tree
# On the device (carry .gl/b1 and this tree's .gl/*.tar.xz):
#   VARIANTS="b1:.gl/b1:gdn new:.:gdn" ARGS="--batches 256 --drafts 8 --no-conventional --kernel-split" \
#     RUNS=2 TESTS="tests/gpu/test_delta_verify.py" REPLAYSSM_COMMIT=<hash> bash perf/ab_spec_device.sh
# VARIANTS: name:dir:families (families comma-separated); dir "." is this tree, which is served
# every .gl/*.tar.xz here, a base tree every DIR/.gl/*.tar.xz of its own. TESTS run with this
# tree's modules until DEADLINE seconds (default 540) of the call have passed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
t0=$(date +%s); elapsed() { echo $(( $(date +%s) - t0 )); }
OUT=${OUT:-/tmp/replayssm_out}
mkdir -p "$OUT/ab_spec"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
: "${VARIANTS:?VARIANTS=\"name:dir:families ...\"}"
here_aot=/tmp/ab_spec/aot_tests  # this tree's modules (the "." variant's, or unpacked for the tests)
for spec in $VARIANTS; do
  IFS=: read -r v d _ <<< "$spec"
  mkdir -p "/tmp/ab_spec/aot_$v"
  if [[ $d == . ]]; then archives=(.gl/*.tar.xz); here_aot=/tmp/ab_spec/aot_$v; else archives=("$d"/.gl/*.tar.xz); fi
  for a in "${archives[@]}"; do [[ -f $a ]] && tar -xJf "$a" -C "/tmp/ab_spec/aot_$v"; done
  echo "$v ($d): $(ls "/tmp/ab_spec/aot_$v/90a" 2>/dev/null | wc -l) prebuilt modules"
done
for run in $(seq 1 "${RUNS:-2}"); do
  for spec in $VARIANTS; do
    IFS=: read -r v d fams <<< "$spec"
    if [[ $d == . ]]; then c=${REPLAYSSM_COMMIT:-worktree}; else c=$(cat "$d/COMMIT" 2>/dev/null || echo unknown); fi
    # shellcheck disable=SC2086
    (cd "$d" && PYTHONPATH=$PWD REPLAYSSM_CACHE_DIR=/tmp/ab_spec/cache_$v REPLAYSSM_AOT_DIR=/tmp/ab_spec/aot_$v \
      REPLAYSSM_COMMIT=$c timeout "${VARIANT_LIMIT:-150}" python3 perf/bench_spec.py --families ${fams//,/ } \
      ${ARGS:-} --name "${v}_run$run" --out "$OUT/ab_spec" > "$OUT/ab_spec/${v}_run$run.log" 2>&1)
    echo "$v run $run: exit $? at $(elapsed) s"
    grep -h "round=" "$OUT/ab_spec/${v}_run$run.log" | sed 's/  */ /g' | cut -c1-100
  done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs, rows = [], []
for f in sorted(glob.glob(os.path.join(out, "ab_spec", "*_run*.json"))):
    d = json.load(open(f))
    tag = os.path.basename(f).rsplit(".", 1)[0]
    variant = tag.rsplit("_run", 1)[0]
    runs.append({"variant": variant, "run": tag, **d["meta"]})
    rows += [{"variant": variant, "variant_commit": d["meta"]["commit"], "run": tag, **r} for r in d["rows"]]
meta = {"runs": runs, "gpu": runs[0]["gpu"] if runs else None, "date": runs[0]["date"] if runs else None}
json.dump({"meta": meta, "rows": rows}, open(os.path.join(out, "ab_spec.json"), "w"), indent=1)
print(f"ab_spec.json: {len(rows)} rows from {len(runs)} runs")
PY
rc=0
if [[ -n ${TESTS:-} ]]; then
  if [[ $here_aot == /tmp/ab_spec/aot_tests ]]; then
    mkdir -p "$here_aot"
    for a in .gl/*.tar.xz; do [[ -f $a ]] && tar -xJf "$a" -C "$here_aot"; done
  fi
  left=$(( ${DEADLINE:-540} - $(elapsed) ))
  if (( left > 30 )); then
    # shellcheck disable=SC2086
    PYTHONPATH=$PWD REPLAYSSM_CACHE_DIR=/tmp/ab_spec/cache_tests REPLAYSSM_AOT_DIR=$here_aot \
      timeout "$left" python3 -m pytest -m gpu $TESTS -q -rs --durations=10 -o faulthandler_timeout=60 \
      -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
    rc=$?
    echo "tests: exit $rc at $(elapsed) s"; tail -3 "$OUT/gpu_tests.log"
  else
    echo "tests: not run, $left s left of DEADLINE"; rc=1
  fi
fi
tar -czf "$OUT/ab_spec_logs.tgz" -C "$OUT" ab_spec
exit $rc
