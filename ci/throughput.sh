#!/usr/bin/env bash
# Issue 28's throughput bars on this GPU host, measured in one run and printed as a
# table of bar, figure and verdict ($OUT/bars.md):
#
#   - the KV worlds' cost: `ci/side_by_side.sh` with KV worlds off (A) and on (B),
#     both at once and then swapped; geometric mean of B / A >= 0.80;
#   - one process >= 300 checked steps/s (`blocktable fuzz`, default mix);
#   - `--jobs 14` >= 3,000 checked steps/s and >= 70% of 14 times one worker
#     (`ci/scaling.sh`, through MPS where the host has it);
#   - stateless slot mapping >= 1G tokens/s, the stateless KV modes' rates beside it.
#
# The CPU's bar (nothing slower under the interpreter) compares two revisions:
# `DEVICE=cpu CORES_A=0 CORES_B=1 bash ci/side_by_side.sh OLD WORKTREE 2 1`.
#
#   bash ci/throughput.sh                 # a minute a measurement, about 8 minutes in all
#   MINUTES=0.5 bash ci/throughput.sh     # half a minute each, about 5 minutes
#
# Variables: MINUTES (1; the stateless KV modes run a quarter of it each), MPS (1
# where nvidia-cuda-mps-control is on the PATH, else 0), OUT (throughput-results).
# Needs the package installed and a GPU host of 16 cores or more. Every measurement
# runs after `blocktable warm`, so none of them pays Triton's compiles. Exit 0 when
# every run passed, whatever the verdicts (a bar not met is a figure, not a failure);
# 1 when a run failed or found a discrepancy (its output is in $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
minutes=${MINUTES:-1}
out=$(mkdir -p "${OUT:-throughput-results}" && cd "${OUT:-throughput-results}" && pwd)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
step() { echo "== $* ($(date +%T))"; }
status=0
ran() { [ "$1" -eq 0 ] || { echo "   exit $1: see $2"; status=1; }; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

step "blocktable warm"
blocktable warm > "$out/warm.txt" 2>&1; ran $? "$out/warm.txt"
blocktable warm --stateless > "$out/warm-stateless.txt" 2>&1; ran $? "$out/warm-stateless.txt"

step "KV worlds off (A) against on (B), side by side"
A_ENV=BLOCKTABLE_KV_WORLDS=0 bash ci/side_by_side.sh WORKTREE WORKTREE "$minutes" 1 > "$out/kv-pair.txt" 2>&1
ran $? "$out/kv-pair.txt"

# One process's rate is the scaling's first run: `blocktable fuzz` as a user runs it.
# Not pinned to one core: its child would share that core with the parent, which
# draws the progress (about a fifth fewer checked steps on an H100 host).
step "1 and 14 workers"
if command -v nvidia-cuda-mps-control > /dev/null; then mps=${MPS:-1}; else mps=${MPS:-0}; fi
echo "   MPS: $mps"
JOBS="1 14" MINUTES=$minutes MPS=$mps OUT="$out/scaling" bash ci/scaling.sh > "$out/scaling.txt" 2>&1
ran $? "$out/scaling.txt"
if grep -q "^  exit [1-9]" "$out/scaling.txt"; then ran 1 "$out/scaling"; fi  # it reports each run's exit

step "stateless"
(cd "$scratch" && blocktable fuzz --stateless --minutes "$minutes" --seed 0 --device cuda --out "$scratch/slot" \
  > "$out/stateless.txt" 2>&1)
ran $? "$out/stateless.txt"
quarter=$(python3 -c "print($minutes / 4)")
kv_mode() {  # NAME, then the fuzz command: a stateless KV mode into $out/stateless-kv-NAME.txt
  local name=$1; shift
  (cd "$scratch" && "$@" > "$out/stateless-kv-$name.txt" 2>&1); ran $? "$out/stateless-kv-$name.txt"
}
kv_mode write blocktable fuzz --stateless --minutes "$quarter" --kv-write triton --seed 0 --device cuda --out kv-write
kv_mode copy blocktable fuzz --stateless --minutes "$quarter" --kv-copy triton --seed 0 --device cuda --out kv-copy
kv_mode gather blocktable fuzz --stateless --minutes "$quarter" --kv-gather triton --seed 0 --device cuda --out kv-gather

{ echo "$(date -u +%F), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(getconf _NPROCESSORS_ONLN) cores;" \
       "$(python3 -c "import platform, torch, triton, numpy, hypothesis as h; print('Python', platform.python_version(), \
'torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'Hypothesis', h.__version__)");" \
       "$minutes min a measurement, MPS $mps"
  echo
  python3 ci/bars.py "$out"; } | tee "$out/bars.md"
exit $status
