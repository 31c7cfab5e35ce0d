#!/usr/bin/env bash
# Builds ibev with CMake and installs it into PREFIX:
#   PREFIX/lib/libibev.so.0.9.0 (SONAME libibev.so.0.9), libibev.so, libibev.a
#   PREFIX/include/ibev/...          the public headers (<ibev/ibev.h>)
#   PREFIX/lib/pkgconfig/ibev.pc     pkg-config --cflags --libs ibev
#   PREFIX/lib/cmake/ibev/           find_package(ibev 0.9) -> ibev::ibev
#   PREFIX/bin/ibev-watch            and share/man/man1/ibev-watch.1
#   PREFIX/bin/ibev-softroce-run     runs a program against soft-RoCE
#   PREFIX/share/doc/ibev/html/      the API reference (Doxygen; IBEV_DOCS=OFF skips it)
#   PREFIX/share/man/man3, man7      ibev_*(3), one per main type, and ibev(7); the C API's
#                                    ibev_c*(3), written from ibev_c.h (tools/c_man_pages.py)
#   PREFIX/lib/python3/dist-packages/ibev/   the Python module (IBEV_PYTHON=OFF skips it)
#
#   tools/install.sh PREFIX
#
# With PREFIX /usr, lib/ is the multiarch directory (lib/x86_64-linux-gnu),
# as Debian lays libraries out. DESTDIR is honoured (tools/package.sh stages
# with it). The build directory
# is build/cmake in the tree, or IBEV_BUILD_DIR; rebuilding is incremental.
# Needs cmake, g++, libibverbs-dev, librdmacm-dev and libboost-dev, and for the
# Python module python3-dev and pybind11-dev (tools/setup.sh).
set -euo pipefail

if [[ $# -ne 1 || $1 == -* ]]; then
  echo "usage: tools/install.sh PREFIX" >&2
  exit 1
fi
prefix=$1
[[ $prefix == /* ]] || prefix=$(pwd)/$prefix
root=$(cd "$(dirname "$0")/.." && pwd)
build=${IBEV_BUILD_DIR:-$root/build/cmake}

# A new cache: nothing of the last configuration (another prefix, another
# libdir, another unit directory) is kept. GNUInstallDirs picks the multiarch
# libdir for /usr. Only the cache goes, not CMake's --fresh, which deletes
# CMakeFiles/ and with it every object: the compile flags do not depend on
# the prefix, so tools/package.sh's install for /usr after an install into
# a prefix (as the README's test command runs them) only relinks.
libdir=()
[[ $prefix == /usr ]] || libdir=(-DCMAKE_INSTALL_LIBDIR=lib)
rm -f "$build/CMakeCache.txt"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_INSTALL_PREFIX="$prefix" "${libdir[@]}" \
  -DIBEV_WERROR="${IBEV_WERROR:-OFF}" -DIBEV_DOCS="${IBEV_DOCS:-ON}" \
  -DIBEV_PYTHON="${IBEV_PYTHON:-ON}" -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
cmake --install "$build" >/dev/null
echo "install: ibev installed into ${DESTDIR:-}$prefix"
