#!/usr/bin/env bash
# Every test of ibev: installs what is missing, then runs the whole suite in
# the default configuration and the unit tests under ASan+UBSan and TSan.
# Ends with one line "tests: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || { echo "tests: setup failed"; exit 1; }

unit_tests=(//tests/core/... //tests/dispatch/... //tests/watch/...)
passed=0
failed=0
status=0

# Runs one `bazel test` and adds its per-target results to the totals.
run() {
  local label=$1
  shift
  local log
  log=$(mktemp)
  echo "== ${label}: bazel test $*"
  bazel test --test_summary=short "$@" 2>&1 | tee "$log" |
    grep -E '^(//|Executed|ERROR|FAIL)' || true
  local rc=${PIPESTATUS[0]}
  local p f
  p=$(grep -cE '^//\S+\s+(\(cached\) )?PASSED' "$log")
  f=$(grep -cE '^//\S+\s+(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY)' "$log")
  if ((rc != 0 && f == 0)); then f=1; fi  # a build error fails the run too
  passed=$((passed + p))
  failed=$((failed + f))
  ((rc == 0)) || status=1
  rm -f "$log"
}

run default //...
run asan --config=asan "${unit_tests[@]}"
run tsan --config=tsan "${unit_tests[@]}"
# A separate workspace that depends on ibev through local_repository.
pushd examples/consumer >/dev/null
run consumer //...
popd >/dev/null

echo "tests: ${passed} passed, ${failed} failed"
exit "$status"
