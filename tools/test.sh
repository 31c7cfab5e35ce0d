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
root=$PWD

tools/setup.sh || { echo "tests: setup failed"; exit 1; }

passed=0
failed=0
status=0

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
# The runtime package is named after the SONAME (libibev0.9).
runtime=libibev$(tools/version.sh --soversion)
purge_packages() {
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get purge -y -q \
    "$runtime" libibev-dev ibev-tools python3-ibev >/dev/null 2>&1 || true
}

# Every temporary file and folder of the run is under $work, removed on exit
# and on interrupt; the packages are purged if they were installed.
work=$(mktemp -d -t ibev-test.XXXXXX)
debs_installed=false
cleanup() {
  if $debs_installed; then purge_packages; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "tests: interrupted"; exit 130' INT TERM

# Runs one `bazel test` and adds its per-target results to the totals, as
# Bazel's build event protocol gives them (tools/bazel_results.py: a target
# passes when all its runs passed; a failed bazel with no failed target, a
# build error, counts as one failure).
run() {
  local label=$1
  shift
  local events=$work/$label.bep.json
  echo "== ${label}: bazel test $*"
  bazel test --build_event_json_file="$events" "$@" >"$work/$label.log" 2>&1
  local rc=$?
  local report p f
  report=$(python3 "$root/tools/bazel_results.py" "$events" "$rc")
  grep -v '^totals: ' <<<"$report" | grep -v ': passed (' || true
  read -r _ p f _ <<<"$(grep '^totals: ' <<<"$report")"
  echo "${label}: ${p:-0} targets passed, ${f:-1} failed"
  if ((rc != 0)); then grep -E '^ERROR' "$work/$label.log" | head -n 20; fi
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-1}))
  if ((rc != 0 || ${f:-1} != 0)); then status=1; fi
}

# Runs one command as one check; its output is shown when it fails.
check() {
  local label=$1
  shift
  local log=$work/check.log
  echo "== ${label}: $*"
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    tail -n 1 "$log"
  else
    failed=$((failed + 1))
    status=1
    tail -n 40 "$log"
  fi
}

# Builds and runs the CMake and make consumers; each counts once, and the
# script's own exit status fails the run too.
consumers() {
  local out rc
  echo "== consumers: tools/consumers.sh $*"
  out=$(tools/consumers.sh "$@")
  rc=$?
  echo "$out"
  local p f
  p=$(grep -cE '^consumer-\S+ .*: passed$' <<<"$out")
  f=$(grep -cE '^consumer-\S+ .*: failed$' <<<"$out")
  if ((rc != 0 && f == 0)); then
    echo "consumers: tools/consumers.sh exited $rc"
    f=1
  fi
  passed=$((passed + p))
  failed=$((failed + f))
  if ((rc != 0 || f != 0)); then status=1; fi
}

run default //...
# The kernel matrix: the soft-RoCE suite (tag "softroce") again, same build,
# in a VM booting the 6.12 kernel (tools/softroce/fetch_kernel.sh 6.12).
run kernel-6.12 --test_env=IBEV_KERNEL=6.12 --test_tag_filters=softroce //...
# The sanitizers over everything, the soft-RoCE suite included: the guest
# runs the instrumented binaries with ASAN_OPTIONS/UBSAN_OPTIONS/TSAN_OPTIONS.
# Tests only: the benchmarks are built in the default configuration; so are
# the checks of documents and scripts (tag config_independent), run once.
# TSan leaves out the host tests that start no thread and never hold two
# locks at once (tag single_thread): it reports races and lock-order
# inversions, and there can be neither (docs/testing.md).
run asan --config=asan --build_tests_only --test_tag_filters=-config_independent //...
run tsan --config=tsan --build_tests_only --test_tag_filters=-config_independent,-single_thread //...
# A separate workspace that depends on ibev through local_repository.
pushd examples/consumer-bazel >/dev/null
run consumer-bazel //...
popd >/dev/null
# The .bazelrc docs/consuming.md gives takes effect (Debian's Bazel printed
# some forty linux-sandbox debug lines per action without it), and the
# consumer's build (clean on a fresh clone) printed none.
check consumer-bazel-quiet bash -c "cd examples/consumer-bazel &&
  bazel build --announce_rc --nobuild //... 2>&1 | grep -q 'spawn_strategy=processwrapper-sandbox' &&
  ! grep -m 3 'linux-sandbox' '$work/consumer-bazel.log' &&
  echo 'the consumer builds with processwrapper-sandbox; no linux-sandbox debug lines'"

# The library's locking rules, proved by Clang's thread-safety analysis
# (core/thread_annotations.h); //tests/tools:thread_safety_test shows the
# check can fail.
check thread-safety tools/thread_safety.sh

# What ibev reads from files and sockets (recordings, fault schedules,
# ibev-watch's HTTP requests), fuzzed with libFuzzer, ASan and UBSan for 20 s
# a target with a fixed seed (tools/fuzz.sh, docs/testing.md);
# //tests/tools:fuzz_test shows the check can fail.
check fuzz tools/fuzz.sh

# The installed package: tools/install.sh into a fresh prefix.
prefix=$work/prefix
check install env IBEV_WERROR=ON tools/install.sh "$prefix"
# The installed unit runs the prefix's ibev-watch, not /usr/bin's.
check install-unit grep -qx "ExecStart=$prefix/bin/ibev-watch .*" \
  "$prefix/lib/systemd/system/ibev-watch.service"
check exports tools/check_exports.sh "$prefix/lib/libibev.so"
consumers "$prefix"

# The Debian packages, installed as a user would, then purged.
debs=$work/debs
mkdir -p "$debs"
# -Werror as for the install above, so its objects are reused, not rebuilt.
check package env IBEV_WERROR=ON tools/package.sh "$debs"
# Debian's own rules: no error, no warning; what is overridden says why
# (tools/lintian/).
check lintian lintian --fail-on error,warning --info "$debs"/*.deb
check package-contents bash -c "dpkg-deb -c $debs/libibev-dev_*.deb >'$work/dev.list' &&
  grep -q 'usr/share/doc/libibev-dev/examples/pingpong/pingpong.cc$' '$work/dev.list' &&
  grep -q 'usr/share/doc/libibev-dev/examples/consumer-c/consumer.c$' '$work/dev.list' &&
  grep -q 'usr/include/ibev/ibev_c.h$' '$work/dev.list' &&
  grep -q 'usr/share/doc/libibev-dev/CHANGELOG.md$' '$work/dev.list' &&
  grep -q 'usr/share/doc/libibev-dev/html/classibev_1_1Dispatcher.html$' '$work/dev.list' &&
  grep -q 'usr/share/man/man3/ibev_dispatcher.3.gz$' '$work/dev.list' &&
  grep -q 'usr/share/man/man3/ibev_c_dispatcher.3.gz$' '$work/dev.list' &&
  grep -q 'usr/share/man/man3/ibev_c.3.gz$' '$work/dev.list' &&
  grep -q 'usr/share/man/man7/ibev.7.gz$' '$work/dev.list' &&
  dpkg-deb -c $debs/ibev-tools_*.deb | grep -q 'lib/systemd/system/ibev-watch.service$' &&
  ! grep -E 'test_seams|cm_devices' '$work/dev.list' &&
  echo 'libibev-dev: docs, API reference, man pages (C too) and examples (C too), no internal header; ibev-tools: the unit'"
debs_installed=true
check apt-install env DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q \
  "$debs/${runtime}"_*.deb "$debs"/libibev-dev_*.deb "$debs"/ibev-tools_*.deb \
  "$debs"/python3-ibev_*.deb
# The service's unit as installed: its binary and man page there, every
# directive known to this systemd (no systemd as PID 1 is needed for this).
check unit-verify systemd-analyze verify /lib/systemd/system/ibev-watch.service
check exports-debs tools/check_exports.sh \
  "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/libibev.so" /usr/include/ibev/ibev_c.h
consumers
check man-pages bash -c "man -w ibev_dispatcher && man -w 7 ibev"
purge_packages
debs_installed=false

echo "tests: ${passed} passed, ${failed} failed"
exit "$status"
