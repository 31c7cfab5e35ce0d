#!/usr/bin/env bash
# A soft-RoCE suite (softroce.bzl's softroce_suite): runs each test program
# given, in turn, on the devices one VM boot made, so that a dozen small
# tests pay for one boot instead of twelve. Each program's output follows a
# header naming it, and a Boost.Test program's JUnit report goes beside the
# suite's (named after it); the last line says which failed. Exits 1 when
# any did.
#   run_each.sh PROGRAM [ARG...] --next-program-- [PROGRAM [ARG...] --next-program--]...
# The separator is spelled out so that no test's own arguments (Boost.Test's
# "--", a flag) can be taken for it.
set -u
next=--next-program--
passed=0
failed=()
run() {
  local name
  name=$(basename "$1")
  echo "==== softroce suite: $*"
  local logger=${BOOST_TEST_LOGGER:-}
  BOOST_TEST_LOGGER=${logger/junit.xml/junit-$name.xml} "$@"
  local rc=$?
  if ((rc == 0)); then
    passed=$((passed + 1))
  else
    failed+=("$name (exit $rc)")
  fi
}
command=()
for arg in "$@"; do
  if [[ $arg == "$next" ]]; then
    ((${#command[@]} > 0)) && run "${command[@]}"
    command=()
  else
    command+=("$arg")
  fi
done
if ((${#command[@]} > 0)); then
  echo "softroce suite: arguments after the last $next: ${command[*]}"
  exit 2
fi
if ((${#failed[@]} == 0)); then
  echo "softroce suite: $passed passed, 0 failed"
  exit 0
fi
echo "softroce suite: $passed passed, ${#failed[@]} failed: ${failed[*]}"
exit 1
