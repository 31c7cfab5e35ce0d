#!/usr/bin/env bash
# Builds and runs the CMake, make and C consumers (examples/consumer-cmake,
# examples/consumer-make, examples/consumer-c) and the Python module's tests
# (tests/python) against an installed ibev, out of the tree:
#
#   tools/consumers.sh PREFIX    ibev installed by tools/install.sh PREFIX
#   tools/consumers.sh           ibev installed in the system (the .debs)
#
# The CMake consumer's ctest runs the program and, through the installed
# ibev-softroce-run, runs it again against soft-RoCE; so do the C consumer,
# built by gcc as C11 with no C++ in its build, and the pytest suite.
# Prints one line per consumer, "consumer-X: passed" or "consumer-X: failed",
# with the log of a failure; exits 1 when any failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-}
where=${prefix:-the system}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0

report() {
  local name=$1 rc=$2 log=$3
  if ((rc == 0)); then
    echo "consumer-$name ($where): passed"
  else
    echo "consumer-$name ($where): failed"
    tail -n 40 "$log" | sed 's/^/  | /'
    status=1
  fi
}

cmake_args=()
[[ -n $prefix ]] && cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix")
(
  set -e
  cmake -S "$root/examples/consumer-cmake" -B "$work/cmake" "${cmake_args[@]}"
  cmake --build "$work/cmake"
  cd "$work/cmake" && ctest --output-on-failure
) >"$work/cmake.log" 2>&1
report cmake $? "$work/cmake.log"

# Before 1.0 every minor release may break the API: a project asking for the
# previous minor (0.6 when ibev is 0.7) must be refused at configure time,
# not build against an API it was not written for.
version=$("$root/tools/version.sh")
IFS=. read -r major minor _ <<<"$version"
if ((major == 0 && minor > 0)); then
  older=0.$((minor - 1))
  mkdir -p "$work/older"
  cat >"$work/older/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(older LANGUAGES CXX)
find_package(ibev $older REQUIRED)
CMAKE
  if cmake -S "$work/older" -B "$work/older/build" "${cmake_args[@]}" >"$work/older.log" 2>&1; then
    echo "find_package(ibev $older) accepted ibev $version" >>"$work/older.log"
    report "cmake-asks-$older" 1 "$work/older.log"
  elif grep -q "requested version \"$older\"" "$work/older.log" &&
       grep -q "version: $version" "$work/older.log"; then
    # Refused for its version, the installed one named: what a user should see.
    report "cmake-asks-$older" 0 "$work/older.log"
  else
    report "cmake-asks-$older" 1 "$work/older.log"
  fi
fi

pkg_config_path=${PKG_CONFIG_PATH:-}
[[ -n $prefix ]] && pkg_config_path=$prefix/lib/pkgconfig${pkg_config_path:+:$pkg_config_path}
(
  set -e
  mkdir -p "$work/make" && cd "$work/make"
  PKG_CONFIG_PATH=$pkg_config_path make -f "$root/examples/consumer-make/Makefile" check
) >"$work/make.log" 2>&1
report make $? "$work/make.log"

# The C consumer: pkg-config and gcc -std=c11 -Werror, then on soft-RoCE
# through the installed runner (in a VM when this kernel has no rdma_rxe).
runner=ibev-softroce-run
[[ -n $prefix ]] && runner=$prefix/bin/ibev-softroce-run
(
  set -e
  mkdir -p "$work/c" && cd "$work/c"
  PKG_CONFIG_PATH=$pkg_config_path make -f "$root/examples/consumer-c/Makefile" check
  "$runner" -- "$work/c/consumer-c" --rdma
) >"$work/c.log" 2>&1
report c $? "$work/c.log"

# The Python module as installed (Debian's python3 finds the .deb's in
# /usr/lib/python3/dist-packages; a prefix's through PYTHONPATH): ibev's own
# pytest suite, without a device and then on soft-RoCE.
python_path=${PYTHONPATH:-}
[[ -n $prefix ]] && python_path=$prefix/lib/python3/dist-packages${python_path:+:$python_path}
(
  set -e
  cd "$work"
  export PYTHONPATH=$python_path PYTHONDONTWRITEBYTECODE=1
  /usr/bin/python3 -c 'import ibev, sys; print("ibev", ibev.__version__, "from", ibev.__file__)'
  /usr/bin/python3 -m pytest -q -p no:cacheprovider "$root/tests/python/test_host.py"
  "$runner" -- /usr/bin/python3 -m pytest -q -p no:cacheprovider "$root/tests/python/test_softroce.py"
) >"$work/python.log" 2>&1
report python $? "$work/python.log"

exit "$status"
