"""`make bench`: exitwatch measured against the engine, the kernel and baselines in one run."""
