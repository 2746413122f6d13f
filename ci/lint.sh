#!/usr/bin/env bash
# Lint and types: ruff over the repository, then mypy over the package. mypy runs on a
# copy laid out as installed (blocktable/ with reference/, kernels/ and properties/
# inside it), because the package-dir mapping in pyproject.toml is invisible to it.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
layout=$(mktemp -d)
trap 'rm -rf "$layout"' EXIT
mkdir -p "$layout/blocktable"
cp -r blocktable/. "$layout/blocktable/"
for folder in reference kernels properties; do
  cp -r "$folder/." "$layout/blocktable/$folder/"
done
cp pyproject.toml "$layout/"
(cd "$layout" && mypy)
