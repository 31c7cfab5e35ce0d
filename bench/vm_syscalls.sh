#!/usr/bin/env bash
# Runs inside the soft-RoCE VM (bench/run_syscalls.sh starts it): the system
# calls a ping-pong and a stream make, ibev's and the baselines', counted by
# strace in both processes. Each configuration runs with N and with 2N
# iterations: the difference is the work's alone, set-up and teardown
# cancel. Prints one line a run:
#   syscalls round=R config=NAME n=N total=T <name>=<calls> ...
#   vm_syscalls.sh SOFTROCE_BENCH N ROUNDS
# The configurations run in a random order within each round, so drift
# falls on every one alike (the counts barely move, but a timer's do).
set -u
bench=$1
n=$2
rounds=$3
dev=${IBEV_TEST_DEVICE:-rxe0}
out=/tmp/syscalls.txt

# count ROUND CONFIG ITERATIONS COMMAND...: COMMAND under strace -f, every
# process and thread it makes counted; one line of calls by name.
count() {
  local round=$1 config=$2 iterations=$3
  shift 3
  if ! timeout 900 strace -f -c -U name,calls -o "$out" -- "$@" >/tmp/run.out 2>&1; then
    echo "syscalls: $config failed:" >&2
    tail -n 20 /tmp/run.out >&2
    exit 1
  fi
  awk -v round="$round" -v config="$config" -v n="$iterations" '
    $1 == "total" { total = $2; next }
    NF == 2 && $2 ~ /^[0-9]+$/ { calls = calls " " $1 "=" $2 }
    END { printf "syscalls round=%s config=%s n=%s total=%s%s\n", round, config, n, total, calls }
  ' "$out"
}

# A two-process perftest run (server, then client), as bench/vm_benchmarks.sh
# runs them: server on CPU 0, client on CPU 1.
perftest_pair() {
  local tool=$1
  shift
  bash -c "taskset -c 0 $tool -d $dev -x 0 $* >/dev/null 2>&1 & sleep 1
           taskset -c 1 $tool -d $dev -x 0 $* localhost; status=\$?; wait; exit \$status"
}
export -f perftest_pair
export dev

run() {
  local round=$1 config=$2 iterations=$3
  case $config in
    ibev_event) count "$round" "$config" "$iterations" \
      "$bench" latency --mode event --iters "$iterations" --cpus 0,1 ;;
    ibev_every) count "$round" "$config" "$iterations" \
      "$bench" latency --mode event --signal-every 1 --send-cq event --iters "$iterations" \
      --cpus 0,1 ;;
    raw_event) count "$round" "$config" "$iterations" \
      "$bench" latency --mode raw-event --iters "$iterations" --cpus 0,1 ;;
    perftest_lat_e) count "$round" "$config" "$iterations" \
      bash -c "perftest_pair ib_send_lat -s 2 -n $iterations -e" ;;
    ibev_stream) count "$round" "$config" "$((iterations * 4))" \
      "$bench" rate --mode event --size 64 --messages "$((iterations * 4))" --cpus 0,1 ;;
    raw_stream) count "$round" "$config" "$((iterations * 4))" \
      "$bench" rate --mode raw-event --size 64 --messages "$((iterations * 4))" --cpus 0,1 ;;
    perftest_bw_e) count "$round" "$config" "$((iterations * 4))" \
      bash -c "perftest_pair ib_send_bw -s 64 -n $((iterations * 4)) -e" ;;
  esac
}

configs=(ibev_event raw_event ibev_every perftest_lat_e ibev_stream raw_stream perftest_bw_e)
for ((round = 1; round <= rounds; ++round)); do
  for config in $(printf '%s\n' "${configs[@]}" | shuf); do
    run "$round" "$config" "$n"
    run "$round" "$config" "$((2 * n))"
  done
done
uname -r | sed "s/^/kernel /"
