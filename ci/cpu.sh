#!/usr/bin/env bash
# The CPU job (.github/workflows/cpu.yml): install as the README says, lint and
# types (ci/lint.sh), then the README's test command. No GPU: the Triton kernels run under the interpreter and
# the `gpu`-marked tests are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/env.sh
ci_check_database
ci_setup cpu
ci_redis
export BLOCKTABLE_PROFILE=ci
bash ci/lint.sh
pytest -n auto
# Where the fleet's example database is set (a repository secret; docs/fleet.md),
# the failures the nightly runners saved are replayed first, read-only: a pull
# request that still has a known bug fails here, and adds nothing to the fleet's.
if [ -n "${BLOCKTABLE_DATABASE:-}" ]; then
  blocktable fuzz --examples 100 --database "$BLOCKTABLE_DATABASE" --database-readonly --out fleet-cases
fi
