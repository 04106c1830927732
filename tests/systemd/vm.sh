#!/bin/bash
# `make test-systemd`: the Debian packages under a real systemd, PID 1 of a Debian 12 VM, or
# of a Debian 13 one (issue 27). Our machines' PID 1 is not systemd, so the units are
# otherwise only checked offline (`systemd-analyze verify`); here they run, hardened as
# shipped. Slow (software emulation), so never part of `make test` nor of .ci/run
# (tests/README.md).
#
#   tests/systemd/vm.sh [--release bookworm|trixie] [--reuse] [--keep]
#
# 1. The image (tests/systemd/image.sh): a debootstrapped release, bookworm (systemd 252,
#    the default) or trixie (systemd 257), with systemd, openssh-server, docker.io,
#    apparmor, linux-image-amd64, busybox-static, python3 and what the .debs depend on, as
#    a raw ext4 image made by `mkfs.ext4 -d`. Cached in $CACHE/images/RELEASE-KEY, KEY a
#    hash of image.sh (its package lists and steps): built again only when image.sh
#    changes. --reuse takes the release's newest complete image whatever its key. The .debs
#    are the same for both: built here, on bookworm (arch:all Python, and the eBPF object
#    with libbpf1 and python3 as its only dependencies, which trixie has too).
# 2. The .debs: the tree's (`make deb`), and the previous build's: the tree at the parent of
#    the newest commit that changed the product (exitwatch/, packaging/, pyproject.toml),
#    built the same way, cached by that commit, with its version lowered (VERSION~prev) so
#    that installing the tree's is an upgrade. EXITWATCH_SYSTEMD_PREV=REF builds REF instead.
# 3. The VM: qemu-system-x86_64 -accel tcg (KVM guests hang on these machines), 2 vCPUs,
#    2 GiB, direct kernel boot of the image's vmlinuz and initrd, the image behind a
#    throwaway qcow2 overlay (the cached image is never written). Its only network is
#    qemu's user network with restrict=on: the guest reaches nothing, not even the host,
#    and the host reaches its sshd by a port forward on 127.0.0.1 alone.
# 4. The checks (tests/systemd/checks.py, kinds.py, alive.py, recipes.py, adoptdoc.py,
#    guest.py), copied in with the .debs and the tree's docs/adopt.md (whose recipes they
#    type as written), and run as root over ssh with the image's key. Each prints PASS or
#    FAIL; the last line of this script is "N passed, N failed", and it exits non-zero on
#    any FAIL, or when the checks did not run to their end.
# 5. Whatever happens (a failure, ^C), the trap stops the VM and removes the overlay.
#
# The run's console, the checks' output and the guest's journal stay in $CACHE/last/.
# EXITWATCH_SYSTEMD_CACHE moves $CACHE (default /var/cache/exitwatch-systemd);
# DEBIAN_MIRROR picks the mirror for the image (default http://deb.debian.org/debian).
# --keep leaves the VM running at the end, and says how to reach it and stop it.
set -euo pipefail

CACHE=${EXITWATCH_SYSTEMD_CACHE:-/var/cache/exitwatch-systemd}
HOST_PATH=/usr/sbin:/usr/bin:/sbin:/bin   # Debian's tools, never pyenv's python
BOOT_DEADLINE=600   # seconds to ssh; ~70-90 s on an idle 2-core machine under TCG
CHECKS_DEADLINE=3600

die() { echo "vm.sh: $*" >&2; exit 1; }
say() { echo "vm.sh: $*" >&2; }

# Runs "$@" and records how long it took, for the summary.
TIMES=()
timed() {
    local what=$1 start=$SECONDS rc=0
    shift
    say "$what..."
    "$@" || rc=$?
    TIMES+=("$(printf '%-44s %4d s%s' "$what" $((SECONDS - start)) "$([ $rc = 0 ] || echo "  FAILED ($rc)")")")
    return "$rc"
}

# What a fresh Debian 12 machine lacks for this script, installed with apt. A trixie image
# needs a debootstrap of Debian 12.9 or later (image.sh says why): an older one is upgraded.
tools() {
    local missing=() pair
    for pair in qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils debootstrap:debootstrap \
        mkfs.ext4:e2fsprogs ssh:openssh-client ssh-keygen:openssh-client flock:util-linux \
        git:git make:make; do
        PATH=$HOST_PATH command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
    done
    if [ "$release" != bookworm ] && ! dpkg --compare-versions \
        "$(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null)" ge 1.0.128+nmu2+deb12u2; then
        missing+=(debootstrap)
    fi
    [ ${#missing[@]} = 0 ] && return 0
    say "apt: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

# -- 1. the image -----------------------------------------------------------------------------

IMAGE_DIR=
image() {
    local key
    key=$(sha256sum "$here/image.sh" | cut -c1-16)
    IMAGE_DIR=$CACHE/images/$release-$key
    if [ ! -e "$IMAGE_DIR/.complete" ] && [ -n "$reuse" ]; then
        IMAGE_DIR=$(ls -1dt "$CACHE/images/$release"-*/.complete 2>/dev/null | head -n 1 |
            xargs -r dirname)
        [ -n "$IMAGE_DIR" ] || die "--reuse: no complete $release image in $CACHE/images"
        say "--reuse: $IMAGE_DIR (image.sh has changed since)"
    fi
    if [ -e "$IMAGE_DIR/.complete" ]; then
        say "image: $IMAGE_DIR (cached)"
        return 0
    fi
    PATH=$HOST_PATH "$here/image.sh" "$IMAGE_DIR" "$release"
    # The release's older images are of no use once image.sh has changed, nor are those
    # named by the hash alone (before there was a choice of release); the other release's
    # stay, for its next run.
    find "$CACHE/images" -mindepth 1 -maxdepth 1 -type d ! -path "$IMAGE_DIR" \
        \( -name "$release-*" -o ! -name "*-*" \) \
        -exec rm -rf --one-file-system {} + 2>/dev/null || true
}

# -- 2. the .debs ------------------------------------------------------------------------------

DEBS=
debs() {
    DEBS=$run/debs
    mkdir -p "$DEBS/new" "$DEBS/prev"
    PATH=$HOST_PATH make -C "$top" deb >"$run/make-deb.log" 2>&1 ||
        die "make deb failed: $run/make-deb.log"
    local version
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$top/pyproject.toml" | head -n 1)
    cp "$top/dist/exitwatch_${version}_all.deb" "$top"/dist/exitwatch-bpf_"${version}"_*.deb \
        "$DEBS/new/"
    prev_build
    cp "$PREV_DIR"/*.deb "$DEBS/prev/"
    say "debs: new $(ls "$DEBS/new" | tr '\n' ' '); prev $(ls "$DEBS/prev" | tr '\n' ' ')"
}

# The previous build: the product as it was before its newest change.
PREV_DIR=
prev_build() {
    local last prev tmp deb v
    if [ -n "${EXITWATCH_SYSTEMD_PREV-}" ]; then
        last=$(git -C "$top" rev-parse --verify "$EXITWATCH_SYSTEMD_PREV^{commit}")
        prev=$last
    else
        last=$(git -C "$top" log -1 --format=%H -- exitwatch packaging pyproject.toml)
        prev=$(git -C "$top" rev-parse "$last^")
    fi
    PREV_DIR=$CACHE/prev/$prev
    [ -e "$PREV_DIR/.complete" ] && return 0
    say "the previous build: ${prev:0:12} ($(git -C "$top" log -1 --format=%s "$prev" | cut -c1-60))"
    rm -rf "$PREV_DIR"
    mkdir -p "$PREV_DIR"
    tmp=$(mktemp -d "$run/prev.XXXXXX")
    git -C "$top" archive "$prev" | tar -C "$tmp" -x
    (cd "$tmp" && PATH=$HOST_PATH packaging/build-deb.sh) >"$PREV_DIR/build.log" 2>&1 ||
        die "the previous build failed: $PREV_DIR/build.log"
    # Lowered, so that the tree's build (same version, most likely) is an upgrade over it.
    for deb in "$tmp"/dist/exitwatch_*_all.deb "$tmp"/dist/exitwatch-bpf_*.deb; do
        rm -rf "$tmp/x"
        dpkg-deb -R "$deb" "$tmp/x"
        v=$(sed -n 's/^Version: //p' "$tmp/x/DEBIAN/control")
        sed -i -e "s/^Version: .*/Version: $v~prev/" \
            -e "s/exitwatch (= $v)/exitwatch (= $v~prev)/" "$tmp/x/DEBIAN/control"
        dpkg-deb -b "$tmp/x" "$PREV_DIR/$(basename "$deb" | sed "s/_${v}_/_${v}~prev_/")" >/dev/null
    done
    echo "$prev" >"$PREV_DIR/commit"
    touch "$PREV_DIR/.complete"
    rm -rf "$tmp"
}

# -- 3. the VM ---------------------------------------------------------------------------------

QEMU_PID=
PORT=
SSH=()
cleanup() {
    local rc=$?
    if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
        if [ -n "$keep" ] && [ "$rc" != 130 ]; then
            say "--keep: the VM runs as pid $QEMU_PID; ${SSH[*]}; stop it: kill $QEMU_PID"
            return
        fi
        kill "$QEMU_PID" 2>/dev/null || true
        local end=$((SECONDS + 30))
        while kill -0 "$QEMU_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
        kill -KILL "$QEMU_PID" 2>/dev/null || true
    fi
    [ -n "${run-}" ] && rm -f "$run/disk.qcow2"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

boot() {
    qemu-img create -q -f qcow2 -b "$IMAGE_DIR/root.img" -F raw "$run/disk.qcow2"
    PORT=$(free_port)
    SSH=(ssh -i "$IMAGE_DIR/id_ed25519" -p "$PORT" -o BatchMode=yes -o LogLevel=ERROR
        -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10
        -o ServerAliveInterval=15 -o ServerAliveCountMax=8 root@127.0.0.1)
    qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 2048 \
        -display none -monitor none -serial "file:$run/console.log" -no-reboot \
        -kernel "$IMAGE_DIR/vmlinuz" -initrd "$IMAGE_DIR/initrd.img" \
        -append "root=/dev/vda rw console=ttyS0 panic=-1" \
        -drive "file=$run/disk.qcow2,if=virtio,format=qcow2,cache=unsafe" \
        -netdev "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:$PORT-:22" \
        -device virtio-net-pci,netdev=n0 >"$run/qemu.log" 2>&1 &
    QEMU_PID=$!
    local end=$((SECONDS + BOOT_DEADLINE))
    until "${SSH[@]}" true 2>/dev/null; do
        kill -0 "$QEMU_PID" 2>/dev/null ||
            die "qemu exited: $(tail -n 3 "$run/qemu.log") $(tail -n 3 "$run/console.log")"
        [ $SECONDS -lt $end ] || die "no ssh within ${BOOT_DEADLINE} s: $(tail -n 3 "$run/console.log")"
        sleep 1
    done
    say "booted: $("${SSH[@]}" 'uname -r; systemctl --version | head -n 1' | tr '\n' ' ')"
}

# -- 4. the checks -----------------------------------------------------------------------------

checks() {
    tar -C "$here" -c checks.py guest.py kinds.py alive.py recipes.py adoptdoc.py \
        -C "$top/docs" adopt.md -C "$run" debs |
        "${SSH[@]}" 'rm -rf /root/rig && mkdir /root/rig && tar -C /root/rig -x'
    local rc=0
    timeout "$CHECKS_DEADLINE" "${SSH[@]}" \
        'cd /root/rig && PYTHONDONTWRITEBYTECODE=1 python3 -u checks.py /root/rig/debs' 2>&1 |
        tee "$run/checks.log" || rc=$?
    "${SSH[@]}" 'journalctl -b --no-pager' >"$run/journal.txt" 2>/dev/null || true
    grep -qx 'checks done' "$run/checks.log" ||
        echo "FAIL the checks did not run to their end (ssh exit $rc)" | tee -a "$run/checks.log"
}

stop_vm() {
    "${SSH[@]}" 'systemctl poweroff' >/dev/null 2>&1 || true
    local end=$((SECONDS + 120))
    while kill -0 "$QEMU_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.5; done
}

# -- main --------------------------------------------------------------------------------------

# A function, called on the last line: bash has read the whole script before it runs any of
# it, so that editing the script during a run does not change the run.
main() {
    [ "$(id -u)" = 0 ] || die "run me as root"
    reuse= keep= release=bookworm
    while [ $# -gt 0 ]; do
        case $1 in
            --reuse) reuse=1 ;;
            --keep) keep=1 ;;
            --release)
                [ $# -gt 1 ] || die "--release needs bookworm or trixie"
                release=$2
                shift
                ;;
            --release=*) release=${1#--release=} ;;
            *) die "unknown argument $1 (usage: vm.sh [--release R] [--reuse] [--keep])" ;;
        esac
        shift
    done
    case $release in
        bookworm | trixie) ;;
        *) die "unknown release $release (bookworm or trixie)" ;;
    esac
    here=$(cd "$(dirname "$0")" && pwd)
    top=$(cd "$here/../.." && pwd)
    mkdir -p "$CACHE/images" "$CACHE/prev"
    exec 9>"$CACHE/.lock"
    flock -n 9 || die "another run holds $CACHE/.lock"
    run=$CACHE/last
    rm -rf "$run"
    mkdir -p "$run"
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    started=$SECONDS

    timed "tools (apt, only what is missing)" tools
    timed "the image (debootstrap, cached)" image
    timed "the .debs (make deb, and the previous build)" debs
    timed "boot to ssh (TCG)" boot
    timed "the checks" checks || true
    [ -n "$keep" ] || timed "power off" stop_vm
    printf '  %s\n' "${TIMES[@]}" >&2
    say "logs: $run (checks.log, console.log, journal.txt); $release, $((SECONDS - started)) s"
    passed=$(grep -c '^PASS ' "$run/checks.log" || true)
    failed=$(grep -c '^FAIL ' "$run/checks.log" || true)
    echo "$passed passed, $failed failed"
    [ "$failed" = 0 ] && [ "$passed" -gt 0 ]
}

main "$@"; exit
