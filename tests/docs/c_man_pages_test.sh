#!/usr/bin/env bash
# The C API's manual pages (issue #48), written from <ibev/ibev_c.h> by
# tools/c_man_pages.py: every function the header declares is named on a page
# (in its NAME, so mandb indexes it: `man ibev_dispatcher_create` finds
# ibev_c_dispatcher(3)), none is named twice, no page is named after a C++
# page (ibev_dispatcher(3) is the class), and the pages the generator would
# write are the ones docs/BUILD.bazel lists (a part added to the header
# needs its page listed there). man_pages_test checks the pages themselves.
#
#   c_man_pages_test.sh IBEV_C_H GENERATOR VERSION_H DATE_PAGE PAGE...
set -uo pipefail
header=$1 generator=$2 version_h=$3 date_page=$4
shift 4
pages=("$@")
passed=0 failed=0
expect() {  # expect NAME CONDITION...
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; fi
}

# What the header declares: a name followed by its argument list, comments
# stripped by the preprocessor (as tools/check_exports.sh reads it), less the
# function pointers of its structs.
declared=$(gcc -fpreprocessed -dD -E -P "$header" | grep -oE '\bibev_[a-z0-9_]+ *\(' |
  tr -d '( ' | sort -u)
expect "the header declares functions" test -n "$declared"
# Every name in each page's NAME line, the page's own first.
named=$(for page in "${pages[@]}"; do
  sed -n '/^\.SH NAME$/{n;s/ \\- .*//;s/, /\n/g;p}' "$page"
done)
for function in $declared; do
  expect "$function is named on a page" grep -qx "$function" <<<"$named"
done
expect "no name is on two pages" test -z "$(sort <<<"$named" | uniq -d)"
expect "every page name is ibev_c*" test -z "$(for page in "${pages[@]}"; do
  basename "$page"; done | grep -v '^ibev_c\(_[a-z_]*\)\{0,1\}\.3$')"

listed=$(for page in "${pages[@]}"; do basename "$page"; done | sort)
would=$(python3 "$generator" "$header" "$version_h" "$date_page" unused --list | sort)
expect "docs/BUILD.bazel lists the pages the header makes ($(tr '\n' ' ' <<<"$would"))" \
  test "$listed" = "$would"

echo "c_man_pages_test: $passed passed, $failed failed"
((failed == 0))
