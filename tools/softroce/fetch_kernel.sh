#!/usr/bin/env bash
# Fetches a Debian kernel for the soft-RoCE test VM and keeps the kernel image
# and the modules the guest loads, outside the source tree. Idempotent and
# silent when the cache is ready.
#
#   fetch_kernel.sh [6.1|6.12]     (default: $IBEV_KERNEL, else 6.1)
#
# 6.1:  Debian 12's own kernel (linux-image-amd64), in
#       ${IBEV_CACHE:-/var/cache/ibev}/kernel
# 6.12: the bookworm-backports kernel, in .../kernel-6.12, fetched through a
#       private sources list naming the suite on the mirror this machine's
#       apt already uses: the system's sources stay untouched.
set -euo pipefail

kernel=${1:-${IBEV_KERNEL:-6.1}}
here=$(cd "$(dirname "$0")" && pwd)
root=${IBEV_CACHE:-/var/cache/ibev}
case $kernel in
  6.1) cache=$root/kernel modules_list=$here/modules.txt suite= ;;
  6.12) cache=$root/kernel-6.12 modules_list=$here/modules-6.12.txt suite=bookworm-backports ;;
  *) echo "fetch_kernel: no kernel '$kernel' (6.1 or 6.12)" >&2; exit 2 ;;
esac
# Ready, and made from the module list as it is now.
[[ -f $cache/ready ]] && cmp -s <(grep -v '^#' "$modules_list") "$cache/modules/list" && exit 0

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
"${sudo[@]}" mkdir -p "$cache"
"${sudo[@]}" chown "$(id -u):$(id -g)" "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

apt_options=()
if [[ -n $suite ]]; then
  # The mirror of this machine's bookworm/main, from apt's own view of it.
  bookworm_mirror() { apt-cache policy 2>/dev/null | awk '/ bookworm\/main amd64 Packages/ {print $2; exit}'; }
  mirror=$(bookworm_mirror)
  if [[ -z $mirror ]]; then  # no package lists yet on a fresh machine
    "${sudo[@]}" apt-get update -q >/dev/null 2>&1 || true
    mirror=$(bookworm_mirror)
  fi
  [[ -n $mirror ]] ||
    { echo "fetch_kernel: apt knows no bookworm/main mirror (run apt-get update)" >&2; exit 1; }
  mkdir -p "$work/lists/partial" "$work/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" \
    >"$work/sources.list"
  apt_options=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives"
    -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
  apt-get "${apt_options[@]}" update -q >"$work/update.log" 2>&1 ||
    { cat "$work/update.log" >&2; echo "fetch_kernel: apt-get update of $suite failed" >&2; exit 1; }
fi

# linux-image-amd64 is a metapackage; the kernel is its versioned dependency.
package=$(apt-cache "${apt_options[@]}" depends linux-image-amd64 2>/dev/null |
  awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [[ -z $package ]]; then
  echo "fetch_kernel: apt-cache knows no linux-image-amd64${suite:+ in $suite} (run apt-get update)" >&2
  exit 1
fi
echo "fetch_kernel: downloading $package for the soft-RoCE VM"
(cd "$work" && apt-get "${apt_options[@]}" download -q "$package" 2>&1 |
  grep -v "^W: Download is performed unsandboxed" || true)
deb=$(ls "$work"/linux-image-*.deb 2>/dev/null | head -n 1)
[[ -n $deb ]] || { echo "fetch_kernel: apt-get download $package failed" >&2; exit 1; }
dpkg-deb -x "$deb" "$work/x"

version=$(ls "$work/x/lib/modules")
cp "$work/x/boot/vmlinuz-$version" "$cache/vmlinuz"
rm -rf "$cache/modules" "$cache/ready" && mkdir -p "$cache/modules"
: >"$cache/modules/order"
while read -r module; do
  [[ -z $module || $module == \#* ]] && continue
  found=$(find "$work/x/lib/modules/$version" \( -name "$module.ko" -o -name "$module.ko.xz" \) |
    head -n 1)
  if [[ -z $found ]]; then
    # Built into this kernel: nothing to load.
    grep -q "/$module\.ko\$" "$work/x/lib/modules/$version/modules.builtin" 2>/dev/null && continue
    echo "fetch_kernel: $module.ko not in $package" >&2
    exit 1
  fi
  echo "$module" >>"$cache/modules/order"
  # busybox's insmod takes plain .ko files.
  case $found in
    *.xz) xz -dc "$found" >"$cache/modules/$module.ko" ;;
    *) cp "$found" "$cache/modules/" ;;
  esac
done <"$modules_list"
grep -v '^#' "$modules_list" >"$cache/modules/list"
echo "$version" >"$cache/ready"
