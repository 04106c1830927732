#!/bin/bash
# A private rootful podman (Debian's podman) serving the Docker API, for the test suite: the
# same shape as engine.sh, which does this for dockerd.
#
#   tests/support/podman.sh start DIR [SOCKET]
#       start its service unless it already runs, import the test image, and print its
#       DOCKER_HOST (unix://SOCKET) on stdout
#   tests/support/podman.sh stop DIR
#       SIGTERM the service, wait, then SIGKILL; fine if it is not running. As with any
#       podman, the containers outlive their service (each has its conmon): a start finds
#       them again.
#   tests/support/podman.sh image DIR
#       import the test image unless it is there
#   tests/support/podman.sh podman DIR ARGS...
#       run podman ARGS itself on DIR's storage and network namespace, the service running
#       or not (what a client of the service would see, made while it was away)
#   tests/support/podman.sh purge DIR
#       remove every container, pod, network and volume, stop the service, end the conmons
#       left, unmount what it left mounted, remove DIR
#
# Everything lives in DIR: root/ (graphroot), run/ (runroot), tmp/ (podman's tmp_dir: its
# events file, locks, exit files), networks/ (the network configs), containers.conf (given
# by CONTAINERS_CONF, so /etc/containers and /usr/share/containers' files are not read),
# netns (its network namespace), podman.pid, podman.log, and host (its DOCKER_HOST).
# SOCKET defaults to DIR/podman.sock.
#
# The host is touched as little as it can be: the service and all it starts (netavark,
# aardvark-dns, conmon, the containers' bridges) run in a network namespace of its own, kept
# by a bind mount on DIR/netns. netavark 1.4 (bookworm's) has no way to leave iptables and
# net.ipv4.ip_forward alone when a container joins a bridge network (compose's networks):
# in that namespace its rules, its sysctl and its bridges (podman0, podman1, ...) are its
# own, and go with it. The containers' own namespaces are still files in the host's
# /run/netns, which podman removes with each container (a purge removes them all).
# Shared with every rootful podman on the host, as podman 4.3 and netavark 1.4 hard-code them
# (no setting moves them): /run/containers/networks (netavark's IPAM db, and aardvark-dns's
# config while a container is on a network with DNS: that aardvark-dns runs in this netns,
# and ends with its last container) and /var/lib/containers/cache (the import's blob cache).
#
# The hard rlimits on the suite's machines are below podman's defaults for containers (no
# container would start): default_ulimits in containers.conf lowers them.
#
# The test image, exitwatch-test/busybox:latest (enginelib.sh), is imported with `podman import`.
set -eu
# shellcheck source=tests/support/enginelib.sh
. "$(dirname "$0")/enginelib.sh"

START_DEADLINE=60 # seconds
STOP_DEADLINE=30

die() { echo "podman.sh: $*" >&2; exit 1; }

running_pid() {
    local pid
    pid=$(cat "$1/podman.pid" 2>/dev/null) || return 1
    is_live "$pid" podman && echo "$pid"
}

answers() { curl -sf --max-time 5 --unix-socket "$1" http://d/_ping >/dev/null 2>&1; }

# The netns is a bind mount of an nsfs inode on DIR/netns; a plain file there is none.
has_netns() { [ "$(stat -f -c %T "$1/netns" 2>/dev/null)" = nsfs ]; }

# podman itself on DIR's storage, in DIR's network namespace: what the service runs, and
# what image and purge call directly.
pod() {
    local dir=$1
    shift
    CONTAINERS_CONF=$dir/containers.conf nsenter --net="$dir/netns" \
        podman --root "$dir/root" --runroot "$dir/run" --storage-driver overlay \
        --cgroup-manager cgroupfs --events-backend file "$@"
}

write_conf() {
    local dir=$1
    cat >"$dir/containers.conf" <<EOF
# Written by tests/support/podman.sh for the private podman in this directory.
[containers]
default_ulimits = ["nofile=10240:10240", "nproc=4096:4096"]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$dir/tmp/events/events.log"
tmp_dir = "$dir/tmp"

[network]
network_backend = "netavark"
network_config_dir = "$dir/networks"
EOF
}

start() {
    local dir=$1 socket=${2-} host pid end
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    socket=${socket:-$dir/podman.sock}
    case $socket in
        /*) ;;
        *) die "SOCKET must be an absolute path, not $socket" ;;
    esac
    host=unix://$socket
    mkdir -p "$dir/root" "$dir/run" "$dir/tmp/events" "$dir/networks" "$(dirname "$socket")"

    if pid=$(running_pid "$dir"); then
        [ "$(cat "$dir/host")" = "$host" ] || die "the podman in $dir already answers on $(cat "$dir/host")"
    else
        if [ -S "$socket" ]; then
            answers "$socket" && die "another engine already answers on $socket"
            rm -f "$socket"
        fi
        rm -f "$dir/podman.pid"
        if ! has_netns "$dir"; then
            touch "$dir/netns"
            unshare --net="$dir/netns" true
            nsenter --net="$dir/netns" ip link set lo up
        fi
        write_conf "$dir"
        echo "$host" >"$dir/host"
        # Its own session, so a Ctrl-C meant for the test run does not reach it. --time=0:
        # it never ends for want of clients.
        setsid bash -c 'echo $$ >"$1/podman.pid"; shift; exec "$@"' _ "$dir" \
            env CONTAINERS_CONF="$dir/containers.conf" nsenter --net="$dir/netns" \
            podman --root "$dir/root" --runroot "$dir/run" --storage-driver overlay \
            --cgroup-manager cgroupfs --events-backend file \
            system service --time=0 "$host" \
            </dev/null >>"$dir/podman.log" 2>&1 &
        end=$((SECONDS + 5))
        until pid=$(running_pid "$dir"); do
            [ "$SECONDS" -lt "$end" ] || { tail -n 15 "$dir/podman.log" >&2; die "podman did not start"; }
            sleep 0.05
        done
    fi

    end=$((SECONDS + START_DEADLINE))
    until answers "$socket"; do
        if ! is_live "$pid" podman || [ "$SECONDS" -ge "$end" ]; then
            tail -n 15 "$dir/podman.log" >&2 || true
            die "podman did not answer on $socket within ${START_DEADLINE}s (log: $dir/podman.log)"
        fi
        sleep 0.1
    done
    image "$dir"
    echo "$host"
}

stop() {
    local dir=$1 pid
    pid=$(running_pid "$dir") || { rm -f "$dir/podman.pid"; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" podman "$STOP_DEADLINE"; then
        echo "podman.sh: podman $pid ignored SIGTERM for ${STOP_DEADLINE}s; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" podman 10 || die "podman $pid survived SIGKILL"
    fi
    rm -f "$dir/podman.pid"
}

# The pids of processes whose command line names DIR: the conmons of its containers
# (conmon -b DIR/root/...), a podman left from a crash.
pids_of() {
    local p
    for p in /proc/[0-9]*; do
        { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -qF -- "$1/" && echo "${p#/proc/}"
    done
    return 0
}

purge() {
    local dir mnt p
    [ -d "$1" ] || return 0
    dir=$(cd "$1" && pwd)
    stop "$dir"
    if has_netns "$dir" && [ -f "$dir/containers.conf" ]; then
        # Through podman first, so that it tears its containers' networks down (their
        # netns files in /run/netns among them). Best effort: a broken store still goes.
        pod "$dir" pod rm --all --force --time 0 >/dev/null 2>&1 || true
        pod "$dir" rm --all --force --volumes --time 0 >/dev/null 2>&1 || true
    fi
    for p in $(pids_of "$dir"); do
        [ "$p" = $$ ] || kill -KILL "$p" 2>/dev/null || true
    done
    # Container rootfs and shm mounts, the storage's own, the netns. Innermost first.
    awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r mnt; do umount -l "$mnt"; done
    rm -rf --one-file-system "$dir"
}

image() {
    local dir
    dir=$(cd "$1" && pwd)
    [ -f "$dir/containers.conf" ] || die "no podman was started in $dir"
    pod "$dir" image exists "$IMAGE" && return 0
    image_tar | pod "$dir" import --quiet "${IMAGE_CHANGES[@]}" - "$IMAGE" >/dev/null
}

case ${1-} in
    start) [ $# -ge 2 ] || die "usage: $0 start DIR [SOCKET]"; start "$2" "${3-}" ;;
    stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
    image) [ $# -eq 2 ] || die "usage: $0 image DIR"; image "$2" ;;
    purge) [ $# -eq 2 ] || die "usage: $0 purge DIR"; purge "$2" ;;
    podman)
        [ $# -ge 3 ] || die "usage: $0 podman DIR ARGS..."
        [ -f "$2/containers.conf" ] || die "no podman was started in $2"
        dir=$(cd "$2" && pwd)
        shift 2
        pod "$dir" "$@"
        ;;
    *) die "usage: $0 start DIR [SOCKET] | stop DIR | image DIR | podman DIR ARGS... | purge DIR" ;;
esac
