#!/bin/bash
# The Debian VM image of `make test-systemd` (tests/systemd/vm.sh), Debian 12 (bookworm) or
# 13 (trixie), built from Debian's packages alone:
#
#   tests/systemd/image.sh DIR [RELEASE]     (RELEASE: bookworm, the default, or trixie)
#
# makes, in DIR: root.img (a raw ext4 file system, made by `mkfs.ext4 -d` from a
# debootstrapped root: no partition table, no boot loader, no loop device, no root-only
# mount), vmlinuz and initrd.img (the image's own kernel and initramfs, for qemu's direct
# kernel boot), and id_ed25519 (the key root logs in with, over ssh). DIR/.complete is
# written last: a DIR without it is a build that did not finish.
#
# The root is systemd's: systemd-sysv is its init, systemd-networkd gives the NIC an address
# by DHCP from qemu's user network, sshd lets root in with the key alone. Docker's engine
# (docker.io, with apparmor) starts at boot from docker.socket, as on a Debian host. Two
# unprivileged users, alice and bob, are in the docker group, so that each can label and
# create containers as runners do. The exitwatch packages' dependencies are in the image, so
# that the .debs install with no network: the guest has none but qemu's port forward.
#
# What differs between the two is named below, with the release: trixie's docker.io only
# Recommends the docker CLI (docker-cli). Every bookworm debootstrap has a trixie script (a
# link to sid's, since 1.0.125), but trixie dropped usr-is-merged, which debootstraps before
# 1.0.128+nmu2+deb12u2 (Debian 12.9) still pull in: vm.sh upgrades an older one.
#
# vm.sh names DIR after the release and a hash of this file, so that any change to the
# package list or the steps below builds a new image; --reuse takes the release's newest
# image there whatever its hash.
# DEBIAN_MIRROR picks the mirror (default http://deb.debian.org/debian).
set -euo pipefail

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SIZE=6G
# What the brief of the rig names, what the exitwatch .debs depend on and recommend
# (packaging/debian/control), and what the checks use.
PACKAGES=(
    systemd systemd-sysv udev dbus openssh-server docker.io apparmor
    linux-image-amd64 initramfs-tools busybox-static python3
    python3-click python3-psutil python3-h11 libbpf1 python3-prometheus-client
    procps iproute2 util-linux kmod ca-certificates
)
declare -A RELEASE_PACKAGES=(
    [bookworm]=""
    [trixie]="docker-cli"
)

die() { echo "image.sh: $*" >&2; exit 1; }

[ $# = 1 ] || [ $# = 2 ] || die "usage: image.sh DIR [bookworm|trixie]"
dir=$1
release=${2:-bookworm}
[ -n "${RELEASE_PACKAGES[$release]+set}" ] || die "unknown release $release (bookworm or trixie)"
# shellcheck disable=SC2206  # a word list on purpose
PACKAGES+=(${RELEASE_PACKAGES[$release]})
root=$dir/root
mkdir -p "$dir"
rm -rf --one-file-system "$root" "$dir/root.img" "$dir/.complete"

# Whatever fails below, leave no mounts behind in the root (debootstrap mounts /proc and
# /sys there and unmounts them itself, but not when it dies halfway).
cleanup() {
    local m
    for m in proc sys dev/pts dev; do
        mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m" || true
    done
}
trap cleanup EXIT

include=$(IFS=,; echo "${PACKAGES[*]}")
echo "image.sh: debootstrap $release (${#PACKAGES[@]} packages named, and their dependencies)"
debootstrap --variant=minbase --include="$include" "$release" "$root" "$MIRROR" \
    >"$dir/debootstrap.log" 2>&1 || die "debootstrap failed: $(tail -n 5 "$dir/debootstrap.log")"

cat >"$root/etc/apt/sources.list" <<APT
deb $MIRROR $release main
deb $MIRROR $release-updates main
deb http://deb.debian.org/debian-security $release-security main
APT
echo exitwatch-rig >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\texitwatch-rig\n' >"$root/etc/hosts"
echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' >"$root/etc/fstab"
: >"$root/etc/machine-id"   # made at first boot, unique to each run's copy

# The NIC by DHCP from qemu's user network (its only address; the guest has no route out,
# see vm.sh's restrict=on).
cat >"$root/etc/systemd/network/10-rig.network" <<NET
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
NET
ln -sf /lib/systemd/system/systemd-networkd.service \
    "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
# Nothing waits for a network that is up anyway.
ln -sf /dev/null "$root/etc/systemd/system/systemd-networkd-wait-online.service"
# A serial getty is of no use here: the console is a log file.
ln -sf /dev/null "$root/etc/systemd/system/serial-getty@ttyS0.service"
# Nor a first-boot wizard, which would wait for answers on that console if systemd took the
# empty machine-id below for a first boot (252 does not; it is no promise of later ones).
ln -sf /dev/null "$root/etc/systemd/system/systemd-firstboot.service"

# Root logs in with the key alone; nothing else does.
ssh-keygen -q -t ed25519 -N '' -C exitwatch-rig -f "$dir/id_ed25519"
install -d -m 700 "$root/root/.ssh"
install -m 600 "$dir/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
cat >"$root/etc/ssh/sshd_config.d/rig.conf" <<SSH
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
SSH

# The two unprivileged users of the checks, each in the docker group (which docker.io made).
chroot "$root" useradd -m -s /bin/bash -G docker alice
chroot "$root" useradd -m -s /bin/bash -G docker bob

# Smaller image: the packages' archives are not needed any more.
chroot "$root" apt-get clean

cp "$(ls -1 "$root"/boot/vmlinuz-* | sort -V | tail -n 1)" "$dir/vmlinuz"
cp "$(ls -1 "$root"/boot/initrd.img-* | sort -V | tail -n 1)" "$dir/initrd.img"
chroot "$root" dpkg-query -W -f='${Package} ${Version}\n' >"$dir/packages.txt"

cleanup
echo "image.sh: mkfs.ext4 -d ($SIZE, sparse)"
truncate -s "$SIZE" "$dir/root.img"
mkfs.ext4 -q -L rig-root -d "$root" "$dir/root.img"
rm -rf --one-file-system "$root"
touch "$dir/.complete"
echo "image.sh: $dir ready ($(du -sh --apparent-size "$dir/root.img" | cut -f1) apparent, $(du -sh "$dir/root.img" | cut -f1) used)"
