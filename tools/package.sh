#!/usr/bin/env bash
# Builds the Debian packages of ibev from the tree tools/install.sh makes for
# /usr, laid out as Debian's policy asks (lintian checks them in the README's
# test command):
#   libibev0.9    libibev.so.0.9 (the runtime library; the package is named
#                 after the SONAME, which carries the minor before 1.0)
#   libibev-dev   headers, libibev.so, libibev.a, ibev.pc, the CMake package,
#                 the API reference (share/doc/libibev-dev/html, registered
#                 with doc-base), ibev_*(3) and ibev(7), the docs and examples
#   ibev-tools    ibev-watch (and its unit ibev-watch.service), ibev-replay,
#                 ibev-softroce-run, their man pages
#   python3-ibev  the Python module ibev (/usr/lib/python3/dist-packages)
#
#   tools/package.sh [OUTDIR]       (default build/deb)
#
# Libraries go to the multiarch directory, stripped (no -dbgsym package: the
# Bazel build is the one to debug with). Versions come from version.h;
# library dependencies from dpkg-shlibdeps. Install with:
# apt-get install ./OUTDIR/*.deb
set -euo pipefail
umask 022  # what dh_fixperms would make of the tree: 0755 folders, 0644 files
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/deb}
[[ $out == /* ]] || out=$(pwd)/$out
version=$("$root/tools/version.sh")
soversion=$("$root/tools/version.sh" --soversion)
runtime=libibev$soversion
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
lib=lib/$multiarch
# The identity this project's commits carry: where bug reports go.
maintainer="ibev maintainers <maintainers@users.noreply.a-seed-506b121e.example>"
# The last commit's date, so that two builds of one commit are identical.
date=$(git -C "$root" log -1 --format=%cD 2>/dev/null || date -R)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

DESTDIR=$work/root "$root/tools/install.sh" /usr >/dev/null
tree=$work/root/usr

# Moves PATHS (relative to /usr) of the install tree into package NAME.
take() {
  local name=$1 path
  shift
  for path in "$@"; do
    mkdir -p "$work/$name/usr/$(dirname "$path")"
    mv "$tree/$path" "$work/$name/usr/$path"
  done
}
take "$runtime" "$lib/libibev.so.$soversion" "$lib/libibev.so.$version"
take libibev-dev include/ibev "$lib/libibev.so" "$lib/libibev.a" "$lib/pkgconfig" "$lib/cmake"
take libibev-dev share/man/man3 share/man/man7 share/doc/ibev/html
take ibev-tools bin share/man share/ibev
take python3-ibev lib/python3
# The service's unit is the one file outside /usr (CMake puts it where
# Debian 12's systemd looks, /lib/systemd/system).
mkdir -p "$work/ibev-tools/lib/systemd"
mv "$work/root/lib/systemd/system" "$work/ibev-tools/lib/systemd/system"
rmdir "$work/root/lib/systemd" "$work/root/lib"
leftover=$(cd "$work/root" && find . -type f -o -type l)
[[ -z $leftover ]] || { echo "package: files in no package: $leftover" >&2; exit 1; }

# What dh_strip does: no debug information, no .comment/.note sections; a
# shared library is not executable (dh_fixperms).
strip_elf() {
  strip --remove-section=.comment --remove-section=.note "$@"
}
strip_elf --strip-unneeded "$work/$runtime/usr/$lib/libibev.so.$version"
chmod 0644 "$work/$runtime/usr/$lib/libibev.so.$version"
strip_elf --strip-debug --enable-deterministic-archives "$work/libibev-dev/usr/$lib/libibev.a"
strip_elf --strip-unneeded "$work/ibev-tools/usr/bin/ibev-watch" "$work/ibev-tools/usr/bin/ibev-replay"
python_module=$(echo "$work"/python3-ibev/usr/lib/python3/dist-packages/ibev/_ibev.*.so)
strip_elf --strip-unneeded "$python_module"
chmod 0644 "$python_module"
gzip -9n "$work"/*/usr/share/man/man*/*.[0-9]

# The -dev package's documentation, as Debian's -dev packages carry it.
dev_doc=$work/libibev-dev/usr/share/doc/libibev-dev
mkdir -p "$dev_doc/examples"
mv "$work/libibev-dev/usr/share/doc/ibev/html" "$dev_doc/html"
rmdir "$work/libibev-dev/usr/share/doc/ibev"
# Registered with doc-base, as Debian's policy (9.10) asks of HTML docs.
mkdir -p "$work/libibev-dev/usr/share/doc-base"
cat >"$work/libibev-dev/usr/share/doc-base/libibev-dev.ibev-reference" <<'DOCBASE'
Document: ibev-reference
Title: ibev API reference
Author: The ibev developers
Abstract: The C++ and C APIs of ibev, RDMA events with the kernel's event model,
 made by Doxygen from the comments of its public headers.
Section: Programming/C++

Format: HTML
Index: /usr/share/doc/libibev-dev/html/index.html
Files: /usr/share/doc/libibev-dev/html/*.html
DOCBASE
cp "$root/README.md" "$root/CHANGELOG.md" "$root"/docs/{api,consuming,design,events}.md "$dev_doc/"
cp -r "$root/examples/consumer.cc" "$root/examples/consumer-cmake" "$root/examples/consumer-make" \
  "$root/examples/consumer-c" "$root/examples/pingpong" "$dev_doc/examples/"
rm -f "$dev_doc/examples/pingpong/BUILD.bazel" "$dev_doc/examples/consumer-c/BUILD.bazel" \
  "$dev_doc/examples/consumer-c/run_softroce.sh"

# dpkg-shlibdeps wants a debian/control beside it; libibev's own dependency
# information comes from the shlibs file written below.
mkdir -p "$work/src/debian"
printf 'Source: ibev\n\nPackage: ibev\nArchitecture: any\n' >"$work/src/debian/control"
shlibs() {
  (cd "$work/src" && dpkg-shlibdeps -O -l"$work/$runtime/usr/$lib" \
    --ignore-missing-info "$@" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}
lib_depends=$(shlibs "$work/$runtime/usr/$lib/libibev.so.$version")
# What a program linked against libibev needs besides it: its own package
# names the runtime with the exact version instead.
shlibs_beside_runtime() {
  shlibs "$@" | tr ',' '\n' | sed 's/^ *//' | grep -v "^$runtime" | paste -sd, | sed 's/,/, /g'
}
tools_depends=$(shlibs_beside_runtime "$work/ibev-tools/usr/bin/ibev-watch" \
  "$work/ibev-tools/usr/bin/ibev-replay")
python_depends=$(shlibs_beside_runtime "$python_module")
# The CPython the module is built for: its ABI is in the module's name.
python_version=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
python_next=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % (sys.version_info[0], sys.version_info[1] + 1))')

# /usr/share/doc/NAME: the machine-readable copyright (DEP-5) and the
# changelog of a native package.
docs() {
  local name=$1 doc=$work/$1/usr/share/doc/$1
  mkdir -p "$doc"
  cat >"$doc/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: ibev
Upstream-Contact: $maintainer
Comment: ibev is offered under rdma-core's terms, so that code can move
 between ibev, rdma-core and the kernel's RDMA stack; its README says why.

Files: *
Copyright: 2026 The ibev developers
License: BSD-2-clause or GPL-2

License: BSD-2-clause
$(sed -n '/^Redistribution and use/,/SUCH DAMAGE\.$/p' "$root/LICENSE" | sed 's/^$/./; s/^/ /')

License: GPL-2
 This program is free software; you can redistribute it and/or modify it
 under the terms of the GNU General Public License version 2 as published by
 the Free Software Foundation.
 .
 On Debian systems, the full text of the GNU General Public License version 2
 can be found in the file '/usr/share/common-licenses/GPL-2'.
COPYRIGHT
  printf 'ibev (%s) unstable; urgency=medium\n\n  * Release %s; CHANGELOG.md in libibev-dev says what changed.\n\n -- %s  %s\n' \
    "$version" "$version" "$maintainer" "$date" | gzip -9n >"$doc/changelog.gz"
}

# Writes DEBIAN/control (and extra fields from stdin), the md5sums and the
# lintian overrides (each with its reason) for package NAME.
control() {
  local name=$1 section=$2 depends=$3 summary=$4
  docs "$name"
  mkdir -p "$work/$name/DEBIAN"
  if [[ -s $root/tools/lintian/$name ]]; then
    mkdir -p "$work/$name/usr/share/lintian/overrides"
    cp "$root/tools/lintian/$name" "$work/$name/usr/share/lintian/overrides/$name"
  fi
  cat >"$work/$name/DEBIAN/control" <<CONTROL
Package: $name
Source: ibev
Version: $version
Architecture: $arch
Maintainer: $maintainer
Section: $section
Priority: optional
Depends: $depends
Installed-Size: $(du -sk "$work/$name/usr" | cut -f1)
Description: $summary
 ibev gives userspace RDMA code the kernel's event model: objects take their
 event handlers at creation, devices keep a list of listeners, and one
 dispatcher reads every async fd and completion channel, resolving who hears
 an event before acking it to rdma-core.
CONTROL
  cat >>"$work/$name/DEBIAN/control"
  # Every file but DEBIAN's: usr/, and lib/ for the unit.
  (cd "$work/$name" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' |
    sort -z | xargs -0 md5sum >DEBIAN/md5sums)
}

control "$runtime" libs "$lib_depends" "RDMA event layer (runtime library)" <<'EXTRA'
Multi-Arch: same
EXTRA
echo "libibev $soversion $runtime (>= $version)" >"$work/$runtime/DEBIAN/shlibs"
echo "activate-noawait ldconfig" >"$work/$runtime/DEBIAN/triggers"
control libibev-dev libdevel \
  "$runtime (= $version), libibverbs-dev, librdmacm-dev, libboost-dev" \
  "RDMA event layer (development files)" </dev/null
# Byte-compiled at install and cleaned at removal, as dh_python3 arranges:
# otherwise an import as root leaves __pycache__ behind a purge.
mkdir -p "$work/python3-ibev/DEBIAN"
printf '#!/bin/sh\nset -e\nif command -v py3compile >/dev/null 2>&1; then\n\tpy3compile -p python3-ibev\nfi\n' \
  >"$work/python3-ibev/DEBIAN/postinst"
printf '#!/bin/sh\nset -e\nif command -v py3clean >/dev/null 2>&1; then\n\tpy3clean -p python3-ibev\nfi\n' \
  >"$work/python3-ibev/DEBIAN/prerm"
chmod 0755 "$work/python3-ibev/DEBIAN/postinst" "$work/python3-ibev/DEBIAN/prerm"
control python3-ibev python \
  "$runtime (= $version), python3 (>= $python_version~), python3 (<< $python_next), $python_depends" \
  "RDMA event layer (Python 3 module)" </dev/null
control ibev-tools net "$runtime (= $version), $tools_depends" \
  "RDMA event layer (ibev-watch, ibev-replay, ibev-softroce-run)" <<'EXTRA'
Recommends: qemu-system-x86, busybox-static, kmod, cpio, iproute2, rdma-core
EXTRA

mkdir -p "$out"
for name in "$runtime" libibev-dev ibev-tools python3-ibev; do
  dpkg-deb --root-owner-group -Zxz --build "$work/$name" \
    "$out/${name}_${version}_${arch}.deb" >/dev/null
  echo "package: $out/${name}_${version}_${arch}.deb"
done
