#!/usr/bin/env bash
# ibev-pingpong against itself and against rdma-core's ibv_rc_pingpong, in
# both roles: two processes swap endpoints over TCP as ibv_rc_pingpong does,
# then a message goes back and forth. Run as root where an rxe device is
# (the soft-RoCE runner arranges that). Usage: run_pingpong.sh IBEV_PINGPONG
set -u
pingpong=$1
device=${IBEV_TEST_DEVICE:-rxe0}
iters=200
ibev=("$pingpong" -d "$device" -g 0 -n "$iters" -t 60)
rdma_core=(ibv_rc_pingpong -d "$device" -g 0 -n "$iters")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failed=0
port=18600

# A pair: NAME, the server's kind, the client's kind (ibev or rdma_core).
# Each must exit 0 and say it did every iteration; neither may run past 90 s.
pair() {
  local name=$1
  local -n server=$2 client=$3
  port=$((port + 1))
  timeout 90 "${server[@]}" -p "$port" >"$out/server" 2>&1 &
  local server_pid=$!
  # ibv_rc_pingpong's client does not retry: wait for the listening socket.
  for _ in $(seq 100); do
    ss -Hltn "sport = :$port" | grep -q . && break
    sleep 0.1
  done
  timeout 90 "${client[@]}" -p "$port" 127.0.0.1 >"$out/client" 2>&1
  local client_rc=$?
  wait "$server_pid"
  local server_rc=$?
  if ((server_rc == 0 && client_rc == 0)) && grep -q "^$iters iters in" "$out/server" &&
     grep -q "^$iters iters in" "$out/client"; then
    echo "ok: $name"
    grep -i "iters\|address" "$out/server" | sed 's/^/    server: /'
    grep -i "iters\|address" "$out/client" | sed 's/^/    client: /'
  else
    echo "FAILED: $name (server exit $server_rc, client exit $client_rc; 124: timed out)"
    sed 's/^/    server: /' "$out/server"
    sed 's/^/    client: /' "$out/client"
    failed=1
  fi
}

pair "ibev server, ibev client" ibev ibev
pair "ibev server, ibv_rc_pingpong client" ibev rdma_core
pair "ibv_rc_pingpong server, ibev client" rdma_core ibev
# Bad input: a clear error and exit 1, never a hang.
if "$pingpong" -d no-such-device -t 5 >"$out/bad" 2>&1; then
  echo "FAILED: a missing device exited 0"; failed=1
elif ! grep -q "ibev-pingpong: .*no-such-device" "$out/bad"; then
  echo "FAILED: a missing device did not say so:"; cat "$out/bad"; failed=1
else
  echo "ok: a missing device: $(cat "$out/bad")"
fi
# A server nobody connects to gives up at its -t, saying so.
started=$SECONDS
if "$pingpong" -d "$device" -p 18699 -t 2 >"$out/alone" 2>&1; then
  echo "FAILED: a server with no client exited 0"; failed=1
elif ! grep -q "ibev-pingpong: accept (no client came).*timed out" "$out/alone" ||
     ((SECONDS - started > 20)); then
  echo "FAILED: a server with no client did not time out at -t:"; cat "$out/alone"; failed=1
else
  echo "ok: a server with no client: $(grep "ibev-pingpong:" "$out/alone")"
fi
exit "$failed"
