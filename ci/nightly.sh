#!/usr/bin/env bash
# The nightly job (.github/workflows/nightly.yml) on one runner: the whole mutation
# catalogue, then a 90-minute lockstep fuzzing run with the nightly profile on every
# core; on the GPU runner also 10 minutes of stateless fuzzing and the throughput
# bars (ci/throughput.sh). Every part runs even when one before it failed; the
# script fails if any did.
#
#   bash ci/nightly.sh cpu|gpu [SEED]      results in nightly-<runner>/
set -uo pipefail
cd "$(dirname "$0")/.."
runner=${1:?usage: ci/nightly.sh cpu|gpu [SEED]}
seed=${2:-0}
case "$runner" in cpu|gpu) ;; *) echo "ci/nightly.sh: runner must be cpu or gpu, got $runner" >&2; exit 2 ;; esac
. ci/env.sh
ci_check_database
ci_setup "$runner" || exit 1
out="nightly-$runner"
mkdir -p "$out"
status=0
# Every core fuzzes (--jobs auto); where the fleet's example database is set (a
# secret; docs/fleet.md), every runner tries the others' failures first and saves
# its own there. Worker i of a run has seed SEED + i: space the runs' seeds apart.
blocktable mutants --budget 120 --json > "$out/mutants.json" || status=1
blocktable fuzz --profile nightly --minutes 90 --jobs auto --seed "$((seed * 1000))" \
  ${BLOCKTABLE_DATABASE:+--database "$BLOCKTABLE_DATABASE"} --out "$out/cases" || status=1
if [ "$runner" = gpu ]; then
  blocktable fuzz --stateless --minutes 10 --jobs auto --seed "$((seed * 1000))" --out "$out/cases" || status=1
  # Issue 28's throughput bars on this runner, a table in $out/throughput/bars.md: a
  # measurement, so a bar not met does not fail the night (a run that fails does).
  OUT="$out/throughput" bash ci/throughput.sh || status=1
fi
exit $status
