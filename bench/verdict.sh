# Sourced by the benchmark scripts that write a verdict table
# (bench/run_recovery.sh, bench/run_syscalls.sh), from the repository's root:
# one row per figure, its verdict computed from the data, never written.
# Needs bench/order_stats.awk.

# row NAME UNIT TARGET_OP TARGET VALUES...: one table row, its verdict from
# the median's interval against the target (TARGET_OP "<=" or "<", or "-"
# for none).
row() {
  local name=$1 unit=$2 op=$3 target=$4
  shift 4
  awk -f bench/order_stats.awk -f <(cat <<'PROGRAM'
    BEGIN {
      n = median_interval(values, x)
      over = 0
      for (i = 1; i <= n; ++i) if (op != "-" && !(op == "<=" ? x[i] <= target : x[i] < target)) ++over
      if (op == "-") verdict = "(no target)"
      else if (LO == "") verdict = "undetermined (too few rounds)"
      else if (op == "<=" ? HI <= target : HI < target) verdict = "met"
      else if (op == "<=" ? LO > target : LO >= target) verdict = "missed"
      else verdict = "undetermined"
      interval = LO == "" ? "" : sprintf("[%g, %g]", LO, HI)
      printf "| %s (%s) | %g | %s | %g | %s | %s | %s |\n", name, unit, MEDIAN, interval, MAX,
             op == "-" ? "" : op " " target, op == "-" ? "" : over " of " n, verdict
    }
PROGRAM
) -v name="$name" -v unit="$unit" -v values="$*" -v op="$op" -v target="$target" </dev/null
}
