#!/usr/bin/env bash
# Runs every benchmark and writes docs/benchmarks.md with its plots, their
# data and the run's raw output in docs/bench/: the registry and the
# dispatcher on this host; completion latency and message rate (ibev against
# perftest and against floors: this harness without ibev), dispatch cost and
# instructions against the number of CQs, memory, fairness, idle CPU,
# link-down and device removal in one soft-RoCE VM session (device removal
# again on the 6.12 kernel). Every verdict is computed from the data by
# bench/verdict.sh, and every figure from the raw output kept beside it, so
# that the report can be recomputed (--from). Never fails on a figure; fails
# only if a benchmark cannot run.
#   bench/run_benchmarks.sh [ITERATIONS [ROUNDS]]   (default 10000, 15)
#   bench/run_benchmarks.sh --from DIR              (no run: the report again
#                                                    from DIR's raw output,
#                                                    e.g. docs/bench/raw)
set -Eeuo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/verdict.sh
source bench/verdict.sh
out=docs/bench
raw_kept=$out/raw
from=
if [[ ${1:-} == --from ]]; then
  from=$(realpath "${2:?usage: run_benchmarks.sh --from DIR}")
else
  iters=${1:-10000}
  rounds=${2:-15}
fi

tools/setup.sh >/dev/null
# gnuplot draws the plots; only the benchmarks want it.
if ! command -v gnuplot >/dev/null; then
  sudo=()
  [[ $(id -u) -ne 0 ]] && sudo=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
    gnuplot-nox >/dev/null
fi
raw=$(mktemp -d)
sampler=
# A run that fails keeps its raw output, and says where and on which line.
trap 'echo "bench: line $LINENO failed: $BASH_COMMAND" >&2' ERR
finish() {
  local rc=$?
  if [[ -n $sampler ]]; then kill "$sampler" 2>/dev/null; fi
  if ((rc == 0)); then rm -rf "$raw"; else echo "bench: the raw output is kept in $raw" >&2; fi
}
trap finish EXIT
mkdir -p "$out"

if [[ -n $from ]]; then
  cp "$from"/*.txt "$raw/"
  read -r iters rounds <<<"$(awk '$1 == "run" {print $2, $3; exit}' "$raw/run.txt")"
else
  started=$SECONDS
  bazel build -c opt //bench:all
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  echo "run $iters $rounds $(date -u +%Y-%m-%d)" >"$raw/run.txt"
  echo "host $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB" >>"$raw/run.txt"
  echo "bench: registry and dispatcher, on this host"
  if [[ -n ${IBEV_BENCH_HOST_FROM:-} ]]; then
    # A trial of the VM part: the host's figures of an earlier run.
    cp "$IBEV_BENCH_HOST_FROM/registry.txt" "$IBEV_BENCH_HOST_FROM/dispatch.txt" "$raw/"
  else
    "$bin/bench/registry_bench" >"$raw/registry.txt"
    "$bin/bench/dispatch_bench" >"$raw/dispatch.txt"
  fi
  # The host's load while the VM runs, a line a second: the host's busy
  # ticks and the VM's (qemu's user + system), whose difference is load
  # that is not the benchmark's.
  (
    while :; do
      q=0
      for pid in $(pgrep -f "qemu-system.*$raw/vm" || true); do
        q=$((q + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
      done
      echo "host $(date +%s.%N) $(awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8}' /proc/stat) $q"
      sleep 1
    done
  ) >"$raw/host.txt" &
  sampler=$!
  echo "bench: soft-RoCE VM, 2 vCPUs, $iters iterations per latency run, $rounds rounds and a warm-up"
  mkdir -p "$raw/vm"
  TEST_TMPDIR="$raw/vm" IBEV_VM_KEEP="$raw/kept" IBEV_VM_CPUS=2 IBEV_VM_TIMEOUT=5400 \
    tools/softroce/softroce_run.sh -- \
    bench/vm_benchmarks.sh "$bin/bench/softroce_bench" "$iters" "$rounds" >"$raw/vm.txt"
  grep -q "^== end" "$raw/vm.txt" || { tail -n 40 "$raw/vm.txt"; echo "bench: the VM run failed"; exit 1; }
  echo "bench: device removal again, on the 6.12 kernel"
  TEST_TMPDIR="$raw/vm" IBEV_KERNEL=6.12 IBEV_VM_CPUS=2 IBEV_VM_TIMEOUT=900 \
    tools/softroce/softroce_run.sh -- \
    bench/vm_benchmarks.sh "$bin/bench/softroce_bench" "$iters" "$rounds" removal \
    >"$raw/vm612.txt"
  kill "$sampler" 2>/dev/null || true
  sampler=
  grep -q "^== end" "$raw/vm612.txt" || { cat "$raw/vm612.txt"; echo "bench: the 6.12 VM run failed"; exit 1; }
  echo "elapsed $((SECONDS - started))" >>"$raw/run.txt"
  # The plots' latency data: each compared row's samples of the median
  # round (chosen below) are kept; the raw output is kept whole.
  if [[ -d $raw/kept/samples ]]; then mv "$raw/kept/samples" "$raw/samples"; fi
fi
vm=$raw/vm.txt

# --- reading the raw output ------------------------------------------------------

# From here on a figure the run did not give is an empty cell (a "no data"
# verdict), not the end of the report.
trap - ERR
set +eE +o pipefail

# Each section "== NAME [ROUND]" of a VM's output in a file of its own, so
# that the thousands of lookups below read a few lines each.
split_sections() {
  mkdir -p "$2"
  awk -v dir="$2" '
    /^== / { if (f != "") close(f); key = substr($0, 4); gsub(/ /, "_", key); f = dir "/" key; printf "" >> f; next }
    f != "" { print >> f }' "$1"
}
split_sections "$vm" "$raw/sections/vm.txt"
split_sections "$raw/vm612.txt" "$raw/sections/vm612.txt"
# section NAME [FILE]: the lines of section "== NAME" of FILE (vm.txt).
section() {
  local f=$raw/sections/$(basename "${2:-$vm}")/${1// /_}
  if [[ -f $f ]]; then cat "$f"; fi
}
# kv NAME: NAME's value on the first stdin line that has NAME=.
kv() { grep -o "\(^\| \)$1=[^ ]*" | head -n 1 | cut -d= -f2; }

# Runs the host saw share the machine with other work: more than a quarter
# of a core busy beyond the VM's own threads, over the run's window (the
# guest's clock is the host's, set at boot). Such a run is dropped, as a
# suspect rerun is in the VM ("CONFIG ROUND reason").
awk '
  FNR == NR && $1 == "host" { t[++n] = $2; busy[n] = $3; vmt[n] = $4; next }
  /^== / { name = $2; round = $3 }
  /^run t_start=/ {
    split($2, a, "="); split($3, b, "="); s = a[2]; e = b[2]
    i = 0; j = 0
    for (k = 1; k <= n; ++k) { if (t[k] <= s) i = k; if (t[k] >= e && j == 0) j = k }
    if (i == 0 || j == 0 || t[j] <= t[i]) next
    foreign = ((busy[j] - busy[i]) - (vmt[j] - vmt[i])) / (t[j] - t[i]) / 100
    if (foreign > 0.25 && name != "rejected") printf "%s %s host_load=%.2f\n", name, round, foreign
  }' "$raw/host.txt" "$vm" 2>/dev/null >"$raw/host_dropped.txt" || true

# dropped CONFIG ROUND: true when that run does not count (the VM's rerun
# was suspect again, or the host was loaded).
dropped() {
  section "$1 $2" | grep -q '^dropped ' && return 0
  grep -q "^$1 $2 " "$raw/host_dropped.txt"
}
# Why runs of CONFIG were left out: "r3 (rcvd_rnr_err=12)", or "none".
drops() {
  local config=$1 r why list=()
  for r in $(seq "$rounds"); do
    why=$(section "$config $r" | awk '$1 == "dropped" {sub("reason=", "", $2); print $2}')
    [[ -n $why ]] || why=$(awk -v c="$config" -v r="$r" '$1 == c && $2 == r {print $3}' "$raw/host_dropped.txt")
    if [[ -n $why ]]; then list+=("r$r ($why)"); fi
  done
  if ((${#list[@]})); then echo "${list[*]}"; else echo none; fi
}

# Extractors: a run's section on stdin, one figure out.
# perftest's latency line: perftest bytes iterations t_min t_max t_typical
# t_avg t_stdev p99 p99.9.
perftest_lat() {
  local -A column=([typical_us]=6 [avg_us]=7 [p99_us]=9 [samples]=3)
  awk -v c="${column[$1]}" '$1 == "perftest" {print $c; exit}'
}
# ib_send_bw: perftest_bw bytes iterations peak average msgrate (Mpps).
perftest_rate() { awk '$1 == "perftest_bw" {printf "%.0f\n", $6 * 1e6; exit}'; }
perftest_avg_over_peak() { awk '$1 == "perftest_bw" {if ($4 > 0) printf "%.2f\n", $5 / $4; exit}'; }
# line_kv KIND NAME: NAME's value on the "KIND ..." line (softroce_bench's
# latency, rate, scale, fairness, idle lines).
line_kv() { grep "^$1 " | kv "$2"; }
# rxe's retransmissions during the run (its requester's retries).
retransmits() { awk '$1 == "hw_delta" {for (i = 2; i <= NF; ++i) {split($i, kv, "="); if (kv[1] == "completer_retry_err") v = kv[2]}; print v + 0; exit}'; }

# values CONFIG EXTRACTOR ARGS...: "ROUND VALUE" for every kept round.
values() {
  local config=$1 r v
  shift
  for r in $(seq "$rounds"); do
    dropped "$config" "$r" && continue
    v=$(section "$config $r" | "$@")
    if [[ -n $v && $v != na ]]; then echo "$r $v"; fi
  done
}
# The values alone, space-separated (for row), and their median.
list() { awk '{printf "%s%s", sep, $2; sep = " "} END {print ""}'; }
median() { awk 'NF {print $NF}' | sort -g | awk '{v[NR] = $1} END {if (NR) print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# paired A B: each round both kept, A's value over B's (rounds joined by
# number, so that a round dropped on either side leaves that pair only).
paired() { join <(sort -k1,1 "$1") <(sort -k1,1 "$2") | sort -k1,1n | awk '$3 > 0 {printf "%.4f\n", $2 / $3}'; }
# difference A B: A's value minus B's, per round.
difference() { join <(sort -k1,1 "$1") <(sort -k1,1 "$2") | sort -k1,1n | awk '{printf "%s %.4f\n", $1, $2 - $3}'; }
fmt() { awk 'NF {printf "%.2f\n", $1}'; }
spaced() { paste -sd' '; }

# Every figure the report uses, one file per series: $raw/s/NAME.
mkdir -p "$raw/s"
series() { local name=$1; shift; values "$@" >"$raw/s/$name"; }
for config in ibev_every raw_event_every raw_floor_every ibev_event ibev_event_worker \
  ibev_adaptive raw_poll; do
  for stat in typical_us avg_us p99_us cpu_s samples send_events events; do
    series "$config.$stat" "$config" line_kv latency "$stat"
  done
done
for config in perftest_event perftest_poll; do
  for stat in typical_us avg_us p99_us samples; do
    series "$config.$stat" "$config" perftest_lat "$stat"
  done
done
for size in 64 4096; do
  for mode in event poll; do
    series "bw_perftest_${mode}_$size.rate" "bw_perftest_${mode}_$size" perftest_rate
    series "bw_perftest_${mode}_$size.avg_over_peak" "bw_perftest_${mode}_$size" perftest_avg_over_peak
  done
  for mode in event adaptive; do
    for stat in msgs_per_s cpu_us_per_msg ack_calls_per_event; do
      series "rate_ibev_${mode}_$size.$stat" "rate_ibev_${mode}_$size" line_kv rate "$stat"
    done
  done
done
for config in scale_1 scale_64 scale_1024 scale_shared scale_floor_1 scale_floor_1024; do
  for stat in dispatch_us_per_completion events_per_completion wall_us_per_round_trip setup_s; do
    series "$config.$stat" "$config" line_kv scale "$stat"
  done
done
fairness=(fairness_unloaded fairness_loaded_apart fairness_loaded fairness_loaded_budget16
  fairness_loaded_event_budget16)
for config in "${fairness[@]}"; do
  for stat in port_p50_us port_p90_us port_max_us pingpong_p50_us pingpong_p99_us \
    saturating_per_s load_rate cap_hits; do
    series "$config.$stat" "$config" line_kv fairness "$stat"
  done
done
series idle.core_percent idle line_kv idle core_percent
for config in $(section configs | head -n 1); do series "$config.retransmits" "$config" retransmits; done
# "median (runs with any of n)"
retrans() {
  printf '%s (%s of %s)' "$(med "$1.retransmits")" "$(awk '$2 > 0' "$raw/s/$1.retransmits" | wc -l)" \
    "$(wc -l <"$raw/s/$1.retransmits")"
}
s() { cat "$raw/s/$1"; }
med() { s "$1" | median; }
each() { s "$1" | list; }
# ratios A B: A over B, paired by round, as row's values.
ratios() { paired "$raw/s/$1" "$raw/s/$2" | spaced; }
# clean_ratios A B: the same, only in the rounds in which neither run
# retransmitted (A's and B's configurations are the series' prefixes): a
# retransmission waits out the 67 ms ACK timeout, which in a stream of a
# second or two is the transport's figure, not the loop's.
clean_ratios() {
  join <(awk '$2 == 0 {print $1}' "$raw/s/${1%%.*}.retransmits" | sort) \
    <(awk '$2 == 0 {print $1}' "$raw/s/${2%%.*}.retransmits" | sort) >"$raw/clean"
  join "$raw/clean" <(join <(sort -k1,1 "$raw/s/$1") <(sort -k1,1 "$raw/s/$2")) |
    sort -k1,1n | awk '$3 > 0 {printf "%.4f\n", $2 / $3}' | spaced
}

# The fairness runs count only where the loaded CQ carried the load asked
# of it (95 % or more): a run that fell behind did not load the loop alike.
for config in "${fairness[@]:1}"; do
  join <(s "$config.saturating_per_s" | sort -k1,1) <(s "$config.load_rate" | sort -k1,1) |
    awk '$3 > 0 && $2 / $3 >= 0.95 {print $1}' >"$raw/s/$config.carried"
  for stat in port_p50_us pingpong_p50_us pingpong_p99_us; do
    join <(sort -k1,1 "$raw/s/$config.carried") <(s "$config.$stat" | sort -k1,1) \
      >"$raw/s/$config.$stat.kept"
  done
done
fairness_ratio() { paired "$raw/s/$1.$2.kept" "$raw/s/fairness_unloaded.$2" | spaced; }

# The registry's and the dispatcher's per-round lines (host).
reg_rounds() { awk -v n="$1" '$1 == "ratio_rounds" && $2 == n {$1 = $2 = ""; print substr($0, 3); exit}' "$raw/registry.txt"; }
reg_memory=$(grep -o 'memory_bytes_per_object_with_handle=[0-9.]*' "$raw/registry.txt" | cut -d= -f2 || true)
executor_rounds() { awk -v k="$1" '$1 == "executor_cost" && $2 ~ /^round=/ {for (i = 2; i <= NF; ++i) {split($i, kv, "="); if (kv[1] == k) printf "%s%s", sep, kv[2]}; sep = " "} END {print ""}' "$raw/dispatch.txt"; }
stop_values=$(awk '$1 == "stop_ms" {$1 = ""; print substr($0, 2)}' "$raw/dispatch.txt")
# delete_ms HOLDER [FILE]: each round's delete time of removal_HOLDER.
delete_ms() { section "removal_$1" "${2:-$vm}" | awk '$1 == "removal" && /round=/ {for (i = 2; i <= NF; ++i) if ($i ~ /^delete_ms=/) {sub("delete_ms=", "", $i); printf "%s%s", sep, $i; sep = " "}} END {print ""}'; }

# Heap bytes and instruction counts: one value per run.
# (A count is not timed: the host's load does not move it, so no run is
# left out for it.)
memory_runs() { for r in 1 2 3; do section "memory $r" | grep '^memory ' | kv "$1"; done | spaced; }
memory_step() { for r in 1 2 3; do section "memory $r" | grep "^memory_step name=$1 " | kv overhead_bytes_per_pair; done | spaced; }
# memory_dhat NAME: NAME's value on bench/dhat_blocks.py's summary line.
memory_dhat() { section memory_blocks | grep '^dhat ' | kv "$1"; }
# memory_blocks: the DHAT table's rows (bench/dhat_blocks.py's block lines),
# then its summary's sums per pair.
memory_blocks() {
  if [[ -z $(memory_dhat places) ]]; then
    echo "| (DHAT did not run, or wrote nothing, in this run) | | | | |"
    return
  fi
  section memory_blocks | grep '^block ' | awk '
    {
      for (i = 2; i <= NF; ++i) { v = $i; k = v; sub(/=.*/, "", k); sub(/^[^=]*=/, "", v); f[k] = v }
      printf "| `%s` | %d | %d | %.2f | %.0f |\n", f["made_by"], f["asked"], f["chunk"], f["per_pair"], f["chunk"] * f["per_pair"]
    }'
  echo "| the blocks listed, all | | | | $(memory_dhat listed_bytes_per_pair) |"
  echo "| ibev's other blocks live at exit (tables, lists, what is made once; $(memory_dhat ibev_places) places in all) | | | | $(memory_dhat ibev_unlisted_bytes_per_pair) |"
  echo "| everyone else's (rdma-core's objects, the benchmark's) | | | | $(memory_dhat other_bytes_per_pair) |"
  # What the listed blocks leave of the target, computed: they are made per
  # pair whatever the tables cost.
  awk -v listed="$(memory_dhat listed_bytes_per_pair)" 'BEGIN {
    if (listed == "") exit
    printf "\nThe listed blocks alone come to %d bytes a pair, ", listed
    if (listed > 1024) printf "%d more than the 1024-byte target: meeting it takes fewer or smaller blocks per pair, whatever the tables cost.\n", listed - 1024
    else printf "which leaves %d bytes of the 1024-byte target for the tables and the rest.\n", 1024 - listed
  }'
}
memory_growth() { for r in 1 2 3; do section "memory $r" | grep '^memory_growth ' | kv bytes_per_pair; done | spaced; }
# Instructions per completion: (count at 2M - count at M) over the
# completions between, for MODE at PAIRS.
per_completion_instructions() {
  local mode=$1 pairs=$2
  paste <(section "counts $mode $pairs 1024" | awk '$1 == "instructions" {print $2} $1 == "scale" {for (i = 2; i <= NF; ++i) if ($i ~ /^completions=/) {sub("completions=", "", $i); print $i}}' | paste -sd' ') \
    <(section "counts $mode $pairs 2048" | awk '$1 == "instructions" {print $2} $1 == "scale" {for (i = 2; i <= NF; ++i) if ($i ~ /^completions=/) {sub("completions=", "", $i); print $i}}' | paste -sd' ') |
    awk 'NF == 4 && $3 > $1 {printf "%.0f\n", ($4 - $2) / ($3 - $1)}'
}
declare -A ir
for mode in ibev raw-floor; do
  for pairs in 1 64 1024; do ir[$mode.$pairs]=$(per_completion_instructions "$mode" "$pairs"); done
done
ir_ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a != "" && b > 0) printf "%.4f", a / b}'; }
# Where the instructions go at one pair: each function's own count, differenced
# as above ("fn COUNT OBJECT FUNCTION" lines). profile MODE prints
# "GROUP PER_COMPLETION FUNCTION" for every function: GROUP is
# the library it runs in (rdma-core, glibc), or in the benchmark's binary
# the loop (ibev's code, or the floor loop's), the benchmark's handlers, or
# other (the standard library's, the loader's).
profile() {
  local mode=$1 completions
  completions=$(for m in 1024 2048; do section "counts $mode 1 $m" | grep '^scale ' | kv completions; done | paste -sd' ')
  { section "counts $mode 1 1024" | sed 's/^fn /fn1 /'; section "counts $mode 1 2048" | sed 's/^fn /fn2 /'; } |
    awk -v completions="$completions" '
      $1 == "fn1" || $1 == "fn2" {
        name = $4; for (i = 5; i <= NF; ++i) name = name " " $i
        key = $3 SUBSEP name
        count[key] += ($1 == "fn2" ? $2 : -$2)
      }
      END {
        split(completions, c, " ")
        if (c[2] <= c[1]) exit
        for (key in count) {
          split(key, part, SUBSEP)
          object = part[1]; name = part[2]
          if (object ~ /^libc\.so/) group = "glibc"
          else if (object ~ /^lib(ibverbs|rxe|mlx|efa|bnxt|hns|irdma|siw)/) group = "rdma-core"
          # The floor loop and its stop test (a bool() std::function it
          # calls each turn) are its loop; the rest of the benchmark code
          # runs inside the completion handlers, the same in both.
          else if (object == "softroce_bench" && name ~ /FloorLoop|FloorCq|drain_into|read_event|^std::_Function_handler<bool \(\)/) group = "loop"
          else if (object == "softroce_bench" && name ~ /bench::/) group = "handlers"
          else if (object == "softroce_bench" && name ~ /ibev::/) group = "loop"
          else group = "other"
          printf "%s %.4f %s\n", group, count[key] / (c[2] - c[1]), name
        }
      }' | sort -k2,2gr
}
profile_ibev=$(profile ibev)
profile_floor=$(profile raw-floor)
# profile_groups: "| GROUP | ibev | floor | ibev - floor |" for each group,
# or one row saying which side has no per-function counts.
profile_groups() {
  if [[ -z $profile_ibev || -z $profile_floor ]]; then
    echo "| (no per-function counts in this run for $([[ -z $profile_ibev ]] && echo "ibev")$([[ -z $profile_ibev && -z $profile_floor ]] && echo " and ")$([[ -z $profile_floor ]] && echo "the floor loop")) | | | |"
    return
  fi
  { echo "$profile_ibev" | sed 's/^/i /'; echo "$profile_floor" | sed 's/^/f /'; } |
    awk '{sum[$1, $2] += $3; seen[$2] = 1}
      END {
        n = split("loop handlers rdma-core glibc other", order, " ")
        for (k = 1; k <= n; ++k) {
          g = order[k]; if (!(g in seen)) continue
          printf "| %s | %.0f | %.0f | %+.0f |\n", g, sum["i", g], sum["f", g], sum["i", g] - sum["f", g]
          ti += sum["i", g]; tf += sum["f", g]
        }
        printf "| all | %.0f | %.0f | %+.0f |\n", ti, tf, ti - tf
      }'
}
# profile_top MODE_TEXT N: the N functions that cost the most a completion.
profile_top() {
  [[ -n $1 ]] || { echo "| | | (no per-function counts in this run) |"; return; }
  echo "$1" | head -n "$2" | awk '{name = $3; for (i = 4; i <= NF; ++i) name = name " " $i
    gsub(/\|/, "\\|", name); if (length(name) > 110) name = substr(name, 1, 107) "..."
    printf "| %.1f | %s | `%s` |\n", $2, $1, name}'
}

# --- the plots ---------------------------------------------------------------------

# The latency plot shows one round, the one whose ibev (every send signaled)
# over perftest -e typical ratio is the median's, so that it is neither the
# best nor the worst round; its number is in the title.
plot_round=$(join <(s ibev_every.typical_us | sort -k1,1) <(s perftest_event.typical_us | sort -k1,1) |
  awk '$3 > 0 {print $1, $2 / $3}' | sort -k2,2g | awk '{r[NR] = $1} END {print r[int((NR + 1) / 2)]}')
# (With --from the samples are not there: the plot's data stays as the run
# wrote it.)
if [[ -d $raw/samples ]]; then
  for name in perftest_event ibev_every perftest_poll ibev_adaptive; do
    sort -g "$raw/samples/$name.$plot_round.txt" |
      awk '{v[NR] = $1} END {for (i = 1; i <= NR; ++i) printf "%s %.6f\n", v[i], (NR - i + 1) / NR}' \
      >"$out/latency_$name.dat"
  done
  rm -f "$out"/latency_ibev_event.dat
fi
{
  echo "# depth perftest_e ibev_event perftest_poll ibev_adaptive (messages/s, 64 B, one run each)"
  for depth in 32 64 128 256; do
    echo "$depth $(section "depth_perftest_event $depth" | perftest_rate)" \
      "$(section "depth_ibev_event $depth" | line_kv rate msgs_per_s)" \
      "$(section "depth_perftest_poll $depth" | perftest_rate)" \
      "$(section "depth_ibev_adaptive $depth" | line_kv rate msgs_per_s)"
  done
} >"$out/rate_vs_depth.dat"
{
  echo "# cqs us_per_completion, median of the kept rounds (each CQ on its own channel)"
  echo "2 $(med scale_1.dispatch_us_per_completion)"
  echo "128 $(med scale_64.dispatch_us_per_completion)"
  echo "2048 $(med scale_1024.dispatch_us_per_completion)"
} >"$out/dispatch_vs_cqs.dat"
echo "# cqs us_per_completion (on 8 shared channels)" >"$out/dispatch_shared.dat"
echo "2048 $(med scale_shared.dispatch_us_per_completion)" >>"$out/dispatch_shared.dat"
{
  echo "# cqs us_per_completion (the same objects, the floor loop, no ibev)"
  echo "2 $(med scale_floor_1.dispatch_us_per_completion)"
  echo "2048 $(med scale_floor_1024.dispatch_us_per_completion)"
} >"$out/dispatch_raw.dat"

gnuplot <<PLOT
set terminal svg size 720,440 dynamic font 'sans,12'
set grid
set key top right

set output '$out/latency_ccdf.svg'
set title 'One-way latency, 2 B RC SEND ping-pong on soft-RoCE (round $plot_round of $rounds, the median round)'
set logscale xy
set xlabel 'latency (us)'
set ylabel 'fraction of samples above'
set format y '10^{%L}'
plot '$out/latency_perftest_event.dat' using 1:2 with lines lw 2 title 'perftest ib\_send\_lat -e', \
     '$out/latency_ibev_every.dat' using 1:2 with lines lw 2 title 'ibev, event mode, the same work', \
     '$out/latency_perftest_poll.dat' using 1:2 with lines lw 2 title 'perftest ib\_send\_lat (busy poll)', \
     '$out/latency_ibev_adaptive.dat' using 1:2 with lines lw 2 title 'ibev, adaptive mode'

set output '$out/rate_vs_depth.svg'
set title 'Message rate against sends outstanding, 64 B RC SEND, one in 32 signaled (one run each)'
unset logscale
set logscale x 2
set format y '%g'
set xlabel 'sends outstanding (tx depth)'
set ylabel 'messages/s'
set yrange [0:*]
set key bottom right
plot '$out/rate_vs_depth.dat' using 1:2 with linespoints lw 2 title 'perftest ib\_send\_bw -e', \
     '' using 1:3 with linespoints lw 2 title 'ibev, event mode', \
     '' using 1:4 with linespoints lw 2 title 'perftest ib\_send\_bw (busy poll)', \
     '' using 1:5 with linespoints lw 2 title 'ibev, adaptive mode'

set output '$out/dispatch_vs_cqs.svg'
set title 'Dispatching thread CPU per work completion against the number of CQs'
set logscale x 2
set xlabel 'CQs served by one loop'
set ylabel 'CPU per completion (us), median of the rounds'
set yrange [0:*]
set key bottom right
plot '$out/dispatch_vs_cqs.dat' using 1:2 with linespoints lw 2 title 'ibev, a channel per CQ', \
     '$out/dispatch_shared.dat' using 1:2 with points pt 7 ps 1.5 title 'ibev, 8 shared channels', \
     '$out/dispatch_raw.dat' using 1:2 with linespoints lw 2 dt 2 title 'the floor loop (no ibev)'
PLOT

# --- the report ----------------------------------------------------------------------

kernel=$(grep -o 'VM ([^)]*)' "$vm" | head -n 1 | tr -d 'VM()' | sed 's/^ //' || true)
run_date=$(awk '$1 == "run" {print $4; exit}' "$raw/run.txt")
elapsed=$(awk '$1 == "elapsed" {printf "%d min", $2 / 60}' "$raw/run.txt")
load_rate=$(section configs | kv fairness_load_rate)
messages=$(section "rate_ibev_event_64 1" | grep '^rate ' | kv messages)
perftest_tx_depth=$(section "perftest_event 1" | grep -m1 'TX depth' | grep -o '[0-9]*' | head -n 1 || true)
perftest_inline=$(section "perftest_event 1" | grep -m1 'Max inline' | grep -o '[0-9]*' | head -n 1 || true)
all_dropped=$(for config in $(section configs | head -n 1); do
  d=$(drops "$config"); if [[ $d != none ]]; then echo "  - $config: $d"; fi; done)
dropped_count=$(grep -o ' r[0-9]* (' <<<"$all_dropped" | wc -l)
rejected=$(grep -c '^== rejected ' "$vm" || true)
# A latency table row: medians over the kept rounds.
lat_row() {
  local config=$1 label=$2
  echo "| $label | $(med "$config.typical_us") | $(med "$config.avg_us") | $(med "$config.p99_us") | $(med "$config.samples") | $( [[ -s $raw/s/$config.cpu_s ]] && med "$config.cpu_s" || echo "not comparable") | $(retrans "$config") | $(each "$config.typical_us") |"
}
rate_row() {
  local config=$1 label=$2 series=$3
  echo "| $label | $(med "$config.$series") | $( [[ -s $raw/s/$config.cpu_us_per_msg ]] && med "$config.cpu_us_per_msg" || echo "not comparable") | $(retrans "$config") | $( [[ -s $raw/s/$config.avg_over_peak ]] && each "$config.avg_over_peak" || echo) | $(each "$config.$series") |"
}
scale_row() {
  local config=$1 label=$2 pairs=$3 cqs=$4 channels=$5 base=$6
  echo "| $label | $pairs | $cqs | $channels | $(med "$config.dispatch_us_per_completion") | $(ratios "$config.dispatch_us_per_completion" "$base.dispatch_us_per_completion" | tr ' ' '\n' | median | fmt) | $(med "$config.events_per_completion") | $(each "$config.dispatch_us_per_completion") | $(med "$config.wall_us_per_round_trip") | $(med "$config.setup_s") |"
}
fairness_row() {
  local config=$1 label=$2 kept
  if [[ $config == fairness_unloaded ]]; then
    kept="$(wc -l <"$raw/s/$config.port_p50_us") of $rounds (the rest dropped above)"
    echo "| $label | $(med "$config.port_p50_us") / $(med "$config.port_max_us") | $(med "$config.pingpong_p50_us") / $(med "$config.pingpong_p99_us") | | | 0 | $kept |"
  else
    kept="$(wc -l <"$raw/s/$config.carried") of $(wc -l <"$raw/s/$config.saturating_per_s")"
    kept_med() { join <(sort -k1,1 "$raw/s/$config.carried") <(s "$config.$1" | sort -k1,1) | median; }
    echo "| $label | $(kept_med port_p50_us) / $(kept_med port_max_us) | $(kept_med pingpong_p50_us) / $(kept_med pingpong_p99_us) | $(fairness_ratio "$config" port_p50_us | tr ' ' '\n' | median | fmt) | $(fairness_ratio "$config" pingpong_p50_us | tr ' ' '\n' | median | fmt) / $(fairness_ratio "$config" pingpong_p99_us | tr ' ' '\n' | median | fmt) | $(kept_med saturating_per_s) (cap held $(kept_med cap_hits)) | $kept |"
  fi
}
growth() { difference "$raw/s/$1.dispatch_us_per_completion" "$raw/s/$2.dispatch_us_per_completion" >"$raw/s/$1.growth"; }
growth scale_1024 scale_1
growth scale_floor_1024 scale_floor_1
link_down=$(section link_down | grep '^link_down ' || true)

cat >docs/benchmarks.md <<DOC
# Benchmarks

Written by \`bench/run_benchmarks.sh $iters $rounds\` on $run_date${elapsed:+ ($elapsed)}: the
registry and the dispatcher on the host; everything RDMA in one soft-RoCE VM
session (qemu TCG, 2 vCPUs, Debian's $kernel kernel, rdma_rxe over a dummy
netdev), with perftest's \`ib_send_lat\` and \`ib_send_bw\` in the same session;
device removal again on the 6.12 kernel. Host: $(awk '$1 == "host" {$1 = ""; print substr($0, 2)}' "$raw/run.txt").
Benchmarks print; none fails on a figure. Under TCG every instruction of the
guest is emulated, so absolute times are far above real hardware's, and a
time moves a good deal between rounds (each round's figures are below): the
verdicts rest on ratios paired by round, with their intervals, and on counts
that load does not move (instructions, heap bytes). The raw output of this run is in
docs/bench/raw/: \`bash bench/run_benchmarks.sh --from docs/bench/raw\`
writes this report again from it.

## Method

- $rounds rounds, after a warm-up round that is dropped; within a round the
  configurations run in a random order (printed in the raw output).
- Every run records the rxe counters that moved. A run in which the
  transport failed (out-of-sequence requests, sequence or RNR errors,
  retries run out, a send error, the link going down) is run again once;
  if the second run is suspect too, its round is dropped from every figure
  that uses that configuration. Retransmissions alone do not drop a run:
  rxe under TCG retransmits in most runs of every tool (an ACK handled
  later than the 67 ms ACK timeout both tools set); each table shows how
  many a configuration's runs had, beside its figures. The host records its own load
  beside the VM's: a run during which more than a quarter of a core was busy
  with something else is dropped too. This run: $rejected $([[ $rejected == 1 ]] && echo run || echo runs) rerun,
  $dropped_count dropped$(if [[ -n $all_dropped ]]; then echo ":"; else echo "."; fi)
$all_dropped
- A ratio is computed per round (a configuration over its baseline in the
  same round) and the figure is the median of those ratios; rounds are
  joined by number, so a round dropped on either side leaves that pair out.
- Percentiles only where the samples support them: p99 from 1000 samples a
  run, p99.9 from 10000; perftest 4.5-0.17 drops its two largest samples,
  so \`-n $iters\` gives it fewer than that, and no p99.9 is given.
- CPU is compared only between runs of the same harness (its own count over
  the timed window, both processes): perftest's process CPU includes its
  clock calibration (get_cpu_mhz, called four times in an \`ib_send_lat\`
  run of perftest 4.5-0.17) and its report, which no ibev row has.

## Summary

$(verdict_table_head)
$(row "event-mode latency, typical: ibev doing ib_send_lat -e's work (every send signaled, its completion through the event path) over ib_send_lat -e" ratio "<=" 1.0 "$(ratios ibev_every.typical_us perftest_event.typical_us)")
$(row "the same, p99" ratio "<=" 1.0 "$(ratios ibev_every.p99_us perftest_event.p99_us)")
$(row "the same work: ibev over the floor (this harness without ibev, in ibev's order)" ratio - 0 "$(ratios ibev_every.typical_us raw_floor_every.typical_us)")
$(row "the same work: this harness without ibev in perftest's order over ib_send_lat -e (what the harness costs)" ratio - 0 "$(ratios raw_event_every.typical_us perftest_event.typical_us)")
$(row "event-mode latency as applications run it (1 in 32 signaled, send CQ polled: less work than ib_send_lat -e does) over ib_send_lat -e" ratio - 0 "$(ratios ibev_event.typical_us perftest_event.typical_us)")
$(row "adaptive-mode latency, typical, over ib_send_lat (busy poll)" ratio "<=" 1.3 "$(ratios ibev_adaptive.typical_us perftest_poll.typical_us)")
$(row "message rate, 64 B, event mode, over ib_send_bw -e, rounds in which neither retransmitted" ratio ">=" 1.0 "$(clean_ratios rate_ibev_event_64.msgs_per_s bw_perftest_event_64.rate)")
$(row "the same, every round" ratio - 0 "$(ratios rate_ibev_event_64.msgs_per_s bw_perftest_event_64.rate)")
$(row "message rate, 64 B, adaptive mode, over ib_send_bw (busy poll), rounds in which neither retransmitted" ratio ">=" 0.95 "$(clean_ratios rate_ibev_adaptive_64.msgs_per_s bw_perftest_poll_64.rate)")
$(row "the same, every round" ratio - 0 "$(ratios rate_ibev_adaptive_64.msgs_per_s bw_perftest_poll_64.rate)")
$(row "message rate, 4 KiB, event mode, over ib_send_bw -e, rounds in which neither retransmitted" ratio ">=" 1.0 "$(clean_ratios rate_ibev_event_4096.msgs_per_s bw_perftest_event_4096.rate)")
$(row "the same, every round" ratio - 0 "$(ratios rate_ibev_event_4096.msgs_per_s bw_perftest_event_4096.rate)")
$(row "message rate, 4 KiB, adaptive mode, over ib_send_bw (busy poll), rounds in which neither retransmitted" ratio ">=" 0.95 "$(clean_ratios rate_ibev_adaptive_4096.msgs_per_s bw_perftest_poll_4096.rate)")
$(row "the same, every round" ratio - 0 "$(ratios rate_ibev_adaptive_4096.msgs_per_s bw_perftest_poll_4096.rate)")
$(row "dispatch CPU per completion, 1024 QP pairs over 1 pair" ratio "<=" 1.2 "$(ratios scale_1024.dispatch_us_per_completion scale_1.dispatch_us_per_completion)")
$(row "the floor loop's, 1024 pairs over 1 pair" ratio - 0 "$(ratios scale_floor_1024.dispatch_us_per_completion scale_floor_1.dispatch_us_per_completion)")
$(row "what 1023 more pairs add per completion: ibev's growth minus the floor's, paired by round" us - 0 "$(difference "$raw/s/scale_1024.growth" "$raw/s/scale_floor_1024.growth" | awk '{print $2}' | spaced)")
$(row_all "instructions per completion, ibev over the floor loop, 1 pair" ratio "<=" 1.15 "$(ir_ratio "${ir[ibev.1]}" "${ir[raw-floor.1]}")")
$(row_all "the same, 64 pairs" ratio "<=" 1.15 "$(ir_ratio "${ir[ibev.64]}" "${ir[raw-floor.64]}")")
$(row_all "the same, 1024 pairs" ratio "<=" 1.15 "$(ir_ratio "${ir[ibev.1024]}" "${ir[raw-floor.1024]}")")
$(row_all "instructions per completion, ibev at 1024 pairs over 1 pair (flat: within 5 %)" ratio "<=" 1.05 "$(ir_ratio "${ir[ibev.1024]}" "${ir[ibev.1]}")")
$(row_all "the same, from below" ratio ">=" 0.95 "$(ir_ratio "${ir[ibev.1024]}" "${ir[ibev.1]}")")
$(row_all "heap per QueuePair + CompletionQueue beyond rdma-core's, each with its handlers" bytes "<=" 1024 "$(memory_runs ibev_overhead_bytes_per_pair)")
$(row_all "what ibev's per-object blocks alone come to, no tables (DHAT, 256 pairs; the table in Memory)" bytes - - "$(memory_dhat listed_bytes_per_pair)")
$(row "port event delay, p50, under a CQ loaded at $load_rate/s on the same Dispatcher, over unloaded" ratio "<=" 2 "$(fairness_ratio fairness_loaded port_p50_us)")
$(row "second CQ's latency, p50, the same" ratio "<=" 2 "$(fairness_ratio fairness_loaded pingpong_p50_us)")
$(row "second CQ's latency, p99, the same" ratio "<=" 2 "$(fairness_ratio fairness_loaded pingpong_p99_us)")
$(row "second CQ's latency, p99, the loaded CQ on a Dispatcher of its own, over unloaded" ratio - 0 "$(fairness_ratio fairness_loaded_apart pingpong_p99_us)")
$(row "idle CPU, adaptive mode (2 ms poll budget), nothing to do" "% of a core" "<" 1 "$(each idle.core_percent)")
$(row "\`rdma link delete\` returns, the device held by an ibev client, 6.1" ms "<=" 1000 "$(delete_ms ibev)")
$(row "the same on 6.12" ms "<=" 1000 "$(delete_ms ibev "$raw/vm612.txt")")
$(row "registry route, 1k hot objects scattered among 1M over 1k objects" ratio "<=" 1.2 "$(reg_rounds ibev_scattered_over_1k)")
$(row "the same for a floor registry with one heap block per object (a std::function and a count)" ratio - - "$(reg_rounds block_floor_scattered_over_1k)")
$(row "what scattering adds to ibev's route, paired by round" ns - - "$(reg_rounds ibev_scattered_minus_1k_ns)")
$(row "what scattering adds to the floor with a block per object, paired by round" ns - - "$(reg_rounds block_floor_scattered_minus_1k_ns)")
$(row "what scattering adds to ibev beyond what it adds to the block floor, paired by round" ns - - "$(reg_rounds ibev_added_beyond_block_floor_ns)")
$(row "registry route, the first 1k registered among 1M over 1k objects" ratio "<=" 1.2 "$(reg_rounds ibev_1M_over_1k)")
$(row_all "registry heap per object with one handler, its Handle included" bytes "<=" 256 "$reg_memory")
$(row "registry attach" "ns per handler" "<=" 1000 "$(reg_rounds attach_ns)")
$(row "registry release" "ns per handler" "<=" 1000 "$(reg_rounds release_ns)")
$(row "\`stop()\` of a running Dispatcher" ms "<=" 10 "$stop_values")

## Completion latency: 2-byte RC send ping-pong, $iters iterations, rxe0 loopback

Medians over the kept rounds. One-way latency is half the round trip, as
perftest reports it. Each side is its own process, pinned to its own vCPU
(server on 0, client on 1, perftest too); no send is inline (perftest
reports \`Max inline data: ${perftest_inline:-?}[B]\` on rxe, \`TX depth: ${perftest_tx_depth:-?}\`).
What each row does:

- **perftest \`ib_send_lat -e\`**: with TX depth ${perftest_tx_depth:-?} every send is signaled,
  and after each post each side sleeps for that send's completion event,
  acks it, re-arms and polls it, before the next receive (one channel for
  both CQs).
- **ibev, every send signaled**: the same work through ibev: every send
  signaled, its completion handled by a handler on the Dispatcher (the send
  CQ in event mode); the receive handler posts the reply. It does not wait
  for the send's completion before the next receive: the Dispatcher serves
  whichever comes first.
- **without ibev, perftest's order**: this harness, no Dispatcher: a thread
  of its own (the main thread waiting, as with a Dispatcher) sleeps in a
  blocking \`ibv_get_cq_event\`, acks, re-arms and drains; after each
  signaled send it waits for its completion as perftest does.
- **without ibev, ibev's order (the floor)**: this harness, no Dispatcher:
  one epoll over both channels, on a thread of its own; on a wake-up, drain,
  read the event, ack (in batches), re-arm, drain again: ibev's event path,
  with nothing of ibev's (no registry, no guards, no table).
- **ibev, 1 in 32 signaled**: how an application runs it: one send in 32
  signaled, the send CQ polled without waiting; less work than perftest's
  loop, so its ratio to perftest has no target.
- **on a WorkerThread**: the same, the handler on a \`WorkerThread\`.
- **busy poll**: perftest without \`-e\`; ibev adaptive (keeps polling until
  the CQ has been quiet for 2 ms); this harness spinning on \`ibv_poll_cq\`.

| run | typical (us) | average (us) | p99 (us) | samples (perftest: its iterations) | CPU in the timed window, both processes (s) | rxe retransmissions a run, median (runs with any) | typical, each kept round |
|---|---|---|---|---|---|---|---|
$(lat_row perftest_event "perftest \`ib_send_lat -e\`")
$(lat_row ibev_every "ibev, event mode, every send signaled")
$(lat_row raw_event_every "without ibev, perftest's order, every send signaled")
$(lat_row raw_floor_every "without ibev, ibev's order (the floor), every send signaled")
$(lat_row ibev_event "ibev, event mode, 1 in 32 signaled")
$(lat_row ibev_event_worker "ibev, event mode, 1 in 32, handler on a WorkerThread")
$(lat_row perftest_poll "perftest \`ib_send_lat\` (busy poll)")
$(lat_row ibev_adaptive "ibev, adaptive mode (2 ms budget)")
$(lat_row raw_poll "without ibev: \`ibv_poll_cq\` loop")

![latency distributions](bench/latency_ccdf.svg)

Per-round ratios (kept rounds, in round order):

| ratio | each round |
|---|---|
| ibev every-signaled ÷ perftest -e, typical | $(ratios ibev_every.typical_us perftest_event.typical_us) |
| ibev every-signaled ÷ the floor, typical | $(ratios ibev_every.typical_us raw_floor_every.typical_us) |
| perftest's order without ibev ÷ perftest -e, typical | $(ratios raw_event_every.typical_us perftest_event.typical_us) |
| ibev 1 in 32 ÷ perftest -e, typical | $(ratios ibev_event.typical_us perftest_event.typical_us) |
| handler on a WorkerThread ÷ on the dispatching thread | $(ratios ibev_event_worker.typical_us ibev_event.typical_us) |
| ibev adaptive ÷ perftest busy poll, typical | $(ratios ibev_adaptive.typical_us perftest_poll.typical_us) |
| ibev adaptive ÷ \`ibv_poll_cq\` loop, typical | $(ratios ibev_adaptive.typical_us raw_poll.typical_us) |

Channel events per run, medians (send CQ's with every send signaled):
ibev $(med ibev_every.events) + $(med ibev_every.send_events), the floor $(med raw_floor_every.events) + $(med raw_floor_every.send_events), perftest's order $(med raw_event_every.events) + $(med raw_event_every.send_events).

## Message rate: RC SEND stream, 128 outstanding, one in 32 signaled

Each run sends $messages messages from a client process to a server process
(pinned as above). perftest: \`ib_send_bw -t 128 -Q 32 -n $messages -s SIZE\`,
with \`-e\` for events; its MsgRate. ibev: \`softroce_bench rate\`, the same
depth and signaling; the client posts more sends from its send CQ's
completion handler, the server's receive handler posts the receives back
(512 ahead, perftest's rx depth); the rate is the client's, from the first
post to the last send completion, as perftest's. perftest's avg/peak is its
average bandwidth over its peak, per run: a run that stalled part of the way
shows a low one. CPU per message is ibev's own count (both processes, the
timed window).

| run | messages/s | CPU per message (us) | rxe retransmissions a run, median (runs with any) | avg/peak, each kept round | messages/s, each kept round |
|---|---|---|---|---|---|
$(rate_row bw_perftest_event_64 "perftest \`ib_send_bw -e\`, 64 B" rate)
$(rate_row rate_ibev_event_64 "ibev, event mode, 64 B" msgs_per_s)
$(rate_row bw_perftest_poll_64 "perftest \`ib_send_bw\` (busy poll), 64 B" rate)
$(rate_row rate_ibev_adaptive_64 "ibev, adaptive mode, 64 B" msgs_per_s)
$(rate_row bw_perftest_event_4096 "perftest \`ib_send_bw -e\`, 4 KiB" rate)
$(rate_row rate_ibev_event_4096 "ibev, event mode, 4 KiB" msgs_per_s)
$(rate_row bw_perftest_poll_4096 "perftest \`ib_send_bw\` (busy poll), 4 KiB" rate)
$(rate_row rate_ibev_adaptive_4096 "ibev, adaptive mode, 4 KiB" msgs_per_s)

| ratio, each kept round | 64 B | 4 KiB |
|---|---|---|
| ibev event ÷ ib_send_bw -e | $(ratios rate_ibev_event_64.msgs_per_s bw_perftest_event_64.rate) | $(ratios rate_ibev_event_4096.msgs_per_s bw_perftest_event_4096.rate) |
| ibev adaptive ÷ ib_send_bw busy poll | $(ratios rate_ibev_adaptive_64.msgs_per_s bw_perftest_poll_64.rate) | $(ratios rate_ibev_adaptive_4096.msgs_per_s bw_perftest_poll_4096.rate) |

\`ibv_ack_cq_events\` calls per completion event (both processes; they are
batched 32 to one call by configuration, so this checks that, not a target):
event mode 64 B $(each rate_ibev_event_64.ack_calls_per_event), 4 KiB $(each rate_ibev_event_4096.ack_calls_per_event).

Against queue depth (64 B, one run each; docs/bench/rate_vs_depth.dat):

![message rate against queue depth](bench/rate_vs_depth.svg)

## Scale: dispatch cost against the number of CQs

One process, one loop, N RC QP pairs over rxe loopback, each QP with a CQ of
its own on a completion channel of its own (2N CQs, 2N channel fds in the
epoll set), or all 2N CQs on 8 shared channels. One message is in flight at
a time, passed round-robin (pair i's ping, its pong, then pair i+1's ping),
8192 round trips, every send signaled, so every CQ of the set is live. The
cost is the dispatching thread's CPU (getrusage RUSAGE_THREAD, from the
first ping to the last pong) per work completion; it includes the verbs the
handlers call, the same at every N. The floor serves the same objects and
handlers with no Dispatcher, in ibev's order (drain, read the event, ack in
batches, re-arm, drain), its channels found by index. The events per
completion column is each loop's channel events over its completions.

| served by | QP pairs | CQs | channels | CPU per completion (us), median | ÷ 1 pair, paired | events per completion | each kept round (us) | wall per round trip (us) | set-up (s) |
|---|---|---|---|---|---|---|---|---|---|
$(scale_row scale_1 ibev 1 2 2 scale_1)
$(scale_row scale_64 ibev 64 128 128 scale_1)
$(scale_row scale_1024 ibev 1024 2048 2048 scale_1)
$(scale_row scale_shared ibev 1024 2048 8 scale_1)
$(scale_row scale_floor_1 "the floor loop" 1 2 2 scale_floor_1)
$(scale_row scale_floor_1024 "the floor loop" 1024 2048 2048 scale_floor_1)

![dispatch cost against the number of CQs](bench/dispatch_vs_cqs.svg)

Instructions per completion, counted by callgrind in the VM (the whole
process, user space: (count at 2048 round trips − count at 1024) over the
completions between, so that set-up and teardown cancel; what is left is the
loop and the verbs its handlers call, the same in both):

| QP pairs | ibev | the floor loop | ibev ÷ floor |
|---|---|---|---|
$(for pairs in 1 64 1024; do echo "| $pairs | ${ir[ibev.$pairs]:-not counted} | ${ir[raw-floor.$pairs]:-not counted} | $(ir_ratio "${ir[ibev.$pairs]}" "${ir[raw-floor.$pairs]}") |"; done)

Where they go, at one pair: each function's own instructions (callgrind_annotate,
not inclusive), differenced in the same way, summed by where the function
runs. "loop" is ibev's code in ibev's column and the floor loop's in the
floor's; "handlers" are the benchmark's completion handlers, the same in both;
"other" is the standard library's and the loader's. Both loops run on a thread
of their own, the main thread waiting, so glibc takes the same paths in both.

| where | ibev | the floor loop | ibev − floor |
|---|---|---|---|
$(profile_groups)

The functions that cost ibev the most a completion:

| instructions per completion | where | function |
|---|---|---|
$(profile_top "$profile_ibev" 14)

And the floor loop's:

| instructions per completion | where | function |
|---|---|---|
$(profile_top "$profile_floor" 10)

## Memory per QP + CQ pair

\`softroce_bench memory --pairs 1024\`, three runs: 1024 objects of each kind
made with raw verbs and then as ibev wrappers, each kind once first (so that
first-use tables are not counted), glibc's heap in use (\`mallinfo2\`:
uordblks + hblkhd) read before and after each step. What the kernel maps
for the queues is in neither. Each step is what the ibev object costs beyond
the same rdma-core objects made raw, per object:

| step | bytes per object beyond rdma-core's, each run |
|---|---|
| a CompletionQueue, polled (no channel, no handler) | $(memory_step cq_polled) |
| a CompletionQueue with a completion handler (its channel, watched) | $(memory_step cq_watched) |
| the same with an event handler too | $(memory_step cq_event_handler) |
| a QueuePair, no event handler | $(memory_step qp) |
| a QueuePair with an event handler | $(memory_step qp_event_handler) |
| the tables' growth the steps found made already (the headline's pairs made them) | $(memory_growth) |

\`\`\`
$(for r in 1 2 3; do section "memory $r" | grep '^memory '; done)
\`\`\`

The blocks ibev keeps per pair, by where they are made: valgrind's DHAT over
\`softroce_bench memory-blocks --pairs 256\`, which makes 256 pairs of the
headline's kind (and one first) and exits holding them, freeing nothing
(bench/dhat_blocks.py). "Chunk" is what glibc's malloc takes for the size
asked. A place counts as ibev's when the first frame above the allocator and
the standard library is ibev's; places that made fewer blocks than one per
two pairs (tables, lists), or blocks of several sizes, are summed apart.
This is one run at 256 pairs, in malloc's chunks, with nothing subtracted:
its sums are not the headline's terms.

| made by | bytes asked | malloc chunk | blocks per pair | bytes per pair |
|---|---|---|---|---|
$(memory_blocks)

## Fairness: a loaded CQ against port events and a second CQ

One Dispatcher serves a receive CQ that a sender thread loads at
$load_rate messages/s (adaptive mode, 2 ms poll budget; event mode in the
last row), a ping-pong
between two more CQs (event mode), and the async fd of a second rxe device
whose dummy netdev is taken down and up 50 times. A port event's delay runs
from its arrival on the async fd (a raw \`ibv_get_async_event\` thread of its
own, SCHED_FIFO) to the ibev listener's call; 100 a run, so p50 and the
maximum are given, not p99. The ping-pong's latency is one-way, taken while
the flaps run. Every loaded configuration carries the same load; a run
counts only where the loaded CQ carried 95 % of it or more (last column).
Ratios are over the same round's unloaded run. Every Dispatcher thread is
pinned to vCPU 0 and the sender to vCPU 1, in every configuration: with the
loaded CQ on a Dispatcher of its own, that Dispatcher (adaptive, never quiet
for 2 ms at this rate) spins on the vCPU the measured one needs.

| the loaded CQ | port event delay, p50 / max (us) | second CQ's latency, p50 / p99 (us) | port p50 ÷ unloaded | second CQ ÷ unloaded, p50 / p99 | loaded CQ's completions/s (sends the 256 cap held back) | runs kept |
|---|---|---|---|---|---|---|
$(fairness_row fairness_unloaded "none (unloaded)")
$(fairness_row fairness_loaded_apart "on a Dispatcher of its own")
$(fairness_row fairness_loaded "on the same Dispatcher, budget 256 (the default)")
$(fairness_row fairness_loaded_budget16 "on the same Dispatcher, budget 16")
$(fairness_row fairness_loaded_event_budget16 "on the same Dispatcher, event mode, budget 16")

## Idle CPU, link down, device removal

An idle process in adaptive mode (2 ms budget), 3 s a round: $(med idle.core_percent) % of a core
(median; each kept round: $(each idle.core_percent)).

Link down to the PORT_ERR handler, 20 flaps in one run: \`$link_down\`.

\`rdma link delete\` while a process holds the device (PD, a watched CQ on a
channel, an SRQ, two RC QPs, an MR). The kernel's delete waits until every
process has closed the device. ibev's holder is a device client whose remove
drops its objects: ibev sees the uverbs node go and closes the device. A
raw-verbs holder notices nothing; here it lets go 3000 ms after the delete
starts, so its row shows that the delete waits for the holder, not a cost.

| kernel | ibev client holding: delete (ms), each round | raw holder letting go after 3000 ms: delete (ms) |
|---|---|---|
| 6.1 | $(delete_ms ibev) | $(delete_ms raw) |
| 6.12 | $(delete_ms ibev "$raw/vm612.txt") | $(delete_ms raw "$raw/vm612.txt") |

## Handlers on executors, \`stop()\`

On the host (\`bazel run -c opt //bench:dispatch_bench\`): injected events
through the whole path (resolve, queue, wake the dispatching thread,
deliver), the handler on the dispatching thread, on a \`WorkerThread\` and on
a Boost.Asio strand; the cost is the process's CPU per event, the main
thread asleep while it waits.

$(verdict_table_columns)
$(row "CPU per event, handler on a WorkerThread over on the dispatching thread, paired by round" ratio - 0 "$(executor_rounds worker_ratio)")
$(row "CPU per event, handler on an Asio strand over on the dispatching thread, paired by round" ratio - 0 "$(executor_rounds strand_ratio)")

## Registry

\`bazel run -c opt //bench:registry_bench\`: route + deliver per event with
1k and 1M registered objects, one handler each, the events on 1k objects:
the first 1k registered (their memory the most compact), or 1k scattered
among the 1M (the case the target is about), or spread over all 1M. The
floor rows route the same events through a bare open-addressing table
(object, function pointer; no allocation per object): what a table of that
size costs any registry. The block floor keeps in each slot a pointer to a
heap block of its object's own (a std::function and a count, made in
registration order, as the Registry's are) and counts it up and down per
event, as a snapshot's copy does: what one block per object costs when the
hot objects are scattered. Both floors' slots are 16 bytes. The "minus"
rows are the same comparisons in nanoseconds per event, paired by round,
since the two ratios have different bases; the last of them is what
scattering adds to ibev less what it adds to the block floor, round by
round. A thread is started first, so that every case runs in a process
with threads, as any with a Dispatcher does. A round during which more than
a quarter of a core was busy with something else is dropped, every case of
it; this run: $(awk '$1 == "host_load" {for (i = 2; i <= NF; ++i) {split($i, kv, "="); f[kv[1]] = kv[2]}
  printf "%d of %d rounds dropped, the busiest %.2f cores", f["dropped"], f["rounds"], f["worst_foreign_cores"]}' "$raw/registry.txt").

| ratio, paired by round | each round |
|---|---|
$(for n in ibev_1M_over_1k ibev_scattered_over_1k ibev_spread_over_1k floor_1M_over_1k floor_scattered_over_1k floor_spread_over_1k block_floor_scattered_over_1k ibev_scattered_minus_1k_ns block_floor_scattered_minus_1k_ns ibev_added_beyond_block_floor_ns ibev_over_floor_1k ibev_over_floor_scattered; do echo "| $n | $(reg_rounds "$n") |"; done)

$(cat docs/syscalls.md 2>/dev/null | sed '1s/^# /## /; 1s/$/ (its own run; its date below)/')

$(cat docs/recovery.md 2>/dev/null | sed '1s/^# /## /; 1s/$/ (its own run; its date below)/')

$(cat docs/soak.md 2>/dev/null | sed '1s/^# /## /; 1s/$/ (its own run; its date below)/')

Builds compared with each other (instructions per operation): docs/compare.md,
written from \`bench/compare_builds.sh\`'s output, not this run.

## Raw output

In docs/bench/raw/: run.txt, registry.txt, dispatch.txt, vm.txt, vm612.txt,
host.txt (the host's load during the VM run).

Reproduce: \`bash bench/run_benchmarks.sh $iters $rounds\`, or single figures
with \`bazel run -c opt //bench:registry_bench\`, \`//bench:dispatch_bench\`,
and \`softroce_bench\` inside the VM
(\`tools/softroce/softroce_run.sh -- bazel-bin/bench/softroce_bench rate --mode event\`).
DOC
if [[ -z $from ]]; then
  rm -rf "$raw_kept"
  mkdir -p "$raw_kept"
  cp "$raw"/run.txt "$raw"/registry.txt "$raw"/dispatch.txt "$raw"/vm.txt "$raw"/vm612.txt \
    "$raw"/host.txt "$raw_kept/"
fi
echo "bench: wrote docs/benchmarks.md and docs/bench/"
sed -n '/^## Summary/,/^## Completion/p' docs/benchmarks.md
