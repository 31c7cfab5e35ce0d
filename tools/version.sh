#!/usr/bin/env bash
# Prints ibev's version ("0.6.0"), or one part of it (--major), as version.h
# writes it: the one place the version lives. CMakeLists.txt reads the same
# three defines.
#   tools/version.sh [--major] [VERSION_H]
set -euo pipefail
part=all
if [[ ${1:-} == --major ]]; then part=major; shift; fi
header=${1:-$(dirname "$0")/../version.h}
read_define() { sed -n "s/^#define IBEV_VERSION_$1 \([0-9]*\)$/\1/p" "$header"; }
major=$(read_define MAJOR)
[[ -n $major ]] || { echo "version.sh: no IBEV_VERSION_MAJOR in $header" >&2; exit 1; }
if [[ $part == major ]]; then echo "$major"; exit 0; fi
echo "$major.$(read_define MINOR).$(read_define PATCH)"
