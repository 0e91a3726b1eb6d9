#!/usr/bin/env bash
# A/B on the device: the replay decode of a base revision and of the working tree, side by side in
# one call (same machine, same clocks, one after the other), written as ONE result file so that
# the call's file limit never drops a variant.
#
# Here (no GPU), once per base:   bash perf/ab_device.sh prepare d7fcbf2     # -> .gl/base (ignored)
# On the device (carry .gl/base): bash perf/ab_device.sh run mamba2:fp32+fp8,fp8_single gdn:bf16 \
#                                      -- --batches 256 --phases lockstep staggered
# Writes $OUT/ab.json (every row tagged `variant` = base | new, `variant_commit`) and $OUT/ab.log.
# Each tree's modules are built in parallel first (perf/profile_step.py, a few steps at B = 8, in
# its own JIT cache), then each family's benchmark runs for base, then for new.
# BENCH=skip runs perf/bench_skip.py (decay skipping; families mamba2 and gdn) instead of
# perf/bench_decode.py. BENCH=spec runs perf/bench_spec.py (the verify + commit round; FORMAT fp32,
# fp32+bf16, fp32+fp8 or fp32+nvfp4 for its --read-dtype, bf16 for a bf16 checkpoint; the bench
# args pass on, e.g. -- --batches 256 --drafts 8 16 --trees binary7 --no-conventional). RUNS=n
# repeats every benchmark n times, base then new each time (rows carry `run`). A tree's
# .gl/aot.tar.xz (perf/prebuild_modules.py, run in that tree; --bench-spec ARGS for BENCH=spec) is
# served to that tree's runs only. GPU tests in the same call: then TESTS=... device_check.sh tests.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cmd=${1:-}; shift || true
if [[ $cmd == prepare ]]; then
  rev=${1:?"prepare REV: the base revision"}
  rm -rf "$root/.gl/base" && mkdir -p "$root/.gl/base"
  git -C "$root" archive "$rev" | tar -x -C "$root/.gl/base"
  git -C "$root" rev-parse --short=12 "$rev" > "$root/.gl/base/COMMIT"
  echo "base $(cat "$root/.gl/base/COMMIT") in .gl/base: name it in the run's carry"
  exit 0
fi
[[ $cmd == run ]] || { echo "usage: ab_device.sh prepare REV | run FAMILY:FORMAT[,FORMAT] ... [-- bench args]" >&2; exit 2; }
[[ -d $root/.gl/base ]] || { echo "no .gl/base: run 'prepare REV' here and carry .gl/base" >&2; exit 2; }
specs=()
while [[ $# -gt 0 && $1 != -- ]]; do specs+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
OUT=${OUT:-/tmp/replayssm_out}
mkdir -p "$OUT" /tmp/ab
res=$(mktemp -d /tmp/ab/results.XXXXXX)  # this invocation's result files only (the JIT caches stay shared)
base_commit=$(cat "$root/.gl/base/COMMIT" 2>/dev/null || echo unknown)
new_commit=${REPLAYSSM_COMMIT:-$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo worktree)}
declare -A dirs=([base]=$root/.gl/base [new]=$root)
declare -A aot=([base]= [new]=)
for v in base new; do
  if [[ -f ${dirs[$v]}/.gl/aot.tar.xz ]]; then
    aot[$v]=$(bash "$root/perf/unpack_aot.sh" "${dirs[$v]}/.gl/aot.tar.xz")
  fi
done
case ${BENCH:-decode} in
  decode) bench=(perf/bench_decode.py --no-peers) ;;
  skip) bench=(perf/bench_skip.py) ;;
  spec) bench=(perf/bench_spec.py) ;;  # (it builds its own modules first)
  *) echo "BENCH: expected decode, skip or spec, got ${BENCH}" >&2; exit 2 ;;
esac
# bench_spec.py takes one format a run: its read copy (--read-dtype) or the checkpoint's dtype
spec_format() {
  case $1 in
    fp32) ;;
    fp32+bf16) echo "--read-dtype bfloat16" ;;
    fp32+fp8) echo "--read-dtype float8_e4m3fn" ;;
    fp32+nvfp4) echo "--read-dtype nvfp4" ;;
    bf16) echo "--state-dtype bfloat16" ;;
    *) echo "BENCH=spec: FORMAT expected fp32, fp32+bf16, fp32+fp8, fp32+nvfp4 or bf16, got $1" >&2; exit 2 ;;
  esac
}
if [[ ${BENCH:-decode} == spec ]]; then  # every format checked before anything runs
  for spec in "${specs[@]}"; do for f in $(echo "${spec#*:}" | tr , ' '); do spec_format "$f" > /dev/null; done; done
fi
[[ ${BENCH:-decode} == spec ]] || for v in base new; do
  for spec in "${specs[@]}"; do
    fam=${spec%%:*}
    for f in $(echo "${spec#*:}" | tr , ' '); do
      (cd "${dirs[$v]}" && PYTHONPATH=${dirs[$v]} REPLAYSSM_CACHE_DIR=/tmp/ab/cache_$v REPLAYSSM_AOT_DIR=${aot[$v]} \
        python3 perf/profile_step.py --family "$fam" --batch 8 --format "$f" --steps 1 > /dev/null 2>&1 \
        || echo "build of $v $fam $f failed (the benchmark will build it, or report it)") &
    done
  done
done
wait
: > "$OUT/ab.log"
for run in $(seq 1 "${RUNS:-1}"); do
  for spec in "${specs[@]}"; do
    fam=${spec%%:*}
    formats=$(echo "${spec#*:}" | tr , ' ')
    for v in base new; do
      d=${dirs[$v]}
      commit=$([[ $v == base ]] && echo "$base_commit" || echo "$new_commit")
      if [[ ${BENCH:-decode} == spec ]]; then
        runs=(); for f in $formats; do runs+=("--families $fam $(spec_format "$f") --name ab_${fam}_${f}_r${run}_$v"); done
      else
        runs=("--family $fam --formats $formats --name ab_${fam}_r${run}_$v")
      fi
      for a in "${runs[@]}"; do
        # shellcheck disable=SC2086
        (cd "$d" && PYTHONPATH=$d REPLAYSSM_CACHE_DIR=/tmp/ab/cache_$v REPLAYSSM_AOT_DIR=${aot[$v]} \
          REPLAYSSM_COMMIT=$commit python3 "${bench[@]}" $a "$@" --out "$res") 2>&1 | sed "s/^/$v /" \
          | tee -a "$OUT/ab.log" | grep -E "B=|rror"
      done
    done
  done
done
python3 - "$OUT/ab.json" "$res" "$base_commit" "$new_commit" "$*" "${specs[@]}" <<'EOF'
import json, pathlib, sys
out, res, base, new, args, specs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
rows, metas = [], {}
for f in sorted(pathlib.Path(res).glob("ab_*.json")):
    d = json.loads(f.read_text())
    variant = f.stem.rsplit("_", 1)[1]
    run = int(f.stem.rsplit("_r", 1)[1].split("_")[0])
    for r in d["rows"]:
        r["variant"], r["variant_commit"], r["run"] = variant, base if variant == "base" else new, run
    rows += d["rows"]
    metas[f.stem] = d["meta"]
meta = dict(commit=new, base_commit=base, command=f"perf/ab_device.sh run {' '.join(specs)} -- {args}", runs=metas)
if metas:
    first = next(iter(metas.values()))
    meta.update(gpu=first.get("gpu"), date=first.get("date"))
pathlib.Path(out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
print(f"wrote {out}: {len(rows)} rows")
EOF
