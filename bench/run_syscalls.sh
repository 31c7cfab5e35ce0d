#!/usr/bin/env bash
# System calls per operation, counted by strace in one soft-RoCE VM session
# (bench/vm_syscalls.sh), and docs/syscalls.md written from them, which
# docs/benchmarks.md embeds: a count that TCG's noise cannot move, where a
# time under TCG moves 20-30 % a round. Per round trip of a 2-byte
# ping-pong: ibev in event mode, the same harness without ibev (a blocking
# ibv_get_cq_event loop) and perftest's ib_send_lat -e; per message of a
# 64-byte stream: ibev in event mode and ib_send_bw -e. Each figure is
# (count at 2N - count at N) / N, both processes, every thread; each
# verdict is computed from the rounds (bench/verdict.sh). Never fails on a
# figure; fails only if a run cannot be made.
#   bash bench/run_syscalls.sh [N [ROUNDS]]   (default 512, 7; N a multiple of 8)
#   bash bench/run_syscalls.sh --from REPORT  (no VM: docs/syscalls.md again from
#                                              the raw lines of REPORT, e.g. itself)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/verdict.sh
source bench/verdict.sh
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT

if [[ ${1:-} == --from ]]; then
  grep -E '^(run|syscalls|kernel) ' "${2:?usage: run_syscalls.sh --from REPORT}" >"$raw/vm.txt"
else
  n=${1:-512}
  rounds=${2:-7}
  if ((n <= 0 || n % 8 != 0)); then
    echo "run_syscalls: N must be a positive multiple of 8 (a stream signals 1 in 32 of 4N)" >&2
    exit 2
  fi
  tools/setup.sh
  # strace counts the calls; only this benchmark wants it.
  if ! command -v strace >/dev/null; then
    sudo=()
    [[ $(id -u) -ne 0 ]] && sudo=(sudo)
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
      strace >/dev/null
  fi
  bazel build -c opt //bench:softroce_bench
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  echo "syscalls: soft-RoCE VM, 2 vCPUs, kernel ${IBEV_KERNEL:-6.1}, N=$n, $rounds rounds"
  echo "run date=$(date -u +%Y-%m-%d) n=$n rounds=$rounds" >"$raw/vm.txt"
  IBEV_VM_CPUS=2 IBEV_VM_TIMEOUT=3000 tools/softroce/softroce_run.sh -- \
    bench/vm_syscalls.sh "$bin/bench/softroce_bench" "$n" "$rounds" | tee -a "$raw/vm.txt"
fi
# The run's own figures, from its raw lines (so --from renders them alike).
run_field() { awk -v k="$1" '$1 == "run" { for (i = 2; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == k) print kv[2] } }' "$raw/vm.txt"; }
n=$(run_field n)
rounds=$(run_field rounds)
run_date=$(run_field date)

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
        if (over == "") { printf "%.4f ", rate(config, r); continue }
        if (!((over, r) in lo) || hi[over, r] == lo[over, r] || rate(over, r) == 0) continue
        printf "%.4f ", rate(config, r) / rate(over, r)
      }
    }' "$raw/vm.txt"
}

# The median per operation of every system call a configuration makes, one
# column a configuration: what each loop spends its calls on.
breakdown() {
  local configs=(ibev_event raw_event ibev_every perftest_lat_e ibev_stream raw_stream perftest_bw_e)
  local names
  names=$(awk '$1 == "syscalls" { for (i = 6; i <= NF; ++i) { split($i, kv, "="); print kv[1] } }' \
    "$raw/vm.txt" | sort -u)
  printf '| system call |'
  printf ' %s |' "${configs[@]}"
  printf '\n|---|'
  printf -- '---|%.0s' "${configs[@]}"
  echo
  local name config line shown
  for name in $names; do
    line="| $name |"
    shown=0
    for config in "${configs[@]}"; do
      local median
      median=$(awk -f bench/order_stats.awk \
        -f <(echo 'BEGIN { n = median_interval(values, x); printf "%.3f", n ? MEDIAN : 0 }') \
        -v values="$(per_op "$config" "$name")" </dev/null)
      line="$line $median |"
      awk -v m="$median" 'BEGIN { exit !(m >= 0.01 || m <= -0.01) }' && shown=1
    done
    if ((shown)); then echo "$line"; fi
  done
}

vm_kernel=$(awk '$1 == "kernel" {print $2}' "$raw/vm.txt")
{
  echo "# System calls per operation (bench/run_syscalls.sh)"
  echo
  echo "\`bash bench/run_syscalls.sh $n $rounds\` on $run_date: soft-RoCE in the qemu"
  echo "TCG VM, 2 vCPUs, kernel $vm_kernel, rxe0 loopback; server on CPU 0, client on CPU 1."
  echo "strace -f counts every system call of both processes and all their threads. Each"
  echo "configuration runs with N = $n and 2N iterations (the streams with 4N and 8N"
  echo "messages) in every round, the configurations in a random order; a figure is"
  echo "(calls at 2N - calls at N) / N, so start-up, connection and teardown cancel. A count"
  echo "does not move with the machine's load as a time does; what can move it is timing"
  echo "itself (whether a completion is there before a process sleeps), so the rounds still"
  echo "give an interval. Each figure is the median of its rounds with the order-statistic"
  echo "interval of that median (at least 95 % coverage); the verdict is computed from the"
  echo "interval: met when the whole interval meets the target, missed when none of it does,"
  echo "undetermined otherwise (bench/verdict.sh). The target, from issue #26: ibev makes no"
  echo "more system calls than the loop it replaces, doing the same work."
  echo
  echo "| figure | median | interval | max | target | over target | verdict |"
  echo "|---|---|---|---|---|---|---|"
  row "ibev, event mode: system calls per round trip" calls - 0 "$(per_op ibev_event total)"
  row "the same harness without ibev: a blocking ibv_get_cq_event loop (ack, re-arm, drain)" \
    calls - 0 "$(per_op raw_event total)"
  row "ibev over the raw loop, paired by round (same signaling: 1 send in 32; same waits)" \
    ratio "<=" 1.0 "$(per_op ibev_event total raw_event)"
  row "ibev, every send signaled, its completion through the event path: per round trip" \
    calls - 0 "$(per_op ibev_every total)"
  row "perftest ib_send_lat -e (every send signaled, each completion waited for): per round trip" \
    calls - 0 "$(per_op perftest_lat_e total)"
  row "ibev with every send signaled over ib_send_lat -e, paired by round" ratio "<=" 1.0 \
    "$(per_op ibev_every total perftest_lat_e)"
  row "ibev, event mode, 64-byte stream: system calls per message" calls - 0 \
    "$(per_op ibev_stream total)"
  row "the same stream without ibev: a blocking ibv_get_cq_event loop on each side" calls - 0 \
    "$(per_op raw_stream total)"
  row "ibev over the raw loop per message, paired by round (same depth, signaling, waits)" \
    ratio "<=" 1.0 "$(per_op ibev_stream total raw_stream)"
  row "ib_send_bw -e, 64-byte stream: system calls per message" calls - 0 \
    "$(per_op perftest_bw_e total)"
  row "ibev over ib_send_bw -e per message, paired by round (not the same work: see below)" \
    ratio - 0 "$(per_op ibev_stream total perftest_bw_e)"
  echo
  echo "Where the calls go: the median per operation of each system call (per round trip for"
  echo "the first four columns, per message for the streams), those of 0.01 or more:"
  echo
  breakdown
  echo
  echo "What each configuration does:"
  echo
  echo "- **ibev_event**: bench/softroce_bench.cc \`latency --mode event\`: each process's"
  echo "  Dispatcher sleeps in epoll_wait; on a wake-up it drains the receive CQ into the"
  echo "  handler, which posts the reply, then reads the channel's event, re-arms and drains"
  echo "  once more. One send in 32 is signaled and the send CQ is polled without waiting."
  echo "  Its Dispatcher's watchdog thread counts too."
  echo "- **raw_event**: the same harness, the Dispatcher never started: the main thread sleeps"
  echo "  in a blocking ibv_get_cq_event (a read of the channel), acks it, re-arms and drains;"
  echo "  the same sends, the same signaling, the same waits: the floor ibev is held to."
  echo "- **ibev_every**: \`latency --mode event --signal-every 1 --send-cq event\`: every send"
  echo "  signaled and its completion handled by a handler on the Dispatcher, as perftest's -e"
  echo "  loop handles each one; what still differs: perftest waits for each send's event"
  echo "  before it polls for the next receive, and one channel serves both its CQs, where"
  echo "  ibev's two CQs have a channel each in one epoll set."
  echo "- **perftest_lat_e**: \`ib_send_lat -s 2 -e\`. Its latency loop (run_iter_lat_send)"
  echo "  waits for an event before each receive poll and, every send being signaled, before"
  echo "  each send completion's poll, each event acked at once and the CQ re-armed"
  echo "  (ctx_notify_events): its read and ioctl columns, 2 a message on each side."
  echo "- **ibev_stream**: \`softroce_bench rate --mode event --size 64\`: 128 sends"
  echo "  outstanding, 1 in 32 signaled, more posted from the send CQ's handler; the server"
  echo "  posts receives back from its receive CQ's handler."
  echo "- **raw_stream**: \`rate --mode raw-event\`, the same stream, each side's thread in the"
  echo "  same blocking loop as raw_event on the CQ whose handler does the work."
  echo "- **perftest_bw_e**: \`ib_send_bw -s 64 -e\`, its own depth and signaling; no target."
  echo
  echo "Reading the breakdown: on rxe a post rings the kernel with a write to the uverbs fd"
  echo "(the write column: one a message sent, in every loop) and a re-arm is an ioctl (one"
  echo "an event read); on mlx5 both are stores to mapped memory, and the counts fall to the"
  echo "waits alone. A wake-up of ibev's costs an epoll_wait, the channel's read and a"
  echo "re-arm; the raw loop's costs its blocking read and the re-arm. ibev makes fewer calls"
  echo "only where its wake-ups serve more completions each: in the ping-pong its drain"
  echo "after the arm finds the next message often enough (its read column against the raw"
  echo "loop's); in the stream how many completions a wake-up finds is the timing's, and"
  echo "the rounds' ratios spread both sides of 1."
  echo
  echo "Raw output:"
  echo
  echo '```'
  grep -E '^(run|syscalls|kernel) ' "$raw/vm.txt"
  echo '```'
} >docs/syscalls.md
echo "syscalls: wrote docs/syscalls.md"
