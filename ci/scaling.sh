#!/usr/bin/env bash
# How fuzzing scales with workers on this host: `blocktable fuzz --jobs J` for each J,
# M minutes each, then a table of the total checked steps/s and programs/s (read
# from each run's summary) and each J's share of J times the rate of one worker.
# Run it by hand on the machine to measure, in an installed environment:
#
#   bash ci/scaling.sh                                   # GPU host: --jobs 1 4 8 14, 1 minute each
#   JOBS="1 2" MINUTES=0.1 DEVICE=cpu bash ci/scaling.sh # a smoke check on a CPU machine
#
#   MPS=1 bash ci/scaling.sh                             # the same with CUDA's MPS server
#
# Variables: JOBS (default "1 4 8 14"), MINUTES (1), SEED (0), DEVICE (cuda),
# KERNEL (triton), PROFILE (ci), OUT (scaling-results: each run's output, and
# table.md), MPS (0; 1: start an MPS control daemon for these runs alone, in a
# private pipe folder, and quit it at the end, so that the workers' kernels share
# the GPU instead of taking turns in time slices). Each J runs in a fresh --out,
# so no run replays another's findings.
set -uo pipefail
jobs=${JOBS:-1 4 8 14}
minutes=${MINUTES:-1}
seed=${SEED:-0}
device=${DEVICE:-cuda}
kernel=${KERNEL:-triton}
profile=${PROFILE:-ci}
out=${OUT:-scaling-results}
mkdir -p "$out"
if [ "${MPS:-0}" = 1 ]; then
  # Its own pipe and log folders (short, absolute: the pipes are sockets), so that
  # only this script's processes find this daemon.
  mps=$(mktemp -d /tmp/mps.XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "could not start the MPS control daemon"; exit 2; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  echo "MPS: on (pipe folder $CUDA_MPS_PIPE_DIRECTORY)"
fi
echo "host: $(nproc) usable cores; device $device; kernel $kernel; $minutes min per run; seed $seed"
for j in $jobs; do
  rm -rf "$out/cases-$j"
  echo "--jobs $j ..."
  blocktable fuzz --kernel "$kernel" --device "$device" --profile "$profile" --jobs "$j" --minutes "$minutes" \
    --seed "$seed" --out "$out/cases-$j" > "$out/jobs-$j.txt" 2>&1
  echo "  exit $? (0: pass, 1: a finding, 2: usage); output in $out/jobs-$j.txt"
done
python3 - "$out" $jobs <<'EOF' | tee "$out/table.md"
import re
import sys

out, jobs = sys.argv[1], [int(j) for j in sys.argv[2:]]
rows = {}
for j in jobs:
    text = open(f"{out}/jobs-{j}.txt").read()
    programs = re.search(r"programs run \(shrinking included\) / operations\s*\S\s*(\d+) \(([\d.]+)/s\)", text)
    steps = re.search(r"checked steps\s*\S\s*(\d+) \(([\d.]+)/s\)", text)
    result = re.search(r"result\s*\S\s*(\w+)", text)
    rows[j] = (float(programs.group(2)) if programs else None, float(steps.group(2)) if steps else None,
               result.group(1) if result else "no summary")
one = rows.get(1, (None, None, None))[1]
print("| jobs | checked steps/s | programs/s | of linear (steps) | result |")
print("| ---: | ---: | ---: | ---: | --- |")
for j, (programs, steps, result) in rows.items():
    share = f"{steps / (j * one):.0%}" if steps and one else "-"
    print(f"| {j} | {steps if steps is not None else '-'} | {programs if programs is not None else '-'} | "
          f"{share} | {result} |")
EOF
