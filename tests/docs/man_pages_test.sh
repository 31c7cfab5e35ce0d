#!/usr/bin/env bash
# The section 3 and 7 manual pages of docs/man (issue #27): each renders
# without a single man(1)/groff warning, is indexed by mandb under its own
# name, is of the version in version.h, and its SYNOPSIS is true to the
# headers: every <ibev/...> it includes is a public header, and every class,
# struct, enum, alias and function it declares is declared in those headers
# (a renamed or removed call fails here). Every ibev page another page refers
# to exists, and ibev(7) lists every section 3 page.
#
#   man_pages_test.sh VERSION_H PAGE... -- PUBLIC_HEADER...
set -uo pipefail
version_h=$1
shift
pages=() headers=()
while (($# > 0)) && [[ $1 != -- ]]; do pages+=("$1"); shift; done
shift
headers=("$@")
((${#pages[@]} > 0 && ${#headers[@]} > 0)) || {
  echo "usage: man_pages_test.sh VERSION_H PAGE... -- PUBLIC_HEADER..." >&2
  exit 2
}
for tool in man groff lexgrog; do
  command -v "$tool" >/dev/null || {
    echo "FAILED: $tool is not installed (apt-get install man-db groff-base, or tools/setup.sh)"
    exit 1
  }
done

passed=0 failed=0
expect() {  # expect NAME CONDITION...
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; fi
}

version=$(sed -n 's/^#define IBEV_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$version_h" |
  paste -sd.)
# The public headers by the name a program includes: dispatch/dispatcher.h.
declare -A public=()
for header in "${headers[@]}"; do public[${header#./}]=$header; done
# The C API's header is <ibev/ibev_c.h> (capi/'s include_prefix, no folder).
for header in "${headers[@]}"; do
  [[ $header == *capi/ibev_c.h ]] && public[ibev_c.h]=$header
done
declare -A page_names=()
for page in "${pages[@]}"; do page_names[$(basename "$page")]=1; done

# The lines of section SECTION of PAGE (its .SH line excluded).
section() { sed -n "/^\.SH \"\{0,1\}$2\"\{0,1\}\$/,/^\.SH /{/^\.SH /!p}" "$1"; }

for page in "${pages[@]}"; do
  file=$(basename "$page")
  name=${file%.*} number=${file##*.}
  upper=${name^^}

  expect "$file: no warnings from man --warnings" \
    test -z "$(man --warnings -E UTF-8 -l -Tutf8 -Z "$page" 2>&1 >/dev/null)"
  expect "$file: .TH names it, section $number, ibev $version" \
    grep -qx "\.TH $upper $number \"[0-9]\{4\}-[0-9][0-9]-[0-9][0-9]\" \"ibev $version\" \"ibev Programmer's Manual\"" "$page"
  expect "$file: mandb indexes it as $name" \
    grep -q "^$page: \"$name - " <(lexgrog "$page" 2>&1)
  for heading in NAME SYNOPSIS DESCRIPTION "SEE ALSO"; do
    expect "$file: has $heading" grep -Eq "^\.SH \"?$heading\"?$" "$page"
  done

  # The SYNOPSIS against the headers it names.
  synopsis=$(section "$page" SYNOPSIS | sed 's/\\-/-/g')
  included=()
  while read -r include; do
    [[ -n $include ]] || continue
    expect "$file: <ibev/$include> is a public header" test -n "${public[$include]:-}"
    [[ -n ${public[$include]:-} ]] && included+=("${public[$include]}")
  done < <(grep -o '#include <ibev/[^>]*>' <<<"$synopsis" | sed 's|#include <ibev/||; s|>$||')
  expect "$file: SYNOPSIS includes a public header" test "${#included[@]}" -gt 0
  if [[ $number == 3 && ${#included[@]} -gt 0 ]]; then
    code=$(grep -v '^\.' <<<"$synopsis" | sed 's|//.*||')
    while read -r function; do
      [[ -n $function ]] || continue
      expect "$file: $function() is declared in ${included[*]}" \
        grep -Eq "(^|[^A-Za-z0-9_])$function *\(" "${included[@]}"
    done < <(grep -oE '[A-Za-z_][A-Za-z0-9_]* *\(' <<<"$code" | sed 's/ *($//' |
      grep -vxE 'void|noexcept|decltype|sizeof|operator' | sort -u)
    while read -r type; do
      [[ -n $type ]] || continue
      expect "$file: '$type' is declared in ${included[*]}" \
        grep -Eq "(^|[^A-Za-z0-9_])$type([^A-Za-z0-9_]|$)" "${included[@]}"
    done < <(grep -oE '(enum class|class|struct|using) [A-Za-z_][A-Za-z0-9_]*' <<<"$code" | sort -u)
  fi

  # References to ibev's own pages lead somewhere.
  while read -r ref; do
    [[ -n $ref ]] || continue
    expect "$file: refers to $ref, which exists" test -n "${page_names[$ref]:-}"
  done < <(grep -oE '^\.BR ibev(_[a-z_]+)? \([37]\)' "$page" | sed -E 's/^\.BR ([a-z_]+) \(([37])\)/\1.\2/' | sort -u)
done

# The overview lists every section 3 page.
overview=
for page in "${pages[@]}"; do [[ $(basename "$page") == ibev.7 ]] && overview=$page; done
expect "there is an overview, ibev.7" test -n "$overview"
if [[ -n $overview ]]; then
  for page in "${pages[@]}"; do
    file=$(basename "$page")
    [[ $file == *.3 ]] || continue
    expect "ibev.7 lists ${file%.3}(3)" grep -qx "\.BR ${file%.3} (3)" "$overview"
  done
fi

echo "man_pages_test: $passed passed, $failed failed"
((failed == 0))
