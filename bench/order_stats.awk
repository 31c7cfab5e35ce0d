# Functions for the benchmark scripts' figures (awk -f bench/order_stats.awk
# -f PROGRAM): a median and its distribution-free interval from a sample's
# order statistics (the binomial sign-test interval, at least 95 %
# coverage), so that a verdict is computed from the data, not written.

# The largest k with P(Binomial(n, 1/2) < k) <= 0.025: the interval
# [x(k), x(n+1-k)] then covers the median with at least 95 % (0: none; n
# below 6 gives none).
function order_k(n,    p, c, i, k) {
  p = 0; c = 1; k = 0
  for (i = 0; i < n; ++i) {
    p += c / 2 ^ n
    if (p > 0.025) break
    k = i + 1
    c = c * (n - i) / (i + 1)
  }
  return k
}

# Splits the space-separated `values`, sorts them into x[1..n] and sets
# MEDIAN, LO and HI (LO and HI empty when n is too small for an interval)
# and MAX. Returns n.
function median_interval(values, x,    n, i, j, t, k) {
  n = split(values, x, " ")
  for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
  MEDIAN = (n % 2) ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2
  MAX = x[n]
  k = order_k(n)
  if (k == 0) { LO = ""; HI = "" } else { LO = x[k]; HI = x[n + 1 - k] }
  return n
}
