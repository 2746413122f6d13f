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

# `ci_check_database`: where BLOCKTABLE_DATABASE (the fleet's example database, a
# secret) is set, it must hold no password: the scripts pass it as --database, and a
# URL's password would sit on the command line of every process of the job (the
# process list, /proc/PID/cmdline) and in any trace of the script. The password goes
# in REDIS_PASSWORD, which blocktable reads from the environment (docs/fleet.md). A
# URL with one stops the job with status 2, printing neither the URL nor the password.
ci_check_database() {
  local url=${BLOCKTABLE_DATABASE:-}
  case "$url" in *://*) ;; *) return 0 ;; esac  # unset, or a folder
  local rest=${url#*://}
  case "$rest" in *@*) ;; *) return 0 ;; esac  # no user information
  # Everything before the last @ is user information (a Redis URL's path is /N), a
  # password in it after a colon, even one holding / or @.
  case "${rest%@*}" in
    *:*)
      echo "ci: BLOCKTABLE_DATABASE holds a password: set it as redis://HOST:PORT/N and the password" \
           "in REDIS_PASSWORD (docs/fleet.md)" >&2
      exit 2 ;;
  esac
}
