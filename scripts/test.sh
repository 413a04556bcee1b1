#!/usr/bin/env bash
# The whole suite as `make test` runs it: two pytest processes at once.
#
#   scripts/test.sh [PYTEST ARGS…]     (the arguments go to both; not -m, which each
#                                       process sets: for a marker of your own, run pytest)
#   TEST_MARKER="not slow" scripts/test.sh …   (what `make test-fast` runs: each process
#                                       keeps only its tests that also match TEST_MARKER)
#
# The tests marked `ray` (a real local Ray: fits, drivers, clusters) hold the machine about
# 80 % busy: their processes wait on actors starting, signals, lost nodes. The others (the
# math on gloo groups, the planner, the files, the docs) run beside them at the lowest CPU
# priority Linux has (SCHED_IDLE; `nice -n 19` where `chrt` is missing), so they take the
# CPU the Ray tests leave idle rather than adding their own time after them. Ray's workers
# run at nice 15: at nice 19 alone the second process would still take a third of a busy
# machine from them.
#
# Each process prints its own summary and slowest tests; the one without Ray prints after
# the other ends. The exit status is non-zero when either process failed.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
if command -v chrt >/dev/null && chrt --idle 0 true 2>/dev/null; then
  lowest=(chrt --idle 0)
else
  lowest=(nice -n 19)
fi
ray_marker="ray${TEST_MARKER:+ and ($TEST_MARKER)}"
no_ray_marker="not ray${TEST_MARKER:+ and ($TEST_MARKER)}"
log=$(mktemp "${TMPDIR:-/tmp}/hetero_ray_tests_without_ray.XXXXXX")

# The cache plugin would have both processes write .pytest_cache at once; only this one does.
HETERO_RAY_TESTS_WITHOUT_RAY=1 "${lowest[@]}" "$PY" -m pytest -m "$no_ray_marker" -p no:cacheprovider "$@" >"$log" 2>&1 &
without_ray=$!
# Ctrl-C or a stopped CI ends both; the log goes either way.
trap 'kill "$without_ray" 2>/dev/null; rm -f "$log"' EXIT

echo "test: the tests that need Ray here; the others beside them at the lowest CPU priority (${lowest[*]}), shown after"
"$PY" -m pytest -m "$ray_marker" "$@"
with_ray_rc=$?

echo
echo "=== the tests without Ray (run beside the above at the lowest CPU priority) ==="
wait "$without_ray"
without_ray_rc=$?
cat "$log"
# 5: pytest found nothing to run there (arguments that pick tests of one kind only).
[ "$with_ray_rc" -eq 5 ] && with_ray_rc=0
[ "$without_ray_rc" -eq 5 ] && without_ray_rc=0
if [ "$with_ray_rc" -ne 0 ] || [ "$without_ray_rc" -ne 0 ]; then
  echo "test: FAILED (tests with Ray: exit $with_ray_rc; without Ray: exit $without_ray_rc)"
  exit 1
fi
