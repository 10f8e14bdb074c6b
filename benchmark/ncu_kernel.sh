#!/usr/bin/env bash
# ncu of one launch per dense contender (benchmark/kernel_profile.py: the flat Sage kernel on 128-
# and 64-key plans, the three-warpgroup one in an experiments build, cuDNN's FP8 SDPA) at H=14
# S=37760: sections that say where the cycles and the bytes go, then a few counters to set side by
# side (instructions per pipe, L2 / DRAM bytes). Counters only, no disassembly.
# Run on the GPU machine from the repository root with a site of installed wheels:
#   SITE=/tmp/site [SHAPE=14,37760] [Q=auto] [SET=sage|bf16|router] benchmark/ncu_kernel.sh OUTDIR
set -uo pipefail
out=${1:?output folder}
mkdir -p "$out"
run() {  # run NAME ncu-args...
  local name=$1; shift
  PYTHONPATH=$SITE:/tmp/cfe-site timeout 300 ncu --profile-from-start off "$@" \
    python3 benchmark/kernel_profile.py --shape "${SHAPE:-14,37760}" --q "${Q:-auto}" --set "${SET:-sage}" > "$out/$name.txt" 2>&1
  echo "ncu $name rc=$?" >> "$out/$name.txt"
}
run sections --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section InstructionStats --section WarpStateStats --section LaunchStats --section Occupancy
M=sm__cycles_elapsed.avg,smsp__inst_executed.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum
M=$M,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_uniform.sum
M=$M,lts__t_bytes.sum,lts__t_sectors_op_read.sum,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__thread_inst_executed.sum
run metrics --metrics "$M"
