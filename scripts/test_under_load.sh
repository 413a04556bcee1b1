#!/usr/bin/env bash
# The whole suite beside a CPU hog: one `yes > /dev/null` per core (HOGS=N: N of them),
# started here and stopped on any exit. It shows the suite asserts what happened, not how
# fast this machine is.
#
#   scripts/test_under_load.sh [pytest args…]      (default: the whole suite, as `make test`)
#   HOGS=1 scripts/test_under_load.sh tests/test_api_bad_use.py
#
# Prints the test count and the wall time at the end; exits with pytest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
cores=$(nproc)
count=${HOGS:-$cores}
case "$count" in ''|*[!0-9]*) echo "test-under-load: HOGS must be a whole number, got '$count'" >&2; exit 2;; esac
hogs=()
stop_hogs() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_hogs EXIT
for _ in $(seq "$count"); do yes > /dev/null & hogs+=($!); done
echo "test-under-load: ${#hogs[@]} CPU hog(s) on $cores core(s); running the suite"
started=$(date +%s)
status=0
"$PY" -m pytest -q -W ignore::DeprecationWarning --durations=40 "$@" || status=$?
echo "test-under-load: pytest exit status $status after $(( $(date +%s) - started )) s beside ${#hogs[@]} hog(s)"
exit "$status"
