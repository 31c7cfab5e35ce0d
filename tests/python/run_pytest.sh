#!/usr/bin/env bash
# Runs pytest on ibev's Python tests with the module Bazel built first on the
# path: Debian's python3 (the headers the module is built against) and
# python3-pytest. Under ASan or TSan the module is instrumented and python3
# is not: the sanitizer's runtime is preloaded, as it must come first, and
# libstdc++ with it (python3 does not load it, and the sanitizer's
# interception of __cxa_throw needs it there from the start).
#   run_pytest.sh PATH/TO/ibev/__init__.py TEST_FILE...
set -euo pipefail
package=$(dirname "$1")
shift
export PYTHONPATH=$(cd "$package/.." && pwd)
export PYTHONDONTWRITEBYTECODE=1  # nothing written into the tree or runfiles
runtime=$(ldd "$package/_ibev.so" | awk '/lib(asan|tsan)\.so/ {print $3; exit}')
if [[ -n $runtime ]]; then
  export LD_PRELOAD="$runtime $(ldd "$package/_ibev.so" | awk '/libstdc\+\+\.so/ {print $3; exit}')"
  # CPython keeps its own allocations to the end: not ibev's leaks.
  export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
fi
junit=()
[[ -n ${XML_OUTPUT_FILE:-} ]] && junit=(--junitxml="$XML_OUTPUT_FILE")
exec /usr/bin/python3 -m pytest -v -p no:cacheprovider "${junit[@]}" "$@"
