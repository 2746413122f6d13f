#!/usr/bin/env bash
# The V2 block-table benchmark on a GPU in one run (`blocktable bench --suite v2`,
# docs/cli.md): installs the package from this checkout without the network, names
# the machine, then times ours, the torch-native twins and any plug-ins given as
# arguments, and prints the tables. About a minute on an H200.
#
#   bash ci/bench_v2_gpu.sh                                   # ours and torch-native
#   bash ci/bench_v2_gpu.sh --v2-gather my_vllm_v2.py:gather  # a plug-in beside them
#   bash ci/bench_v2_gpu.sh --quick                           # four steps instead of eight
#
# results.json (rows under v2_rows), results.md and the log go to $OUT/bench-v2
# (OUT defaults to bench-v2-results). Exit 0: every implementation agreed with ours and
# was timed; 1: one differed or raised (its row says how); 2: a usage error; 124: the
# run passed BENCH_TIMEOUT (default 270 s). Assumes torch, triton, numpy and rich are
# installed. DEVICE=cpu runs the tiny steps under the interpreter (a smoke check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-v2-results}
PY=${PYTHON:-python3}
mkdir -p "$OUT/bench-v2"
export PYTHONUNBUFFERED=1
$PY -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/bench-v2/install.log" 2>&1 \
  || { cat "$OUT/bench-v2/install.log"; exit 1; }
{ if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  fi
  $PY -c "import sys, torch, triton, numpy; print('python', sys.version.split()[0], '| torch', torch.__version__, \
'| triton', triton.__version__, '| numpy', numpy.__version__)"
} | tee "$OUT/bench-v2/machine.txt"
timeout "${BENCH_TIMEOUT:-270}" $PY -m blocktable.cli.main bench --suite v2 --device "${DEVICE:-cuda}" \
  --out "$OUT/bench-v2" "$@" 2>&1 | tee "$OUT/bench-v2/bench.log"
rc=${PIPESTATUS[0]}
echo "bench exit $rc (0: all agreed and timed; 1: an implementation differed or raised; 2: usage; 124: timed out)"
exit "$rc"
