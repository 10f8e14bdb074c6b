#!/usr/bin/env bash
# Several benchmark/device_run.sh invocations in one device call, each under its own time limit and
# into its own $OUT subfolder (so a step cut off at its limit still returns what the others wrote):
#   benchmark/device_call.sh NAME:SECONDS:STEP[+STEP...][:ENV=VALUE[@ENV=VALUE...]] ...
# e.g. benchmark/device_call.sh suite:150:suite c14:260:contenders-sglang:SBS_CONTENDER_SHAPES=14,37760
set -uo pipefail
cd "$(dirname "$0")/.."
BASE=${OUT:-$PWD/device-out}
for spec in "$@"; do
  IFS=: read -r name secs steps envs <<< "$spec"
  (
    IFS=@ read -ra kv <<< "${envs:-}"
    for e in "${kv[@]}"; do export "${e?}"; done
    # shellcheck disable=SC2086
    OUT="$BASE/$name" timeout "$secs" bash benchmark/device_run.sh ${steps//+/ }
    echo "== $name ($steps) rc=$? after $SECONDS s"
  )
done
