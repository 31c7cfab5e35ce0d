#!/usr/bin/env bash
# Checks an installed libibev.so: its SONAME is libibev.so.<soversion>
# (tools/version.sh: 0.8 before 1.0, the major after), and the
# only symbols it exports are the ibev:: API (members of public classes may
# name detail types in their signatures; nothing of ibev::detail, std:: or
# boost:: is exported on its own).
#
#   tools/check_exports.sh PREFIX/lib/libibev.so
set -euo pipefail
lib=$1
root=$(cd "$(dirname "$0")/.." && pwd)
soversion=$("$root/tools/version.sh" --soversion)

soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [[ $soname != "libibev.so.$soversion" ]]; then
  echo "check_exports: SONAME is '$soname', not libibev.so.$soversion" >&2
  exit 1
fi
symbols=$(nm -D --defined-only "$lib" | c++filt | cut -d' ' -f3-)
# The version node, named after the SONAME's version (cmake/libibev.map.in).
if ! grep -qx "IBEV_$soversion" <<<"$symbols"; then
  echo "check_exports: no version node IBEV_$soversion in $lib" >&2
  exit 1
fi
unversioned=$(grep -v "@@IBEV_$soversion\$" <<<"$symbols" | grep -vx "IBEV_$soversion" || true)
if [[ -n $unversioned ]]; then
  echo "check_exports: symbols outside the node IBEV_$soversion:" >&2
  head -5 <<<"$unversioned" >&2
  exit 1
fi
stray=$(grep -vE "^(ibev::|typeinfo (name )?for ibev::|vtable for ibev::|IBEV_${soversion//./\\.}\$)" <<<"$symbols" || true)
internal=$(grep -E '^((typeinfo (name )?|vtable )for )?ibev::detail::' <<<"$symbols" || true)
if [[ -n $stray || -n $internal ]]; then
  echo "check_exports: $lib exports more than the ibev:: API:" >&2
  printf '%s\n' "$stray" "$internal" | sed '/^$/d' | head -20 >&2
  exit 1
fi
echo "check_exports: $soname exports $(wc -l <<<"$symbols") symbols, all ibev:: API"
