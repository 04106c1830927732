# shellcheck shell=bash
# What engine.sh (dockerd) and podman.sh (podman) share, sourced by both: whether a pid is
# the engine still, waiting for it to end, and the test image's rootfs and settings.

# The test image, exitwatch-test/busybox:latest, needs no registry: a rootfs of busybox-static
# and its applet links in /bin, imported. Its default command sleeps forever but, unlike a
# bare `sleep infinity` as pid 1, ends on SIGTERM: a 10 s stop timeout per container would
# otherwise slow down every stop and every engine stop.
IMAGE=exitwatch-test/busybox:latest
IMAGE_CHANGES=(
    --change 'ENV PATH=/bin'
    --change 'CMD ["sh", "-c", "trap \"exit 0\" TERM; sleep infinity & wait"]'
)

# Whether pid $1 is a live process named $2. A zombie has exited, and where nobody reaps
# it, it keeps its pid; an unrelated process may have been given the pid of an engine that
# died long ago.
is_live() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] || return 1
    stat=${stat##*) }
    case ${stat%% *} in Z | X | x) return 1 ;; esac
}

wait_gone() { # pid name deadline-seconds
    local end=$((SECONDS + $3))
    while is_live "$1" "$2"; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.1
    done
}

# The test image's rootfs, as a tar stream on stdout.
image_tar() {
    local rootfs applet
    rootfs=$(mktemp -d)
    mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
    cp /bin/busybox "$rootfs/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -s busybox "$rootfs/bin/$applet"
    done
    echo 'root:x:0:0:root:/:/bin/sh' >"$rootfs/etc/passwd"
    tar -C "$rootfs" -c .
    rm -rf "$rootfs"
}
