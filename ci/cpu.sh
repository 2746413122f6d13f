#!/usr/bin/env bash
# The CPU job (.github/workflows/cpu.yml): install as the README says, then the
# README's test command. No GPU: the Triton kernels run under the interpreter and
# the `gpu`-marked tests are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/env.sh
ci_setup cpu
export BLOCKTABLE_PROFILE=ci
pytest -n auto
