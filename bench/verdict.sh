# Sourced by the benchmark scripts that write a verdict table
# (bench/run_recovery.sh, bench/run_syscalls.sh), from the repository's root:
# how a verdict is reached, and one row per figure, its verdict computed from
# the data, never written.
# Needs bench/order_stats.awk.

# row NAME UNIT TARGET_OP TARGET VALUES...: one table row, its verdict from
# the median's interval against the target (TARGET_OP "<=" or "<", or "-"
# for none).
row() {
  local name=$1 unit=$2 op=$3 target=$4
  shift 4
  awk -f bench/order_stats.awk -f <(cat <<'PROGRAM'
    # The values as given (what the verdict compares is what the row shows);
    # a median of an even count is computed, shown with awk's %.6g.
    BEGIN {
      n = median_interval(values, x)
      over = 0
      for (i = 1; i <= n; ++i) if (op != "-" && !(op == "<=" ? x[i] <= target : x[i] < target)) ++over
      if (op == "-") verdict = "(no target)"
      else if (LO == "") verdict = "undetermined (too few rounds)"
      else if (op == "<=" ? HI <= target : HI < target) verdict = "met"
      else if (op == "<=" ? LO > target : LO >= target) verdict = "missed"
      else verdict = "undetermined"
      interval = LO == "" ? "" : sprintf("[%s, %s]", LO, HI)
      printf "| %s (%s) | %s | %s | %s | %s | %s | %s |\n", name, unit, MEDIAN, interval, MAX,
             op == "-" ? "" : op " " target, op == "-" ? "" : over " of " n, verdict
    }
PROGRAM
) -v name="$name" -v unit="$unit" -v values="$*" -v op="$op" -v target="$target" </dev/null
}

# What every verdict table says before its rows: how a row's verdict is
# reached. Then the table's head.
verdict_table_head() {
  echo "Each figure is the median of its rounds with the order-statistic interval"
  echo "of that median (at least 95 % coverage, bench/order_stats.awk); the verdict is"
  echo "computed from the interval against the target: met when the whole interval meets"
  echo "it, missed when none of it does, undetermined otherwise. \"Over target\" counts the"
  echo "rounds that missed it, as a bound is a promise about every round."
  echo
  echo "| figure | median | interval | max | target | over target | verdict |"
  echo "|---|---|---|---|---|---|---|"
}
