#!/usr/bin/env bash
# Type-check the whole kvstab namespace with mypy.
# pyproject maps theory/, proofs/, empirical/, audit/ and live/ into kvstab.* (package-dir),
# a layout mypy cannot follow from the source tree; so lay the namespace out as
# it is installed, in a temporary folder, and check that.
# usage: scripts/typecheck.sh [PYTHON]   (PYTHON must have mypy installed)
set -euo pipefail
PY="${1:-python3}"
# a relative interpreter path must survive the cd below
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp -r "$root/kvstab" "$tmp/kvstab"
for sub in theory proofs empirical audit live fleet; do
  cp -r "$root/$sub" "$tmp/kvstab/$sub"
done
find "$tmp" -name __pycache__ -prune -exec rm -rf {} +
cd "$tmp"
"$PY" -m mypy --config-file "$root/pyproject.toml" -p kvstab
