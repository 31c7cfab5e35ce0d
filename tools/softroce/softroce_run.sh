#!/usr/bin/env bash
# Runs a program against a soft-RoCE (rdma_rxe) device. Installed as
# ibev-softroce-run (tools/install.sh, with its man page), for any program of
# any build system; `softroce_test` runs Bazel tests through it.
#
#   softroce_run.sh [--devices 1|2] [--] PROGRAM [ARGS...]
#   softroce_run.sh --fetch-kernel     (once: the kernel the VM boots)
#   softroce_run.sh --help | --version
#
# The VM boots Debian 12's 6.1 kernel, or with IBEV_KERNEL=6.12 the
# bookworm-backports one (fetch_kernel.sh fetches either).
#
# Where the host can create rxe devices (root, rdma_rxe loadable) they are made
# on the host; otherwise a throwaway VM boots Debian's stock kernel under qemu
# (TCG) with the host's root shared read-only, and the binary runs there as
# root. Either way the binary sees:
#   IBEV_TEST_DEVICE   rxe0, on netdev IBEV_TEST_NETDEV (dummy d0, or veth v0)
#                      with address IBEV_TEST_ADDRESS (fd00::1), for rdma_cm; on
#                      d0 a test adds it itself (port tests count GID changes)
#   IBEV_TEST_DEVICE2  rxe1, on netdev IBEV_TEST_NETDEV2, veth v1 (--devices 2),
#                      address IBEV_TEST_ADDRESS2 (fd00::2)
# and its exit status, output and JUnit report (for Bazel's test.xml) come
# back as if it had run here. It starts with SIGINT and SIGQUIT at their
# defaults, as from a prompt. Every wait is bounded; a failure says what broke.
# The guest sees the host's files read-only, except /run, /proc, /sys and
# /dev, which are its own: a program or working directory there is refused
# before the VM boots. Nothing is left in $TMPDIR (or Bazel's TEST_TMPDIR).
#
# Environment: IBEV_SOFTROCE=auto|host|vm (default auto), IBEV_KERNEL=6.1|6.12
# (the VM's kernel, default 6.1), IBEV_VM_TIMEOUT (seconds the guest may run,
# default 240), IBEV_VM_CPUS (default 1, so that two test VMs share 2 cores),
# IBEV_CACHE (kernel cache root).
#
# Exit status: the program's; 1 when the VM could not be made or did not
# finish, or for a usage error; 97 when the rxe devices could not be made; 98
# when the guest could not enter the working directory; the reason on stderr.
set -uo pipefail

# Its companions (guest_init.sh, modules.txt, fetch_kernel.sh): under `bazel
# test` this script runs under the test's name, in the runfiles of whichever
# workspace uses it (ibev itself, or a consumer's @ibev, whatever its name);
# in the source tree they are beside it; installed, in ../share/ibev/softroce.
self_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
here=
for candidate in ${TEST_SRCDIR:+"$TEST_SRCDIR"/*/tools/softroce} "$self_dir" \
    "$self_dir/../share/ibev/softroce"; do
  if [[ -f $candidate/guest_init.sh ]]; then here=$candidate; break; fi
done
usage() {
  cat <<'USAGE'
usage: ibev-softroce-run [--devices 1|2] [--] PROGRAM [ARGS...]
       ibev-softroce-run --fetch-kernel
       ibev-softroce-run --help | --version

Runs PROGRAM as root against a soft-RoCE device (rxe0; with --devices 2 also
rxe1, on a veth pair): on this host when its kernel has rdma_rxe, otherwise
in a throwaway qemu VM booting Debian's kernel with this host's files shared
read-only (all but /run, /proc, /sys and /dev, which are the guest's own).

  -d, --devices N     1 (rxe0 on a dummy netdev, default) or 2
      --fetch-kernel  fetch the kernel the VM boots (once; IBEV_KERNEL picks it)
  -h, --help          this text
  -V, --version       the version

PROGRAM sees IBEV_TEST_DEVICE (rxe0), IBEV_TEST_NETDEV, IBEV_TEST_ADDRESS
(fd00::1), and with two devices IBEV_TEST_DEVICE2, IBEV_TEST_NETDEV2,
IBEV_TEST_ADDRESS2. Environment: IBEV_SOFTROCE=auto|host|vm,
IBEV_KERNEL=6.1|6.12, IBEV_VM_TIMEOUT (seconds, default 240), IBEV_VM_CPUS
(default 1), IBEV_CACHE (default /var/cache/ibev), IBEV_VM_KEEP (a folder
PROGRAM's TEST_TMPDIR is copied to when it ends).

Exit status: PROGRAM's; 1 when the VM could not be made or did not finish,
or for a usage error; 97 when the rxe devices could not be made; 98 when the
guest could not enter the working directory. The reason goes to stderr.
USAGE
}
# A usage error: the reason, then the usage, on stderr; exit 1.
usage_error() {
  echo "ibev-softroce-run: $1" >&2
  usage >&2
  exit 1
}
# The installed copy has its version written in (CMakeLists.txt); the source
# tree reads version.h.
version=IBEV_VERSION_UNSET
if [[ $version == IBEV_VERSION_UNSET ]]; then
  version=$(bash "$self_dir/../version.sh" 2>/dev/null) || version=unknown
fi

options=$(getopt -o +d:hV -l devices:,fetch-kernel,help,version -n ibev-softroce-run -- "$@" 2>&1) ||
  usage_error "$(head -n 1 <<<"$options" | sed 's/^ibev-softroce-run: //')"
eval set -- "$options"
devices=1
fetch=false
while true; do
  case $1 in
    -d|--devices) devices=$2; shift 2 ;;
    --fetch-kernel) fetch=true; shift ;;
    -h|--help) usage; exit 0 ;;
    -V|--version) echo "ibev-softroce-run (ibev) $version"; exit 0 ;;
    --) shift; break ;;
  esac
done
[[ -n $here ]] || {
  echo "softroce: guest_init.sh not found (beside $0, in its runfiles or share/ibev/softroce)" >&2
  exit 1
}
if $fetch; then exec "$here/fetch_kernel.sh"; fi
[[ $# -ge 1 ]] || usage_error "no program given"
[[ $devices == 1 || $devices == 2 ]] || usage_error "--devices is 1 or 2, not '$devices'"
program=$1
# As a shell does: a name without a slash is looked up on PATH only.
if [[ $program != */* ]]; then program=$(type -P "$program") || program=$1; fi
[[ $program == */* && -f $program && -x $program ]] ||
  usage_error "no program $1 (a path, or a command on PATH)"
# Physical paths: what the guest sees (/var/run is /run, the guest's own).
binary=$(cd "$(dirname "$program")" && pwd -P)/$(basename "$program")
shift
# What a VM guest cannot see of the host: its own /run, /proc, /sys, /dev.
guest_cannot_see() {
  case $1/ in
    /run/*|/proc/*|/sys/*|/dev/*) return 0 ;;
  esac
  return 1
}
mode=${IBEV_SOFTROCE:-auto}
timeout_s=${IBEV_VM_TIMEOUT:-240}
cpus=${IBEV_VM_CPUS:-1}
kernel=${IBEV_KERNEL:-6.1}
case $kernel in
  6.1) cache=${IBEV_CACHE:-/var/cache/ibev}/kernel ;;
  6.12) cache=${IBEV_CACHE:-/var/cache/ibev}/kernel-6.12 ;;
  *) echo "softroce: IBEV_KERNEL is 6.1 or 6.12, not $kernel" >&2; exit 1 ;;
esac
# Everything of the run in one folder, removed however the run ends (also
# under Bazel: another runner may reuse TEST_TMPDIR without clearing it).
work=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/ibev-softroce.XXXXXX") ||
  { echo "softroce: cannot make a temporary folder" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# The commands that make the devices, as root, wherever the test runs.
# Addresses stay in fd00::/8; nothing here reaches beyond the machine.
write_device_setup() {
  echo 'ip link set lo up || { echo "softroce: cannot bring lo up"; exit 97; }'
  if [[ $devices == 1 ]]; then
    cat <<'SETUP'
ip link add d0 type dummy && ip link set d0 up &&
  rdma link add rxe0 type rxe netdev d0 || { echo "softroce: cannot create rxe0 on dummy d0"; exit 97; }
export IBEV_TEST_DEVICE=rxe0 IBEV_TEST_NETDEV=d0 IBEV_TEST_ADDRESS=fd00::1
SETUP
  else
    # Both ends in one namespace: rdma_rxe listens in the initial namespace
    # only. The two devices share carrier (port) events. A packet for the
    # other end's address would go through lo, which rxe ignores: policy
    # routing sends what this host sends to fd00::2 out of v0 and to fd00::1
    # out of v1 (the local table moved behind those rules), so rxe0 and rxe1
    # carry traffic. rdma_cm also checks that the way back to a request's
    # source leaves by the netdev it came in on (a lookup with that oif), or
    # it rejects (reason 28): the oif rules say so.
    cat <<'SETUP'
ip link add v0 type veth peer name v1 &&
  ip addr add fd00::1/64 dev v0 nodad && ip addr add fd00::2/64 dev v1 nodad &&
  ip link set v0 up && ip link set v1 up &&
  ip -6 route add fd00::2/128 dev v0 table 10 && ip -6 route add fd00::1/128 dev v1 table 11 &&
  ip -6 rule add pref 100 table local && ip -6 rule del pref 0 &&
  ip -6 rule add pref 10 iif lo to fd00::2/128 lookup 10 &&
  ip -6 rule add pref 10 iif lo to fd00::1/128 lookup 11 &&
  ip -6 rule add pref 10 oif v0 to fd00::2/128 lookup 10 &&
  ip -6 rule add pref 10 oif v1 to fd00::1/128 lookup 11 &&
  rdma link add rxe0 type rxe netdev v0 && rdma link add rxe1 type rxe netdev v1 ||
  { echo "softroce: cannot create rxe0/rxe1 on the veth pair v0/v1"; exit 97; }
export IBEV_TEST_DEVICE=rxe0 IBEV_TEST_NETDEV=v0 IBEV_TEST_DEVICE2=rxe1 IBEV_TEST_NETDEV2=v1
export IBEV_TEST_ADDRESS=fd00::1 IBEV_TEST_ADDRESS2=fd00::2
SETUP
  fi
}

# The job: make the devices, then run the binary where Bazel would have, with
# Bazel's test environment and a JUnit report in the results folder.
write_job() {
  local results=$1
  shift
  {
    echo "#!/bin/bash"
    echo "set -u"
    echo "export PATH=/usr/sbin:/usr/bin:/sbin:/bin"
    write_device_setup
    # The test's whole environment (Bazel's test env, --test_env, a test's
    # env attribute, ASAN_OPTIONS/UBSAN_OPTIONS/TSAN_OPTIONS), but what
    # describes this shell rather than the test.
    local var
    for var in $(compgen -e); do
      case $var in
        PATH|PWD|OLDPWD|SHLVL|_|HOSTNAME|TERM|DISPLAY|SSH_*|XDG_*) ;;
        *) printf 'export %s=%q\n' "$var" "${!var}" ;;
      esac
    done
    printf 'export TEST_TMPDIR=%q\n' "$results/tmp"
    printf 'mkdir -p %q\n' "$results/tmp"
    # Each test case's entry and exit in the job's log: a guest that times
    # out shows where it was.
    printf 'export BOOST_TEST_LOGGER=%q\n' "HRF,unit_scope,stdout:JUNIT,message,$results/junit.xml"
    printf 'cd %q || { echo "softroce: cannot enter the working directory %q" >&2; exit 98; }\n' "$PWD" "$PWD"
    # A test still running this long after the VM started (when the host's
    # timeout started counting) is ended, after every thread's stack is
    # written to the log, before the host's own timeout kills the VM with
    # nothing said: the next hang names itself. The deadline is the host's
    # clock's, which the guest's is (read from the RTC at boot), not the
    # guest's uptime: a boot slowed by a loaded host would otherwise eat
    # the dump's margin.
    printf 'stacks_after=%q\n' "$(stacks_after)"
    printf 'deadline=%q\n' "$(($(date +%s) + $(stacks_after)))"
    # gdb gets half the margin, so that the dump is written before the host's
    # timeout ends the VM.
    printf 'gdb_for=%q\n' "$(($(stacks_margin) / 2))"
    cat <<'WATCH'
# The test and every process it started (a suite runs its binaries as
# children), parents first.
family() {
  local child
  echo "$1"
  for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do family "$child"; done
}
dump_stacks() {
  echo "softroce: the test still runs ${stacks_after}s after the VM started; every thread's stack:"
  local pid task pids
  pids=$(family "$1")
  for pid in $pids; do
    for task in /proc/"$pid"/task/*; do
      echo "-- thread ${task##*/} ($(cat "$task/comm" 2>/dev/null)), kernel stack:"
      cat "$task/stack" 2>/dev/null
    done
  done
  # gdb for the youngest: the test binary itself, not a suite's shell.
  if command -v gdb >/dev/null; then
    timeout "$gdb_for" gdb -batch -nx -ex 'set pagination off' -ex 'thread apply all bt' \
      -p "$(tail -n 1 <<<"$pids")" 2>&1 | grep -vE '^\[(New LWP|Thread debugging|Inferior)'
  fi
}
WATCH
    # In the background (the watcher below times it), but with SIGINT and
    # SIGQUIT at their defaults: bash starts a background command with both
    # ignored, and a program started so never hears them (Python never
    # raises KeyboardInterrupt). The trap resets them in the subshell, which
    # then becomes the program.
    printf '(trap - INT QUIT; exec %q' "$binary"
    local arg
    for arg in "$@"; do printf ' %q' "$arg"; done
    echo ') &'
    cat <<'WATCH'
test_pid=$!
(
  now=$(date +%s)
  if ((now < deadline - stacks_after - 300 || now > deadline + 300)); then
    # The guest's clock is not the host's: count from its boot instead.
    up=$(cut -d. -f1 /proc/uptime)
    wait_s=$((stacks_after > up ? stacks_after - up : 1))
  else
    wait_s=$((deadline > now ? deadline - now : 1))
  fi
  sleep "$wait_s" &
  sleeper=$!
  trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
  wait "$sleeper"
  # Ended whatever the dump says (gdb may be cut off by its timeout).
  if kill -0 "$test_pid" 2>/dev/null; then
    dump_stacks "$test_pid"
    kill -9 $(family "$test_pid") 2>/dev/null
  fi
) &
watcher=$!
wait "$test_pid"
rc=$?
kill "$watcher" 2>/dev/null
exit "$rc"
WATCH
  } >"$results/job.sh"
}

# Seconds after the guest's boot after which a test's stacks are dumped and
# it is ended: the guest's timeout less the dump's margin (a quarter of it,
# at least 30 s; gdb gets half of that).
stacks_margin() {
  local margin=$((timeout_s / 4))
  ((margin < 30)) && margin=30
  echo "$margin"
}
stacks_after() {
  local margin
  margin=$(stacks_margin)
  echo $((timeout_s > margin + 5 ? timeout_s - margin : 5))
}

# IBEV_VM_KEEP=DIR: what the program wrote to its TEST_TMPDIR is copied to
# DIR when it ends (the guest sees the host's files read-only, and the run's
# folder goes with the run): a benchmark's samples.
keep_outputs() {
  if [[ -n ${IBEV_VM_KEEP:-} && -d $1/tmp ]]; then
    mkdir -p "$IBEV_VM_KEEP" && cp -r "$1/tmp/." "$IBEV_VM_KEEP/"
  fi
}

# Hands a JUnit report to Bazel, which otherwise writes its own test.xml.
keep_junit() {
  if [[ -n ${XML_OUTPUT_FILE:-} && -s $1/junit.xml ]]; then
    cp "$1/junit.xml" "$XML_OUTPUT_FILE"
  fi
}

host_can_run() {
  [[ $(id -u) -eq 0 ]] || return 1
  [[ -d /sys/module/rdma_rxe ]] || modprobe rdma_rxe 2>/dev/null || return 1
  command -v rdma >/dev/null || return 1
}

run_on_host() {
  echo "softroce: running on this host's kernel (rdma_rxe loaded)"
  # A network namespace of its own, so that the devices made for the test
  # never meet the host's interfaces and vanish with the test.
  local netns=ibev-test-$$
  ip netns add "$netns" || { echo "softroce: cannot create netns $netns" >&2; return 1; }
  write_job "$work" "$@"
  ip netns exec "$netns" bash "$work/job.sh"
  local rc=$?
  # rxe devices on netdevs of the namespace go with it.
  ip netns exec "$netns" rdma link delete rxe0 2>/dev/null
  ip netns exec "$netns" rdma link delete rxe1 2>/dev/null
  ip netns delete "$netns" 2>/dev/null
  keep_junit "$work"
  keep_outputs "$work"
  return "$rc"
}

run_in_vm() {
  local path
  for path in "$binary" "$(pwd -P)"; do
    if guest_cannot_see "$path"; then
      echo "softroce: the VM guest cannot see $path: it shares this host's files, but" \
        "/run, /proc, /sys and /dev are its own; run from, and a program in, another folder" >&2
      return 1
    fi
  done
  [[ $(uname -m) == x86_64 ]] ||
    { echo "softroce: the VM boots an amd64 kernel under qemu-system-x86_64: an x86_64 host only" >&2; return 1; }
  command -v qemu-system-x86_64 >/dev/null ||
    { echo "softroce: qemu-system-x86_64 is missing (tools/setup.sh installs qemu-system-x86)" >&2; return 1; }
  [[ -f $cache/ready ]] ||
    { echo "softroce: no kernel in $cache (fetch it once: IBEV_KERNEL=$kernel $0 --fetch-kernel)" >&2; return 1; }
  [[ -x /bin/busybox ]] && /bin/busybox --list >/dev/null 2>&1 ||
    { echo "softroce: /bin/busybox is missing (busybox-static)" >&2; return 1; }

  # The initramfs (busybox, the modules, the init script), built once per
  # content and kept beside the kernel; uncompressed, as TCG unpacks gzip slowly.
  local key initramfs
  key=$(cat "$here/guest_init.sh" "$cache/modules/order" /bin/busybox "$cache/ready" |
    md5sum | cut -c1-12) || { echo "softroce: cannot read the guest files" >&2; return 1; }
  initramfs=$cache/initramfs-$key.cpio
  if [[ ! -f $initramfs ]]; then
    (
      set -e
      local initrd=$work/initramfs
      mkdir -p "$initrd/bin" "$initrd/modules" "$initrd/proc" "$initrd/sys" "$initrd/dev"
      cp /bin/busybox "$initrd/bin/busybox"
      cp "$cache"/modules/* "$initrd/modules/"
      cp "$here/guest_init.sh" "$initrd/init"
      chmod +x "$initrd/init"
      cd "$initrd"
      find . | cpio -o -H newc --quiet >"$work/initramfs.cpio"
      mv "$work/initramfs.cpio" "$initramfs"
    ) || { echo "softroce: cannot build the initramfs in $cache" >&2; return 1; }
  fi

  local results=$work/results
  mkdir -p "$results"
  write_job "$results" "$@"

  local started=$SECONDS
  timeout --kill-after=5 "$timeout_s" qemu-system-x86_64 \
    -accel tcg -cpu qemu64 -smp "$cpus" -m 2048 -nodefaults \
    -display none -monitor none -serial "file:$work/console.log" \
    -no-reboot -nic none \
    -kernel "$cache/vmlinuz" -initrd "$initramfs" \
    -append "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=reliable lpj=5000000 8250.nr_uarts=1 ibev.results=$results" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$results,mount_tag=results,security_model=none,multidevs=remap" \
    >"$work/qemu.log" 2>&1
  local qemu_rc=$?
  local took=$((SECONDS - started))

  [[ -f $results/job.log ]] && cat "$results/job.log"
  keep_junit "$results"
  keep_outputs "$results"
  if [[ -f $results/job_rc ]]; then
    local rc
    rc=$(cat "$results/job_rc")
    echo "softroce: VM ($(cat "$cache/ready")) ran the test in ${took}s (exit $rc)"
    return "$rc"
  fi
  if [[ -f $results/vm_error ]]; then
    echo "softroce: the VM failed: $(cat "$results/vm_error")" >&2
  elif [[ $qemu_rc -eq 124 || $qemu_rc -eq 137 ]]; then
    echo "softroce: guest timeout after ${timeout_s}s" >&2
  elif [[ ! -f $results/vm_booted ]]; then
    echo "softroce: the VM did not boot (qemu exit $qemu_rc)" >&2
    tail -n 20 "$work/qemu.log" >&2
  else
    echo "softroce: the VM stopped before the test finished (qemu exit $qemu_rc)" >&2
  fi
  echo "---- last lines of the guest console ----" >&2
  tail -n 30 "$work/console.log" >&2 2>/dev/null
  return 1
}

case $mode in
  host) run_on_host "$@" ;;
  vm) run_in_vm "$@" ;;
  auto) if host_can_run; then run_on_host "$@"; else run_in_vm "$@"; fi ;;
  *) echo "softroce: IBEV_SOFTROCE is auto, host or vm, not $mode" >&2; exit 1 ;;
esac
