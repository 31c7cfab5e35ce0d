# shellcheck shell=bash
# Sourced by the scripts that drive clang++ over the library's sources without
# Bazel (tools/thread_safety.sh, tools/fuzz.sh): the headers as Bazel lays
# them out (<ibev/core/...>, <ibev/ibev_c.h>), from a folder of links into the
# tree. ibev_clang_tree SCRATCH fills SCRATCH/ibev and sets ibev_clang_flags
# to the flags that find them (the tree's own "apps/..." includes too).
ibev_clang_tree() {
  local scratch=$1 root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  mkdir "$scratch/ibev"
  local package
  for package in core formats health dispatch verbs cm; do
    ln -s "$root/$package" "$scratch/ibev/$package"
  done
  ln -s "$root/capi/ibev_c.h" "$scratch/ibev/ibev_c.h"
  ln -s "$root/ibev.h" "$scratch/ibev/ibev.h"
  ln -s "$root/version.h" "$scratch/ibev/version.h"
  # shellcheck disable=SC2034 # for the script that sources this
  ibev_clang_flags=(-std=c++17 -I"$scratch" -iquote "$root")
}
