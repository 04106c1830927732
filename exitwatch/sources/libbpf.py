"""Raw ctypes bindings to the few libbpf 1.x calls the eBPF source makes.

Nothing here knows what the program does. Each call raises OSError with the errno libbpf
reported; libbpf's own messages go to this module's logger at debug level.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from typing import Any

log = logging.getLogger(__name__)

# The 1.x soname: 0.x returned error pointers unless put in strict mode, which these
# bindings do not handle.
SONAME = "libbpf.so.1"
BPF_ANY = 0

_p = ctypes.c_void_p
_i = ctypes.c_int

# int (*ring_buffer_sample_fn)(void *ctx, void *data, size_t size)
SampleFn = ctypes.CFUNCTYPE(_i, _p, _p, ctypes.c_size_t)
# int (*libbpf_print_fn_t)(enum libbpf_print_level, const char *, va_list). A va_list
# argument reaches the callee as a pointer on x86-64 (and by reference on arm64), so it
# can be handed on to vsnprintf as an opaque pointer.
_PrintFn = ctypes.CFUNCTYPE(_i, _i, ctypes.c_char_p, _p)

# name: (restype, argtypes). Pointer results must be c_void_p, or ctypes truncates them
# to a C int.
_PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "bpf_object__open_file": (_p, [ctypes.c_char_p, _p]),
    "bpf_object__load": (_i, [_p]),
    "bpf_object__close": (None, [_p]),
    "bpf_object__find_map_by_name": (_p, [_p, ctypes.c_char_p]),
    "bpf_object__find_program_by_name": (_p, [_p, ctypes.c_char_p]),
    "bpf_map__set_max_entries": (_i, [_p, ctypes.c_uint32]),
    "bpf_map__fd": (_i, [_p]),
    "bpf_program__attach": (_p, [_p]),
    "bpf_link__destroy": (_i, [_p]),
    "ring_buffer__new": (_p, [_i, SampleFn, _p, _p]),
    "ring_buffer__epoll_fd": (_i, [_p]),
    "ring_buffer__consume": (_i, [_p]),
    "ring_buffer__free": (None, [_p]),
    "bpf_map_update_elem": (_i, [_i, _p, _p, ctypes.c_uint64]),
    "bpf_map_lookup_elem": (_i, [_i, _p, _p]),
    "bpf_map_delete_elem": (_i, [_i, _p]),
    "libbpf_set_print": (_p, [_PrintFn]),
}

_LEVELS = ("warn", "info")
_LIBBPF_DEBUG = 2  # enum libbpf_print_level


def _vsnprintf() -> Any:
    fn = ctypes.CDLL(None).vsnprintf
    fn.restype = _i
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, _p]
    return fn


_format = _vsnprintf()


@_PrintFn
def _print_to_log(level: int, fmt: bytes, args: int) -> int:
    # libbpf would print straight to stderr; a daemon wants it in its own log. Its debug
    # level (every CO-RE relocation) is dropped, as libbpf's own printer does.
    if level < _LIBBPF_DEBUG and log.isEnabledFor(logging.DEBUG):
        buf = ctypes.create_string_buffer(1024)
        _format(buf, len(buf), fmt, args)
        log.debug("libbpf %s: %s", _LEVELS[level], buf.value.decode(errors="replace").rstrip())
    return 0


def _error(call: str, err: int) -> OSError:
    return OSError(err, f"{call}: {os.strerror(err)}")


class Libbpf:
    """libbpf.so.1 with the prototypes set. Opening it raises OSError if it is missing."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(SONAME, use_errno=True)
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        lib.libbpf_set_print(_print_to_log)
        self._lib = lib

    def _ptr(self, call: str, *args: Any) -> int:
        # libbpf 1.x returns NULL and sets errno for every pointer-returning call.
        ptr = getattr(self._lib, call)(*args)
        if not ptr:
            raise _error(call, ctypes.get_errno() or errno.EINVAL)
        return ptr

    def _int(self, call: str, *args: Any) -> int:
        # ...and a negative errno for every int-returning one.
        ret = getattr(self._lib, call)(*args)
        if ret < 0:
            raise _error(call, -ret)
        return ret

    def open_object(self, path: str) -> int:
        return self._ptr("bpf_object__open_file", os.fsencode(path), None)

    def load_object(self, obj: int) -> None:
        self._int("bpf_object__load", obj)

    def close_object(self, obj: int) -> None:
        self._lib.bpf_object__close(obj)

    def find_map(self, obj: int, name: str) -> int:
        return self._ptr("bpf_object__find_map_by_name", obj, name.encode())

    def find_program(self, obj: int, name: str) -> int:
        return self._ptr("bpf_object__find_program_by_name", obj, name.encode())

    def set_max_entries(self, bpf_map: int, entries: int) -> None:
        self._int("bpf_map__set_max_entries", bpf_map, entries)

    def map_fd(self, bpf_map: int) -> int:
        return self._int("bpf_map__fd", bpf_map)

    def attach(self, prog: int) -> int:
        return self._ptr("bpf_program__attach", prog)

    def destroy_link(self, link: int) -> None:
        self._lib.bpf_link__destroy(link)

    def ring_buffer_new(self, map_fd: int, callback: Any) -> int:
        """`callback` is a SampleFn; the caller keeps it referenced while the ring lives."""
        return self._ptr("ring_buffer__new", map_fd, callback, None, None)

    def ring_buffer_epoll_fd(self, rb: int) -> int:
        return self._int("ring_buffer__epoll_fd", rb)

    def ring_buffer_consume(self, rb: int) -> int:
        """Run the callback for every record ready now, without blocking."""
        return self._int("ring_buffer__consume", rb)

    def ring_buffer_free(self, rb: int) -> None:
        self._lib.ring_buffer__free(rb)

    def update_u32_u64(self, fd: int, key: int, value: int) -> None:
        k, v = ctypes.c_uint32(key), ctypes.c_uint64(value)
        self._int("bpf_map_update_elem", fd, ctypes.byref(k), ctypes.byref(v), BPF_ANY)

    def lookup_u32_u64(self, fd: int, key: int) -> int:
        k, v = ctypes.c_uint32(key), ctypes.c_uint64()
        self._int("bpf_map_lookup_elem", fd, ctypes.byref(k), ctypes.byref(v))
        return v.value

    def delete_u32(self, fd: int, key: int) -> None:
        k = ctypes.c_uint32(key)
        self._int("bpf_map_delete_elem", fd, ctypes.byref(k))
