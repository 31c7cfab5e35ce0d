#!/usr/bin/env bash
# System calls per operation, counted by the kernel's syscall tracepoints
# (perf stat) in one soft-RoCE VM session (bench/vm_syscalls.sh), and
# docs/syscalls.md written from them, which docs/benchmarks.md embeds: a count
# moves far less with the machine's load than a time does under TCG. Per
# round trip of a 2-byte ping-pong: ibev in event mode, the same harness
# without ibev (a blocking ibv_get_cq_event loop), ibev with every send
# signaled, and perftest's ib_send_lat -e; per message of a 64-byte stream:
# ibev, the same stream without it, ib_send_bw -e. Each figure is
# (count at 2N - count at N) / N, both processes, every thread; each verdict
# is computed from the rounds (bench/verdict.sh). Never fails on a figure;
# fails only if a run cannot be made.
#   bash bench/run_syscalls.sh [N [ROUNDS]]   (default 512, 7; N a multiple of 8)
#   bash bench/run_syscalls.sh --from REPORT  (no VM: docs/syscalls.md again from
#                                              the raw lines of REPORT, e.g. itself)
set -euo pipefail
from=
if [[ ${1:-} == --from ]]; then
  from=$(realpath "${2:?usage: run_syscalls.sh --from REPORT}")
fi
cd "$(dirname "$0")/.."
# shellcheck source=bench/verdict.sh
source bench/verdict.sh
raw=$(mktemp -d)
report=
trap 'rm -rf "$raw" "$report"' EXIT
# The raw lines, each of its own shape (bench/vm_syscalls.sh's header says
# which), so that a report's other text is never read as data.
raw_lines='^(run date=|configs |perftest version=|syscalls round=|detail round=|kernel )'

if [[ -n $from ]]; then
  grep -E "$raw_lines" "$from" >"$raw/vm.txt"
else
  n=${1:-512}
  rounds=${2:-7}
  if ((n <= 0 || n % 8 != 0 || rounds < 1)); then
    echo "run_syscalls: N is a positive multiple of 8 (a stream signals 1 in 32 of 4N), ROUNDS >= 1" >&2
    exit 2
  fi
  tools/setup.sh
  # perf counts the calls; only this benchmark wants it.
  if ! command -v perf >/dev/null; then
    sudo=()
    [[ $(id -u) -ne 0 ]] && sudo=(sudo)
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends linux-perf >/dev/null
  fi
  bazel build -c opt //bench:softroce_bench
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  echo "syscalls: soft-RoCE VM, 2 vCPUs, kernel ${IBEV_KERNEL:-6.1}, N=$n, $rounds rounds"
  echo "run date=$(date -u +%Y-%m-%d) n=$n rounds=$rounds" >"$raw/vm.txt"
  IBEV_VM_CPUS=2 IBEV_VM_TIMEOUT=3000 tools/softroce/softroce_run.sh -- \
    bench/vm_syscalls.sh "$bin/bench/softroce_bench" "$n" "$rounds" | tee -a "$raw/vm.txt"
fi

# field KIND KEY: KEY's value on the first line of KIND ("run", "perftest").
field() {
  awk -v kind="$1" -v key="$2" '$1 == kind {
    for (i = 2; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == key) { print kv[2]; exit } } }' \
    "$raw/vm.txt"
}
n=$(field run n)
rounds=$(field run rounds)
run_date=$(field run date)
perftest_version=$(field perftest version)
vm_kernel=$(awk '$1 == "kernel" {print $2}' "$raw/vm.txt")
read -r -a configs <<<"$(awk '$1 == "configs" { $1 = ""; print; exit }' "$raw/vm.txt")"

# per_op CONFIG FIELD: each round's (FIELD at 2N - FIELD at N) / N for
# CONFIG; FIELD is "total" or a system call's name (none made: 0).
# per_op CONFIG FIELD OVER: the same, over CONFIG OVER's, paired by round.
per_op() {
  awk -v config="$1" -v field="$2" -v over="${3:-}" '
    $1 == "syscalls" {
      split("", f)
      for (i = 2; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] }
      c = f["config"]; r = f["round"]; m = f["n"] + 0
      if (c != config && c != over) next
      if (!((c, r) in lo) || m < lo[c, r]) { lo[c, r] = m; lo_count[c, r] = f[field] + 0 }
      if (!((c, r) in hi) || m > hi[c, r]) { hi[c, r] = m; hi_count[c, r] = f[field] + 0 }
      rounds[r] = 1
    }
    function rate(c, r) { return (hi_count[c, r] - lo_count[c, r]) / (hi[c, r] - lo[c, r]) }
    END {
      for (r in rounds) {
        if (!((config, r) in lo) || hi[config, r] == lo[config, r]) continue
        if (over == "") { printf "%.6g ", rate(config, r); continue }
        if (!((over, r) in lo) || hi[over, r] == lo[over, r] || rate(over, r) == 0) continue
        printf "%.6g ", rate(config, r) / rate(over, r)
      }
    }' "$raw/vm.txt"
}

# The median per operation of each system call counted, one column a
# configuration: what each loop spends its calls on.
breakdown() {
  local names
  names=$(awk '$1 == "syscalls" {
      for (i = 6; i <= NF; ++i) { split($i, kv, "="); print kv[1] }; exit }' "$raw/vm.txt")
  printf '| system call |'
  printf ' %s |' "${configs[@]}"
  printf '\n|---|'
  printf -- '---|%.0s' "${configs[@]}"
  echo
  local name config line median
  for name in $names total; do
    line="| $name |"
    for config in "${configs[@]}"; do
      median=$(awk -f bench/order_stats.awk \
        -f <(echo 'BEGIN { n = median_interval(values, x); printf "%.3f", n ? MEDIAN : 0 }') \
        -v values="$(per_op "$config" "$name")" </dev/null)
      line="$line $median |"
    done
    echo "$line"
  done
}

report=$(mktemp docs/.syscalls.XXXXXX)  # written whole, then renamed: a failed run leaves the last report
{
  echo "# System calls per operation (bench/run_syscalls.sh)"
  echo
  echo "\`bash bench/run_syscalls.sh $n $rounds\` on $run_date: soft-RoCE in the qemu TCG VM,"
  echo "2 vCPUs, kernel $vm_kernel, rxe0 loopback, perftest $perftest_version; server on"
  echo "CPU 0, client on CPU 1. The kernel's syscall tracepoints count every system call"
  echo "of both processes and all their threads (perf stat; unlike strace, nothing stops"
  echo "a process at a call, so its timing is its own). Each configuration runs with"
  echo "N = $n and 2N iterations (the streams with 4N and 8N messages) in every round, the"
  echo "configurations in a random order; a figure is (calls at 2N - calls at N) / N, so"
  echo "start-up, connection and teardown cancel. Timing still moves a count (whether a"
  echo "completion is there before a process sleeps; how often a timer fires during a"
  echo "run), so the rounds give each figure its interval. The targets are issue #26's:"
  echo "ibev makes no more system calls than the loop it replaces, doing the same work."
  verdict_table_head
  row "ibev, event mode: system calls per round trip" calls - 0 "$(per_op ibev_event total)"
  row "the same harness without ibev: a blocking ibv_get_cq_event loop (ack, re-arm, drain)" \
    calls - 0 "$(per_op raw_event total)"
  row "ibev over the raw loop, paired by round (same sends, signaling and waits)" \
    ratio "<=" 1.0 "$(per_op ibev_event total raw_event)"
  row "ibev, every send signaled, its completion through the event path: per round trip" \
    calls - 0 "$(per_op ibev_every total)"
  row "the same work without ibev, in perftest's order (a blocking wait for each send's completion too)" \
    calls - 0 "$(per_op raw_event_every total)"
  row "the same work without ibev, in ibev's order (epoll; drain, read, ack, re-arm, drain): the floor" \
    calls - 0 "$(per_op raw_floor_every total)"
  row "ibev with every send signaled over the floor, paired by round (the same work and order)" \
    ratio "<=" 1.0 "$(per_op ibev_every total raw_floor_every)"
  row "ibev with every send signaled over perftest's order without ibev, paired by round" \
    ratio "<=" 1.0 "$(per_op ibev_every total raw_event_every)"
  row "perftest ib_send_lat -e: per round trip" calls - 0 "$(per_op perftest_lat_e total)"
  row "ibev with every send signaled over ib_send_lat -e, paired by round (what differs: below)" \
    ratio "<=" 1.0 "$(per_op ibev_every total perftest_lat_e)"
  row "ibev, event mode, 64-byte stream: per message" calls - 0 "$(per_op ibev_stream total)"
  row "the same stream without ibev: a blocking ibv_get_cq_event loop on each side" calls - 0 \
    "$(per_op raw_stream total)"
  row "ibev over the raw loop per message, paired by round (same depth, signaling, waits)" \
    ratio "<=" 1.0 "$(per_op ibev_stream total raw_stream)"
  row "ib_send_bw -e, 64-byte stream, 128 outstanding, 1 in 32 signaled: per message" calls \
    - 0 "$(per_op perftest_bw_e total)"
  row "ibev over ib_send_bw -e per message, paired by round (what differs: below)" \
    ratio "<=" 1.0 "$(per_op ibev_stream total perftest_bw_e)"
  echo
  echo "Where the calls go: the median per operation of each system call counted, and of"
  echo "the rest (other) and all (total); per round trip for the ping-pongs, per message"
  echo "for the streams:"
  echo
  breakdown
  echo
  echo "What each configuration does (bench/softroce_bench.cc, perftest's own loops):"
  echo
  echo "- **ibev_event**: \`latency --mode event\`: each process's Dispatcher sleeps in"
  echo "  epoll_wait; on a wake-up it drains the receive CQ into the handler, which posts the"
  echo "  reply, then reads the channel's event, drains, re-arms and drains once more. One"
  echo "  send in 32 is signaled and the send CQ is polled without waiting."
  echo "- **raw_event**: the same harness, its Dispatcher made without a watchdog and never"
  echo "  started: a thread of its own sleeps in a blocking ibv_get_cq_event (a read of the"
  echo "  channel), acks it, re-arms and drains; the same sends, signaling and waits: the"
  echo "  floor ibev is held to."
  echo "- **ibev_every**: \`latency --mode event --signal-every 1 --send-cq event\`: every send"
  echo "  signaled and its completion handled by a handler on the Dispatcher, as perftest's"
  echo "  loop handles each one. What still differs: perftest waits for each send's event"
  echo "  before it polls for the next receive, and (in the version above) one channel"
  echo "  serves both its CQs, where ibev's two CQs have a channel each in one epoll set."
  echo "- **raw_event_every**: \`latency --mode raw-event --signal-every 1 --send-cq event\`:"
  echo "  the raw loop doing ibev_every's work in perftest's order: after each signaled send"
  echo "  it blocks for that send's completion event, acks, re-arms and polls it."
  echo "- **raw_floor_every**: \`latency --mode raw-floor --signal-every 1 --send-cq event\`:"
  echo "  ibev_every's work and order with nothing of ibev's: one epoll over both channels;"
  echo "  per ready channel drain, read one event, ack (batched), re-arm, drain."
  echo "- **perftest_lat_e**: \`ib_send_lat -s 2 -e\`. Its loop (run_iter_lat_send) waits for an"
  echo "  event before each receive poll and, every send being signaled, before each send"
  echo "  completion's poll; each event is acked at once and the CQ re-armed"
  echo "  (ctx_notify_events)."
  echo "- **ibev_stream**: \`rate --mode event --size 64\`: 128 sends outstanding, 1 in 32"
  echo "  signaled, more posted from the send CQ's handler; the server posts receives back"
  echo "  from its receive CQ's handler."
  echo "- **raw_stream**: \`rate --mode raw-event\`, the same stream, each side's thread in the"
  echo "  same blocking loop as raw_event, on the CQ whose handler does the work."
  echo "- **perftest_bw_e**: \`ib_send_bw -s 64 -t 128 -Q 32 -e\`: the same depth and"
  echo "  signaling as ibev_stream. What differs: its own loop blocks in the channel's read"
  echo "  with no epoll set (so no epoll_wait), and (in the version above) one channel"
  echo "  serves both its CQs."
  echo
  echo "On rxe a post rings the kernel with a write to the uverbs fd, and a re-arm is an"
  echo "ioctl, so in the breakdown the write row counts posts, and the read and ioctl rows"
  echo "count events read and re-arms; a loop on an epoll set adds its epoll_wait row. Each"
  echo "round's own figures are in the raw output; the detail lines are softroce_bench's"
  echo "own report of the same runs (its CQ events among them)."
  echo
  echo "Raw output:"
  echo
  echo '```'
  grep -E "$raw_lines" "$raw/vm.txt"
  echo '```'
} >"$report"
chmod 644 "$report"
mv "$report" docs/syscalls.md
report=
echo "syscalls: wrote docs/syscalls.md"
