#!/usr/bin/env bash
# Everything a GPU machine must show, in one run: the whole test suite with the
# compiled kernels, the benchmark, the stateless fuzz throughput, a lockstep fuzz
# throughput run and the mutation gate. Results go to $OUT (default gpu-results/).
# Assumes torch, triton, numpy, hypothesis, pytest, pytest-xdist and rich are
# installed (the package itself is installed here without touching the network).
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 BLOCKTABLE_PROFILE=ci
PY=${PYTHON:-python3}
JOBS=${JOBS:-8}
step() { echo; echo "=== $* ($(date +%T))"; }

step install
$PY -m pip install -q --no-deps --no-build-isolation --no-index -e . > /tmp/install.log 2>&1 || { cat /tmp/install.log; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY -c "import sys, torch, triton, numpy, hypothesis, pytest; print('python', sys.version.split()[0], '| torch', torch.__version__, '| triton', triton.__version__, '| numpy', numpy.__version__, '| hypothesis', hypothesis.__version__, '| pytest', pytest.__version__)"
} | tee "$OUT/machine.txt"

step "tests (pytest -n $JOBS)"
timeout ${TEST_TIMEOUT:-600} $PY -m pytest -n "$JOBS" -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/pytest.log" | tail -25

step bench
timeout ${BENCH_TIMEOUT:-150} blocktable bench --out "$OUT/bench" 2>&1 | tail -45

step "stateless fuzz"
timeout 90 blocktable fuzz --stateless --minutes ${STATELESS_MINUTES:-0.5} --seed 1 --out /tmp/stateless 2>&1 | tee "$OUT/stateless.txt" | tail -12

step "lockstep fuzz"
timeout 120 blocktable fuzz --minutes ${LOCKSTEP_MINUTES:-1} --seed 1 --out /tmp/lockstep 2>&1 | tee "$OUT/lockstep.txt" | tail -20

step mutants
# MUTANT_ONLY: ids or layers (e.g. "kernel"), all of them when unset
timeout ${MUTANT_TIMEOUT:-240} blocktable mutants ${MUTANT_ONLY:+--only $MUTANT_ONLY} --budget ${MUTANT_BUDGET:-60} --jobs "$JOBS" 2>&1 | tee "$OUT/mutants.txt" | tail -60
step done
