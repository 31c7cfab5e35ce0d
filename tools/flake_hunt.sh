#!/usr/bin/env bash
# Runs every test target N times (default 5) in each configuration the
# README's test command uses (default, ASan+UBSan, TSan, the soft-RoCE suite
# on kernel 6.12) and prints, per configuration and target, the runs, the
# failures and the first failing run's log (kept under the output folder,
# since the next configuration's runs overwrite Bazel's). A flaky test is a
# defect: this finds them. Two soft-RoCE VMs run at once, one vCPU each, as
# in the test command (softroce_run.sh); at N=5 plan for about 95 minutes.
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

# One configuration: bazel test with the build event protocol's JSON, read
# by tools/bazel_results.py (as tools/test.sh does), each target's runs.
hunt() {
  local name=$1
  shift
  local events=$out/$name.bep.json
  echo "== $name: bazel test --runs_per_test=$runs $*"
  bazel test --runs_per_test="$runs" --build_event_json_file="$events" "$@" \
    >"$out/$name.log" 2>&1
  local rc=$?
  local report
  report=$(python3 tools/bazel_results.py "$events" "$rc" --keep-logs "$out/$name" --no-tests-ok)
  grep -v '^totals: ' <<<"$report" | sed 's/^/  /'
  local targets_failed r f
  read -r _ _ targets_failed r f <<<"$(grep '^totals: ' <<<"$report")"
  total_runs=$((total_runs + ${r:-0}))
  total_failed=$((total_failed + ${f:-0}))
  # A target that did not build, or a failed bazel, fails with no failed run.
  if ((${targets_failed:-1} > 0)); then status=1; fi
}

hunt default "${targets[@]}"
hunt asan --config=asan "${targets[@]}"
hunt tsan --config=tsan "${targets[@]}"
hunt kernel-6.12 --test_env=IBEV_KERNEL=6.12 --test_tag_filters=softroce "${targets[@]}"

minutes=$(((SECONDS - started + 30) / 60))
echo "flake_hunt: $total_runs runs, $total_failed failed in $minutes min (logs in $out)"
((status == 0)) || echo "flake_hunt: some targets failed or did not build (above)"
exit "$status"
