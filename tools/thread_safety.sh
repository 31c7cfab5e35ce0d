#!/usr/bin/env bash
# Clang's thread-safety analysis over the library (core/thread_annotations.h):
# every library .cc, or the files given, compiled with -Wthread-safety and
# -Werror, syntax only; fails on any warning. The headers are found as Bazel
# lays them out (<ibev/core/...>, <ibev/ibev_c.h>): a scratch folder of
# links into the tree (tools/clang_tree.sh, which tools/fuzz.sh shares).
# Tests are left out: they lock what they like. python/ too: its headers
# want python3-dev's flags, and its mutexes (objects.h, bind_waiting.cc,
# bind_verbs.cc) are plain std ones, unannotated.
# Usage: tools/thread_safety.sh [FILE.cc...]; prints one line when all pass.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if (($# > 0)); then
  files=("$@")
else
  cd "$root"
  mapfile -t files < <(find core formats health dispatch verbs cm capi apps -name '*.cc' | sort)
fi

scratch=$(mktemp -d -t ibev-tsa.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
# shellcheck source=tools/clang_tree.sh
source "$root/tools/clang_tree.sh"
ibev_clang_tree "$scratch"

# -Wthread-safety-beta too: the analysis's newer checks, which pass as well.
printf '%s\0' "${files[@]}" |
  xargs -0 -P2 -n1 clang++ "${ibev_clang_flags[@]}" -fsyntax-only \
    -Wthread-safety -Wthread-safety-beta -Werror
echo "thread-safety: ${#files[@]} files, no warning"
