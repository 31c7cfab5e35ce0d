#!/usr/bin/env bash
# Is this tree's registry and dispatcher slower than an older commit's? Builds
# bench/instruction_counts, bench/registry_bench and bench/dispatch_bench at
# BASE (a temporary git worktree; instruction_counts.cc is copied there if
# BASE has none: it uses the public API only) and here, all -c opt.
#
# First the counts load cannot move: instructions per operation (route,
# inject, attach+release), counted by callgrind over N and 2N operations,
# the difference divided by N so the set-up cancels; three runs each, whose
# spread is printed (it should be 0).
#
# Then the timings, in ROUNDS rounds, each the base's binaries and this
# tree's back to back, so a load that comes and goes lands on both (the
# 2-core CI machine is never quiet), in turns first (ABBA), so an order
# effect cancels. For each figure (ns per event, ns per
# handler, bytes per object) it prints
# the median of the per-round ratios (this tree / base: below 1 is better),
# a distribution-free interval for that median from the ratios' order
# statistics (the binomial sign-test interval, at least 95 % coverage), and a
# verdict with a 5 % margin: "no worse" when the interval's top is at most
# 1.05, "worse" when its bottom is above 1.05, else "not shown" (the data do
# not decide; more rounds may). Every round's ratios are printed first, so
# the verdicts can be recomputed from the output.
# The instruction verdicts use the same 5 % margin, on the spread's worst
# case (this tree's most against the base's least).
#   bench/compare_builds.sh BASE [ROUNDS]   (default 9 rounds; 0: counts only)
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bench/compare_builds.sh BASE [ROUNDS]}
rounds=${2:-9}
# Fewer than 6 paired ratios cannot give a 95 % interval for their median;
# 0: the instruction counts only.
((rounds == 0 || rounds >= 6)) || { echo "compare_builds: ROUNDS must be 0 or at least 6" >&2; exit 1; }
base_commit=$(git rev-parse --verify "$base^{commit}")
here=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- . || here="$here+changes"

tree=$(mktemp -d)
raw=$(mktemp -d)
# The base builds in an output base of its own under $tree, which goes with it.
base_bazel=(bazel --output_base="$tree/output")
cleanup() {
  (cd "$tree/base" 2>/dev/null && "${base_bazel[@]}" shutdown >/dev/null 2>&1) || true
  git worktree remove --force "$tree/base" >/dev/null 2>&1 || true
  git worktree prune
  chmod -R u+w "$tree" 2>/dev/null || true
  rm -rf "$tree" "$raw"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v valgrind >/dev/null ||
  { echo "compare_builds: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
benches=(instruction_counts registry_bench dispatch_bench)
targets=("${benches[@]/#/\/\/bench:}")
git worktree add --detach -q "$tree/base" "$base_commit"
if [[ ! -f $tree/base/bench/instruction_counts.cc ]]; then
  cp bench/instruction_counts.cc "$tree/base/bench/"
  sed -n '/^# Instructions per operation/,/^)/p' bench/BUILD.bazel >>"$tree/base/bench/BUILD.bazel"
fi
quiet=(--noshow_progress --ui_event_filters=-info)
(cd "$tree/base" && "${base_bazel[@]}" build -c opt "${quiet[@]}" "${targets[@]}")
base_bin=$(cd "$tree/base" && "${base_bazel[@]}" info -c opt bazel-bin 2>/dev/null)
bazel build -c opt "${quiet[@]}" "${targets[@]}"
here_bin=$(bazel info -c opt bazel-bin 2>/dev/null)
mkdir -p "$raw/bin/base" "$raw/bin/here"
for b in "${benches[@]}"; do
  cp "$base_bin/bench/$b" "$raw/bin/base/"
  cp "$here_bin/bench/$b" "$raw/bin/here/"
done

# The figures of one run of both benchmarks, "name value" per line.
figures() {
  "$1/registry_bench" | awk '
    /^  1 object /            {print "route_1_object_ns", $3}
    /^  1k objects /          {print "route_1k_objects_ns", $3}
    /^  1M objects /          {print "route_1M_objects_ns", $3}
    /^  1k hot objects /      {print "route_1k_hot_among_1M_ns", $7}
    /^  events spread /       {print "route_spread_over_1M_ns", $6}
    /^attach /                {print "attach_ns", $2}
    /^release /               {print "release_ns", $2}
    /^memory /                {print "bytes_per_object", $2}'
  "$1/dispatch_bench" | awk '
    /^inject / {
      for (i = 2; i <= NF; ++i) {
        split($i, kv, "=")
        if (kv[1] == "where") where = kv[2]
        if (kv[1] == "ns_per_event") wall = kv[2]
        if (kv[1] == "cpu_ns_per_event") cpu = kv[2]
      }
      print "inject_" where "_ns", wall
      print "inject_" where "_cpu_ns", cpu
    }'
}

echo "compare_builds: base $(git rev-parse --short "$base_commit"), here $here"

# instructions BIN CASE N: callgrind's count for CASE with N operations.
instructions() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1/instruction_counts" "$2" "$3" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
n=20000
echo
echo "instructions per operation (callgrind, (count(2N) - count(N)) / N, N=$n; 3 runs: min max)"
printf '%-20s %15s  %15s %8s  %s\n' case "base min max" "here min max" ratio verdict
for c in route_1k route_spread_64k inject attach_release; do
  for side in base here; do
    for run in 1 2 3; do
      one=$(instructions "$raw/bin/$side" "$c" "$n")
      two=$(instructions "$raw/bin/$side" "$c" $((2 * n)))
      echo $(((two - one) / n))
    done | sort -n | awk 'NR == 1 {min = $1} {max = $1} END {print min, max}' >"$raw/ins.$side"
  done
  read -r base_min base_max <"$raw/ins.base"
  read -r here_min here_max <"$raw/ins.here"
  # Worst case of the spread: this tree's most against the base's least.
  awk -v c="$c" -v b0="$base_min" -v b1="$base_max" -v h0="$here_min" -v h1="$here_max" 'BEGIN {
    worst = h1 / b0
    printf "%-20s %7d %7d  %7d %7d %8.3f  %s\n", c, b0, b1, h0, h1, h0 / b0,
      worst <= 1.05 ? "no worse" : (h0 / b1 > 1.05 ? "worse" : "not shown")
  }'
done

((rounds > 0)) || exit 0
echo
echo "timings: $rounds rounds, the base's run and this tree's back to back, in turns first"
export LC_ALL=C  # sort and join agree on the order
for r in $(seq "$rounds"); do
  # ABBA: an order effect (a warm cache, a clock ramping up) cancels.
  if ((r % 2)); then
    figures "$raw/bin/base" >"$raw/base.$r"
    figures "$raw/bin/here" >"$raw/here.$r"
  else
    figures "$raw/bin/here" >"$raw/here.$r"
    figures "$raw/bin/base" >"$raw/base.$r"
  fi
  join <(sort -k1,1 "$raw/base.$r") <(sort -k1,1 "$raw/here.$r") |
    awk -v r="$r" '{printf "round %d %s base=%s here=%s ratio=%.4f\n", r, $1, $2, $3, $3 / $2}' |
    tee -a "$raw/ratios"
done

echo
printf '%-30s %8s %19s  %s\n' figure median "interval" verdict
awk -f bench/order_stats.awk -f <(cat <<'PROGRAM'
  { sub("ratio=", "", $6); v[$3] = v[$3] " " $6 }
  END {
    for (name in v) {
      m = median_interval(v[name], x)  # a figure missing from some rounds has fewer ratios
      if (LO == "") { printf "%-30s too few rounds (%d)\n", name, m; continue }
      verdict = HI <= 1.05 ? "no worse" : LO > 1.05 ? "worse" : "not shown"
      printf "%-30s %8.3f   [%6.3f, %6.3f]  %s\n", name, MEDIAN, LO, HI, verdict
    }
  }
PROGRAM
) "$raw/ratios" | sort
