#!/usr/bin/env bash
# Inside the soft-RoCE VM (bench/run_fleet_soak.sh runs it): ibev-watch with
# its metrics endpoint, a real Prometheus server scraping it every 5 s, and a
# fault schedule done for real by ibev-replay for SECONDS (flaps, GID changes,
# a removal and return now and then, busier in odd minutes). Then it asks
# Prometheus for events per minute per type and prints them as
#   DATA <seconds from start> <event> <events per minute>
# and what ibev-watch and the schedule counted, as CHECK lines.
#   fleet_soak_job.sh IBEV_WATCH IBEV_REPLAY SECONDS
set -euo pipefail
watch=$1 replay=$2 seconds=$3
device=${IBEV_TEST_DEVICE:-rxe0} netdev=${IBEV_TEST_NETDEV:-d0}
work=$(mktemp -d /tmp/fleet-soak.XXXXXX)  # Prometheus mmaps: not on 9p

"$watch" --metrics-listen 127.0.0.1:9464 >/dev/null 2>"$work/watch.err" &
watch_pid=$!
cat >"$work/prometheus.yml" <<CONFIG
global:
  scrape_interval: 5s
scrape_configs:
  - job_name: ibev
    static_configs:
      - targets: ['127.0.0.1:9464']
CONFIG
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address=127.0.0.1:9090 >"$work/prometheus.log" 2>&1 &
prometheus_pid=$!
for _ in $(seq 600); do
  grep -q 'ready to receive web requests' "$work/prometheus.log" && break
  sleep 0.1
done
grep -q 'ready to receive web requests' "$work/prometheus.log" ||
  { echo "prometheus did not start"; tail "$work/prometheus.log"; exit 1; }

# The schedule, the same for a given SECONDS (a fixed seed).
awk -v seconds="$seconds" -v dev="$device" -v netdev="$netdev" 'BEGIN {
  srand(28)
  for (t = 5; t < seconds - 20;) {
    r = rand()
    if (r < 0.6) {
      printf "%.3fs port-down %s 1\n", t, dev
      t += 0.5 + rand()
      printf "%.3fs port-up %s 1\n", t, dev
    } else if (r < 0.95) {
      printf "%.3fs gid-change %s 1\n", t, dev
    } else {
      printf "%.3fs remove %s\n", t, dev
      t += 2
      printf "%.3fs add %s %s\n", t, dev, netdev
    }
    t += (int(t / 60) % 2 ? 1 : 3) + 4 * rand()
  }
}' >"$work/faults"
start=$(date +%s)
"$replay" --schedule --real "$work/faults" >"$work/replay.out"
sleep $((start + seconds - $(date +%s) > 0 ? start + seconds - $(date +%s) : 0))
sleep 12  # two more scrapes
end=$(date +%s)

curl -sG http://127.0.0.1:9090/api/v1/query_range \
  --data-urlencode 'query=sum by (event) (increase(ibev_watch_events_total[1m]))' \
  --data-urlencode "start=$((start + 60))" --data-urlencode "end=$end" \
  --data-urlencode 'step=15' >"$work/range.json"
/usr/bin/python3 - "$work/range.json" "$start" <<'PY'
import json, sys
answer = json.load(open(sys.argv[1]))
start = int(sys.argv[2])
for series in answer["data"]["result"]:
    for at, value in series["values"]:
        print("DATA %d %s %.2f" % (int(float(at)) - start, series["metric"]["event"], float(value)))
PY
curl -s http://127.0.0.1:9464/metrics | grep '^ibev_watch_events_total' | sed 's/^/CHECK metric /'
for fault in port-down port-up gid-change remove add; do
  echo "CHECK schedule $fault $(grep -c " $fault " "$work/faults" || true)"
done
echo "CHECK replay $(wc -l <"$work/replay.out") faults done"
kill "$prometheus_pid" "$watch_pid"
wait 2>/dev/null || true
rm -rf "$work"
