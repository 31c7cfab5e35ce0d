#!/usr/bin/env bash
# Makes ibev's API reference (HTML) from the public headers' comments with
# docs/doxygen/Doxyfile, warnings as errors: exits non-zero, after printing
# them, when Doxygen warns. The CMake build runs it for the installed
# reference, //tests/docs:doxygen_test to keep the comments warning-free.
#
#   docs/doxygen/doxygen.sh OUTPUT_DIR       (the HTML goes to OUTPUT_DIR/html)
#
# Doxygen sees the tree as ibev/ (a symbolic link in a scratch directory),
# as a program includes it. Needs doxygen and python3 (tools/setup.sh).
set -euo pipefail

if [[ $# -ne 1 || $1 == -* ]]; then
  echo "usage: docs/doxygen/doxygen.sh OUTPUT_DIR" >&2
  exit 1
fi
# Not resolved through symbolic links: in Bazel's runfiles the tree is a
# forest of links, whose root is where the headers are.
root=$(cd "$(dirname "$0")/../.." && pwd)
for tool in doxygen python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "doxygen.sh: $tool is not installed (apt-get install $tool, or tools/setup.sh)" >&2
    exit 1
  fi
done

mkdir -p "$1"
output=$(cd "$1" && pwd)
view=$(mktemp -d)
trap 'rm -rf "$view"' EXIT
ln -s "$root" "$view/ibev"

version_h=$root/version.h
version=$(sed -n 's/^#define IBEV_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$version_h" |
  paste -sd.)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
  { echo "doxygen.sh: no version in $version_h" >&2; exit 1; }

# Made in the scratch directory, and moved to OUTPUT_DIR/html only when
# Doxygen did not warn: a build never installs a reference that failed.
warnings=$view/warnings
status=0
(cd "$view" && IBEV_VERSION=$version IBEV_DOXYGEN_OUTPUT=$view/out \
  IBEV_DOXYGEN_FILTER=$root/docs/doxygen/comment_filter.py \
  doxygen "$root/docs/doxygen/Doxyfile") 2>"$warnings" || status=$?
# Paths as the tree names them (dispatch/dispatcher.h), not the scratch view.
sed "s|$view/ibev/||g" "$warnings" >&2
if ((status != 0)) || [[ -s $warnings ]]; then
  echo "doxygen.sh: Doxygen warned (exit status $status), so no reference was made; fix the comments named above" >&2
  exit 1
fi
rm -rf "$output/html"
mv "$view/out/html" "$output/html"
