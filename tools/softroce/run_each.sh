#!/usr/bin/env bash
# A soft-RoCE suite (softroce.bzl's softroce_suite): runs each test binary
# given, in turn, on the devices one VM boot made, so that a dozen small
# tests pay for one boot instead of twelve. Each binary's output follows a
# header naming it, and its JUnit report goes beside the suite's (named
# after it); the last line says which failed. Exits 1 when any did.
#   run_each.sh BINARY...
set -u
passed=0
failed=()
for binary in "$@"; do
  name=$(basename "$binary")
  echo "==== softroce suite: $name"
  logger=${BOOST_TEST_LOGGER:-}
  BOOST_TEST_LOGGER=${logger/junit.xml/junit-$name.xml} "$binary"
  rc=$?
  if ((rc == 0)); then
    passed=$((passed + 1))
  else
    failed+=("$name (exit $rc)")
  fi
done
if ((${#failed[@]} == 0)); then
  echo "softroce suite: $passed passed, 0 failed"
  exit 0
fi
echo "softroce suite: $passed passed, ${#failed[@]} failed: ${failed[*]}"
exit 1
