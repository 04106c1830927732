#!/bin/bash
# `make test-debian13`: the Debian packages and the suite on Debian 13 (trixie), for real:
# this machine's kernel under trixie's own userland (python3 3.13, python3-docker 7.1,
# psutil 7.0, libbpf 1.5, docker.io 26.1 with its containerd and runc, compose v2). Slow
# (a root to build, ~1.5 GB of packages, the suite twice), so never part of `make test`.
#
#   tests/debian13.sh [--reuse] [PYTEST_ARGS...]
#
# 1. A trixie root: `debootstrap --variant=minbase` from the Debian mirror, cached in
#    $CACHE/base (built again when missing or incomplete) and copied afresh for each run
#    to $CACHE/run.
# 2. The packages: the .debs built here (`make deb`) installed into that root with their
#    dependencies from trixie, before anything else: a minimal install, with no
#    systemd-tmpfiles, where the postinst alone makes the hook spool. Then the installed
#    agent's end-to-end reap, on trixie's own engine: a SIGKILLed owner's container,
#    workdir and on-death hook, `exitwatch status`, and what an `exitwatch run` left.
# 3. The suite, from a clone of this tree (HEAD, with the work tree's changes on top) in
#    the root: `make deps`, which installs the Makefile's apt packages from trixie, its
#    venv and the eBPF object, then `make test`: lint, the venv's pass and the pass under
#    trixie's /usr/bin/python3 and libraries, side by side, each reported whole. The
#    suite's private engines are trixie's dockerd, started by tests/support/engine.sh
#    inside the root. With PYTEST_ARGS, those tests alone run, under both interpreters one
#    after the other, instead of `make test`.
# --reuse skips 1 and 2 and runs 3 in the last run's root as it was left (its packages and
#    venv installed), with the tree cloned again: to rerun what failed after a fix.
#
# Each step runs in a mount namespace of its own (unshare --mount) that pivot_roots into
# the run's root and unmounts the host's, with the host's /proc, /sys (the cgroup
# hierarchies, the kernel's BTF) and /dev, and a fresh /run. Not a chroot: under a chroot
# dockerd's containers are given the host's root. Caches kept between runs, under $CACHE:
# apt's archives, pip's cache, and the suite's tool venvs (/var/cache/exitwatch-test).
# EXITWATCH_DEBIAN13_CACHE moves $CACHE (default /var/cache/exitwatch-debian13);
# DEBIAN_MIRROR picks the mirror (default http://deb.debian.org/debian).
set -euo pipefail

CACHE=${EXITWATCH_DEBIAN13_CACHE:-/var/cache/exitwatch-debian13}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SRC=/src/exitwatch   # the tree's clone, inside the root
DEBS=/src/debs
PATH_IN=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
IMAGE=exitwatch-test/busybox:latest

die() { echo "debian13.sh: $*" >&2; exit 1; }
say() { echo "debian13.sh: $*" >&2; }

# Runs "$@" and records how long it took and whether it failed, for the summary.
TIMES=()
timed() {
    local what=$1 start=$SECONDS rc=0 mark=
    shift
    say "$what..."
    "$@" || rc=$?
    [ "$rc" = 0 ] || mark="  FAILED ($rc)"
    TIMES+=("$(printf '%-52s %4d s%s' "$what" $((SECONDS - start)) "$mark")")
    return "$rc"
}

# -- on the host ------------------------------------------------------------------------------

base() {
    [ -e "$CACHE/base/.exitwatch-complete" ] && return 0
    command -v debootstrap >/dev/null ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    rm -rf --one-file-system "$CACHE/base" "$CACHE/base.new"
    debootstrap --variant=minbase trixie "$CACHE/base.new" "$MIRROR" >"$CACHE/debootstrap.log"
    cat >"$CACHE/base.new/etc/apt/sources.list" <<EOF
deb $MIRROR trixie main
deb $MIRROR trixie-updates main
deb http://deb.debian.org/debian-security trixie-security main
EOF
    # No init runs in the root: a package's postinst must not try to start its service.
    printf '#!/bin/sh\nexit 101\n' >"$CACHE/base.new/usr/sbin/policy-rc.d"
    chmod 755 "$CACHE/base.new/usr/sbin/policy-rc.d"
    touch "$CACHE/base.new/.exitwatch-complete"
    mv "$CACHE/base.new" "$CACHE/base"
}

fresh_run() {
    rm -rf --one-file-system "$CACHE/run"
    cp -a "$CACHE/base" "$CACHE/run"
}

# The site's network, as the host has it: the local CAs of a proxy that intercepts TLS, and
# pip's settings (which name the CA file). Nothing of Debian's.
site() {
    local root=$CACHE/run
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    if [ -d /usr/local/share/ca-certificates ]; then
        mkdir -p "$root/usr/local/share/ca-certificates"
        cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
    fi
    if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$root/etc/pip.conf"; fi
}

# HEAD of this tree, cloned, with the work tree's changes (modified, new, deleted) on top.
clone() {
    local top=$1 dst=$CACHE/run$SRC
    rm -rf --one-file-system "$dst"
    mkdir -p "$(dirname "$dst")"
    git clone -q --no-hardlinks "$top" "$dst"
    git -C "$dst" checkout -q --detach "$(git -C "$top" rev-parse HEAD)"
    (cd "$top" && git ls-files -z -m -o --exclude-standard | tar --null -T - -c) | tar -C "$dst" -x
    (cd "$top" && git ls-files -z -d) | (cd "$dst" && xargs -0r rm -f --)
}

# Runs `tests/debian13.sh --inside STEP ARGS` in the run's root, pivoted into.
enter() {
    local root=$CACHE/run
    site
    mkdir -p "$CACHE/apt" "$CACHE/pip" "$CACHE/tools" "$root/var/cache/apt/archives" \
        "$root/root/.cache/pip" "$root/var/cache/exitwatch-test"
    unshare --mount --propagation private -- "$0" --enter "$root" "$@"
}

pivot() {
    local root=$1
    shift
    mount --bind "$root" "$root"   # pivot_root wants a mount point
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=0755 tmpfs "$root/run"
    mount --bind "$CACHE/apt" "$root/var/cache/apt/archives"
    mount --bind "$CACHE/pip" "$root/root/.cache/pip"
    mount --bind "$CACHE/tools" "$root/var/cache/exitwatch-test"
    cd "$root"
    mkdir -p .host
    pivot_root . .host
    umount -l /.host
    rmdir /.host
    exec chroot . /usr/bin/env -i PATH="$PATH_IN" HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
        /bin/bash "$SRC/tests/debian13.sh" --inside "$@"
}

# -- in the root ------------------------------------------------------------------------------

versions() {
    echo "versions in the root:"
    sed -n 's/^PRETTY_NAME="\(.*\)"$/  \1/p' /etc/os-release
    echo "  kernel $(uname -r) (the host's)"
    echo "  $(python3 --version)"
    dpkg-query -W -f='  ${Package} ${Version}\n' python3-docker python3-psutil python3-click \
        python3-h11 python3-prometheus-client libbpf1 docker.io containerd runc \
        docker-compose 2>/dev/null || true
    echo "  $(dockerd --version)"
    if command -v docker-compose >/dev/null; then echo "  docker-compose $(docker-compose version --short)"; fi
}

packages() {
    export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
    apt-get update -qq
    apt-get install -y -qq "$DEBS"/*.deb >/dev/null
    # The postinst's spool: proved only where tmpfiles could not have made it.
    if command -v systemd-tmpfiles >/dev/null; then
        die "this root has systemd-tmpfiles: it proves nothing about the postinst"
    fi
    [ "$(stat -c '%F %a %U %G' /var/spool/exitwatch/hooks)" = "directory 1733 root root" ] ||
        die "the spool is $(stat -c '%F %a %U %G' /var/spool/exitwatch/hooks 2>&1)"
    echo "spool: /var/spool/exitwatch/hooks is root's, 1733, with no systemd-tmpfiles"
    # The engine for the reap (the package only Suggests it), and the test image's busybox.
    apt-get install -y -qq docker.io busybox-static >/dev/null
    versions
}

# Waits up to $1 seconds for the command "${@:2}" to succeed.
within() {
    local end=$((SECONDS + $1))
    until "${@:2}" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$end" ] || die "not within ${1}s: ${*:2}"
        sleep 0.2
    done
}

# The Python expression $1 of the agent's status document, `d`.
status_json() {
    exitwatch status --json | python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"
}
watched() { [ "$(status_json "any(o['pid'] == $1 for o in d['owners'])")" = True ]; }
reaped() { [ "$(status_json "sum(r['owner'] == '$1' and r['ok'] for r in d['reaps'])")" = "$2" ]; }
gone() { ! docker inspect "$1" && [ ! -e "$2" ]; }

reap() {
    local host owner ostr cid agent run_tmp log=/tmp/ew-e2e/agent.log root=/tmp/ew-e2e/root
    rm -rf /tmp/ew-e2e
    mkdir -p "$root"
    host=$("$SRC/tests/support/engine.sh" start /tmp/ew-e2e/engine /run/ew-e2e/docker.sock)
    export DOCKER_HOST=$host
    echo "engine: dockerd $(docker version --format '{{.Server.Version}}') on $host"

    exitwatch agent --docker-host "$host" --workdir-root "$root" 2>"$log" &
    agent=$!
    # The installed CLI labels, marks and registers a hook for an owner that then dies.
    sleep 1000 &
    owner=$!
    ostr=$(exitwatch labels --pid "$owner" --format env | sed -n 's/^export EXITWATCH_OWNER=//p')
    # shellcheck disable=SC2046  # the labels are words
    cid=$(docker run -d $(exitwatch labels --pid "$owner" --format docker-args) "$IMAGE")
    mkdir "$root/w"
    echo data >"$root/w/data"
    exitwatch mark "$root/w" --pid "$owner"
    exitwatch on-death --pid "$owner" -- /bin/sh -c 'echo ran >/tmp/ew-e2e/hook-ran' >/dev/null
    within 60 grep -q 'ready: watching' "$log"
    grep -q "exit source ebpf" "$log" || die "the agent did not pick ebpf: $(cat "$log")"
    within 30 watched "$owner"
    exitwatch status | sed -n '1,/^$/p'

    kill -KILL "$owner"
    wait "$owner" 2>/dev/null || true
    within 30 gone "$cid" "$root/w"
    within 30 test -e /tmp/ew-e2e/hook-ran
    within 30 reaped "$ostr" 3
    echo "status after the owner's SIGKILL:"
    exitwatch status | sed -n '/^ *recent removals/,$p'

    # What a run leaves, gone when it ends: its container and its TMPDIR.
    exitwatch run -- /bin/sh -c "docker run -d --name ew-run-left $IMAGE >/dev/null &&
        echo \"\$TMPDIR\" >/tmp/ew-e2e/run-tmpdir && touch \"\$TMPDIR/x\""
    run_tmp=$(cat /tmp/ew-e2e/run-tmpdir)
    [ -n "$run_tmp" ] || die "the run had no TMPDIR"
    within 30 gone ew-run-left "$run_tmp"
    echo "run: its container and its TMPDIR ($run_tmp) are gone"

    kill -TERM "$agent"
    wait "$agent" || die "the agent exited $?: $(cat "$log")"
    "$SRC/tests/support/engine.sh" purge /tmp/ew-e2e/engine
    unset DOCKER_HOST
    echo "reap: container, workdir and hook of a SIGKILLed owner, and a run's leftovers: done"
}

# `make run` until its agent answers: it starts an engine on the default socket, where
# none answers in the root.
make_run() {
    local make log=/tmp/ew-make-run.log
    mkdir -p /tmp/ew-make-run
    setsid make run ARGS="--workdir-root /tmp/ew-make-run" >"$log" 2>&1 &
    make=$!
    within 120 .venv/bin/exitwatch status
    .venv/bin/exitwatch status | sed -n '1,3p'
    kill -TERM -- "-$make"   # make and its agent; the engine has a session of its own
    wait "$make" || true
    grep -q "exitwatch stopped" "$log" || die "make run: $(tail -n 20 "$log")"
    tests/support/engine.sh purge /var/lib/exitwatch-engine
    rm -rf /tmp/ew-make-run
}

suite() {
    export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
    cd "$SRC"
    # What a machine that has a checkout and runs `make` has before make installs the rest.
    if ! command -v make >/dev/null || ! command -v update-ca-certificates >/dev/null; then
        apt-get update -qq
        apt-get install -y -qq make ca-certificates >/dev/null
    fi
    update-ca-certificates >/dev/null   # the site's CAs (see site())
    timed "make deps (apt, venv, eBPF object)" make deps
    versions
    timed "make run" make_run
    # The whole `make test` (lint, then both passes side by side, each reported whole);
    # with PYTEST_ARGS, those tests under each interpreter, one after the other.
    if [ $# -eq 0 ]; then
        timed "make test" make test
        return
    fi
    local failed=0
    timed "pytest $* (venv)" .venv/bin/python -m pytest -q "$@" || failed=1
    timed "pytest $* (/usr/bin/python3)" \
        env PYTHONPATH="$SRC" /usr/bin/python3 -m pytest -q -p no:cacheprovider "$@" || failed=1
    return "$failed"
}

inside() {
    local step=$1
    shift
    local rc=0
    case $step in
        packages) timed "install the .debs" packages; timed "the installed agent's reap" reap ;;
        suite) suite "$@" || rc=$? ;;
        *) die "unknown step $step" ;;
    esac
    printf '  %s\n' "${TIMES[@]}"
    return "$rc"
}

# -- main -------------------------------------------------------------------------------------

case ${1-} in
    --enter) shift; pivot "$@" ;;
    --inside) shift; inside "$@"; exit ;;
esac

[ "$(id -u)" = 0 ] || die "run me as root"
top=$(cd "$(dirname "$0")/.." && pwd)
reuse=
if [ "${1-}" = --reuse ]; then reuse=1; shift; fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock -n 9 || die "another run holds $CACHE/.lock"
started=$SECONDS

if [ -z "$reuse" ]; then
    timed "the trixie root (debootstrap, cached)" base
    timed "a fresh copy of it" fresh_run
    timed "make deb (here)" make -C "$top" deb >"$CACHE/make-deb.log" 2>&1 ||
        die "make deb failed: $CACHE/make-deb.log"
    mkdir -p "$CACHE/run$DEBS"
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$top/pyproject.toml" | head -n 1)
    cp "$top/dist/exitwatch_${version}_all.deb" "$top"/dist/exitwatch-bpf_"${version}"_*.deb \
        "$CACHE/run$DEBS/"
fi
[ -d "$CACHE/run/usr" ] || die "no run's root to reuse in $CACHE/run"
timed "clone the tree into the root" clone "$top"
printf '  %s\n' "${TIMES[@]}"
[ -n "$reuse" ] || enter packages
rc=0
enter suite "$@" || rc=$?
say "done in $((SECONDS - started)) s$([ "$rc" = 0 ] || echo ", FAILED")"
exit "$rc"
