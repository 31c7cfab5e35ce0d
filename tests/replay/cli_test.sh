#!/usr/bin/env bash
# ibev-replay's command line, on the host: what it prints for a recording and
# a schedule (scaled by --speed), its refusals with their line and exit
# statuses, and its man page naming every option.
#
#   cli_test.sh IBEV_REPLAY MAN_PAGE RECORDING VERSION_SH VERSION_H
set -uo pipefail
replay=$1 man=$2 recording=$3 version_sh=$4 version_h=$5
passed=0 failed=0
expect() {  # expect NAME CONDITION...
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; fi
}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out=$dir/out err=$dir/err
run() { "$replay" "$@" >"$out" 2>"$err"; echo $?; }

version=$(bash "$version_sh" "$version_h")
expect "-V exits 0" test "$(run -V)" = 0
expect "-V prints the version of version.h" grep -qx "ibev-replay (ibev) $version" "$out"
expect "the man page is of version $version" grep -q "^\.TH IBEV-REPLAY 1 .* \"ibev $version\"" "$man"
expect "the man page has no warnings" \
  test -z "$(man --warnings -E UTF-8 -l -Tutf8 -Z "$man" 2>&1 >/dev/null)"
expect "-h prints the usage" test "$(run -h)" = 0
expect "... with the exit statuses" grep -q '^Exit status' "$out"

expect "a recording prints" test "$(run "$recording")" = 0
expect "... every event and change, counts left out" test "$(wc -l <"$out")" = 6
expect "... a port event" grep -qx '+1.000000 rxe0 port 1 IBV_EVENT_PORT_ERR' "$out"
expect "... an object by address" grep -qx '+2.000000 rxe0 qp 0x55d0c0ffee00 IBV_EVENT_QP_FATAL' "$out"
expect "... a removal" grep -qx '+3.000100 rxe0 device removed' "$out"
expect "--speed 2 halves the times" test "$(run -x 2 "$recording")" = 0
expect "... so" grep -qx '+0.750000 rxe0 port 1 IBV_EVENT_PORT_ACTIVE' "$out"
expect "stdin with -" test "$("$replay" - <"$recording" | wc -l)" = 6

cat >"$dir/faults" <<'FAULTS'
# at    fault       device  argument
0s      port-down   rxe0    1
1.5s    port-up     rxe0    1
2500ms  qp-fatal    rxe0    0x11
3s      remove      rxe0
3.5s    add         rxe0    d0
4s      netem       rxe0    loss=20% delay=30ms
5s      netem-off   rxe0
6s      listener-close rxe1
7s      listener-open  rxe1
8s      peer-kill      rxe1
9s      peer-start     rxe1
FAULTS
expect "a schedule prints its events" test "$(run --schedule "$dir/faults")" = 0
expect "... in order" diff -u - "$out" <<'EXPECTED'
+0.000000 rxe0 port 1 IBV_EVENT_PORT_ERR
+1.500000 rxe0 port 1 IBV_EVENT_PORT_ACTIVE
+2.500000 rxe0 qp #17 IBV_EVENT_QP_FATAL
+3.000000 rxe0 device IBV_EVENT_DEVICE_FATAL
+3.000000 rxe0 device removed
+3.500000 rxe0 device added
EXPECTED
expect "--real refuses qp-fatal before doing anything (exit 1)" \
  test "$(run --schedule --real "$dir/faults")" = 1
expect "... naming its line" grep -q 'faults:4: qp-fatal has no real action' "$err"
printf '0s port-down rxe0 1\n1s listener-close rxe1\n2s listener-open rxe1\n' >"$dir/listener"
expect "--real refuses listener-close before doing anything (exit 1)" \
  test "$(run --schedule --real "$dir/listener")" = 1
expect "... naming its line" grep -q 'listener:2: listener-close has no real action' "$err"
printf '0s port-down rxe0 1\n1s peer-kill rxe1\n2s peer-start rxe1\n' >"$dir/peer"
expect "--real refuses peer-kill before doing anything (exit 1)" \
  test "$(run --schedule --real "$dir/peer")" = 1
expect "... naming its line" grep -q 'peer:2: peer-kill has no real action' "$err"
printf '0s port-down ../../x 1\n' >"$dir/path"
expect "--real refuses a name that is a path (exit 1)" test "$(run -s -r "$dir/path")" = 1
expect "... naming it" grep -q "path:1: '../../x' is not a device or netdev name" "$err"
printf '0s port-down nosuch0 1\n' >"$dir/nodev"
if [[ $(id -u) -eq 0 ]]; then
  expect "--real on a device that is not soft-RoCE exits 2" test "$(run -s -r "$dir/nodev")" = 2
  expect "... saying so" grep -q 'nodev:1: nosuch0 is not a soft-RoCE device here' "$err"
else
  expect "--real as a user exits 1" test "$(run -s -r "$dir/nodev")" = 1
  expect "... saying it needs root" grep -q -- '--real needs root' "$err"
fi

printf '{"recording":"ibev","version":1,"time":"x"}\nnot json\n' >"$dir/bad"
expect "a malformed recording exits 1" test "$(run "$dir/bad")" = 1
expect "... naming its line" grep -q 'bad:2: not a JSON object' "$err"
printf '1s explode rxe0\n' >"$dir/badfaults"
expect "a malformed schedule exits 1" test "$(run -s "$dir/badfaults")" = 1
expect "... naming its line" grep -q "badfaults:1: unknown fault 'explode'" "$err"
printf '1s netem rxe0 reorder=5%%\n' >"$dir/badnetem"
expect "a netem reordering with no delay exits 1" test "$(run -s "$dir/badnetem")" = 1
expect "... naming its line" grep -q "badnetem:1: netem's reorder needs a delay above 0" "$err"
expect "a missing file exits 1" test "$(run "$dir/none")" = 1
expect "... saying why" grep -q 'cannot open .*/none: No such file or directory' "$err"

for bad in "" "a b" "--real $recording" "-x -1 $recording" "-x fast $recording" \
    "-x 1e-300 $recording" --bogus; do
  # shellcheck disable=SC2086
  expect "'$bad' is a usage error (exit 1)" test "$(run $bad)" = 1
  expect "'$bad' prints the usage" grep -q '^usage: ibev-replay' "$err"
done

for pair in s:schedule r:real x:speed V:version h:help; do
  expect "man page documents -${pair%%:*}, --${pair#*:}" \
    grep -q "\\\\fB\\\\-${pair%%:*}\\\\fR, \\\\fB\\\\-\\\\-${pair#*:}" "$man"
done
echo "$passed passed, $failed failed"
((failed == 0))
