# Sourced by the CI scripts (not run on its own): `ci_setup cpu|gpu` makes a fresh
# virtual environment in .venv-ci-<runner>, activates it and installs the package
# with its test extra. On the CPU runner the CPU build of torch goes in first: a
# plain `torch` requirement would pull a multi-GB CUDA build.

ci_setup() {
  local runner=${1:?usage: ci_setup cpu|gpu}
  local venv=".venv-ci-$runner"
  rm -rf "$venv"
  python3 -m venv "$venv"
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
  python -m pip install --quiet --upgrade pip
  if [ "$runner" = cpu ]; then
    python -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
  fi
  python -m pip install --quiet -e '.[test,lint]'
  python -m pip list 2>/dev/null | grep -iE '^(numpy|torch|triton|hypothesis|pytest|pytest-xdist|rich|ruff|mypy) '
}

# `ci_redis`: the Redis server from the OS packages, for the example-database tests
# (each starts its own server on a free port); with BLOCKTABLE_REQUIRE_REDIS=1 they
# fail rather than skip where it is missing.
ci_redis() {
  if ! command -v redis-server > /dev/null; then
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -q > /dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q redis-server > /dev/null
  fi
  export BLOCKTABLE_REQUIRE_REDIS=1
}
