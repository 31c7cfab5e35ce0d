#!/usr/bin/env bash
# The fleet view over a soak: ibev-watch scraped by a real Prometheus server
# while a fault schedule flaps, re-addresses and re-adds a soft-RoCE device
# for SECONDS (bench/fleet_soak_job.sh, in the VM); then the events per
# minute per type Prometheus answers, plotted into docs/bench/fleet_events.svg
# (data beside it) and quoted in docs/operations.md.
#   bash bench/run_fleet_soak.sh [SECONDS]      (default 300, about 7 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
tools/setup.sh
if ! command -v gnuplot >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gnuplot-nox >/dev/null
fi
bazel build //apps/ibev_watch:ibev-watch //apps/ibev_replay:ibev-replay
bin=$(bazel info bazel-bin 2>/dev/null)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
IBEV_VM_TIMEOUT=$((seconds + 300)) tools/softroce/softroce_run.sh -- \
  "$PWD/bench/fleet_soak_job.sh" "$bin/apps/ibev_watch/ibev-watch" \
  "$bin/apps/ibev_replay/ibev-replay" "$seconds" | tee "$out"

# One row per time, a column per event type (0 where Prometheus had none).
data=docs/bench/fleet_events.dat
/usr/bin/python3 - "$out" >"$data" <<'PY'
import sys
values, times, events = {}, set(), set()
for line in open(sys.argv[1]):
    fields = line.split()
    if len(fields) == 4 and fields[0] == "DATA":
        at, event = int(fields[1]), fields[2]
        values[at, event] = fields[3]
        times.add(at)
        events.add(event)
events = sorted(events)
print("# seconds " + " ".join(events))
for at in sorted(times):
    print(at, " ".join(values.get((at, e), "0") for e in events))
PY
columns=$(head -n 1 "$data" | wc -w)
[[ $columns -gt 2 ]] || { echo "fleet-soak: Prometheus answered no series"; exit 1; }
plot=""
for ((c = 3; c <= columns; c++)); do
  name=$(head -n 1 "$data" | awk -v c="$c" '{ print $c }' | sed 's/IBV_EVENT_//; s/_/\\\\_/g')
  plot+="${plot:+, }'$data' using (\$1/60):$((c - 1)) with linespoints lw 2 title '$name'"
done
gnuplot <<PLOT
set terminal svg size 720,400 dynamic font 'sans,12'
set output 'docs/bench/fleet_events.svg'
set title "Events per minute by type, as Prometheus stored them (soft-RoCE, ${seconds} s soak)"
set grid
set key outside right
set xlabel 'minutes into the soak'
set ylabel 'events per minute'
set yrange [0:*]
plot $plot
PLOT

# docs/operations.md: the section between the markers, rewritten.
kernel=$(cat "${IBEV_CACHE:-/var/cache/ibev}/kernel/ready" 2>/dev/null || uname -r)
section=$(mktemp)
{
  echo "<!-- fleet-soak: written by bench/run_fleet_soak.sh -->"
  echo "\`bash bench/run_fleet_soak.sh $seconds\` on $(date -u +%Y-%m-%d): soft-RoCE (rxe0) in the"
  echo "qemu TCG VM, kernel $kernel, Prometheus $(prometheus --version 2>&1 | awk 'NR==1 {print $3}')"
  echo "scraping ibev-watch every 5 s while \`ibev-replay --schedule --real\` did"
  echo "$(awk '$1 == "CHECK" && $2 == "schedule" { s += $4 } END { print s + 0 }' "$out") faults"
  echo "(flaps, GID changes, a removal and return now and then; busier in odd"
  echo "minutes). The plot is \`sum by (event) (increase(ibev_watch_events_total[1m]))\`"
  echo "from Prometheus's HTTP API, every 15 s (data: docs/bench/fleet_events.dat):"
  echo
  echo "![events per minute](bench/fleet_events.svg)"
  echo
  echo "What ibev-watch counted at the end, and the faults done:"
  echo
  echo '```'
  awk '$1 == "CHECK" { $1 = ""; sub(/^ /, ""); print }' "$out"
  echo '```'
  echo "<!-- fleet-soak: end -->"
} >"$section"
awk -v section="$section" '
  /^<!-- fleet-soak: written/ { while ((getline line < section) > 0) print line; skip = 1; next }
  /^<!-- fleet-soak: end -->/ { skip = 0; next }
  !skip { print }' docs/operations.md >"$section.md"
mv "$section.md" docs/operations.md
rm -f "$section"
echo "fleet-soak: wrote docs/bench/fleet_events.svg, $data and docs/operations.md"
