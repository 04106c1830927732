"""The results as targets met or missed, and as rows of figures: a table for the terminal, and
the rows of docs/benchmarks.md (page.py).

Only measured figures appear: a section that did not run, or a source that was unavailable,
shows as such rather than as a number."""

from __future__ import annotations

_Q = ("p50", "p95", "p99", "max")
# The engines section's reap-latency runs: its key, and who it is in the report.
_PODMANS = (("rootful_podman", "rootful podman"), ("rootless_podman", "rootless podman"))


def _check(
    out: list, section: str, name: str, value: float | int | None, op: str, limit: float
) -> None:
    if value is None:
        return  # not measured, not reported
    met = value <= limit if op == "<=" else value < limit if op == "<" else value >= limit
    out.append({"section": section, "target": f"{name} {op} {limit:g}", "value": value, "met": met})


def _failed(v: object) -> bool:
    return isinstance(v, dict) and "error" in v


def _measured(results: dict) -> dict:
    """The sections that ran to the end."""
    return {k: v for k, v in results["sections"].items() if not _failed(v)}


def targets(results: dict) -> list[dict]:
    s = _measured(results)
    out: list[dict] = []
    for r in s.get("latency", []):
        if "unavailable" in r:
            continue
        src = r["source"]
        if src == "netlink":
            _check(out, "latency", "netlink overhead p95 ms", r["overhead_ms"].get("p95"), "<=", 50)
        if src == "poll":
            _check(
                out,
                "latency",
                "poll overhead p99 ms (interval + 50)",
                r["overhead_ms"].get("p99"),
                "<=",
                r["poll_interval_s"] * 1000 + 50,
            )
        else:
            _check(out, "latency", f"{src} workdir p99 ms", r["workdir_ms"].get("p99"), "<=", 100)
        _check(out, "latency", f"{src} missed", r["missed"], "<=", 0)
    for r in s.get("storm", []):
        if "unavailable" in r:
            continue
        v = r["variant"]
        _check(out, "storm", f"{v} missed", r["missed"], "<=", 0)
        _check(out, "storm", f"{v} late (> 2 s)", r["late"], "<=", 0)
        if v != "netlink-nofilter":
            _check(out, "storm", f"{v} agent CPU per exit / floor", r["agent_vs_floor"], "<=", 1.5)
            _check(
                out, "storm", f"{v} forkstat CPU per exit / agent", r["forkstat_vs_agent"], ">=", 3
            )
    for r in s.get("hooks", []):
        if "unavailable" not in r:
            src = r["source"]
            _check(
                out,
                "hooks",
                f"{src} SIGKILL to hook overhead p95 ms",
                r["overhead_ms"].get("p95"),
                "<=",
                20,
            )
            _check(out, "hooks", f"{src} missed", r["missed"], "<=", 0)
    wd = s.get("watchdog")
    if wd and "unavailable" not in wd:
        # The promise: a hung runner is ended and reaped within its timeout plus a
        # second; its hook starting is the last of that.
        late = wd["late_ms"].get("p95")
        _check(
            out, "watchdog", "timeout to hook started, past the timeout, p95 ms", late, "<=", 1000
        )
        _check(out, "watchdog", "missed", wd["missed"], "<=", 0)
    if "wrapper" in s:
        w = s["wrapper"]
        overhead = w["create_start_ms"]["overhead"].get("p95")
        _check(out, "wrapper", "create+start overhead p95 ms", overhead, "<=", 5)
        _check(out, "wrapper", "stream throughput / direct", w["stream"]["ratio"], ">=", 0.9)
        _check(out, "wrapper", "wrapper RSS MB", w["wrapper_rss_mb"], "<=", 40)
        _check(out, "wrapper", f"failures of {w['clients']} clients", w["client_failures"], "<=", 0)
    if "adopt" in s:
        a = s["adopt"]
        ping = a["ping_ms"]["overhead"].get("p95")
        _check(out, "adopt", "new connection + _ping overhead p95 ms", ping, "<=", 1)
        cs = a["create_start_ms"]["overhead"].get("p50")
        _check(out, "adopt", "create+start overhead p50 ms", cs, "<=", 3)
        _check(out, "adopt", "stream throughput / direct", a["stream"]["ratio"], ">=", 0.95)
        lists = a["list"]
        what = f"GET /containers/json, {lists['clients']} clients, throughput / direct"
        _check(out, "adopt", what, lists["ratio"], ">=", 0.9)
        _check(out, "adopt", f"failures of {a['clients']} clients", a["client_failures"], "<=", 0)
        rss = max(a["adopt_rss_mb_peak"], a["cp"]["rss_mb"])
        _check(out, "adopt", "adopt RSS MB (serving, and during the cp)", rss, "<=", 60)
    if "idle" in s:
        _check(out, "idle", "agent CPU %", s["idle"]["cpu_pct"], "<", 0.5)
        _check(out, "idle", "agent RSS MB", s["idle"]["rss_mb"], "<", 60)
    if "scale" in s:
        sc = s["scale"]
        _check(out, "scale", "reconcile time / docker ps", sc["reconcile"]["ratio"], "<=", 1.5)
        _check(
            out,
            "scale",
            "bulk reap throughput / docker rm -f",
            sc["bulk"]["throughput_ratio"],
            ">=",
            1.0,
        )
        w = sc["workdirs"]
        _check(out, "scale", "workdir start-up reconcile / find", w["ratio"], "<=", 1.5)
        _check(out, "scale", "workdir periodic reconcile / find", w["periodic_ratio"], "<=", 1.5)
    if "engines" in s:
        e = s["engines"]
        for key, who in _PODMANS:
            r = e.get(key, {"unavailable": "not run"})
            if "unavailable" not in r:
                what = f"{who} SIGKILL to container gone, overhead p95 ms"
                _check(out, "engines", what, r["overhead_ms"].get("p95"), "<=", 10)
                _check(out, "engines", f"{who} missed", r["missed"], "<=", 0)
        i, n = e["idle"], e["engines"]
        _check(out, "engines", f"idle agent CPU, {n} engines / one", i["cpu_pct_ratio"], "<=", 1.2)
        _check(out, "engines", f"idle agent RSS, {n} engines / one", i["rss_mb_ratio"], "<=", 1.2)
    return out


def _dist(d: dict) -> str:
    if not d.get("n", 1):
        return "none"
    return " / ".join(f"{d[q]:.1f}" for q in _Q if q in d)


def rows(results: dict) -> list[tuple[str, str, str]]:
    """(section, figure, value) for everything measured."""
    s = _measured(results)
    out = [(k, "failed", v["error"]) for k, v in results["sections"].items() if _failed(v)]
    dist = "p50 / p95 / p99 / max ms"
    for r in s.get("latency", []):
        out += _latency("latency", r["source"], r)
    for r in s.get("storm", []):
        v = r["variant"]
        if "unavailable" in r:
            out.append(("storm", v, f"unavailable: {r['unavailable']}"))
            continue
        per = r["cpu_s_per_100k_exits"]
        out += [
            (
                "storm",
                f"{v}: exits/s ({r['loops']} loops, {r['seconds']:g} s)",
                str(r["exits_per_s"]),
            ),
            ("storm", f"{v}: exit source", str(r.get("source_line"))),
            ("storm", f"{v}: missed / late of {r['owners']}", f"{r['missed']} / {r['late']}"),
            (
                "storm",
                f"{v}: times events were lost / resyncs (the agent's counters)",
                f"{r.get('events_lost')} / {r['resyncs']}",
            ),
            ("storm", f"{v}: reap {dist}", _dist(r["container_ms"])),
            (
                "storm",
                f"{v}: CPU s per 100k exits, every reader of this storm",
                ", ".join(f"{k} {x:.2f}" for k, x in per.items()),
            ),
            ("storm", f"{v}: agent / floor", str(r["agent_vs_floor"])),
        ]
        if r.get("reader_vs_floor") is not None:
            out.append(("storm", f"{v}: reader thread / floor", str(r["reader_vs_floor"])))
        if r.get("forkstat_vs_agent") is not None:
            out.append(("storm", f"{v}: forkstat / agent", str(r["forkstat_vs_agent"])))
        if r.get("floor_reader"):
            out.append(("storm", f"{v}: floor reader ENOBUFS", str(r["floor_reader"]["enobufs"])))
        if r.get("bpf"):
            b = r["bpf"]
            out.append(
                (
                    "storm",
                    f"{v}: BPF program ns per run ({b['run_cnt']} runs)",
                    str(b["ns_per_run"]),
                )
            )
    for r in s.get("hooks", []):
        src = r["source"]
        if "unavailable" in r:
            out.append(("hooks", src, f"unavailable: {r['unavailable']}"))
            continue
        out += [
            ("hooks", f"{src}: SIGKILL -> hook started, {dist}", _dist(r["hook_ms"])),
            ("hooks", f"{src}: floor, plain fork+exec, {dist}", _dist(r["plain_ms"])),
            (
                "hooks",
                f"{src}: overhead, per trial (ours - the plain start run just before), {dist}",
                _dist(r["overhead_ms"]),
            ),
            ("hooks", f"{src}: trials", f"{r['trials']} trials, {r['missed']} missed"),
        ]
    wd = s.get("watchdog")
    if wd and "unavailable" in wd:
        out.append(("watchdog", wd["source"], f"unavailable: {wd['unavailable']}"))
    elif wd:
        t = f"{wd['timeout_s']:g} s"
        out += [
            (
                "watchdog",
                f"timeout ({t}) -> hook started, past the timeout, {dist}",
                _dist(wd["late_ms"]),
            ),
            ("watchdog", f"floor, SIGKILL -> hook started, {dist}", _dist(wd["kill_ms"])),
            (
                "watchdog",
                f"overhead, per trial (ours - the SIGKILL trial next to it), {dist}",
                _dist(wd["overhead_ms"]),
            ),
            ("watchdog", "trials", f"{wd['trials']} trials, {wd['missed']} missed"),
        ]
    if "wrapper" in s:
        w = s["wrapper"]
        cs, ping, st = w["create_start_ms"], w["ping_ms"], w["stream"]
        out += [
            ("wrapper", f"`docker run -d` create+start, direct, {dist}", _dist(cs["direct"])),
            ("wrapper", f"create+start through the run's socket, {dist}", _dist(cs["run"])),
            (
                "wrapper",
                f"create+start overhead, per trial (socket - direct beside it), {dist}",
                _dist(cs["overhead"]),
            ),
            (
                "wrapper",
                f"`_ping` on a new connection, overhead per trial, {dist}",
                _dist(ping["overhead"]),
            ),
            (
                "wrapper",
                f"exec stream of {st['bytes'] >> 20} MiB: socket / direct, MB/s",
                f"{st['run_mb_s']} / {st['direct_mb_s']} = {st['ratio']}",
            ),
            (
                "wrapper",
                f"{w['clients']} concurrent clients: failures",
                str(w["client_failures"]),
            ),
            (
                "wrapper",
                "wrapper peak RSS MB, serving (with its cleanup)",
                f"{w['wrapper_rss_mb']} ({w['wrapper_rss_mb_with_cleanup']})",
            ),
        ]
    if "adopt" in s:
        a = s["adopt"]
        cs, ping, st, li, cp = a["create_start_ms"], a["ping_ms"], a["stream"], a["list"], a["cp"]
        out += [
            ("adopt", f"create+start, direct, {dist}", _dist(cs["direct"])),
            ("adopt", f"create+start through the adopt socket, {dist}", _dist(cs["adopt"])),
            (
                "adopt",
                f"create+start overhead, per trial (adopt - direct beside it), {dist}",
                _dist(cs["overhead"]),
            ),
            (
                "adopt",
                f"new connection + `_ping`, attribution included, overhead per trial, {dist}",
                _dist(ping["overhead"]),
            ),
            (
                "adopt",
                f"exec stream of {st['bytes'] >> 20} MiB: adopt / direct, MB/s",
                f"{st['adopt_mb_s']} / {st['direct_mb_s']} = {st['ratio']}",
            ),
            (
                "adopt",
                f"`GET /containers/json`, {li['clients']} clients at once: adopt / direct, req/s",
                f"{li['adopt_per_s']} / {li['direct_per_s']} = {li['ratio']}",
            ),
            ("adopt", f"{a['clients']} concurrent clients: failures", str(a["client_failures"])),
            (
                "adopt",
                f"`docker cp` of {cp['bytes'] >> 20} MiB out: MB/s; adopt's peak RSS MB meanwhile",
                f"{cp['adopt_mb_s']}; {cp['rss_mb']}",
            ),
            (
                "adopt",
                "adopt peak RSS MB, serving the rest (all along)",
                f"{a['adopt_rss_mb']} ({a['adopt_rss_mb_peak']})",
            ),
        ]
    if "idle" in s:
        i = s["idle"]
        out += [
            (
                "idle",
                f"{i['owners']} owners x {i['containers'] // max(i['owners'], 1)} "
                f"containers: CPU % over {i['seconds']:g} s",
                str(i["cpu_pct"]),
            ),
            ("idle", "RSS MB (peak)", f"{i['rss_mb']} ({i['rss_peak_mb']})"),
        ]
    if "scale" in s:
        sc = s["scale"]
        rc, b, w = sc["reconcile"], sc["bulk"], sc["workdirs"]
        bulks = [b, *([sc["bulk_many"]] if "bulk_many" in sc else [])]
        out += [
            (
                "scale",
                f"reconcile {rc['containers']} containers: agent to ready / docker ps, s",
                f"{rc['ours_median_s']} / {rc['baseline_median_s']} = {rc['ratio']}",
            ),
            (
                "scale",
                "agent to ready with nothing to list, s",
                " ".join(map(str, sc["startup_empty"]["ours_s"])),
            ),
            *(
                (
                    "scale",
                    f"bulk reap {x['containers']} {_of(x.get('owners', 1))}: "
                    "agent / docker rm -f, containers/s",
                    f"{x['ours_per_s']} / {x['baseline_per_s']} = {x['throughput_ratio']}",
                )
                for x in bulks
            ),
            *(
                (
                    "scale",
                    f"bulk reap {x['containers']} {_of(x['owners'])}: the agent's "
                    "engine connections at once, peak "
                    f"(engine_concurrency {x['engine_concurrency']})",
                    str(x["peak_connections"]),
                )
                for x in bulks
                if "peak_connections" in x
            ),
            (
                "scale",
                f"workdirs {w['dirs']}: agent to ready / find, s",
                f"{w['ours_median_s']} / {w['baseline_median_s']} = {w['ratio']}",
            ),
            (
                "scale",
                f"workdirs {w['dirs']}: a periodic reconcile / find, s",
                f"{w['periodic_median_s']} / {w['baseline_median_s']} = {w['periodic_ratio']}",
            ),
        ]
    if "engines" in s:
        out += _engines(s["engines"])
    return out


def _latency(section: str, name: str, r: dict) -> list[tuple[str, str, str]]:
    """The rows of one reap-latency run (latency.run) whose agent is called `name`."""
    if "unavailable" in r:
        return [(section, name, f"unavailable: {r['unavailable']}")]
    dist = "p50 / p95 / p99 / max ms"
    n = f"{r['container_ms'].get('n', 0)} trials, {r['missed']} missed"
    out = [
        (section, f"{name}: SIGKILL -> container gone, {dist}", _dist(r["container_ms"])),
        (section, f"{name}: floor, engine DELETE force, {dist}", _dist(r["floor_api_ms"])),
        (section, f"{name}: floor, `docker rm -f` CLI, {dist}", _dist(r["floor_cli_ms"])),
        (
            section,
            f"{name}: overhead, per trial (ours - the API floor run just before), {dist}",
            _dist(r["overhead_ms"]),
        ),
    ]
    if "floor_noise_ms" in r:
        what = f"{name}: noise, per trial (the API floor - one more run just before), {dist}"
        out.append((section, what, _dist(r["floor_noise_ms"])))
    return [
        *out,
        (section, f"{name}: SIGKILL -> workdir gone, {dist}", _dist(r["workdir_ms"])),
        (section, f"{name}: trials", n),
    ]


def _engines(e: dict) -> list[tuple[str, str, str]]:
    out = []
    for key, who in _PODMANS:
        if key in e:
            version = e[key].get("podman", e["podman"])
            out += _latency("engines", f"{who} {version}, {e['source']}", e[key])
    i = e["idle"]
    for key, what in (("cpu_pct", "CPU %"), ("rss_mb", "RSS MB")):
        each = zip(i["all"], i["one"], i[f"{key}_ratios"], strict=True)
        out.append(
            (
                "engines",
                f"idle, {i['owners']} owners x {i['containers_per_engine'] // max(i['owners'], 1)} "
                f"containers on each engine: {what}, {e['engines']} engines / one, per trial",
                ", ".join(f"{a[key]} / {b[key]} = {r}" for a, b, r in each),
            )
        )
    return out


def _of(owners: int) -> str:
    return "of one owner" if owners == 1 else f"of {owners} owners dying at once"


def table(results: dict) -> str:
    r = rows(results)
    width = max((len(f) for _, f, _ in r), default=10)
    lines = [f"{'section':8} {'figure':{width}} value"]
    lines += [f"{s:8} {f:{width}} {v}" for s, f, v in r]
    lines.append("")
    for t in results["targets"]:
        lines.append(
            f"{'met   ' if t['met'] else 'MISSED'} {t['section']:8} {t['target']}: {t['value']}"
        )
    return "\n".join(lines)
