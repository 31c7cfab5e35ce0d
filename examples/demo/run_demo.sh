#!/usr/bin/env bash
# Runs the demo with ibev-watch beside it, as root on a host or guest with an
# rxe device (tools/demo.sh arranges that). Usage: run_demo.sh DEMO IBEV_WATCH
set -u
demo=$1
watch=$2
device=${IBEV_TEST_DEVICE:-rxe0}
out=$(mktemp)
"$watch" -d "$device" >"$out" 2>&1 &
watcher=$!
# ibev-watch says when it listens; give it up to 10 s.
for _ in $(seq 100); do grep -q "watching" "$out" && break; sleep 0.1; done
"$demo" "$device" "${IBEV_TEST_NETDEV:-d0}"
rc=$?
sleep 0.5
kill -TERM "$watcher"
wait "$watcher"
echo
echo "ibev-watch, running beside it, printed:"
sed 's/^/  /' "$out"
rm -f "$out"
exit "$rc"
