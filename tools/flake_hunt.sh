#!/usr/bin/env bash
# Runs every test target N times (default 5) in each configuration the
# README's test command uses (default, ASan+UBSan, TSan, the soft-RoCE suite
# on kernel 6.12) and prints, per configuration and target, the runs, the
# failures and the first failing run's log (kept under the output folder,
# since the next configuration's runs overwrite Bazel's). A flaky test is a
# defect: this finds them. Two soft-RoCE VMs run at once, one vCPU each, as
# in the test command (softroce_run.sh); at N=5 plan for about an hour.
#
#   tools/flake_hunt.sh [N] [OUTPUT_DIR] [TARGET...]   (default //...)
#
# Ends with one line "flake_hunt: R runs, F failed in M min" and exits 1 when
# any run failed (or a build failed).
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
out=${2:-$(mktemp -d -t ibev-flake-hunt.XXXXXX)}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "flake_hunt: N is a whole number >= 1, not '$runs'" >&2; exit 2; }
mkdir -p "$out" || exit 2
shift $(($# > 2 ? 2 : $#))
targets=("$@")
((${#targets[@]} > 0)) || targets=(//...)
tools/setup.sh || { echo "flake_hunt: setup failed"; exit 2; }

started=$SECONDS
total_runs=0
total_failed=0
status=0

# One configuration: bazel test with the build event protocol's JSON, then
# its testResult events counted per target.
hunt() {
  local name=$1
  shift
  local events=$out/$name.bep.json
  echo "== $name: bazel test --runs_per_test=$runs $*"
  bazel test --runs_per_test="$runs" --build_event_json_file="$events" "$@" \
    >"$out/$name.log" 2>&1
  local rc=$?
  local report
  report=$(python3 - "$events" "$out/$name" "$rc" <<'PY'
import json, os, shutil, sys
from urllib.parse import urlparse, unquote

events_path, keep_dir, bazel_rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
targets = {}  # label -> [runs, failures, first failing log]
unbuilt = []
try:
    with open(events_path) as events:
        for line in events:
            event = json.loads(line)
            ident = event.get("id", {})
            if "testResult" in ident and "testResult" in event:
                label = ident["testResult"]["label"]
                entry = targets.setdefault(label, [0, 0, None])
                entry[0] += 1
                if event["testResult"].get("status") != "PASSED":
                    entry[1] += 1
                    if entry[2] is None:
                        for output in event["testResult"].get("testActionOutput", []):
                            if output.get("name") == "test.log":
                                entry[2] = unquote(urlparse(output["uri"]).path)
            elif "targetCompleted" in ident and event.get("aborted") is not None:
                unbuilt.append(ident["targetCompleted"]["label"])
            elif "targetCompleted" in ident and not event.get("completed", {}).get("success", True):
                unbuilt.append(ident["targetCompleted"]["label"])
except FileNotFoundError:
    pass
os.makedirs(keep_dir, exist_ok=True)
runs = failed = 0
for label in sorted(targets):
    count, failures, log = targets[label]
    runs += count
    failed += failures
    line = f"  {label}: {count} runs, {failures} failed"
    if log:
        kept = os.path.join(keep_dir, label.strip("/").replace("/", "_").replace(":", "_") + ".log")
        try:
            shutil.copyfile(log, kept)
            line += f"; first failing log: {kept}"
        except OSError:
            line += f"; first failing log: {log}"
    print(line)
for label in unbuilt:
    print(f"  {label}: did not build")
    failed += 1
# 4: built, but no test matched (a configuration's filter over TARGETs).
if bazel_rc not in (0, 4) and failed == 0:
    print(f"  bazel exited {bazel_rc} with no failed run: see {keep_dir}.log")
    failed = 1
print(f"TOTALS {runs} {failed}")
PY
)
  printf '%s\n' "$report" | grep -v '^TOTALS '
  local totals
  totals=$(grep '^TOTALS ' <<<"$report")
  local r f
  read -r _ r f <<<"$totals"
  total_runs=$((total_runs + ${r:-0}))
  total_failed=$((total_failed + ${f:-1}))
  if ((${f:-1} > 0)); then status=1; fi
}

hunt default "${targets[@]}"
hunt asan --config=asan "${targets[@]}"
hunt tsan --config=tsan "${targets[@]}"
hunt kernel-6.12 --test_env=IBEV_KERNEL=6.12 --test_tag_filters=softroce "${targets[@]}"

minutes=$(((SECONDS - started + 30) / 60))
echo "flake_hunt: $total_runs runs, $total_failed failed in $minutes min (logs in $out)"
exit "$status"
