#!/usr/bin/env bash
# In //examples:examples_suite's VM: consumer-c --rdma, then
# ibev-c-pingpong's server and client on the test device, the link flapped
# while their messages flow: each must heal (its health down, recovering, up
# again), finish every iteration and exit 0. Run as root where an rxe device
# is (the soft-RoCE runner arranges that).
#   run_softroce.sh CONSUMER_C IBEV_C_PINGPONG
set -u
consumer=$1
pingpong=$2
device=${IBEV_TEST_DEVICE:-rxe0}
netdev=${IBEV_TEST_NETDEV:-d0}
iters=3000
port=18650
out=$(mktemp -d)
trap 'ip link set "$netdev" up; rm -rf "$out"' EXIT
failed=0

"$consumer" --rdma || failed=1

timeout 120 "$pingpong" -d "$device" -p "$port" -n "$iters" -t 100 >"$out/server" 2>&1 &
server_pid=$!
timeout 120 "$pingpong" -d "$device" -p "$port" -n "$iters" -i 1 -t 100 127.0.0.1 \
  >"$out/client" 2>&1 &
client_pid=$!
# Until `file` says `what` (20 s at most: the check below says what was missed).
saw() {
  local file=$1 what=$2
  for _ in $(seq 200); do
    grep -q "$what" "$file" && return 0
    sleep 0.1
  done
  return 1
}
# The flap as soon as both are connected: a run of $iters round trips lasts
# seconds even where the VM is fast, so the link goes down inside it.
saw "$out/client" "^connected" && saw "$out/server" "^connected"
ip link set "$netdev" down
# Up again once both sides saw it go (soft-RoCE's loopback carries traffic
# on a link that is down, so an unseen flap would heal nothing).
saw "$out/server" "^health: up -> down" && saw "$out/client" "^health: up -> down"
ip link set "$netdev" up
wait "$client_pid"
client_rc=$?
wait "$server_pid"
server_rc=$?
if ((server_rc == 0 && client_rc == 0)) &&
   grep -q "^$iters iters in .*healed [1-9]" "$out/server" &&
   grep -q "^$iters iters in .*healed [1-9]" "$out/client"; then
  echo "ok: ibev-c-pingpong healed after a link flap"
  sed 's/^/    server: /' "$out/server"
  sed 's/^/    client: /' "$out/client"
else
  echo "FAILED: ibev-c-pingpong through a link flap (server exit $server_rc, client exit" \
    "$client_rc; 124: timed out)"
  sed 's/^/    server: /' "$out/server"
  sed 's/^/    client: /' "$out/client"
  failed=1
fi
# Bad input: a clear error and exit 1, never a hang.
if "$pingpong" -d no-such-device -t 5 >"$out/bad" 2>&1; then
  echo "FAILED: a missing device exited 0"; failed=1
elif ! grep -q "ibev-c-pingpong: no-such-device: ibev_device_open" "$out/bad"; then
  echo "FAILED: a missing device did not say so:"; cat "$out/bad"; failed=1
else
  echo "ok: a missing device: $(cat "$out/bad")"
fi
exit "$failed"
