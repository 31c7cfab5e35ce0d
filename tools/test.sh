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

# Runs one `bazel test` and adds its per-target results to the totals. A run
# that fails without naming a failed target (a build error) counts as one.
run() {
  local label=$1
  shift
  local log rc
  log=$(mktemp)
  echo "== ${label}: bazel test $*"
  bazel test --test_summary=short "$@" >"$log" 2>&1
  rc=$?
  grep -E '^(//|Executed|ERROR|FAIL)' "$log" || true
  local p f
  p=$(grep -cE '^//\S+\s+(\(cached\) )?PASSED' "$log")
  f=$(grep -cE '^//\S+\s+(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY)' "$log")
  if ((rc != 0 && f == 0)); then f=1; fi
  passed=$((passed + p))
  failed=$((failed + f))
  if ((rc != 0 || f != 0)); then status=1; fi
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
