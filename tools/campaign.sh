#!/usr/bin/env bash
# The long fault campaign (issue #50): the runner
# (tests/softroce:campaign_test_bin) for seeds FIRST.. FIRST+COUNT-1, CASES
# schedules each, in one soft-RoCE VM with two devices
# (tools/softroce/softroce_run.sh --devices 2),
# nice'd; prints each seed's line and the totals: schedules, faults,
# invariant checks, violations (each with its seed, reproduce string and
# shrunk schedule file), duration. docs/reliability.md keeps the figures.
#
#   tools/campaign.sh [FIRST [COUNT [CASES]]]     (defaults 100 10 10)
#
# CAMPAIGN_SEED_BOUND=S: a seed's bound in seconds (below), instead of 30 s
# for each schedule and shrinking run.
#
# The VM's timeout grows with the run (about 8 s a schedule under TCG, at
# most); run it holding /tmp/ibev-vm.lock where others share the machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
first=${1:-100}
count=${2:-10}
cases=${3:-10}
cd "$root"
bazel build //tests/softroce:campaign_test_bin //tests/softroce:session_peer >&2
binary=$(readlink -f bazel-bin/tests/softroce/campaign_test_bin)
peer=$(readlink -f bazel-bin/tests/softroce/session_peer)
# Kept: every schedule's line, for docs/reliability.md and for whatever the
# totals do not say.
log=$(mktemp "${TMPDIR:-/tmp}/ibev-campaign.XXXXXX")
started=$(date +%s)
status=0
# A process a seed: a seed whose harness broke (librdmacm 44.0's device
# list can lose a device a removal and re-add left, docs/reliability.md)
# takes no later seed with it.
# A seed still running past its bound (30 s for each schedule and each of
# the 20 shrinking runs, about 4 times what one takes: every wait in the
# runner is bounded) is
# a hang: its stacks are printed, the seed is killed with the processes it
# started and counted as a broken harness, and the next seed runs. The
# kernel's stacks come first, of every thread of the runner and of its
# child processes (the peer process, an rdma, ip or tc command: the runner
# waits for each), then of every task in uninterruptible sleep (a kworker
# the others wait for), as softroce_run.sh's dump does for a whole job;
# then gdb's of the runner. A thread stuck in the kernel (a peer that a
# SIGKILL cannot end, an `rdma link add` that does not return) shows only
# there.
bound=${CAMPAIGN_SEED_BOUND:-$(((cases + 20) * 30))}
# The VM's time has room for one hang's bound.
IBEV_VM_TIMEOUT=$((60 + count * cases * 15 + bound)) nice -n 10 tools/softroce/softroce_run.sh --devices 2 -- \
  /bin/bash -c 'status=0
    bound=$5
    family() {
      local child
      echo "$1"
      for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do family "$child"; done
    }
    kernel_stack() {
      echo "-- ${1#/proc/} ($(cat "$1/comm" 2>/dev/null)), $(grep -m1 "^State:" "$1/status" 2>/dev/null):"
      cat "$1/stack" 2>/dev/null
    }
    for ((seed = $1; seed < $1 + $2; seed++)); do
      "$0" --log_level=message --color_output=no --run_test=every_schedule_keeps_the_invariants -- \
        --seed "$seed" --cases "$3" --peer "$4" &
      pid=$!
      for ((waited = 0; waited < bound; waited++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
      done
      if kill -0 "$pid" 2>/dev/null; then
        echo "campaign seed $seed: the harness broke: still running after ${bound} s (a hang)"
        pids=$(family "$pid")
        echo "every thread of it and of its child processes, in the kernel:"
        for p in $pids; do
          for task in /proc/"$p"/task/*; do kernel_stack "$task"; done
        done
        echo "every other task in uninterruptible sleep (D), in the kernel:"
        for task in /proc/[0-9]*/task/[0-9]*; do
          grep -q "^State:.D" "$task/status" 2>/dev/null || continue
          grep -qx "${task#/proc/}" <<<"$(for p in $pids; do ls -d /proc/"$p"/task/* 2>/dev/null; done | sed "s|^/proc/||")" ||
            kernel_stack "$task"
        done
        echo "its threads (gdb):"
        timeout 120 gdb -batch -nx -ex "set pagination off" -ex "thread apply all bt" -p "$pid" 2>&1 |
          grep -vE "^\[(New LWP|Thread debugging|Inferior)"
        kill -9 $pids 2>/dev/null
      fi
      wait "$pid" || status=$?
    done
    exit "$status"' "$binary" "$first" "$count" "$cases" "$peer" "$bound" >"$log" 2>&1 || status=$?
ended=$(date +%s)
grep -E '^campaign seed|^  reproduce|^  shrunk|the harness broke' "$log" || true
awk -v s=$((ended - started)) -v status="$status" '
  /^campaign seed [0-9]+: [0-9]+ schedules/ {
    n++; sched += $4; faults += $6; checks += $8; viol += $11
  }
  END {
    printf "campaign: %d seeds, %d schedules, %d faults, %d invariant checks, %d violations, %d s (exit %d)\n",
      n, sched, faults, checks, viol, s, status
  }' "$log"
echo "campaign: every schedule's line in $log"
exit "$status"
