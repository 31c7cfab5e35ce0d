# Sourced by the benchmark scripts that write a verdict table
# (bench/run_benchmarks.sh, bench/run_recovery.sh, bench/run_syscalls.sh),
# from the repository's root: how a verdict is reached, and one row per
# figure, its verdict computed from the data, never written.
# Needs bench/order_stats.awk.

# verdict_row KIND NAME UNIT TARGET_OP TARGET VALUES...: one table row.
# KIND "median": a timed figure, one value per round; the verdict comes from
# the median's order-statistic interval against the target. KIND "every": a
# count that load cannot move (instructions, heap bytes), one value per run;
# the interval is [min, max], and the verdict is met when every run meets
# the target. TARGET_OP is "<=", "<", ">=", ">" or "-" (no target).
verdict_row() {
  local kind=$1 name=$2 unit=$3 op=$4 target=$5
  shift 5
  awk -f bench/order_stats.awk -f <(cat <<'PROGRAM'
    function meets(v) {
      if (op == "<=") return v <= target
      if (op == "<") return v < target
      if (op == ">=") return v >= target
      return v > target
    }
    # The values as given (what the verdict compares is what the row shows);
    # a median of an even count is computed, shown with awk's %.6g.
    BEGIN {
      n = median_interval(values, x)
      if (n == 0) {
        printf "| %s (%s) | | | | %s | | no data |\n", name, unit, op == "-" ? "" : op " " target
        exit
      }
      if (kind == "every") { LO = x[1]; HI = x[n] }
      over = 0
      for (i = 1; i <= n; ++i) if (op != "-" && !meets(x[i] + 0)) ++over
      if (op == "-") verdict = "(no target)"
      else if (LO == "") verdict = "undetermined (too few rounds)"
      else if (meets(LO + 0) && meets(HI + 0)) verdict = "met"
      else if (!meets(LO + 0) && !meets(HI + 0)) verdict = "missed"
      else verdict = "undetermined"
      interval = LO == "" ? "" : sprintf("[%s, %s]", LO, HI)
      # The worst round: the largest against an upper bound, the smallest
      # against a lower one.
      worst = (op == ">=" || op == ">") ? x[1] : MAX
      printf "| %s (%s) | %s | %s | %s | %s | %s | %s |\n", name, unit, MEDIAN, interval, worst,
             op == "-" ? "" : op " " target, op == "-" ? n (n == 1 ? " run" : " runs") : over " of " n, verdict
    }
PROGRAM
) -v kind="$kind" -v name="$name" -v unit="$unit" -v values="$*" -v op="$op" \
    -v target="$target" </dev/null
}

# row NAME UNIT TARGET_OP TARGET VALUES...: a timed figure, one value per round.
row() { verdict_row median "$@"; }
# row_all NAME UNIT TARGET_OP TARGET VALUES...: a deterministic count, one value per run.
row_all() { verdict_row every "$@"; }

# What every verdict table says before its rows: how a row's verdict is
# reached. Then the table's head.
verdict_table_head() {
  echo "A timed figure is the median of its rounds with the order-statistic interval"
  echo "of that median (at least 95 % coverage, bench/order_stats.awk); a count that"
  echo "load cannot move (instructions, bytes) shows its runs' [min, max]. The verdict is"
  echo "computed from the interval against the target: met when the whole interval meets"
  echo "it, missed when none of it does, undetermined otherwise. \"Worst\" is the round"
  echo "furthest from the target's side, and \"over target\" counts the rounds that missed"
  echo "it, as a bound is a promise about every round."
  echo
  verdict_table_columns
}
verdict_table_columns() {
  echo "| figure | median | interval | worst | target | over target | verdict |"
  echo "|---|---|---|---|---|---|---|"
}
