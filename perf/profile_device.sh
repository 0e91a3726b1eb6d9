#!/usr/bin/env bash
# One device call that profiles instead of testing: the bandwidth ceilings (perf/bandwidth_probe.cu)
# and Nsight Compute on one non-flush step and one flush step of a replay decode configuration.
#   bash perf/profile_device.sh [profile_step.py args, e.g. --family mamba2 --batch 256 --format fp32+fp8]
# Writes under $OUT, per profile (tag: the arguments' values, e.g. mamba2_256_fp32_fp8, with TAG's
# prefix): ncu_<tag>_breakdown.txt (perf/sass_breakdown.py of the first kernel: per opcode,
# execution count and block) and ncu_<tag>.tar.xz (the details page, stall reasons, SASS source
# counters and the run's log), so that four profiles stay within a call's eight files; with
# KEEP_REP=1 also the report, ncu_<tag>.ncu-rep (about 15 MB for four launches at B = 256); and
# bandwidth.txt (BANDWIDTH=0 skips the probe).
# TREE=DIR profiles the tree in DIR (e.g. .gl/base from perf/ab_device.sh prepare, with its own
# JIT cache and its .gl/aot.tar.xz if it has one) instead of this one.
set -uo pipefail
OUT=${OUT:-/tmp/replayssm_out}
mkdir -p "$OUT"
tree=$(cd "${TREE:-.}" && pwd)
cache=/tmp/replayssm_cache$([[ -n ${TREE:-} ]] && echo "_$(basename "$tree")")
export REPLAYSSM_CACHE_DIR=${REPLAYSSM_CACHE_DIR:-$cache}
if [[ -n ${TREE:-} && -f $tree/.gl/aot.tar.xz ]]; then
  REPLAYSSM_AOT_DIR=$(bash "$(dirname "${BASH_SOURCE[0]}")/unpack_aot.sh" "$tree/.gl/aot.tar.xz") && export REPLAYSSM_AOT_DIR
fi
if [[ ${BANDWIDTH:-1} == 1 ]]; then
  nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/bandwidth_probe perf/bandwidth_probe.cu && /tmp/bandwidth_probe | tee "$OUT/bandwidth.txt"
fi
tag=${TAG:-}$(echo "$*" | sed 's/--[a-z-]* //g; s/[^A-Za-z0-9]/_/g')  # e.g. mamba2_256_fp32_fp8
work=/tmp/profile_$tag
rm -rf "$work" && mkdir -p "$work"
cd "$tree" || exit 2
export PYTHONPATH=$tree${PYTHONPATH:+:$PYTHONPATH}
python3 perf/profile_step.py --steps 2 "$@" > /dev/null  # JIT-compiles outside the profiler
# From empty rings, launches 16, 32, 48 (counting from 0) flush: a flush leaves its own record in
# the ring. Launches 29 to 32 are three non-flush steps and a flush (LAUNCHES=1: the first only;
# SKIP=32 LAUNCHES=1: the flush alone). A verify (--draft-len T): KERNEL=replay_verify and a
# SKIP of your choice (one verify launch per round).
ncu --clock-control none -k regex:${KERNEL:-replay_decode} --launch-skip ${SKIP:-29} --launch-count ${LAUNCHES:-4} --set full \
  -o "$work/ncu_$tag" python3 perf/profile_step.py "$@" > "$work/ncu_${tag}_run.log" 2>&1
ncu --import "$work/ncu_$tag.ncu-rep" --page details > "$work/ncu_${tag}.txt" 2>&1
ncu --import "$work/ncu_$tag.ncu-rep" --page raw | grep -E "issue_stalled.*per_warp_active|warps_issue_stalled_[a-z_]*_per_issue_active|inst_executed.sum |dram__bytes_(read|write).sum " > "$work/ncu_${tag}_stalls.txt" 2>&1
ncu --import "$work/ncu_$tag.ncu-rep" --page source --print-source sass --csv > "$work/ncu_${tag}_sass.csv" 2>&1
python3 perf/sass_breakdown.py "$work/ncu_${tag}_sass.csv" > "$OUT/ncu_${tag}_breakdown.txt" 2>&1  # per opcode, count, block
tar -cJf "$OUT/ncu_$tag.tar.xz" -C "$work" --exclude "*.ncu-rep" .
[[ ${KEEP_REP:-0} == 1 ]] && cp "$work/ncu_$tag.ncu-rep" "$OUT/"
tail -3 "$work/ncu_${tag}_run.log"
grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$work/ncu_${tag}.txt"
