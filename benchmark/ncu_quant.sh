#!/usr/bin/env bash
# ncu of one Sage quantizer call (benchmark/quant_profile.py), whole and K/V-only, at H=14 S=37760,
# with the sections that say what limits it (speed of light, memory workload, warp states).
# Run on the GPU machine from the repository root with a site of installed wheels:
#   SITE=/tmp/site benchmark/ncu_quant.sh OUTDIR
set -uo pipefail
out=${1:?output folder}
mkdir -p "$out"
M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex_op_write.sum,lts__t_sector_hit_rate.pct
for kv in "" --kv-only; do
  PYTHONPATH=$SITE timeout 240 ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --metrics "$M" \
    python3 benchmark/quant_profile.py --shape 14,37760 $kv > "$out/ncu$kv.txt" 2>&1
  echo "ncu $kv rc=$?" >> "$out/ncu$kv.txt"
done
