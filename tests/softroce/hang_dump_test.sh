#!/usr/bin/env bash
# The harness itself: a test that hangs in the guest is ended before the
# VM's timeout, and every one of its threads' stacks is in the log, so that
# a hang names itself (a guest timeout used to show only the last test case
# entered). A real program stands in for the hung test: sleep.
#
#   hang_dump_test.sh SOFTROCE_RUN
set -uo pipefail
runner=$1
# 50 s for the guest: the job's watcher dumps and ends the test 20 s after
# the VM started, by the host's clock, giving gdb 15 s.
out=$(IBEV_VM_TIMEOUT=50 "$runner" -- /bin/sleep 600 2>&1)
rc=$?
printf '%s\n' "$out" | tail -n 40
fail() {
  echo "hang_dump_test: FAILED: $*"
  exit 1
}
((rc != 0)) || fail "a test that hung passed"
grep -q "softroce: guest timeout" <<<"$out" && fail "the host's timeout came first"
grep -q "the test still runs 20s after the VM started; every thread's stack:" <<<"$out" ||
  fail "no stack dump"
grep -qE "^-- thread [0-9]+ \(sleep\), kernel stack:" <<<"$out" || fail "no thread of the test listed"
grep -qE "nanosleep" <<<"$out" || fail "the stack does not say where it waits (nanosleep)"
echo "hang_dump_test: passed"
