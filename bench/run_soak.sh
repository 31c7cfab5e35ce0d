#!/usr/bin/env bash
# Runs bench/soak.cc on a soft-RoCE device (in the VM when this kernel has no
# rdma_rxe) and prints its figures, which docs/benchmarks.md reports.
#   bash bench/run_soak.sh [SECONDS] [PAIRS]      (default 600 s, 8 pairs)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
pairs=${2:-8}
tools/setup.sh
bazel build -c opt //bench:soak
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
IBEV_VM_CPUS=2 IBEV_VM_TIMEOUT=$((seconds + 240)) \
  tools/softroce/softroce_run.sh -- "$bin/bench/soak" --seconds "$seconds" --pairs "$pairs"
