#!/usr/bin/env bash
# Every test of ibev: installs what is missing, then runs the whole suite in
# the default configuration, under ASan+UBSan and under TSan (the soft-RoCE
# tests too, in the VM on Debian 12's 6.1 kernel), the soft-RoCE tests again
# on the 6.12 kernel of bookworm-backports,
# then ibev as other projects take it: the Bazel consumer workspace, the
# CMake install with its exports checked, the CMake and make consumers
# against that prefix, and the Debian packages installed with apt-get, the
# consumers built against them, and purged again.
# Ends with one line "tests: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || { echo "tests: setup failed"; exit 1; }

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

# Runs one command as one check; its output is shown when it fails.
check() {
  local label=$1
  shift
  local log
  log=$(mktemp)
  echo "== ${label}: $*"
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    tail -n 1 "$log"
  else
    failed=$((failed + 1))
    status=1
    tail -n 40 "$log"
  fi
  rm -f "$log"
}

# Builds and runs the CMake and make consumers; each counts once.
consumers() {
  local out
  echo "== consumers: tools/consumers.sh $*"
  out=$(tools/consumers.sh "$@")
  echo "$out"
  passed=$((passed + $(grep -cE '^consumer-\S+ .*: passed$' <<<"$out")))
  failed=$((failed + $(grep -cE '^consumer-\S+ .*: failed$' <<<"$out")))
  grep -qE ': failed$' <<<"$out" && status=1
  return 0
}

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
purge_packages() {
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get purge -y -q \
    libibev0 libibev-dev ibev-tools >/dev/null 2>&1 || true
}

run default //...
# The kernel matrix: the soft-RoCE suite (tag "softroce") again, same build,
# in a VM booting the 6.12 kernel (tools/softroce/fetch_kernel.sh 6.12).
run kernel-6.12 --test_env=IBEV_KERNEL=6.12 --test_tag_filters=softroce //...
# The sanitizers over everything, the soft-RoCE suite included: the guest
# runs the instrumented binaries with ASAN_OPTIONS/UBSAN_OPTIONS/TSAN_OPTIONS.
run asan --config=asan //...
run tsan --config=tsan //...
# A separate workspace that depends on ibev through local_repository.
pushd examples/consumer-bazel >/dev/null
run consumer-bazel //...
popd >/dev/null

# The installed package: tools/install.sh into a fresh prefix.
prefix=$(mktemp -d)
check install env IBEV_WERROR=ON tools/install.sh "$prefix"
check exports tools/check_exports.sh "$prefix/lib/libibev.so"
consumers "$prefix"
rm -rf "$prefix"

# The Debian packages, installed as a user would, then purged.
debs=$(mktemp -d)
check package tools/package.sh "$debs"
trap purge_packages EXIT
check apt-install env DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q \
  "$debs"/libibev0_*.deb "$debs"/libibev-dev_*.deb "$debs"/ibev-tools_*.deb
consumers
purge_packages
rm -rf "$debs"

echo "tests: ${passed} passed, ${failed} failed"
exit "$status"
