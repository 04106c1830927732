"""The agent's loop: exit hints in, owners confirmed dead, their resources
removed, and what happened recorded.

loop.py owns the index (index.py), the queue every input arrives on and the owners to
judge or watch again (rechecks.py), and tells once of other machines' owners, which it
leaves alone (elsewhere.py); removals.py runs the removal jobs, reconcile.py the
periodic full listings, record.py and audit.py write down every outcome. It may import
exitwatch.owner, exitwatch.procfs, exitwatch.sources.base and exitwatch.kinds.base: it
drives kinds through their one interface and knows none by name.
"""
