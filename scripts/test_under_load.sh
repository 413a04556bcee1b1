#!/usr/bin/env bash
# The whole suite beside a CPU hog: one `yes > /dev/null` per core, started here and stopped
# on any exit. It shows the suite asserts what happened, not how fast this machine is.
#
#   scripts/test_under_load.sh [pytest args…]      (default: the whole suite, as `make test`)
#
# Prints the test count and the wall time at the end; exits with pytest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
cores=$(nproc)
hogs=()
stop_hogs() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_hogs EXIT
for _ in $(seq "$cores"); do yes > /dev/null & hogs+=($!); done
echo "test-under-load: ${#hogs[@]} CPU hog(s) on $cores core(s); running the suite"
started=$(date +%s)
status=0
"$PY" -m pytest -q -W ignore::DeprecationWarning --durations=40 "$@" || status=$?
echo "test-under-load: pytest exit status $status after $(( $(date +%s) - started )) s beside $cores hog(s)"
exit "$status"
