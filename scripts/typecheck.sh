#!/usr/bin/env bash
# Type-check the whole kvstab namespace with mypy.
# pyproject's package-dir installs theory/, proofs/, empirical/ and props/ inside kvstab.*, a
# layout mypy cannot follow from the source tree. So the namespace is laid out as it is
# installed, in a temporary folder of symbolic links to the checkout (nothing is copied: mypy reads
# the working files), with the map read from pyproject.toml; mypy's paths are mapped back to the
# checkout's in its output.
# usage: scripts/typecheck.sh [PYTHON]   (PYTHON must have mypy installed)
set -euo pipefail
PY="${1:-python3}"
# a relative interpreter path must survive the cd below
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# one line per mapped package: "import.name folder" (the root package first)
"$PY" - "$root" > "$tmp/map" <<'PYEOF'
import sys, tomllib
root = sys.argv[1]
dirs = tomllib.load(open(f"{root}/pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"]
for name, folder in sorted(dirs.items(), key=lambda kv: kv[0].count(".")):
    print(name, folder.rstrip("/"))
PYEOF
sed_args=()
while read -r name folder; do
  rel="${name//.//}"
  if [ "$name" = kvstab ]; then
    mkdir -p "$tmp/kvstab"
    for entry in "$root/$folder"/*; do
      [ "$(basename "$entry")" = __pycache__ ] || ln -s "$entry" "$tmp/kvstab/$(basename "$entry")"
    done
  else
    ln -s "$root/$folder" "$tmp/$rel"
    sed_args+=(-e "s#^$rel/#$folder/#")
  fi
done < "$tmp/map"
cd "$tmp"
status=0
"$PY" -m mypy --config-file "$root/pyproject.toml" -p kvstab > "$tmp/out" 2>&1 || status=$?
sed "${sed_args[@]}" "$tmp/out"
exit "$status"
