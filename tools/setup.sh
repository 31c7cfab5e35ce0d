#!/usr/bin/env bash
# Installs every Debian package ibev needs on a fresh Debian 12 machine.
# Idempotent: says nothing and changes nothing when everything is there.
set -euo pipefail

packages=(
  # build and test
  bazel-bootstrap g++ libibverbs-dev librdmacm-dev ibverbs-providers libboost-dev
  libboost-test-dev
  # the fault campaign's schedules, generated and shrunk (tests/campaign)
  librapidcheck-dev
  # ibev-watch --journal (sd_journal_send); its unit checked with
  # systemd-analyze, the journal test run against systemd-journald
  libsystemd-dev systemd
  # scraping ibev-watch in the soft-RoCE tests and the fleet soak
  curl
  # ibev-watch's metrics checked by promtool, scraped by a real Prometheus
  # server in the soft-RoCE VM (//tests/softroce:ibev_watch_test)
  prometheus
  # the installable build, its consumers and the Debian packages
  cmake make pkgconf dpkg-dev
  # the packages checked against Debian's rules
  lintian
  # soft-RoCE test VM and the real peers run inside it
  qemu-system-x86 busybox-static kmod cpio xz-utils iproute2 rdma-core
  ibverbs-utils perftest rdmacm-utils
  # every thread's stack when a test hangs in the VM (softroce_run.sh)
  gdb
  # reading Bazel's build event protocol (tools/bazel_results.py)
  python3
  # Clang's thread-safety analysis over the library (tools/thread_safety.sh)
  clang
  # libFuzzer and Clang's sanitizer runtimes for the fuzz targets
  # (tools/fuzz.sh), which clang does not pull in
  libclang-rt-14-dev
  # the Python module (python/: pybind11 on Debian's CPython) and its tests
  python3-dev pybind11-dev python3-pytest
  # the API reference (docs/doxygen), checked by //tests/docs:doxygen_test
  doxygen
  # the manual pages' checks (//tests/docs:man_pages_test)
  man-db groff-base
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null |
      grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi

if ((${#missing[@]} > 0)); then
  echo "setup: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q \
    --no-install-recommends "${missing[@]}"
fi

# The soft-RoCE VM's kernels, for hosts whose kernel has no rdma_rxe: the
# suite runs on Debian 12's 6.1 and on the backports' 6.12.
"$(dirname "$0")/softroce/fetch_kernel.sh" 6.1
"$(dirname "$0")/softroce/fetch_kernel.sh" 6.12
