"""The soak (`make soak`): owners of every kind die at random, continuously, while others
live, under one real agent, for SOAK_SECONDS (default 600); at the end no dead owner's
resource of any kind is left, no live owner's is gone, and every hook ran as its contract
says. The agent's RSS, fds and threads, and the RSS of the services the owners run through
(`exitwatch run`'s wrappers, the adopt service), are sampled throughout and printed as a
table, then a JSON summary. Exits 1 with one line for each violation. Not collected by
pytest.

Each kind of owner is an **actor** (`actor.Actor`), a module of its own, on a thread of its
own: it keeps a pool of live owners full, ends one at random each round (SIGKILL, mostly)
and makes another, checks after each round that none of its live owners lost anything, and
at the end says what its dead owners left and what else its contract was owed:

    plain.py   owners with a container, a compose project (v1 and v2) and a workdir
    runs.py    `exitwatch run` runs: containers, a network, a named volume, TMPDIR files
               and a setsid leftover; CMD or the wrapper SIGKILLed, half each
    hooks.py   owners with on-death hooks, of three unprivileged users (one of them
               filling its lane with slow hooks), some failing once, some cancelled
    adopt.py   runner containers on one `exitwatch adopt` socket, each instance making
               sandboxes (a network and volumes, half of them) through it; `docker
               kill`ed, or `docker restart`ed, whose new instance is an owner of its own

    sampling.py  the agent's and the actors' services' figures, every SAMPLE_EVERY s
    checks.py    the end: leaks given time to go, the actors' contracts, the audit log's
                 latencies, the agent's warnings
    report.py    the tables and the JSON summary

SOAK_SECONDS sets the length, SOAK_SOURCE (default auto) the exit source, SOAK_SEED the
random choices.
"""
