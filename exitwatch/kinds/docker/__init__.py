"""Containers labelled with an owner, with their compose projects, networks and volumes.

kind.py is the kind; engine.py is the narrow Docker client it uses, unixhttp.py the one
call made straight over the socket, compose.py the rule of which project members are
the owner's, networks.py what an ended run leaves beside its containers.
"""

import sys


def _import_sdk() -> None:
    """Import docker-py past setuptools' distutils shim, when setuptools is installed.

    docker-py before 6 (bookworm's 5.0.3) imports distutils.spawn for one function. The
    shim (setuptools' distutils-precedence.pth puts it first on sys.meta_path) answers
    that import with setuptools' own distutils, which imports all of setuptools and
    pkg_resources first: 0.3 s of CPU more at each start of the agent, `exitwatch reap` and
    `run`'s cleanup, as much as the SDK itself. The standard library's distutils, which
    python3-docker depends on, does the same job. Where there is none (Python 3.12 on),
    the shim's it is."""
    shims = [(i, f) for i, f in enumerate(sys.meta_path) if type(f).__module__ == "_distutils_hack"]
    for _, shim in shims:
        sys.meta_path.remove(shim)

    def restore() -> None:
        for i, shim in shims:
            sys.meta_path.insert(i, shim)
        shims.clear()

    try:
        import docker
    except ImportError:
        restore()
        import docker  # noqa: F401
    finally:
        restore()


_import_sdk()
