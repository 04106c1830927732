"""The status document for people: what `exitwatch status` prints, from a running agent's
document or a one-shot scan's."""

from __future__ import annotations

import time

from exitwatch.kinds import registry


def render(status: dict) -> str:
    """The readable view of a status document (of a running agent, or of a one-shot scan)."""
    out = []
    agent = status.get("agent")
    if agent:
        out.append(
            f"exitwatch {agent['version']} (pid {agent['pid']}), up {_age(agent['uptime_s'])}"
        )
        out.append(f"  source:   {agent['source']} ({agent['source_reason']})")
        if agent.get("dry_run"):
            out.append("  dry run:  nothing is removed")
    else:
        out.append("no agent answers: a one-shot scan shows what it would find (nothing removed)")
        skipped = status.get("skipped_markers")
        if skipped:
            noun = "marker" if skipped == 1 else "markers"
            out.append(f"  {skipped} {noun} skipped; `exitwatch reap --dry-run` lists them")
        out += [f"  not listed: {why}" for why in status.get("not_listed", ())]
    if "machine" in status:  # a document of an agent before machine ids has none
        out.append(f"  machine:  {status['machine'] or 'none (no machine id here)'}")
    for reg in registry.KINDS:  # each kind's health, as it words it
        health = status.get(reg.health_key) if reg.health_key else None
        if health:
            out += reg.health_lines(health)
    counters = status.get("counters")
    if counters:
        out.append(
            "  counters: "
            + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(counters.items()))
        )
    if status.get("reconcile"):
        out.append(f"  reconcile: {_reconcile(status['reconcile'])}")
    owners = status.get("owners", [])
    out += ["", f"owners watched: {len(owners)}"]
    for owner in owners:
        out.extend(_owner_lines(owner))
    away = status.get("elsewhere", [])
    if away:
        out += ["", f"other machines' owners, left alone: {len(away)}"]
        for owner in away:
            out.extend(_owner_lines(owner))
    pending = status.get("pending", [])
    out += ["", f"orphans pending: {len(pending)}"]
    for item in pending:
        line = f"  {item['owner']} ({item.get('death', 'dead')}): {', '.join(item['what'])}"
        if item.get("attempt"):
            line += f" [attempt {item['attempt']}, {item.get('state', '')}]"
        out.append(line)
    reaps = status.get("reaps")
    if reaps is not None:
        out += ["", f"recent removals: {len(reaps)}"]
        for reap in reaps:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(reap["time"]))
            out.append(
                f"  {when} {reap['result']}: {reap['what']} owner={reap['owner']} "
                f"death={reap['death']!r} latency={reap['latency_ms']} ms"
            )
    # Paths, project names and errors come from users; each line reaches a terminal.
    return "\n".join(map(_escaped, out))


def _escaped(line: str) -> str:
    """`line` with every unprintable character (ESC, CSI, a newline, a bidi override)
    written as its escape, so no user-chosen name can drive the operator's terminal."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)


def _reconcile(rec: dict) -> str:
    every = f"every {rec['interval_s']:g} s" if rec.get("interval_s") else "only at start"
    last = rec.get("last")
    if not last:
        return f"{every}; the start-up listing is not in yet"
    when = time.strftime("%H:%M:%S", time.localtime(last["at"]))
    if last.get("start_up"):
        text = f"{every}; last at start, {when}"
    else:
        text = (
            f"{every}; last {when}: {last['listed']} listed in {last['took_s']} s, "
            f"{last['missed']} unknown to the index, {last['orphaned']} of dead owners"
        )
        if last.get("errors"):
            text += f"; could not list {'; '.join(last['errors'])}"
    if rec.get("running"):
        text += "; one is listing now"
    return text


def _owner_lines(owner: dict) -> list[str]:
    name = f", {owner['name']}" if owner.get("name") else ""
    where = f", {owner['why']}" if owner.get("why") else ""
    lines = [f"  {owner['owner']} (pid {owner['pid']}{name}{where})"]
    for reg in registry.KINDS:
        lines += reg.lines(owner)
    return lines


def _age(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s"
