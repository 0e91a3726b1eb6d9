#!/usr/bin/env bash
# One device call that profiles instead of testing: the bandwidth ceilings (perf/bandwidth_probe.cu)
# and Nsight Compute on one non-flush step and one flush step of a replay decode configuration.
#   bash perf/profile_device.sh [profile_step.py args, e.g. --family mamba2 --batch 256 --format fp32+fp8]
# Writes under $OUT: bandwidth.txt, ncu_<family>_<format>.txt (details, stall reasons and SASS source counters of four launches)
# and ncu_<tag>_breakdown.txt (perf/sass_breakdown.py of the first kernel: per opcode, execution count and block); BANDWIDTH=0 skips the probe.
set -uo pipefail
OUT=${OUT:-/tmp/replayssm_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export REPLAYSSM_CACHE_DIR=${REPLAYSSM_CACHE_DIR:-/tmp/replayssm_cache}
if [[ ${BANDWIDTH:-1} == 1 ]]; then
  nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/bandwidth_probe perf/bandwidth_probe.cu && /tmp/bandwidth_probe | tee "$OUT/bandwidth.txt"
fi
tag=$(echo "$*" | sed 's/--[a-z-]* //g; s/[^A-Za-z0-9]/_/g')  # e.g. mamba2_256_fp32_fp8
python3 perf/profile_step.py --steps 2 "$@" > /dev/null  # JIT-compiles outside the profiler
# From empty rings, launches 16, 32, 48 (counting from 0) flush: a flush leaves its own record in
# the ring. Launches 29 to 32 are three non-flush steps and a flush (LAUNCHES=1: the first only;
# SKIP=32 LAUNCHES=1: the flush alone). A verify (--draft-len T): KERNEL=replay_verify and a
# SKIP of your choice (one verify launch per round).
ncu --clock-control none -k regex:${KERNEL:-replay_decode} --launch-skip ${SKIP:-29} --launch-count ${LAUNCHES:-4} --set full \
  -o "$OUT/ncu_$tag" python3 perf/profile_step.py "$@" > "$OUT/ncu_${tag}_run.log" 2>&1
ncu --import "$OUT/ncu_$tag.ncu-rep" --page details > "$OUT/ncu_${tag}.txt" 2>&1
ncu --import "$OUT/ncu_$tag.ncu-rep" --page raw | grep -E "issue_stalled.*per_warp_active|warps_issue_stalled_[a-z_]*_per_issue_active|inst_executed.sum |dram__bytes_(read|write).sum " > "$OUT/ncu_${tag}_stalls.txt" 2>&1
ncu --import "$OUT/ncu_$tag.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_${tag}_sass.csv" 2>&1
python3 perf/sass_breakdown.py "$OUT/ncu_${tag}_sass.csv" > "$OUT/ncu_${tag}_breakdown.txt" 2>&1  # per opcode, count, block
tail -3 "$OUT/ncu_${tag}_run.log"
grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$OUT/ncu_${tag}.txt"
