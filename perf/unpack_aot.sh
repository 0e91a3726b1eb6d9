#!/usr/bin/env bash
# Prints the folder that serves the modules of a prebuilt archive (perf/prebuild_modules.py's
# .gl/aot.tar.xz; point REPLAYSSM_AOT_DIR at it), unpacking the archive on its first use only:
# /tmp/replayssm_aot_cache/<its md5, 12 digits>. The scripts of one device call that serve the same
# archive (perf/verify_ab_call.sh, perf/ab_device.sh, perf/device_check.sh, perf/profile_device.sh)
# then unpack it once, and another archive never meets another's modules.
#   dir=$(bash perf/unpack_aot.sh .gl/aot.tar.xz)
set -euo pipefail
archive=${1:?"usage: unpack_aot.sh ARCHIVE"}
dir=/tmp/replayssm_aot_cache/$(md5sum < "$archive" | cut -c1-12)
if [[ ! -f $dir/.unpacked ]]; then
  rm -rf "$dir.part" && mkdir -p "$dir.part"
  tar -xJf "$archive" -C "$dir.part"
  touch "$dir.part/.unpacked"
  rm -rf "$dir" && mv "$dir.part" "$dir"
fi
echo "$dir"
