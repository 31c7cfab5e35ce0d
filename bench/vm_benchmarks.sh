#!/usr/bin/env bash
# Runs inside the soft-RoCE VM (bench/run_benchmarks.sh starts it): perftest
# and ibev side by side on rxe0, same kernel, same run. Prints sections
# "== name" with raw lines; the host turns them into docs/benchmarks.md.
# Latency samples for the plots go to $TEST_TMPDIR/samples (the host's share).
#   vm_benchmarks.sh SOFTROCE_BENCH ITERATIONS ROUNDS [removal]
# ("removal": the device removal figures alone, for a second kernel.)
# Latency and rate runs are interleaved, ROUNDS times, so that the machine's
# drift falls on every configuration alike.
set -u
bench=$1
iters=$2
rounds=$3
dev=${IBEV_TEST_DEVICE:-rxe0}
samples=${TEST_TMPDIR:-/tmp}/samples
mkdir -p "$samples"
# Messages per rate run: long enough to dwarf the start, as perftest's 5000+.
messages=20000

# Every two-process run pins its server to CPU 0 and its client to CPU 1,
# perftest and ibev alike: where the scheduler puts two processes is the
# largest source of drift on this emulated machine, and it must not differ
# between the runs compared.
#
# perftest, server and client as two processes; each one's CPU time (user,
# sys) from bash's `times`, as for ibev below. The client's output is kept
# in /tmp/client.out.
perftest_pair() {
  local tool=$1
  shift
  bash -c "taskset -c 0 $tool -d $dev -x 0 $* > /tmp/server.out 2>&1; times" \
    >/tmp/server.times 2>&1 &
  sleep 1
  bash -c "timeout 600 taskset -c 1 $tool -d $dev -x 0 $* localhost; times" \
    >/tmp/client.out 2>&1
  wait
  echo "cpu $(tail -n 1 /tmp/client.out) $(tail -n 1 /tmp/server.times)"
}

# ib_send_lat; with SAMPLES=name, -H and every one-way sample kept for the
# plots (perftest prints them sorted, one per iteration).
perftest_latency() {
  local label=$1
  shift
  echo "== $label"
  local histogram=
  [[ -n ${SAMPLES:-} ]] && histogram=-H
  perftest_pair ib_send_lat -s 2 -n "$iters" $histogram "$@" | tee /tmp/cpu.line >/dev/null
  grep -m1 -E 'Max inline data' /tmp/client.out | sed 's/^ */perftest_header /'
  grep -E '^ *2 +[0-9]+ ' /tmp/client.out | tail -n 1 | sed 's/^ */perftest /'
  if [[ -n ${SAMPLES:-} ]]; then
    awk -F', ' '/^[0-9]+, [0-9.]+$/ {print $2}' /tmp/client.out >"$samples/$SAMPLES"
  fi
  cat /tmp/cpu.line
}

# ib_send_bw: MsgRate[Mpps] is its message rate.
perftest_rate() {
  local label=$1
  shift
  echo "== $label"
  perftest_pair ib_send_bw -n "$messages" "$@" | tee /tmp/cpu.line >/dev/null
  grep -m1 -E 'Max inline data' /tmp/client.out | sed 's/^ */perftest_header /'
  # Its columns are separated by tabs and spaces.
  grep -E '^[[:space:]]*[0-9]+([[:space:]]+[0-9.]+){4}[[:space:]]*$' /tmp/client.out | tail -n 1 |
    awk '{$1 = $1; print "perftest_bw " $0}'
  cat /tmp/cpu.line
}

# ibev's two-process runs fork their own server; `times` counts both.
ibev_run() {
  local label=$1
  shift
  echo "== $label"
  bash -c "timeout 600 $bench $* --cpus 0,1; times" >/tmp/ibev.out 2>&1
  grep -E '^(latency|rate) ' /tmp/ibev.out
  echo "cpu $(tail -n 1 /tmp/ibev.out)"
}
ibev_latency() {
  local label=$1
  shift
  local keep=()
  [[ -n ${SAMPLES:-} ]] && keep=(--samples "$samples/$SAMPLES")
  ibev_run "$label" latency --iters "$iters" "$@" "${keep[@]}"
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

# perftest's rate tools: tx depth 128, one completion in 32 (-Q), as ibev's.
bw_common=(-t 128 -Q 32)
for round in $(seq "$rounds"); do
  # Round 1 keeps every sample of the four compared latency rows.
  first() { ((round == 1)) && echo "$1"; }
  SAMPLES=$(first perftest_event.txt) perftest_latency "perftest_event $round" -e
  SAMPLES=$(first ibev_event.txt) ibev_latency "ibev_event $round" --mode event
  ibev_latency "raw_event $round" --mode raw-event
  ibev_latency "ibev_event_worker $round" --mode event --executor worker
  SAMPLES=$(first perftest_poll.txt) perftest_latency "perftest_poll $round"
  SAMPLES=$(first ibev_adaptive.txt) ibev_latency "ibev_adaptive $round" --mode adaptive \
    --budget-us 2000
  ibev_latency "raw_poll $round" --mode raw-poll
  for size in 64 4096; do
    perftest_rate "bw_perftest_event_$size $round" -s "$size" "${bw_common[@]}" -e
    ibev_run "rate_ibev_event_$size $round" rate --mode event --size "$size" \
      --messages "$messages"
    perftest_rate "bw_perftest_poll_$size $round" -s "$size" "${bw_common[@]}"
    ibev_run "rate_ibev_adaptive_$size $round" rate --mode adaptive --budget-us 2000 \
      --size "$size" --messages "$messages"
  done
done

# Message rate against queue depth, 64 B, one round.
for depth in 32 64 128 256; do
  perftest_rate "depth_perftest_event $depth" -s 64 -t "$depth" -Q 32 -e
  ibev_run "depth_ibev_event $depth" rate --mode event --size 64 --depth "$depth" \
    --messages "$messages"
  perftest_rate "depth_perftest_poll $depth" -s 64 -t "$depth" -Q 32
  ibev_run "depth_ibev_adaptive $depth" rate --mode adaptive --budget-us 2000 --size 64 \
    --depth "$depth" --messages "$messages"
done

# Dispatch cost against the number of CQs: the same round-robin ping-pong
# over 1, 64 and 1024 QP pairs, each CQ on its own channel, and 1024 pairs'
# 2048 CQs on 8 shared channels; and the same round robin served by no
# Dispatcher (one thread's epoll, read, ack, re-arm, drain): what the objects
# themselves cost as they grow. Interleaved rounds, one line each, into one
# section per configuration.
rm -f /tmp/scale_*
for ((round = 1; round <= rounds; round++)); do
  for pairs in 1 64 1024; do
    timeout 600 "$bench" scale --pairs "$pairs" --messages 8192 >>/tmp/scale_$pairs
  done
  timeout 600 "$bench" scale --pairs 1024 --channels 8 --messages 8192 >>/tmp/scale_shared
  for pairs in 1 1024; do
    timeout 600 "$bench" scale --pairs "$pairs" --messages 8192 --mode raw-event \
      >>/tmp/scale_raw_$pairs
  done
done
for pairs in 1 64 1024; do
  echo "== scale $pairs"
  cat /tmp/scale_$pairs
done
echo "== scale_shared 1024"
cat /tmp/scale_shared
for pairs in 1 1024; do
  echo "== scale_raw $pairs"
  cat /tmp/scale_raw_$pairs
done
echo "== memory"
timeout 300 "$bench" memory --pairs 1024

# A port event's delay and a second CQ's latency, with and without a
# saturated CQ on the same Dispatcher; the same saturated CQ on a Dispatcher
# of its own (the device and the CPUs as loaded, but no loop shared with the
# port events and the ping-pong); its turn bounded to 16 completions
# (CompletionOptions::budget), adaptive and event mode. A p99 of one run
# moves by 3x between runs here, so: interleaved rounds, a line each.
fairness_configs=(
  "unloaded|--load 0"
  "loaded|--load 1 --mode adaptive --budget-us 2000"
  "loaded_apart|--load 2 --mode adaptive --budget-us 2000"
  "loaded_budget16|--load 1 --mode adaptive --budget-us 2000 --turn-budget 16"
  "loaded_event_budget16|--load 1 --mode event --turn-budget 16"
)
rm -f /tmp/fairness_*
for ((round = 1; round <= rounds; round++)); do
  for config in "${fairness_configs[@]}"; do
    # shellcheck disable=SC2086 # the flags are words
    timeout 600 "$bench" fairness --rounds 50 ${config#*|} | grep '^fairness ' \
      >>"/tmp/fairness_${config%%|*}"
  done
done
for config in "${fairness_configs[@]}"; do
  echo "== fairness_${config%%|*}"
  cat "/tmp/fairness_${config%%|*}"
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
