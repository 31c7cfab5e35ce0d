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
out=$(mktemp)
IBEV_VM_CPUS=2 IBEV_VM_TIMEOUT=$((seconds + 240)) \
  tools/softroce/softroce_run.sh -- "$bin/bench/soak" --seconds "$seconds" --pairs "$pairs" |
  tee "$out"
status=${PIPESTATUS[0]}
# docs/soak.md: the figures, which docs/benchmarks.md embeds when regenerated.
kernel=$(cat "${IBEV_CACHE:-/var/cache/ibev}/kernel/ready" 2>/dev/null || uname -r)
{
  echo "# Soak (bench/run_soak.sh)"
  echo
  echo "\`bash bench/run_soak.sh $seconds $pairs\` on $(date -u +%Y-%m-%d), soft-RoCE (rxe0)"
  echo "in the qemu TCG VM, 2 vCPUs, kernel $kernel. Targets: 0 lost or"
  echo "misrouted, the same port/GID events as a raw-verbs watcher, RSS growth"
  echo "under 1 % after the first minute's warm-up, the fd count unchanged."
  echo
  echo '```'
  grep -E '^(soak|messages|link|port|handlers|rss|fds|dispatcher)' "$out"
  echo '```'
} >docs/soak.md
rm -f "$out"
echo "soak: wrote docs/soak.md"
exit "$status"
