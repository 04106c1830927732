# exitwatch: `make run` and `make test` work on a fresh Debian 12 machine, as root.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# Debian's own interpreter and bookworm's libraries: what the .deb runs on.
DEBIAN_PY := /usr/bin/python3

# The same names on Debian 12 and 13 (tests/debian13.sh installs them on trixie), bar the
# release's own below. docker-compose: v1 (1.29) on 12, v2 on 13, where the suite takes v1
# from PyPI (tests/support/tools.py). prometheus: for its promtool, which checks packaging/prometheus/
# (tests/system/test_prometheus_rules.py). man-db, groff-base: `man -l` renders the man
# pages, and systemd's systemd-analyze checks the unit (tests/system/test_deb.py).
# e2fsprogs: chattr, for undeletable files; git: the suite reads the checkout. A normal
# install has those three already; a minimal or container one may not. python3-setuptools:
# the offline wheel build of tests/system/test_bpf_object.py (Debian 12 pulls it in, 13 not).
# podman, podman-compose: the rootful podman of tests/support/podman.sh (4.3 and 1.0.3 on 12,
# 5.4 and 1.3 on 13; rootful, so neither uidmap nor slirp4netns); catatonit: the init of the
# pause image podman builds for a pod's infra container (only recommended by podman), and a
# rootless podman's pause process. rootlesskit, uidmap (newuidmap): a real user's rootless
# dockerd and podman (tests/support/rootless.sh; docker.io has the rootless dockerd).
APT_PACKAGES := docker.io docker-compose podman podman-compose catatonit busybox-static python3-venv python3-setuptools \
	python3-psutil python3-docker python3-click python3-prometheus-client python3-h11 \
	python3-pytest python3-pytest-xdist python3-hypothesis \
	clang libbpf-dev gcc util-linux forkstat curl prometheus iproute2 man-db groff-base \
	systemd e2fsprogs git rootlesskit uidmap
# The release, from /etc/os-release: 13 moved the docker CLI out of docker.io into
# docker-cli, which docker.io only Recommends (so an apt set not to install
# recommendations would leave the suite without `docker`). 12 has no docker-cli package.
DEBIAN_RELEASE := $(shell . /etc/os-release 2>/dev/null && echo "$$VERSION_ID")
APT_PACKAGES_13 := docker-cli
APT_PACKAGES += $(APT_PACKAGES_$(DEBIAN_RELEASE))

.PHONY: all deps apt venv test test-unit lint run clean

all: deps

include exitwatch/sources/Makefile.bpf

deps: apt venv bpf

# Installs only what is missing, so a ready machine pays nothing.
apt:
	@missing=""; for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "apt: installing$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml | apt
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q --upgrade -e '.[test]' ruff mypy
	touch $@

# mypy checks the modules whose typed dictionaries are the status document, the kinds'
# health and the gauges (service/status/schema.py), and what builds and serves them, against
# docs/operations.md's schema; [tool.mypy] in pyproject.toml names them.
lint: venv
	$(VENV)/bin/ruff check exitwatch tests bench packaging
	$(VENV)/bin/ruff format --check exitwatch tests bench packaging
	$(VENV)/bin/mypy

# The suite twice, side by side: under the newest PyPI libraries (the venv), and under
# Debian's python3 with bookworm's packages (what the .deb depends on). The files that drive
# a library run in both; the few that run in one are tests/conftest.py's ONE_PASS (the
# venv's: the package, the runners, the bench's smoke). Each pass spreads its test files
# over pytest-xdist workers, each with a private engine of its own: TEST_WORKERS for the
# Debian pass, one more for the venv's. Each pass writes its own log under build/test/,
# shown whole once both are done; the target fails if either does. TEST_WORKERS (a number; 0
# runs each pass in one process, as pytest alone does): tests/README.md, "Where the time
# goes". Each pass is started as a process group of its own (set -m: a background job of a
# shell without job control ignores SIGINT), so that a ^C reaches its workers, whose
# fixtures then clean up.
TEST_LOGS := build/test
TEST_WORKERS ?= 2
TEST_XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(1) --dist loadfile)
test: deps lint
	@mkdir -p $(TEST_LOGS)
	@start=$$(date +%s); \
	set -m; \
	$(VPY) -m pytest -q --pass venv $(call TEST_XDIST,$$(( $(TEST_WORKERS) + 1 ))) \
		>$(TEST_LOGS)/venv.log 2>&1 & venv=$$!; \
	PYTHONPATH=$(CURDIR) $(DEBIAN_PY) -m pytest -q -p no:cacheprovider --pass debian \
		$(call TEST_XDIST,$(TEST_WORKERS)) \
		>$(TEST_LOGS)/debian.log 2>&1 & debian=$$!; \
	set +m; \
	trap 'kill -INT -- -$$venv -$$debian 2>/dev/null; wait; exit 130' INT TERM; \
	wait $$venv; rv=$$?; wait $$debian; rd=$$?; \
	for pass in venv debian; do \
		echo "== $$pass pass ($(TEST_LOGS)/$$pass.log)"; cat $(TEST_LOGS)/$$pass.log; \
	done; \
	echo "== venv pass: exit $$rv; debian pass: exit $$rd; $$(( $$(date +%s) - start )) s in all"; \
	[ $$rv -eq 0 ] && [ $$rd -eq 0 ]

# tests/unit alone (tests/README.md): no root, no engine, no network; seconds. Any user can
# run it, with the venv's python or another with the test extras: make test-unit VPY=python3
test-unit:
	$(VPY) -m pytest -q tests/unit

# A Docker engine is started on the default socket if none answers there.
run: deps
	@if ! docker -H unix:///var/run/docker.sock version >/dev/null 2>&1; then \
		tests/support/engine.sh start /var/lib/exitwatch-engine /var/run/docker.sock; \
	fi
	$(VENV)/bin/exitwatch agent $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# The Debian packages in dist/ (packaging/build-deb.sh, packaging/README.md).
.PHONY: deb
deb:
	packaging/build-deb.sh

# Benchmarks against the real engine and kernel, with their baselines in the same run
# (docs/benchmarks.md). Never part of `make test`; tests/engine/test_bench_smoke.py runs the smoke.
BENCH_BIN := build/bench

.PHONY: bench bench-smoke bench-bins

bench-bins: $(BENCH_BIN)/forkloop $(BENCH_BIN)/cnfloor

$(BENCH_BIN)/%: bench/%.c
	@mkdir -p $(BENCH_BIN)
	gcc -O2 -Wall -Wextra -o $@ $<

bench: deps bench-bins
	$(VPY) -m bench.run

bench-smoke: deps bench-bins
	$(VPY) -m bench.run --smoke --results $(BENCH_BIN)/results-smoke.json --docs ''

# Debian 13 (trixie) for real (tests/debian13.sh): the .debs installed and reaping in a
# debootstrapped trixie root, then `make test` in it, pivot_rooted into, on trixie's engine
# and Python. Slow; never part of `make test`. ARGS: --reuse and/or pytest arguments.
.PHONY: test-debian13
test-debian13:
	tests/debian13.sh $(ARGS)

# The .debs under a real systemd (tests/systemd/vm.sh): a Debian VM image built from Debian's
# packages, booted under qemu (software emulation), the tree's packages installed, upgraded,
# run and removed there, with end-to-end checks over ssh. Slow; never part of `make test`
# nor .ci/run (tests/README.md). RELEASE: bookworm (the default, Debian 12) or trixie
# (Debian 13), each with its own cached image. ARGS: --reuse (the release's cached image
# whatever its key) and/or --keep.
RELEASE ?= bookworm
.PHONY: test-systemd
test-systemd:
	tests/systemd/vm.sh --release $(RELEASE) $(ARGS)

# The soak (docs/reliability.md): owners die at random for SOAK_SECONDS (default 600) while
# others live; fails on a leak or a wrong removal. Never part of `make test`.
.PHONY: soak
soak: deps
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests $(VPY) -m soak

# docker-py's own integration suite, run directly and through both proxies (`exitwatch adopt`,
# `exitwatch run`) against a private engine, each test's outcome compared with the direct
# path's (tests/dockerpy/check.py; tests/README.md, "docker-py's suite through the
# proxies"). About 11 minutes here: never part of `make test`. ARGS: check.py's options.
.PHONY: test-dockerpy
test-dockerpy: venv
	PYTHONPATH=$(CURDIR) $(VPY) tests/dockerpy/check.py $(ARGS)

# docs/hooks.md's remote-sandbox recipes (Daytona, E2B, Modal, Prime Intellect, plain HTTP)
# against each provider's package from PyPI, each in a venv of its own under build/recipes/
# (tests/recipes/check.py; docs/hooks.md, "How these were checked"). It needs PyPI and root
# (unshare -n): never part of `make test`. RECIPES_LATEST=1: each package's newest release
# instead of the version the page names. ARGS: check.py's options (--only daytona,http).
.PHONY: test-recipes
test-recipes: apt
	$(PYTHON) tests/recipes/check.py --python $(PYTHON) $(if $(RECIPES_LATEST),--latest) $(ARGS)
