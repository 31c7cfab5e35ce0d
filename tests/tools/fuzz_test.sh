#!/usr/bin/env bash
# tools/fuzz.sh can fail: over a target with a bug (fuzz_fixture_fuzz.cc) it
# exits non-zero, says ASan's finding and names the reproducer, which
# --reproduce runs into the same failure. (That it passes over targets
# without one is tools/test.sh's fuzz check.)
#
#   fuzz_test.sh FUZZ_SH FIXTURE_CC
set -uo pipefail
script=$1 fixture=$2
failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

if bash "$script" --time 30 "$fixture" >"$out" 2>&1; then
  echo "FAILED: the bug was not found:"; cat "$out"; failed=1
elif ! grep -q "heap-buffer-overflow" "$out" || ! grep -q "fuzz_fixture found something" "$out"; then
  echo "FAILED: failed for another reason:"; cat "$out"; failed=1
else
  echo "ok: the bug is found and reported"
  reproducer=$(grep -oE '^  /\S+/found/fuzz_fixture-crash-\S+' "$out" | head -n 1 | tr -d ' ')
  if [[ ! -f $reproducer ]]; then
    echo "FAILED: no reproducer named:"; cat "$out"; failed=1
  elif [[ $(head -c 3 "$reproducer") != bug ]]; then
    echo "FAILED: the reproducer does not begin with bug"; failed=1
  elif bash "$script" --reproduce "$fixture" "$reproducer" >"$out" 2>&1; then
    echo "FAILED: --reproduce passed on the reproducer"; failed=1
  elif grep -q "heap-buffer-overflow" "$out"; then
    echo "ok: --reproduce fails on the reproducer"
  else
    echo "FAILED: --reproduce failed for another reason:"; cat "$out"; failed=1
  fi
  # The run keeps its folder for the reproducer: this one is done with it.
  if [[ $reproducer == */found/* ]]; then rm -rf "${reproducer%/found/*}"; fi
fi
exit "$failed"
