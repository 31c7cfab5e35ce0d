#!/usr/bin/env bash
# Prints ibev's version ("0.9.0"), its major (--major), or the SONAME's
# version (--soversion: the major, and before 1.0 the minor too, "0.9", since
# every 0.x release may break the ABI), as version.h writes it: the one place
# the version lives. CMakeLists.txt reads the same three defines and makes the
# same SONAME.
#   tools/version.sh [--major|--soversion] [VERSION_H]
set -euo pipefail
part=all
if [[ ${1:-} == --major || ${1:-} == --soversion ]]; then part=${1#--}; shift; fi
header=${1:-$(dirname "$0")/../version.h}
read_define() { sed -n "s/^#define IBEV_VERSION_$1 \([0-9]*\)$/\1/p" "$header"; }
major=$(read_define MAJOR)
[[ -n $major ]] || { echo "version.sh: no IBEV_VERSION_MAJOR in $header" >&2; exit 1; }
if [[ $part == major ]]; then echo "$major"; exit 0; fi
if [[ $part == soversion ]]; then
  if ((major == 0)); then echo "0.$(read_define MINOR)"; else echo "$major"; fi
  exit 0
fi
echo "$major.$(read_define MINOR).$(read_define PATCH)"
