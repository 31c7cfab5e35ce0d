#!/usr/bin/env bash
# Fetches Debian's stock kernel (linux-image-amd64) for the soft-RoCE test VM
# and keeps the kernel image and the modules the guest loads, outside the
# source tree: ${IBEV_CACHE:-/var/cache/ibev}/kernel. Idempotent and silent
# when the cache is ready.
set -euo pipefail

cache=${IBEV_CACHE:-/var/cache/ibev}/kernel
[[ -f $cache/ready ]] && exit 0

here=$(cd "$(dirname "$0")" && pwd)
sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi

"${sudo[@]}" mkdir -p "$cache"
"${sudo[@]}" chown "$(id -u):$(id -g)" "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# linux-image-amd64 is a metapackage; the kernel is its versioned dependency.
package=$(apt-cache depends linux-image-amd64 2>/dev/null |
  awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [[ -z $package ]]; then
  echo "fetch_kernel: apt-cache knows no linux-image-amd64 (run apt-get update)" >&2
  exit 1
fi
echo "fetch_kernel: downloading $package for the soft-RoCE VM"
(cd "$work" && apt-get download -q "$package" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
deb=$(ls "$work"/linux-image-*.deb 2>/dev/null | head -n 1)
[[ -n $deb ]] || { echo "fetch_kernel: apt-get download $package failed" >&2; exit 1; }
dpkg-deb -x "$deb" "$work/x"

version=$(ls "$work/x/lib/modules")
cp "$work/x/boot/vmlinuz-$version" "$cache/vmlinuz"
rm -rf "$cache/modules" && mkdir -p "$cache/modules"
while read -r module; do
  [[ -z $module || $module == \#* ]] && continue
  found=$(find "$work/x/lib/modules/$version" -name "$module.ko" | head -n 1)
  [[ -n $found ]] || { echo "fetch_kernel: $module.ko not in $package" >&2; exit 1; }
  cp "$found" "$cache/modules/"
done <"$here/modules.txt"
cp "$here/modules.txt" "$cache/modules/order"
echo "$version" >"$cache/ready"
