#!/bin/bash
# A user's rootless engines for the test suite, as a bench host's users run them: the user's
# rootless dockerd (under rootlesskit) and rootless podman service, each started AS the user,
# at the standard paths, with the test image imported by the user.
#
#   tests/support/rootless.sh start ENGINE USER DIR
#       ENGINE is docker or podman. Start USER's ENGINE unless it already runs, import the
#       test image (enginelib.sh's) as USER, and print its DOCKER_HOST on stdout:
#         docker  unix:///run/user/UID/docker.sock
#         podman  unix:///run/user/UID/podman/podman.sock
#   tests/support/rootless.sh stop ENGINE USER DIR
#       SIGTERM, wait, then SIGKILL; fine if it is not running. podman's containers outlive
#       its service (each under its conmon): they are stopped too, and the user's podman pause
#       process ended, so that a stopped engine leaves no process behind, as dockerd does.
#   tests/support/rootless.sh purge USER DIR
#       Stop both, end every process left of USER (and of USER's subordinate ids), unmount
#       what is mounted below DIR and /run/user/UID, and remove both. For a user that exists
#       for these engines alone (support/rootless.py makes one per test session).
#
# USER must exist, with subordinate ids (/etc/subuid, /etc/subgid), and a home (from the
# users database) below DIR or anywhere else it may write; the home is made if missing. It
# holds the engines' data: dockerd's data-root ~/docker, podman's storage and its
# configuration (~/.config/containers), which the user's own podman CLI reads too. DIR is
# root's: the engines' logs (docker.log, podman.log) and the pid files that stop trusts,
# which the user cannot rewrite.
#
# With no systemd --user and no logind, /run/user/UID is made here (the user's, 0700), as
# logind would, and removed by purge. Everything the engines run lives in the user's own
# namespaces: no iptables rule, no bridge and no mount on the host.
#
# Differences from a stock bench host, and why:
# - dockerd runs under rootlesskit with dockerd-rootless.sh's own flags, but in a network
#   namespace of its own made by `unshare --net` in rootlesskit's child, not by slirp4netns:
#   slirp4netns (and vpnkit) need /dev/net/tun, which only root may open on a machine whose
#   udev never ran (mode 0600, as here; udev makes it 0666). dockerd then makes its bridges
#   (`docker network create`) in that namespace, as it does under slirp4netns; the namespace
#   has no way out, and the suite pulls nothing. Upstream calls rootlesskit --net=host
#   unsupported: dockerd 26 (Debian 13) panics on GET /version there, so nothing here asks it
#   (answers() pings), and the suite's docker-py client takes its API version from /_ping.
# - For the same reason, podman's containers need `--network none` (its rootless default,
#   slirp4netns, cannot start); `podman network create` only writes a file, and works.
# - podman stores with vfs, runs without cgroups of its own (cgroupfs: cgroup v1 gives a
#   user none), logs events to a file (no journald), and its containers' ulimits are below
#   the host's hard limits (its defaults are above them, and its containers fail to start).
set -eu

START_DEADLINE=60   # seconds; dockerd on a loaded 2-core VM can take a while
STOP_DEADLINE=30
PURGE_DEADLINE=10   # for the user's stray processes to go after SIGKILL
# shellcheck source=tests/support/enginelib.sh
. "$(dirname "$0")/enginelib.sh"
cd /   # the user's processes start here, never in a directory only root may enter

die() { echo "rootless.sh: $*" >&2; exit 1; }

# The user's name, ids, home and runtime directory, from the users database.
user_of() {
    local entry
    entry=$(getent passwd "$1") || die "no user $1"
    user=$1
    uid=$(echo "$entry" | cut -d: -f3)
    gid=$(echo "$entry" | cut -d: -f4)
    home=$(echo "$entry" | cut -d: -f6)
    run=/run/user/$uid
    [ "$uid" != 0 ] || die "$1 is root: rootless engines are for unprivileged users"
    grep -q "^$1:" /etc/subuid && grep -q "^$1:" /etc/subgid ||
        die "$1 has no subordinate ids in /etc/subuid and /etc/subgid (usermod --add-subuids)"
}

# A command as the user: its real ids, no groups, a clean environment that names its home
# and runtime directory (what a login would give it). Extra NAME=VALUE words go to env.
as_user() {
    setpriv --reuid="$uid" --regid="$gid" --clear-groups \
        env -i HOME="$home" XDG_RUNTIME_DIR="$run" PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

# /run/user/UID and the home, as logind and useradd would make them.
user_dirs() {
    mkdir -p /run/user
    [ -d "$run" ] || install -d -o "$uid" -g "$gid" -m 0700 "$run"
    [ -d "$home" ] || install -d -o "$uid" -g "$gid" -m 0700 "$home"
    [ "$(stat -c %u "$run")" = "$uid" ] || die "$run is not $user's"
}

# Whether pid $1 is a live process named $2 (enginelib.sh) that runs as the user.
is_users() {
    is_live "$1" "$2" && [ "$(awk '/^Uid:/ { print $2 }' "/proc/$1/status" 2>/dev/null)" = "$uid" ]
}

# Whether pid $1 has not ended (nor become a zombie). Not is_users: a process just spawned
# is setsid, setpriv and env before it is the engine, and its name says so for a moment.
not_ended() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    case ${stat%% *} in Z | X | x) return 1 ;; esac
}

# /_ping, not `docker version`: under rootlesskit --net=host, dockerd 26's GET /version panics
# (its RootlessKit details have no network driver), where 20.10's answered.
answers() { curl -sf --max-time 10 --unix-socket "${1#unix://}" http://localhost/_ping >/dev/null 2>&1; }

# Per engine: the process stop signals (its comm), its socket, and how it is started.
engine_of() {
    case $1 in
        docker) comm=rootlesskit socket=$run/docker.sock ;;
        podman) comm=podman socket=$run/podman/podman.sock ;;
        *) die "ENGINE must be docker or podman, not $1" ;;
    esac
    engine=$1
    pidfile=$dir/$engine.pid
    log=$dir/$engine.log
    host=unix://$socket
}

running_pid() {
    local pid
    pid=$(cat "$pidfile" 2>/dev/null) || return 1
    is_users "$pid" "$comm" && echo "$pid"
}

spawn_docker() {
    # dockerd-rootless.sh's rootlesskit flags, bar --net (see the top). The child removes the
    # copied-up /run's links to the host's docker and containerd, as that script's child does.
    # Its own session, so a Ctrl-C meant for the test run does not reach it.
    setsid setpriv --reuid="$uid" --regid="$gid" --clear-groups \
        env -i HOME="$home" XDG_RUNTIME_DIR="$run" PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        rootlesskit --net=host --copy-up=/etc --copy-up=/run --propagation=rslave \
        --state-dir="$run/dockerd-rootless" \
        sh -c 'rm -f /run/docker /run/containerd /run/xtables.lock; exec unshare --net dockerd "$@"' \
        dockerd --iptables=false --ip-forward=false --bridge=none \
        --config-file "$home/.config/docker/daemon.json" \
        -H "$host" --data-root "$home/docker" --exec-root "$run/docker" \
        --pidfile "$run/docker.pid" --shutdown-timeout 2 \
        </dev/null >>"$log" 2>&1 &
    echo $!
}

spawn_podman() {
    setsid setpriv --reuid="$uid" --regid="$gid" --clear-groups \
        env -i HOME="$home" XDG_RUNTIME_DIR="$run" PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        podman system service --time=0 "$host" \
        </dev/null >>"$log" 2>&1 &
    echo $!
}

# The user's configuration of each engine, written by the user: what its own CLI reads too.
configure() {
    case $engine in
        docker)
            # Its own (empty) daemon.json: nothing of the host's /etc/docker applies.
            as_user sh -c 'mkdir -p "$HOME/.config/docker" && echo "{}" >"$HOME/.config/docker/daemon.json"'
            ;;
        podman)
            as_user sh -c 'mkdir -p "$HOME/.config/containers" "$XDG_RUNTIME_DIR/podman" &&
                cat >"$HOME/.config/containers/containers.conf" <<EOF &&
[containers]
default_ulimits = ["nofile=10240:10240", "nproc=4096:4096"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
                printf "[storage]\ndriver = \"vfs\"\n" >"$HOME/.config/containers/storage.conf"'
            ;;
    esac
}

start() {
    local pid end
    user_dirs
    mkdir -p "$dir"
    if ! pid=$(running_pid); then
        # A socket nobody answers on is left over from a crash; one that answers is not ours.
        if [ -S "$socket" ] || [ -L "$socket" ]; then
            answers "$host" && die "another engine already answers on $socket"
            rm -f "$socket"
        fi
        configure
        pid=$(spawn_"$engine")
        echo "$pid" >"$pidfile"
    fi
    end=$((SECONDS + START_DEADLINE))
    until answers "$host"; do
        if ! not_ended "$pid" || [ "$SECONDS" -ge "$end" ]; then
            tail -n 15 "$log" >&2 || true
            die "$user's rootless $engine did not answer on $socket within ${START_DEADLINE}s (log: $log)"
        fi
        sleep 0.1
    done
    # Imported by the user, through the engine's own socket (podman's too: its Docker API).
    if ! as_user DOCKER_HOST="$host" docker image inspect "$IMAGE" >/dev/null 2>&1; then
        image_tar | as_user DOCKER_HOST="$host" docker import "${IMAGE_CHANGES[@]}" - "$IMAGE" \
            >/dev/null || die "$user could not import the test image into its rootless $engine"
    fi
    echo "$host"
}

stop() {
    local pid pause
    if pid=$(running_pid); then
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_gone "$pid" "$comm" "$STOP_DEADLINE"; then
            echo "rootless.sh: $user's $engine ($pid) ignored SIGTERM for ${STOP_DEADLINE}s; sending SIGKILL" >&2
            # With what it started: the engine itself runs in a child, in the user's
            # namespace (rootlesskit's child and dockerd, podman's re-executed self).
            # shellcheck disable=SC2046  # a list of pids
            kill -KILL "$pid" $(descendants "$pid") 2>/dev/null || true
            wait_gone "$pid" "$comm" 10 || die "$user's $engine ($pid) survived SIGKILL"
        fi
    fi
    rm -f "$pidfile"
    # $run/libpod is podman's own: without it, podman never ran for the user since its
    # runtime directory was made, and its CLI would only start a pause process to stop.
    if [ "$engine" = podman ] && [ -d "$run/libpod" ]; then
        # Its containers, each under a conmon of its own, and the pause process that holds the
        # user's namespace: podman's CLI, as the user, stops the first; the second is ended
        # by its pid (from a file of the user's, so only a pid that is the user's own).
        if [ -n "$(as_user podman ps -q 2>/dev/null)" ]; then
            as_user timeout "$STOP_DEADLINE" podman stop --all --time 2 >/dev/null 2>&1 ||
                echo "rootless.sh: $user's podman could not stop its containers" >&2
        fi
        # catatonit where it is installed (the Makefile installs it), else podman itself.
        pause=$(cat "$run/libpod/tmp/pause.pid" 2>/dev/null) || pause=
        for comm in catatonit podman; do
            [ -n "$pause" ] && is_users "$pause" "$comm" || continue
            kill -TERM "$pause" 2>/dev/null || true
            wait_gone "$pause" "$comm" "$STOP_DEADLINE" || kill -KILL "$pause" 2>/dev/null || true
        done
    fi
}

# The pids of the descendants of pid $1.
descendants() {
    ps -e -o pid=,ppid= | awk -v top="$1" '
        { parent[$1] = $2 }
        END {
            found[top] = 1
            do {
                more = 0
                for (p in parent) if (!(p in found) && (parent[p] in found)) { found[p] = 1; more = 1 }
            } while (more)
            for (p in found) if (p != top) print p
        }'
}

# The processes whose real or effective uid is the user's or one of its subordinate ids
# (what runs in its containers): their pids. Not zombies: they have ended, and are their
# parent's (or init's) to reap.
users_processes() {
    local ranges
    ranges=$(awk -F: -v u="$user" '$1 == u { print $2, $2 + $3 - 1 }' /etc/subuid)
    ps -e -o pid=,ruid=,euid=,stat= | awk -v self=$$ -v uid="$uid" -v ranges="$ranges" '
        function ours(id,   i, n, r) {
            if (id == uid) return 1
            n = split(ranges, r, /[ \n]/)
            for (i = 1; i + 1 <= n; i += 2) if (id >= r[i] && id <= r[i + 1]) return 1
            return 0
        }
        $1 != self && $4 !~ /^Z/ && (ours($2) || ours($3)) { print $1 }'
}

purge() {
    local e pids end mnt
    for e in docker podman; do
        engine_of "$e"
        stop
    done
    # Whatever else runs as the user (a container left by a crash, a runner of a test):
    # SIGKILL, by pid, until none is left.
    end=$((SECONDS + PURGE_DEADLINE))
    while pids=$(users_processes) && [ -n "$pids" ]; do
        [ "$SECONDS" -lt "$end" ] || die "processes of $user outlived SIGKILL: $(echo $pids)"
        # shellcheck disable=SC2086  # a list of pids
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    # Nothing of theirs should be mounted on the host (their mounts live in the user's own
    # namespaces), but a crash must not make rm walk into a mount. Innermost first.
    awk -v d="$dir/" -v r="$run/" 'index($5, d) == 1 || index($5, r) == 1 { print $5 }' \
        /proc/self/mountinfo | sort -r | while read -r mnt; do umount -l "$mnt"; done
    rm -rf --one-file-system "$run"
    [ ! -d "$dir" ] || rm -rf --one-file-system "$dir"
}

absolute() {
    case $1 in
        /*) echo "$1" ;;
        *) die "DIR must be an absolute path, not $1" ;;
    esac
}

case ${1-} in
    start | stop)
        [ $# -eq 4 ] || die "usage: $0 $1 docker|podman USER DIR"
        user_of "$3"
        dir=$(absolute "$4")
        engine_of "$2"
        "$1"
        ;;
    purge)
        [ $# -eq 3 ] || die "usage: $0 purge USER DIR"
        user_of "$2"
        dir=$(absolute "$3")
        purge
        ;;
    *) die "usage: $0 start docker|podman USER DIR | stop docker|podman USER DIR | purge USER DIR" ;;
esac
