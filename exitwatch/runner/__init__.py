"""The runner's side: the commands a runner uses (labels, mark, on-death), and
`exitwatch run`, which adopts an unmodified runner through a labelling Docker socket.

It may import exitwatch.contract, exitwatch.owner, exitwatch.procfs and the kinds whose
removal `exitwatch run` reuses; never the agent or the service.
"""
