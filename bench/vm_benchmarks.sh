#!/usr/bin/env bash
# Runs inside the soft-RoCE VM (bench/run_benchmarks.sh starts it): perftest
# and ibev side by side on rxe0, same kernel, same run. Prints sections
# "== name" with raw lines; the host turns them into docs/benchmarks.md.
#   vm_benchmarks.sh SOFTROCE_BENCH ITERATIONS ROUNDS [removal]
# ("removal": the device removal figures alone, for a second kernel.)
# Latency runs are interleaved, ROUNDS times, so that the machine's drift
# falls on every configuration alike.
set -u
bench=$1
iters=$2
rounds=$3
dev=${IBEV_TEST_DEVICE:-rxe0}

# Every latency run pins its server to CPU 0 and its client to CPU 1, perftest
# and ibev alike: where the scheduler puts two processes is the largest
# source of drift on this emulated machine, and it must not differ between
# the runs compared.
#
# perftest's ib_send_lat, server and client as two processes; each one's CPU
# time (user, sys) from bash's `times`, as for ibev below.
perftest() {
  local label=$1
  shift
  echo "== $label"
  bash -c "taskset -c 0 ib_send_lat -d $dev -x 0 -s 2 -n $iters $* > /tmp/server.out 2>&1; times" \
    >/tmp/server.times 2>&1 &
  sleep 1
  bash -c "timeout 600 taskset -c 1 ib_send_lat -d $dev -x 0 -s 2 -n $iters $* localhost; times" \
    >/tmp/client.out 2>&1
  wait
  grep -E '^ *2 +[0-9]+ ' /tmp/client.out | tail -n 1 | sed 's/^ */perftest /'
  echo "cpu $(tail -n 1 /tmp/client.out) $(tail -n 1 /tmp/server.times)"
}

# ibev's ping-pong forks its own server; `times` counts both processes.
ibev_latency() {
  local label=$1
  shift
  echo "== $label"
  bash -c "timeout 600 $bench latency --cpus 0,1 --iters $iters $*; times" >/tmp/ibev.out 2>&1
  grep '^latency' /tmp/ibev.out
  echo "cpu $(tail -n 1 /tmp/ibev.out)"
}

removal() {
  echo "== removal_ibev"
  timeout 300 "$bench" removal --holder ibev --rounds 5
  echo "== removal_raw"
  timeout 300 "$bench" removal --holder raw --rounds 3 --hold-ms 3000
}
if [[ ${4:-} == removal ]]; then
  removal
  echo "== end"
  exit 0
fi

for round in $(seq "$rounds"); do
  perftest "perftest_event $round" -e
  ibev_latency "ibev_event $round" --mode event
  ibev_latency "raw_event $round" --mode raw-event
  perftest "perftest_poll $round"
  ibev_latency "ibev_adaptive $round" --mode adaptive --budget-us 2000
  ibev_latency "raw_poll $round" --mode raw-poll
done
echo "== ibev_idle"
timeout 60 "$bench" idle --budget-us 2000 --seconds 3
echo "== stream_ack1"
timeout 600 "$bench" stream --ack-batch 1 --messages 20000
echo "== stream_ack32"
timeout 600 "$bench" stream --ack-batch 32 --messages 20000
echo "== link_down"
timeout 120 "$bench" link-down --rounds 20
removal
echo "== end"
