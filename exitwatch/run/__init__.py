"""The runner's side: the commands a runner uses (labels, mark, on-death: cli.py), and
`exitwatch run` (supervise.py), which runs an unmodified runner as one owner behind a
labelling Docker socket of its own, in directories that dirs.py places, makes and removes.

It may import exitwatch.proxy (the socket), exitwatch.contract, exitwatch.owner,
exitwatch.procfs and the kinds whose removal `exitwatch run` reuses; never
exitwatch.adopt, the agent or the service.
"""
