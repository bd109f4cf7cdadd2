#!/usr/bin/env bash
# Three cold runs of the README's test command, one after another, each in a
# fresh clone: what a new user (or a CI job) meets, three times in a row.
#
# Each run clones the repository into a new temporary folder with nothing beside
# it (no shared/, no venv, no numba cache: the cache lives beside the source),
# runs the command the README gives under "```bash" (found there, so this script
# and the README cannot drift apart), and records pass/fail and wall time.  The
# logs stay in the soak folder; the clones are removed unless --keep.
#
# The command runs in the foreground with SIGINT at its default: a suite started
# as a background job of a non-interactive shell inherits SIGINT ignored (see the
# commit that fixed the Ctrl-C test), and under GNU timeout it is reset again, so
# neither wrapper is used here.
#
# usage: scripts/ci-soak.sh [--runs N] [--branch BRANCH] [--keep] [REPO]
#   REPO    the repository to clone (default: the one holding this script)
#   BRANCH  the branch to test (default main)
#   N       how many runs (default 3)
# exit status: 0 if every run passed, 1 if one failed, 2 on bad usage
set -euo pipefail

runs=3
branch=main
keep=0
repo=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
    --branch) branch="${2:?--branch needs a name}"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "ci-soak: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) repo="$1"; shift ;;
  esac
done
case "$runs" in
  ''|*[!0-9]*|0) echo "ci-soak: --runs must be a positive integer, got '$runs'" >&2; exit 2 ;;
esac
if [ -z "$repo" ]; then
  repo="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
fi

# the README's test command: the one line of its bash block that makes the venv and runs pytest
readme_cmd="$(git -C "$repo" show "$branch:README.md" | grep -E '^python3 -m venv .venv .*pytest' || true)"
if [ "$(printf '%s\n' "$readme_cmd" | grep -c .)" -ne 1 ]; then
  echo "ci-soak: expected one 'python3 -m venv .venv … pytest …' line in $branch's README.md, found:" >&2
  printf '%s\n' "$readme_cmd" >&2
  exit 2
fi

soak="$(mktemp -d "${TMPDIR:-/tmp}/kvstab-soak.XXXXXX")"
echo "ci-soak: $runs cold run(s) of $repo ($branch); logs in $soak"
echo "ci-soak: command: $readme_cmd"

results=()
failed=0
for i in $(seq 1 "$runs"); do
  home="$soak/run-$i"        # a folder of its own: the clone has nothing beside it
  mkdir -p "$home"
  log="$soak/run-$i.log"
  start=$(date +%s)
  status=0
  {
    git clone --quiet --no-hardlinks --branch "$branch" "$repo" "$home/kvstab" &&
      (cd "$home/kvstab" && bash -c "$readme_cmd")
  } >"$log" 2>&1 || status=$?
  secs=$(( $(date +%s) - start ))
  if [ "$status" -eq 0 ]; then verdict=PASS; else verdict="FAIL (exit $status)"; failed=1; fi
  line="run $i: $verdict in $((secs / 60)) min $((secs % 60)) s; $(tail -n 1 "$log")"
  echo "ci-soak: $line"
  results+=("$line")
  if [ "$keep" -eq 0 ]; then rm -rf "$home"; fi
done

echo "ci-soak: summary ($branch, $(git -C "$repo" rev-parse --short "$branch"))"
printf '  %s\n' "${results[@]}"
if [ "$failed" -ne 0 ]; then
  echo "ci-soak: at least one run failed; see $soak/run-*.log"
  exit 1
fi
echo "ci-soak: all $runs runs passed"
