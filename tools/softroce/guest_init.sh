#!/bin/busybox sh
# PID 1 of the soft-RoCE test VM. Loads the modules, mounts the host's root
# read-only (over 9p) under a tmpfs overlay, mounts the results share at the
# host path it has there, and runs the job the host wrote into it, chrooted,
# so that the host's binaries and libraries run unchanged. Always powers off.
/bin/busybox --install -s /bin
mount -t proc proc /proc 2>/dev/null; echo "init starts at $(cut -d" " -f1 /proc/uptime)"
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

results_path=$(sed -n 's/.*ibev.results=\([^ ]*\).*/\1/p' /proc/cmdline)

# Writes why the VM gave up where the host looks for it, then powers off.
fail() {
  echo "ibev-vm: $*"
  [ -d /results ] && echo "$*" > /results/vm_error
  poweroff -f
}

mkdir -p /results
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results /results 2>/dev/null
for module in $(grep -v '^#' /modules/order); do
  insmod "/modules/$module.ko" || fail "module $module failed to load"
done
# 9p was loaded just now: mount the results share for real.
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results /results ||
  fail "cannot mount the results share"
echo "modules loaded at $(cut -d" " -f1 /proc/uptime)"
echo booted > /results/vm_booted

mkdir -p /host /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 hostroot /host ||
  fail "cannot mount the host root"
mount -t tmpfs -o size=512m tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot ||
  fail "cannot mount the overlay"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -o bind /dev /newroot/dev
mount -t tmpfs tmpfs /newroot/run
mkdir -p "/newroot$results_path"
mount -o bind /results "/newroot$results_path" || fail "cannot bind the results share"

echo "job starts at $(cut -d" " -f1 /proc/uptime)"
chroot /newroot /bin/bash "$results_path/job.sh" > /results/job.log 2>&1
echo $? > /results/job_rc
echo "job done at $(cut -d" " -f1 /proc/uptime)"
sync
poweroff -f
