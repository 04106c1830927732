#!/bin/bash
# A private Docker engine (Debian's docker.io dockerd) for the test suite and `make run`.
#
#   tests/support/engine.sh start DIR [SOCKET]
#       start it unless it already runs, make the test image, and print its DOCKER_HOST
#       (unix://SOCKET) on stdout
#   tests/support/engine.sh stop DIR
#       SIGTERM, wait, then SIGKILL; fine if it is not running
#   tests/support/engine.sh image DIR
#       import the test image unless it is there
#   tests/support/engine.sh purge DIR
#       stop it, unmount what it left mounted, remove DIR
#
# Everything lives in DIR: data/ (data-root), exec/ (exec-root), daemon.json, dockerd.pid,
# dockerd.log, and host (the DOCKER_HOST it answers on). containerd's sockets live under
# exec/, and a unix socket path holds at most 107 bytes, so keep DIR short.
# SOCKET defaults to /run/exitwatch-test/docker.sock. Any other path works too, the system
# daemon's included (`make run` on a machine without one), but never a socket some other
# engine answers on.
#
# The engine touches as little of the host as it can: no iptables rules, no docker0 bridge,
# no ip_forward change, and its own (empty) daemon.json so /etc/docker/daemon.json is ignored.
# EXITWATCH_TEST_BRIDGE=NAME gives it a default bridge network on the existing bridge NAME
# (with an IPv4 address) instead of none, for runners that `docker run --network bridge`.
#
# The test image, exitwatch-test/busybox:latest (enginelib.sh), is imported with `docker import`.
set -eu
# shellcheck source=tests/support/enginelib.sh
. "$(dirname "$0")/enginelib.sh"

DEFAULT_SOCKET=/run/exitwatch-test/docker.sock
START_DEADLINE=60   # seconds; dockerd on a loaded 2-core VM can take a while
STOP_DEADLINE=30

die() { echo "engine.sh: $*" >&2; exit 1; }

running_pid() {
    local pid
    pid=$(cat "$1/dockerd.pid" 2>/dev/null) || return 1
    is_live "$pid" dockerd && echo "$pid"
}

answers() { DOCKER_HOST=$1 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start() {
    local dir=$1 socket=${2:-$DEFAULT_SOCKET} host pid end containerd
    case $socket in
        /*) ;;
        *) die "SOCKET must be an absolute path, not $socket" ;;
    esac
    host=unix://$socket
    mkdir -p "$dir/data" "$dir/exec" "$(dirname "$socket")"
    dir=$(cd "$dir" && pwd)

    if pid=$(running_pid "$dir"); then
        [ "$(cat "$dir/host")" = "$host" ] || die "the engine in $dir already answers on $(cat "$dir/host")"
    else
        # A socket nobody answers on is left over from a crash; one that answers is not ours.
        if [ -S "$socket" ]; then
            answers "$host" && die "another engine already answers on $socket"
            rm -f "$socket"
        fi
        rm -f "$dir/dockerd.pid"
        # dockerd trusts a containerd pid file whose process still exists, even as a zombie,
        # and then waits in vain for that containerd to answer.
        containerd=$(cat "$dir/exec/containerd/containerd.pid" 2>/dev/null) || containerd=
        if [ -n "$containerd" ] && ! is_live "$containerd" containerd; then
            rm -f "$dir/exec/containerd/containerd.pid"
        fi
        echo '{}' >"$dir/daemon.json"
        echo "$host" >"$dir/host"
        # Its own session, so a Ctrl-C meant for the test run does not reach it.
        setsid dockerd \
            --config-file "$dir/daemon.json" \
            -H "$host" \
            --data-root "$dir/data" \
            --exec-root "$dir/exec" \
            --pidfile "$dir/dockerd.pid" \
            --storage-driver overlay2 \
            --iptables=false --ip-forward=false --bridge="${EXITWATCH_TEST_BRIDGE:-none}" \
            --shutdown-timeout 2 \
            </dev/null >>"$dir/dockerd.log" 2>&1 &
        pid=$!
    fi

    end=$((SECONDS + START_DEADLINE))
    until answers "$host"; do
        if ! is_live "$pid" dockerd || [ "$SECONDS" -ge "$end" ]; then
            tail -n 15 "$dir/dockerd.log" >&2 || true
            die "dockerd did not answer on $socket within ${START_DEADLINE}s (log: $dir/dockerd.log)"
        fi
        sleep 0.1
    done
    image "$dir"
    echo "$host"
}

stop() {
    local dir=$1 pid containerd nets net
    pid=$(running_pid "$dir") || { rm -f "$dir/dockerd.pid"; return 0; }
    # Its networks' bridges outlive the engine in the host's namespace, and every engine on
    # the host picks its subnets from the same default pools: after a few suites, network
    # creates failed with "could not find an available, non-overlapping IPv4 address pool".
    # Named now, removed once it is gone (best effort: a wedged engine names none).
    nets=$(timeout 5 docker -H "$(cat "$dir/host" 2>/dev/null)" network ls -q --no-trunc \
        --filter driver=bridge 2>/dev/null) || nets=
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" dockerd "$STOP_DEADLINE"; then
        echo "engine.sh: dockerd $pid ignored SIGTERM for ${STOP_DEADLINE}s; sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        # dockerd started this containerd and no longer can stop it.
        containerd=$(cat "$dir/exec/containerd/containerd.pid" 2>/dev/null) || containerd=
        [ -n "$containerd" ] && kill -KILL "$containerd" 2>/dev/null || true
        wait_gone "$pid" dockerd 10 || die "dockerd $pid survived SIGKILL"
    fi
    rm -f "$dir/dockerd.pid"
    for net in $nets; do
        ip link delete "br-${net:0:12}" 2>/dev/null || true
    done
}

purge() {
    local dir mnt
    [ -d "$1" ] || return 0
    dir=$(cd "$1" && pwd)
    stop "$dir"
    # dockerd leaves its data-root bind-mounted onto itself, and a crash leaves container
    # mounts behind. Innermost first.
    awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r mnt; do umount -l "$mnt"; done
    rm -rf --one-file-system "$dir"
}

image() {
    local dir=$1
    export DOCKER_HOST
    DOCKER_HOST=$(cat "$dir/host" 2>/dev/null) || die "no engine was started in $dir"
    docker image inspect "$IMAGE" >/dev/null 2>&1 && return 0
    image_tar | docker import "${IMAGE_CHANGES[@]}" - "$IMAGE" >/dev/null
}

case ${1-} in
    start) [ $# -ge 2 ] || die "usage: $0 start DIR [SOCKET]"; start "$2" "${3-}" ;;
    stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
    image) [ $# -eq 2 ] || die "usage: $0 image DIR"; image "$2" ;;
    purge) [ $# -eq 2 ] || die "usage: $0 purge DIR"; purge "$2" ;;
    *) die "usage: $0 start DIR [SOCKET] | stop DIR | image DIR | purge DIR" ;;
esac
