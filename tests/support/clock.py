"""A wall clock shifted for one process alone: an LD_PRELOAD shim over clock_gettime
(CLOCK_REALTIME and its coarse and TAI kin), gettimeofday and time(), built with gcc.

A time namespace shifts only CLOCK_MONOTONIC and CLOCK_BOOTTIME, never the wall clock (and
the agent refuses to run in one), so a test that steps the wall clock under the process it
tests does it this way. The shift is read from a file at every call, so a test can step a
running process's clock: `Shift.set(-3600)` puts it an hour behind.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*gettime_fn)(clockid_t, struct timespec *);
typedef int (*gettimeofday_fn)(struct timeval *, void *);

static int shift_fd = -2;

/* Nanoseconds to add, from the file named by EXITWATCH_TEST_CLOCK_SHIFT (seconds). */
static long long shift_ns(void) {
    if (shift_fd == -2) {
        const char *path = getenv("EXITWATCH_TEST_CLOCK_SHIFT");
        shift_fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    }
    if (shift_fd < 0)
        return 0;
    char buf[64];
    ssize_t n = pread(shift_fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    return (long long)(strtod(buf, NULL) * 1e9);
}

static int wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static gettime_fn real;
    if (!real)
        real = (gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && wall(id)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns();
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    static gettimeofday_fn real;
    if (!real)
        real = (gettimeofday_fn)dlsym(RTLD_NEXT, "gettimeofday");
    int rc = real(tv, tz);
    if (rc == 0 && tv) {
        long long us = (long long)tv->tv_sec * 1000000LL + tv->tv_usec + shift_ns() / 1000;
        tv->tv_sec = us / 1000000LL;
        tv->tv_usec = us % 1000000LL;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
"""
# Fixed width, written in place: a reader's pread never sees a short or empty file.
_FORMAT = "{:+021.6f}\n"


class Shift:
    """The shim, built in `where`, and the file that holds its shift in seconds (0 at
    first). `env()` is what a process needs in its environment to run shifted."""

    def __init__(self, where: Path) -> None:
        source = where / "clockshift.c"
        source.write_text(SHIM_C)
        self.library = where / "clockshift.so"
        subprocess.run(
            ["gcc", "-O2", "-Wall", "-fPIC", "-shared", "-o", str(self.library), str(source)],
            check=True,
            capture_output=True,
        )
        self.path = where / "clockshift"
        self.path.write_text(_FORMAT.format(0))

    def set(self, seconds: float) -> None:
        with open(self.path, "r+") as f:
            f.write(_FORMAT.format(seconds))

    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.library), "EXITWATCH_TEST_CLOCK_SHIFT": str(self.path)}
