#!/usr/bin/env bash
# The GPU job (.github/workflows/gpu.yml): the compiled kernels, `gpu`-marked tests
# included. On a machine with several GPUs each xdist worker pins its own
# (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/env.sh
ci_check_database
ci_setup gpu
export BLOCKTABLE_PROFILE=ci
pytest -n auto
# The fleet's saved failures of the compiled kernels, replayed read-only where its
# example database is set (docs/fleet.md).
if [ -n "${BLOCKTABLE_DATABASE:-}" ]; then
  blocktable fuzz --examples 200 --jobs auto --database "$BLOCKTABLE_DATABASE" --database-readonly --out fleet-cases
fi
