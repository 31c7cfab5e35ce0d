#!/usr/bin/env bash
# ibev-watch's command line, on the host (no device needed): rdma-core's tool
# conventions (getopt_long forms, usage errors exit 1 with a reason and the
# usage, -V), --help and the man page documenting every JSON field the
# formatter writes; on a kernel without RDMA, waiting for devices (and a clear
# exit 2 with -d).
#
#   cli_test.sh IBEV_WATCH MAN_PAGE RECORDING_CC VERSION_SH VERSION_H
set -uo pipefail
watch=$1 man=$2 format=$3 version_sh=$4 version_h=$5
passed=0 failed=0
expect() {  # expect NAME CONDITION...
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; fi
}
out=$(mktemp) err=$(mktemp)
run() { "$watch" "$@" >"$out" 2>"$err"; echo $?; }

version=$(bash "$version_sh" "$version_h")
expect "-V exits 0" test "$(run -V)" = 0
expect "-V prints the version of version.h" grep -qx "ibev-watch (ibev) $version" "$out"
expect "--version is -V" test "$(run --version)" = 0
expect "-h exits 0" test "$(run -h)" = 0
expect "--help prints the usage" grep -q '^usage: ibev-watch' "$out"
expect "--help documents exit statuses" grep -q '^Exit status' "$out"
help=$(cat "$out")

# Every JSON key the formatter writes is in --help and in the man page.
keys=$(grep -o '\\"[a-z_]*\\":' "$format" | tr -d '\\":' | sort -u)
expect "format.cc has JSON keys" test -n "$keys"
for key in $keys; do
  expect "--help names JSON field $key" grep -qw "$key" <<<"$help"
  expect "the man page names JSON field $key" grep -qx ".B $key" "$man"
done

for bad in --bogus --device= -d extra "--json --nope" "--json --journal" \
    --metrics-listen=9100 --metrics-listen=:65536 --metrics-listen=:x \
    --metrics-listen=::1:9100 --metrics-textfile=; do
  # shellcheck disable=SC2086
  expect "'$bad' is a usage error (exit 1)" test "$(run $bad)" = 1
  expect "'$bad' prints the usage" grep -q '^usage: ibev-watch' "$err"
  expect "'$bad' says why in one line first" grep -qv '^usage:' <(head -n 1 "$err")
done

expect "the man page is of version $version" grep -q "^\.TH IBEV-WATCH 1 .* \"ibev $version\"" "$man"
expect "the man page has no warnings" \
  test -z "$(man --warnings -E UTF-8 -l -Tutf8 -Z "$man" 2>&1 >/dev/null)"

# Every short option has its long form, and both are in the man page.
for pair in d:device j:json c:count V:version h:help; do
  expect "man page documents -${pair%%:*}, --${pair#*:}" \
    grep -q "\\\\fB\\\\-${pair%%:*}\\\\fR, \\\\fB\\\\-\\\\-${pair#*:}" "$man"
done

# The long-only options too.
for long in journal metrics-listen metrics-textfile; do
  expect "man page documents --$long" grep -q "^\\\\fB\\\\-\\\\-${long//-/\\\\-}\\\\fR" "$man"
  expect "--help documents --$long" grep -q -- "--$long" <<<"$help"
done

if [[ ! -e /sys/class/infiniband_verbs ]]; then
  # Without -d, no RDMA is a host with no device yet: it waits for devices
  # (an exit made the unit's Restart=on-failure restart it every 5 s), and
  # SIGTERM ends it with 0 as anywhere.
  # Where no journald listens (this host, a container), --journal says so
  # once at start (sd_journal_send would lose every entry without a word).
  journal=()
  [[ -S /run/systemd/journal/socket ]] || journal=(--journal)
  "$watch" "${journal[@]}" >"$out" 2>"$err" &
  pid=$!
  for _ in $(seq 200); do
    grep -q 'ibev-watch: watching no device yet' "$err" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05  # polling the output, bounded at 10 s
  done
  expect "no RDMA in the kernel: it waits for devices" grep -q 'ibev-watch: watching no device yet' "$err"
  kill -TERM "$pid" 2>/dev/null
  wait "$pid"
  expect "... and SIGTERM ends it with 0" test $? = 0
  expect "... saying plainly there is no RDMA yet" grep -q 'this kernel has no RDMA support' "$err"
  expect "... and that it waits" grep -q 'waiting for RDMA devices to appear' "$err"
  if ((${#journal[@]})); then
    expect "--journal with no journald says so once" \
      test "$(grep -c 'cannot write to the systemd journal' "$err")" = 1
  fi
  expect "-d on a kernel without RDMA exits 2" test "$(run -d rxe0)" = 2
  expect "... plainly" grep -q 'this kernel has no RDMA support' "$err"
fi
rm -f "$out" "$err"
echo "$passed passed, $failed failed"
((failed == 0))
