#!/usr/bin/env bash
# The GPU job (.github/workflows/gpu.yml): the compiled kernels, `gpu`-marked tests
# included. On a machine with several GPUs each xdist worker pins its own
# (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/env.sh
ci_setup gpu
export BLOCKTABLE_PROFILE=ci
pytest -n auto
