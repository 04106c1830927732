"""What the tests share, imported as `from support.procs import ...` (tests/conftest.py
puts tests/ on sys.path): real processes (procs), real agent processes and the container
helpers of the end-to-end tests (agentproc), the private engines (engine; engine.sh for
dockerd, podman.sh for a rootful podman, enginelib.sh what they source), a real user's
rootless dockerd and podman (rootless; rootless.sh), the unprivileged user (users), tools
and runners from PyPI (tools, runners), and the one fake
resource kind of the unit tests (things)."""
