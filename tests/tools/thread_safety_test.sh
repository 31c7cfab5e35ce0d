#!/usr/bin/env bash
# tools/thread_safety.sh can fail: it rejects a guarded field read without
# its mutex, naming the field, and accepts the same file with the read
# locked (so the rejection is the analysis's, not a missing header's).
#
#   thread_safety_test.sh THREAD_SAFETY_SH LOCKED_CC UNLOCKED_CC
set -uo pipefail
script=$1 locked=$2 unlocked=$3
failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

if bash "$script" "$locked" >"$out" 2>&1; then
  echo "ok: the locked read passes"
else
  echo "FAILED: the locked read was rejected:"; cat "$out"; failed=1
fi
if bash "$script" "$unlocked" >"$out" 2>&1; then
  echo "FAILED: the unlocked read passed"; failed=1
elif grep -q "reading variable 'count_' requires holding mutex 'mutex_'" "$out"; then
  echo "ok: the unlocked read is rejected"
else
  echo "FAILED: rejected for another reason:"; cat "$out"; failed=1
fi
exit "$failed"
