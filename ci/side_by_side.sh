#!/usr/bin/env bash
# Lockstep throughput of two versions of blocktable, measured side by side on one GPU
# host: both fuzz at the same time on disjoint cores, then again with the cores
# swapped, so that neither the host nor the cores favour one of them.
#
# usage: ci/side_by_side.sh REV_A REV_B [MINUTES] [SEED]
#   REV_A, REV_B: git revisions of this repository, the working tree ("WORKTREE"), or a
#                 folder holding another checkout's blocktable/ reference/ kernels/ properties/
#                 (for a machine that has no git history, such as a GPU host's copy)
#   A_ENV, B_ENV: optional environment settings for each side, for example
#                 A_ENV="BLOCKTABLE_PREFIX_WORLDS=0" (the same revision without prefix caching)
#   A_ARGS, B_ARGS: optional extra `fuzz` arguments for each side, for example
#                 B_ARGS="--pool ours" (our pool through the class path, beside the direct one)
#   CORES_A, CORES_B: the two core sets (default 2-3 and 4-5); DEVICE: cuda (default) or cpu
#   WARM: "short" (default): one 20-program run of A before the pair fills Triton's
#                 compile cache with the common kernels (on a GPU, that `fuzz` also
#                 compiles every KV kernel variant in the background: `blocktable
#                 warm`; give each side its own TRITON_CACHE_DIR in A_ENV and B_ENV for
#                 a runner's cold first minute); "same": each side first runs
#                 the measured command once (both at once, on their own cores), so the
#                 measured runs compile nothing that the same seed's programs need, and
#                 the ratio is the cost of a step, not of Triton's compiles on first use
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1; B=$2; MINUTES=${3:-1}; SEED=${4:-1}
CORES_A=${CORES_A:-2-3}; CORES_B=${CORES_B:-4-5}; DEVICE=${DEVICE:-cuda}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
folders="blocktable reference kernels properties"
tree() {  # REV DEST: the package laid out as installed (blocktable/ with its three subpackages)
  mkdir -p "$work/src-$2" "$work/$2"
  # shellcheck disable=SC2086
  if [ "$1" = WORKTREE ]; then cp -r $folders "$work/src-$2/"
  elif [ -d "$1" ]; then (cd "$1" && cp -r $folders "$work/src-$2/")
  else git archive "$1" $folders | tar -x -C "$work/src-$2"; fi
  cp -r "$work/src-$2/blocktable" "$work/$2/blocktable"
  for sub in reference kernels properties; do cp -r "$work/src-$2/$sub" "$work/$2/blocktable/$sub"; done
}
tree "$A" a; tree "$B" b
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
fuzz() {  # SIDE CORES ENV LABEL ARGS
  # shellcheck disable=SC2086
  (cd "$work" && env $3 PYTHONPATH="$work/$1" taskset -c "$2" python -c \
    "import sys; from blocktable.cli.main import main; sys.exit(main())" \
    fuzz --minutes "$MINUTES" --seed "$SEED" --device "$DEVICE" --out "$work/cases-$4" $5 > "$work/$4.txt" 2>&1)
}
# One short run first, so that both sides find Triton's compile cache warm.
(cd "$work" && PYTHONPATH="$work/a" python -c "import sys; from blocktable.cli.main import main; sys.exit(main())" \
  fuzz --examples 20 --device "$DEVICE" --out "$work/warm" > /dev/null 2>&1) || true
if [ "${WARM:-short}" = same ]; then
  fuzz a "$CORES_A" "${A_ENV:-}" a0 "${A_ARGS:-}" & fuzz b "$CORES_B" "${B_ENV:-}" b0 "${B_ARGS:-}" & wait
fi
fuzz a "$CORES_A" "${A_ENV:-}" a1 "${A_ARGS:-}" & fuzz b "$CORES_B" "${B_ENV:-}" b1 "${B_ARGS:-}" & wait
fuzz a "$CORES_B" "${A_ENV:-}" a2 "${A_ARGS:-}" & fuzz b "$CORES_A" "${B_ENV:-}" b2 "${B_ARGS:-}" & wait
rate() { grep -E "^│ checked steps" "$work/$1.txt" | grep -oE "\(([0-9.]+)/s\)" | tr -d '(/s)'; }
a1=$(rate a1); b1=$(rate b1); a2=$(rate a2); b2=$(rate b2)
echo "checked steps/s: first run A $a1, B $b1; swapped A $a2, B $b2"
result() { grep -E "^│ result" "$work/$1.txt" | awk -F'│' '{gsub(/ /, "", $3); print $3}'; }
echo "results: first run A $(result a1), B $(result b1); swapped A $(result a2), B $(result b2)"
python3 -c "import math; print(f'B / A, geometric mean: {math.sqrt(($b1 / $a1) * ($b2 / $a2)):.3f}')"
