#!/usr/bin/env bash
# Builds the Debian packages of ibev from the tree tools/install.sh makes:
#   libibev0      libibev.so.0 (the runtime library)
#   libibev-dev   headers, libibev.so, libibev.a, ibev.pc, the CMake package
#   ibev-tools    ibev-watch (and its man page), ibev-softroce-run
#
#   tools/package.sh [OUTDIR]       (default build/deb)
#
# Versions come from version.h; library dependencies from dpkg-shlibdeps.
# Install with: apt-get install ./OUTDIR/*.deb
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/deb}
[[ $out == /* ]] || out=$(pwd)/$out
version=$("$root/tools/version.sh")
major=${version%%.*}
arch=$(dpkg --print-architecture)
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
take libibev0 "lib/libibev.so.$major" "lib/libibev.so.$version"
take libibev-dev include/ibev lib/libibev.so lib/libibev.a lib/pkgconfig lib/cmake
take ibev-tools bin share/man share/ibev
leftover=$(cd "$tree" && find . -type f -o -type l)
[[ -z $leftover ]] || { echo "package: files in no package: $leftover" >&2; exit 1; }

# dpkg-shlibdeps wants a debian/control beside it; libibev's own dependency
# information comes from the shlibs file written below.
mkdir -p "$work/src/debian"
printf 'Source: ibev\n\nPackage: ibev\nArchitecture: any\n' >"$work/src/debian/control"
shlibs() {
  (cd "$work/src" && dpkg-shlibdeps -O -l"$work/libibev0/usr/lib" \
    --ignore-missing-info "$@" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}
lib_depends=$(shlibs "$work/libibev0/usr/lib/libibev.so.$version")
tools_depends=$(shlibs "$work/ibev-tools/usr/bin/ibev-watch")
tools_depends=$(tr ',' '\n' <<<"$tools_depends" | sed 's/^ *//' | grep -v '^libibev0' | paste -sd, | sed 's/,/, /g')

# Writes DEBIAN/control (and extra fields from stdin) for package NAME.
control() {
  local name=$1 section=$2 depends=$3 summary=$4
  mkdir -p "$work/$name/DEBIAN" "$work/$name/usr/share/doc/$name"
  cat >"$work/$name/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: $arch
Maintainer: ibev developers <ibev@localhost>
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
  printf 'ibev %s, packaged by tools/package.sh.\n' "$version" \
    >"$work/$name/usr/share/doc/$name/copyright"
}

control libibev0 libs "$lib_depends" "RDMA event layer (runtime library)" </dev/null
echo "libibev $major libibev0 (>= $version)" >"$work/libibev0/DEBIAN/shlibs"
echo "activate-noawait ldconfig" >"$work/libibev0/DEBIAN/triggers"
control libibev-dev libdevel \
  "libibev0 (= $version), libibverbs-dev, librdmacm-dev, libboost-dev" \
  "RDMA event layer (development files)" </dev/null
control ibev-tools net "libibev0 (= $version), $tools_depends" \
  "RDMA event layer (ibev-watch, ibev-softroce-run)" <<'EXTRA'
Recommends: qemu-system-x86, busybox-static, kmod, cpio, iproute2, rdma-core
EXTRA

mkdir -p "$out"
for name in libibev0 libibev-dev ibev-tools; do
  dpkg-deb --root-owner-group -Zxz --build "$work/$name" \
    "$out/${name}_${version}_${arch}.deb" >/dev/null
  echo "package: $out/${name}_${version}_${arch}.deb"
done
