#!/usr/bin/env bash
# ibev-softroce-run's command line, on the host, without booting a VM: the
# conventions of ibev-watch (getopt forms, --help, -V, a usage error exits 1
# with its reason then the usage), a man page that matches, a program or
# working directory the guest cannot see refused before the VM boots, and no
# temporary folder left behind (issue #27: every run left one).
#
#   softroce_run_cli_test.sh SOFTROCE_RUN MAN_PAGE VERSION_SH VERSION_H
set -uo pipefail
runner=$(realpath "$1") man=$2 version_sh=$3 version_h=$4
passed=0 failed=0
expect() {  # expect NAME CONDITION...
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; fi
}
scratch=$(mktemp -d)
out=$scratch/out err=$scratch/err
run() { bash "$runner" "$@" >"$out" 2>"$err"; echo $?; }

version=$(bash "$version_sh" "$version_h")
expect "-V exits 0" test "$(run -V)" = 0
expect "-V prints the version of version.h" grep -qx "ibev-softroce-run (ibev) $version" "$out"
expect "--version is -V" test "$(run --version)" = 0
expect "-h exits 0" test "$(run -h)" = 0
expect "--help exits 0" test "$(run --help)" = 0
expect "--help prints the usage" grep -q '^usage: ibev-softroce-run' "$out"
expect "--help documents exit statuses" grep -q '^Exit status' "$out"
help=$(cat "$out")

for bad in --bogus "--devices 3 /bin/true" "-d" "" "/nonexistent/program" "no-such-command-here"; do
  # shellcheck disable=SC2086
  expect "'$bad' is a usage error (exit 1)" test "$(run $bad)" = 1
  expect "'$bad' says why in one line first" grep -q '^ibev-softroce-run: ' <(head -n 1 "$err")
  expect "'$bad' prints the usage" grep -q '^usage: ibev-softroce-run' "$err"
done

# What the guest cannot see is refused at once, naming the path, and nothing
# boots (no kernel is needed to get there).
empty_cache=$scratch/cache
mkdir -p "$empty_cache"
code=$(cd /proc && IBEV_SOFTROCE=vm IBEV_CACHE=$empty_cache bash "$runner" /bin/true 2>"$err" >/dev/null; echo $?)
expect "a working directory under /proc is refused (exit 1)" test "$code" = 1
expect "... saying the guest cannot see it" grep -q 'cannot see /proc' "$err"
if [[ -L /var/run && $(readlink -f /var/run) == /run ]]; then
  # A symbolic way into the guest's own /run: refused as /run itself.
  code=$(cd /var/run && IBEV_SOFTROCE=vm IBEV_CACHE=$empty_cache bash "$runner" /bin/true 2>"$err" >/dev/null; echo $?)
  expect "a working directory under /var/run (/run) is refused (exit 1)" test "$code" = 1
  expect "... named by its physical path" grep -q 'cannot see /run' "$err"
fi

# No temporary folder left, in TMPDIR or in a TEST_TMPDIR (a failed run here:
# no kernel in an empty cache).
tmp=$scratch/tmp test_tmp=$scratch/test_tmp
mkdir -p "$tmp" "$test_tmp"
code=$(env -u TEST_TMPDIR TMPDIR="$tmp" IBEV_SOFTROCE=vm IBEV_CACHE="$empty_cache" \
  bash "$runner" /bin/true 2>"$err" >"$out"; echo $?)
expect "no kernel: exit 1" test "$code" = 1
expect "no kernel: says how to fetch one, on stderr" grep -q -- '--fetch-kernel' "$err"
expect "nothing left in TMPDIR" test -z "$(ls -A "$tmp")"
TEST_TMPDIR=$test_tmp IBEV_SOFTROCE=vm IBEV_CACHE=$empty_cache bash "$runner" /bin/true >/dev/null 2>&1
expect "nothing left in TEST_TMPDIR" test -z "$(ls -A "$test_tmp")"

# The man page: clean for man(1), this version, every option of --help.
expect "the man page has no warnings" test -z "$(man --warnings -E UTF-8 -l -Tutf8 -Z "$man" 2>&1 >/dev/null)"
expect "the man page is of version $version" grep -q "^\.TH IBEV-SOFTROCE-RUN 1 .* \"ibev $version\"" "$man"
for option in $(grep -oE -- '--[a-z-]+' <<<"$help" | sort -u); do
  expect "the man page documents $option" grep -qF -- "\\fB${option//-/\\-}" "$man"
done
for pair in d:devices V:version h:help; do
  expect "--help documents -${pair%%:*}, --${pair#*:}" grep -q -- "-${pair%%:*}, --${pair#*:}" <<<"$help"
done
rm -rf "$scratch"
echo "$passed passed, $failed failed"
((failed == 0))
