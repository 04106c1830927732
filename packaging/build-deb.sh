#!/bin/bash
# Build the Debian packages into dist/ (`make deb`):
#   dist/exitwatch_<version>_all.deb        the agent, the unit, the conffile, the man pages
#   dist/exitwatch-bpf_<version>_<arch>.deb the eBPF object (see packaging/README.md)
# Installs the build dependencies (debian/control's Build-Depends) and lintian with apt.
# The build runs in a temporary copy of the tree with packaging/debian as its debian/, so
# the repository never gets a ./debian or build leftovers.
set -euo pipefail

# Debian's own python3 and tools only: pyenv's python3 may come first on the caller's PATH.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

die() { echo "build-deb.sh: $*" >&2; exit 1; }

# sed, not python3: a fresh machine may have no python3 before the build dependencies.
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
[ -n "$version" ] || die "no version in pyproject.toml"

tmp=$(mktemp -d /tmp/exitwatch-deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
src=$tmp/exitwatch-$version
mkdir "$src"
# What the build reads: the package, its metadata, and the packaging. The tree's eBPF
# object is left out so that the package build compiles its own.
tar -c --exclude=__pycache__ --exclude='*.bpf.o' --exclude='*.pyc' \
    pyproject.toml README.md exitwatch packaging | tar -C "$src" -x
cp -r packaging/debian "$src/debian"

export DEBIAN_FRONTEND=noninteractive
# Ask apt only when something is missing, so a ready machine builds offline.
if ! (cd "$src" && dpkg-checkbuilddeps) 2>/dev/null || ! command -v lintian >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends dpkg-dev lintian >/dev/null
    apt-get build-dep -y -qq "$src" >/dev/null
fi

changelog=$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version 2>/dev/null) ||
    die "cannot read packaging/debian/changelog"
[ "$changelog" = "$version" ] ||
    die "packaging/debian/changelog is at $changelog but pyproject.toml at $version: add a changelog entry"

(cd "$src" && dpkg-buildpackage -us -uc -b)

mkdir -p dist
# Older builds of these packages would be picked up by `apt install dist/*.deb`.
rm -f dist/exitwatch_*.deb dist/exitwatch-bpf_*.deb dist/exitwatch_*.changes dist/exitwatch_*.buildinfo
mv "$tmp"/*.deb "$tmp"/*.changes "$tmp"/*.buildinfo dist/
ls -1 dist/exitwatch*_"$version"_*.deb
