#!/usr/bin/env bash
# Checks an installed libibev.so: its SONAME is libibev.so.<soversion>
# (tools/version.sh: 0.9 before 1.0, the major after), the
# only symbols it exports are the ibev:: API (members of public classes may
# name detail types in their signatures; nothing of ibev::detail, std:: or
# boost:: is exported on its own) and the C API's functions, and every
# function the installed <ibev/ibev_c.h> declares is exported.
#
#   tools/check_exports.sh LIBDIR/libibev.so [IBEV_C_H]
#
# IBEV_C_H defaults to PREFIX/include/ibev/ibev_c.h for LIBDIR PREFIX/lib.
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
stray=$(grep -vE "^(ibev::|typeinfo (name )?for ibev::|vtable for ibev::|ibev_[a-z0-9_]+@@IBEV_|IBEV_${soversion//./\\.}\$)" <<<"$symbols" || true)
internal=$(grep -E '^((typeinfo (name )?|vtable )for )?ibev::detail::' <<<"$symbols" || true)
if [[ -n $stray || -n $internal ]]; then
  echo "check_exports: $lib exports more than the ibev:: API:" >&2
  printf '%s\n' "$stray" "$internal" | sed '/^$/d' | head -20 >&2
  exit 1
fi
# The C API: what the header declares (a name followed by its argument
# list, comments stripped by the preprocessor) is what the library defines,
# neither more nor less.
header=${2:-$(dirname "$(dirname "$lib")")/include/ibev/ibev_c.h}
declared=$(gcc -fpreprocessed -dD -E -P "$header" | grep -oE '\bibev_[a-z0-9_]+ *\(' |
  tr -d '( ' | sort -u)
exported=$(sed -n 's/^\(ibev_[a-z0-9_]*\)@@IBEV_.*/\1/p' <<<"$symbols" | sort -u)
if [[ -z $declared || $declared != "$exported" ]]; then
  echo "check_exports: the C API in $header and $lib differ:" >&2
  diff <(echo "$declared") <(echo "$exported") | sed -n 's/^</  declared, not exported:/p; s/^>/  exported, not declared:/p' >&2
  exit 1
fi
echo "check_exports: $soname exports $(wc -l <<<"$symbols") symbols: the ibev:: API and $(wc -l <<<"$declared") C functions"

