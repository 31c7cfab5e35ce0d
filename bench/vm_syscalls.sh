#!/usr/bin/env bash
# Runs inside the soft-RoCE VM (bench/run_syscalls.sh starts it): the system
# calls a ping-pong and a stream make, ibev's and the baselines', counted by
# the kernel's syscall tracepoints (perf stat, every thread and child of the
# processes measured; nothing stops them, as ptrace would). Each
# configuration runs with N and with 2N iterations: the difference is the
# work's alone, set-up and teardown cancel. Prints
#   configs NAME...                    (the configurations, in report order)
#   perftest version=V
#   syscalls round=R config=NAME n=N total=T <name>=<calls> ... other=<calls>
#   detail round=R config=NAME n=N <softroce_bench's own line>
#   kernel RELEASE
#   vm_syscalls.sh SOFTROCE_BENCH N ROUNDS
# The configurations run in a random order within each round, so drift
# falls on every one alike.
set -u
bench=$1
n=$2
rounds=$3
dev=${IBEV_TEST_DEVICE:-rxe0}
configs=(ibev_event raw_event ibev_every raw_event_every raw_floor_every perftest_lat_e
  ibev_stream raw_stream perftest_bw_e)
# The calls counted one by one; the rest of the total is "other".
names=(read write ioctl epoll_wait futex poll)
events=raw_syscalls:sys_enter
for name in "${names[@]}"; do events+=",syscalls:sys_enter_$name"; done

mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing || {
  echo "syscalls: cannot mount tracefs" >&2
  exit 1
}

# report ROUND CONFIG ITERATIONS FILES...: one line, the FILES' counts summed.
report() {
  local round=$1 config=$2 iterations=$3
  shift 3
  awk -F, -v round="$round" -v config="$config" -v n="$iterations" -v names="${names[*]}" '
    $3 == "raw_syscalls:sys_enter" { total += $1 }
    $3 ~ /^syscalls:sys_enter_/ { sub("syscalls:sys_enter_", "", $3); calls[$3] += $1; counted += $1 }
    END {
      line = sprintf("syscalls round=%s config=%s n=%s total=%d", round, config, n, total)
      split(names, list, " ")
      for (i = 1; i in list; ++i) line = line sprintf(" %s=%d", list[i], calls[list[i]])
      print line sprintf(" other=%d", total - counted)
    }' "$@"
}

fail() {
  echo "syscalls: $1 failed:" >&2
  tail -n 20 /tmp/run.out >&2
  exit 1
}

# perf stat exits 0 when its workload is killed by a signal: a run counts
# only when the workload printed its result line too.
# ibev's harness forks its own server: one process tree, one perf stat.
bench_run() {
  local round=$1 config=$2 iterations=$3
  shift 3
  timeout 900 perf stat -x, -o /tmp/bench.perf -e "$events" -- "$bench" "$@" --cpus 0,1 \
    >/tmp/run.out 2>&1 || fail "$config"
  grep -qE '^(latency|rate) ' /tmp/run.out || fail "$config (no result)"
  report "$round" "$config" "$iterations" /tmp/bench.perf
  grep -E '^(latency|rate) ' /tmp/run.out | sed "s/^/detail round=$round config=$config n=$iterations /"
}

# perftest's server and client, as bench/vm_benchmarks.sh runs them (server
# on CPU 0, client on CPU 1), each counted on its own: the shell between
# them is not.
# SIZE is the message size, whose result line (size, iterations, ...) the
# client prints when it ran to the end.
perftest_run() {
  local round=$1 config=$2 iterations=$3 size=$4 tool=$5
  shift 5
  timeout 900 perf stat -x, -o /tmp/server.perf -e "$events" -- \
    taskset -c 0 "$tool" -d "$dev" -x 0 -s "$size" "$@" >/tmp/server.out 2>&1 &
  local server=$!
  sleep 1
  local client=0
  timeout 900 perf stat -x, -o /tmp/client.perf -e "$events" -- \
    taskset -c 1 "$tool" -d "$dev" -x 0 -s "$size" "$@" localhost >/tmp/client.out 2>&1 ||
    client=$?
  wait "$server" || { ((client != 0)) || client=1; }
  cat /tmp/client.out /tmp/server.out >/tmp/run.out
  ((client == 0)) || fail "$config"
  grep -qE "^[[:space:]]*$size[[:space:]]+$iterations[[:space:]]" /tmp/client.out ||
    fail "$config (no result)"
  report "$round" "$config" "$iterations" /tmp/server.perf /tmp/client.perf
}

run() {
  local round=$1 config=$2 i=$3
  case $config in
    ibev_event) bench_run "$round" "$config" "$i" latency --mode event --iters "$i" ;;
    raw_event) bench_run "$round" "$config" "$i" latency --mode raw-event --iters "$i" ;;
    ibev_every) bench_run "$round" "$config" "$i" \
      latency --mode event --signal-every 1 --send-cq event --iters "$i" ;;
    raw_event_every) bench_run "$round" "$config" "$i" \
      latency --mode raw-event --signal-every 1 --send-cq event --iters "$i" ;;
    raw_floor_every) bench_run "$round" "$config" "$i" \
      latency --mode raw-floor --signal-every 1 --send-cq event --iters "$i" ;;
    perftest_lat_e) perftest_run "$round" "$config" "$i" 2 ib_send_lat -n "$i" -e ;;
    # Streams: 4 messages an iteration; 128 outstanding, 1 in 32 signaled.
    ibev_stream) bench_run "$round" "$config" "$((4 * i))" \
      rate --mode event --size 64 --messages "$((4 * i))" ;;
    raw_stream) bench_run "$round" "$config" "$((4 * i))" \
      rate --mode raw-event --size 64 --messages "$((4 * i))" ;;
    perftest_bw_e) perftest_run "$round" "$config" "$((4 * i))" 64 \
      ib_send_bw -t 128 -Q 32 -n "$((4 * i))" -e ;;
  esac
}

echo "configs ${configs[*]}"
echo "perftest version=$(dpkg-query -W -f='${Version}' perftest)"
for ((round = 1; round <= rounds; ++round)); do
  for config in $(printf '%s\n' "${configs[@]}" | shuf); do
    run "$round" "$config" "$n"
    run "$round" "$config" "$((2 * n))"
  done
done
uname -r | sed "s/^/kernel /"
