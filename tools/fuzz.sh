#!/usr/bin/env bash
# libFuzzer over what ibev reads from files and sockets (tests/fuzz/): the
# recording reader, the fault-schedule reader and ibev-watch's metrics
# endpoint. Each target is built with clang++ -fsanitize=fuzzer,address,
# undefined and run for a bounded time with a fixed seed over a copy of its
# seed corpus (tests/fuzz/corpus/NAME, never written to) and its dictionary
# (tests/fuzz/NAME.dict), the targets side by side. Prints one line when
# none found anything; else exits 1 naming each reproducer, kept in a folder
# under /tmp (run it again: tools/fuzz.sh --reproduce NAME FILE). What a
# fuzzer finds becomes a test in the parser's own suite (docs/testing.md).
#
# Usage: tools/fuzz.sh [--time SECONDS | --long] [TARGET_fuzz.cc...]
#        tools/fuzz.sh --reproduce NAME|TARGET_fuzz.cc FILE...
#   --time S  seconds each target runs (default 20); --long: 300, niced.
#   Targets default to tests/fuzz/*_fuzz.cc; NAME is the file's name
#   without _fuzz.cc.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

seconds=20
nice=()
reproduce=()
while (($# > 0)); do
  case $1 in
    --time) seconds=$2; shift 2 ;;
    --long) seconds=300; nice=(nice -n 19); shift ;;
    --reproduce) shift; reproduce=("$@"); set --; break ;;
    -*) echo "fuzz: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done

if ((${#reproduce[@]} > 0)); then
  targets=("${reproduce[0]}")
  inputs=("${reproduce[@]:1}")
  [[ ${targets[0]} == *.cc ]] || targets=("$root/tests/fuzz/${targets[0]}_fuzz.cc")
elif (($# > 0)); then
  targets=("$@")
else
  targets=("$root"/tests/fuzz/*_fuzz.cc)
fi

scratch=$(mktemp -d -t ibev-fuzz.XXXXXX)
keep=false
trap '$keep || rm -rf "$scratch"' EXIT
# shellcheck source=tools/clang_tree.sh
source "$root/tools/clang_tree.sh"
ibev_clang_tree "$scratch"
flags=("${ibev_clang_flags[@]}" -O1 -g1 "-fsanitize=fuzzer,address,undefined"
  -fno-sanitize-recover=undefined -fno-omit-frame-pointer)

# The library sources each target links (by NAME); a target not listed
# (a test's fixture) links none.
sources_of() {
  case $1 in
    recording) echo formats/recording.cc core/event.cc core/event_type.cc ;;
    fault_schedule) echo formats/fault_schedule.cc formats/recording.cc core/event.cc core/event_type.cc ;;
    http_request) echo apps/ibev_watch/metrics_response.cc ;;
  esac
}

# Every source compiled once, two compilers at a time, the targets' own first
# (http_request_fuzz.cc's Beast is the longest, 20 s of CPU of some 46), then
# each target linked.
names=()
declare -A objects_of
sources=()
for target in "${targets[@]}"; do
  name=$(basename "$target" _fuzz.cc)
  names+=("$name")
  objects=("$scratch/obj/$name.o")
  sources=("$target=$scratch/obj/$name.o" "${sources[@]}")
  for source in $(sources_of "$name"); do
    objects+=("$scratch/obj/${source//\//_}.o")
    sources+=("$root/$source=$scratch/obj/${source//\//_}.o")
  done
  objects_of[$name]="${objects[*]}"
done
mkdir "$scratch/obj"
# shellcheck disable=SC2016 # the inner bash expands them
printf '%s\n' "${sources[@]}" | awk '!seen[$0]++' | tr '\n' '\0' |
  xargs -0 -P2 -I{} bash -c 'source=${1%%=*}; clang++ "${@:2}" -c "$source" -o "${1#*=}"' _ {} "${flags[@]}"
for name in "${names[@]}"; do
  # shellcheck disable=SC2086 # objects_of holds space-separated paths
  clang++ "${flags[@]}" ${objects_of[$name]} -o "$scratch/$name" -libverbs -pthread
done

built=$SECONDS

if ((${#reproduce[@]} > 0)); then
  "$scratch/${names[0]}" -runs=1 "${inputs[@]}"
  exit  # with the target's status
fi

# Each target in the background, its log beside its corpus copy.
declare -A pid_of
for name in "${names[@]}"; do
  corpus=$scratch/corpus/$name
  mkdir -p "$corpus" "$scratch/found"
  if [[ -d $root/tests/fuzz/corpus/$name ]]; then cp -r "$root/tests/fuzz/corpus/$name/." "$corpus"; fi
  options=(-seed=1 -max_total_time="$seconds" -runs=$((seconds * 200000)) -timeout=10
    -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 -artifact_prefix="$scratch/found/$name-")
  if [[ -f $root/tests/fuzz/$name.dict ]]; then options+=(-dict="$root/tests/fuzz/$name.dict"); fi
  "${nice[@]}" "$scratch/$name" "${options[@]}" "$corpus" >"$scratch/$name.log" 2>&1 &
  pid_of[$name]=$!
done

failed=()
summary=()
for name in "${names[@]}"; do
  if wait "${pid_of[$name]}"; then
    runs=$(grep -m1 -oP 'stat::number_of_executed_units: \K[0-9]+' "$scratch/$name.log" || echo '?')
    summary+=("$name $runs runs")
  else
    failed+=("$name")
  fi
done

if ((${#failed[@]} > 0)); then
  keep=true
  for name in "${failed[@]}"; do
    echo "== fuzz: $name found something ($scratch/$name.log):"
    grep -E 'ERROR|broken invariant|runtime error|SUMMARY|Test unit written' "$scratch/$name.log" | head -n 20
  done
  echo "fuzz: ${#failed[@]} of ${#names[@]} targets found something; reproducers in $scratch/found:"
  printf '  %s\n' "$scratch"/found/*
  exit 1
fi
joined=$(printf '%s, ' "${summary[@]}")
echo "fuzz: ${#names[@]} targets built in ${built} s, run ${seconds} s each, nothing found" \
  "(${joined%, })"
