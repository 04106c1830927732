"""docs/benchmarks.md from the results: bench/benchmarks.md.in filled with report.py's rows and
targets, the hand-written analysis of the page it replaces kept as it was."""

from __future__ import annotations

from pathlib import Path

from bench.report import rows

ANALYSIS_BEGIN = "<!-- analysis: kept as written when the harness rewrites this page -->"
ANALYSIS_END = "<!-- end of analysis -->"


def _analysis(path: Path) -> str:
    """The hand-written analysis in the current page, if any."""
    if not path.exists():
        return ""
    text = path.read_text()
    if ANALYSIS_BEGIN in text and ANALYSIS_END in text:
        return text.split(ANALYSIS_BEGIN, 1)[1].split(ANALYSIS_END, 1)[0].strip()
    return ""


def update_docs(results: dict, path: Path, results_rel: str) -> None:
    template = (Path(__file__).with_name("benchmarks.md.in")).read_text()
    m = results["machine"]
    machine = "\n".join(f"| {k} | {v} |" for k, v in m.items())
    figures = "\n".join(f"| {s} | {f} | {v} |" for s, f, v in rows(results))
    tgt = "\n".join(
        f"| {t['section']} | {t['target']} | {t['value']} | {'met' if t['met'] else '**missed**'} |"
        for t in results["targets"]
    )
    sizes = "\n".join(f"| `BENCH_{k.upper()}` | {v} |" for k, v in results["sizes"].items())
    page = template.format(
        started=results["started"],
        duration=results["duration_s"],
        machine=machine,
        figures=figures,
        targets=tgt,
        sizes=sizes,
        results=results_rel,
        analysis=f"{ANALYSIS_BEGIN}\n{_analysis(path)}\n{ANALYSIS_END}",
        smoke=" (smoke sizes: not figures to quote)" if results["smoke"] else "",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
