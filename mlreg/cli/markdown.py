"""Markdown pieces of ``mlreg report``: escaped cells and tables, and the sections of one
promotion's report (plan, stages, shadow replay, performance check, memory headroom, contract
diff, error); every check's verdict: :mod:`mlreg.cli.verdict_lines`."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from mlreg.cli.output import rollout_line

Doc = dict[str, Any]


def cell(value: object) -> str:
    """One table cell: user-supplied text can neither break the table nor inject HTML."""
    text = html.escape("" if value is None else str(value), quote=False).replace("|", "\\|")
    return " ".join(text.split()) or "-"


def table(headers: list[str], rows: Iterable[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


def _plan_lines(report: Doc) -> list[str]:
    plan = report.get("plan") or {}
    steps = plan.get("steps") or []
    if not steps:
        return []
    rows = [
        [
            s["model"],
            "ensemble, re-pointed" if s["role"] == "ensemble" else s["role"],
            f"v{s['version']}",
            ", ".join(f"v{v}" for v in s.get("from") or []) or "nothing",
            "yes" if s.get("upload") else "no",
            "changes" if s.get("config_changes") else "unchanged",
        ]
        for s in steps
    ]
    targets = ", ".join(plan.get("targets") or []) or "-"
    rollout = plan.get("rollout")
    where = (
        f"rolls out {cell(rollout_line(rollout))}."
        if rollout
        else f"loads on {cell(targets)} (the first is the canary)."
    )
    return [
        *table(["model", "role", "serves", "serving now", "upload", "config"], rows),
        f"Store `{cell(plan.get('store', '-'))}`; {where}",
        "",
    ]


def _stage_lines(report: Doc) -> list[str]:
    stages = report.get("stages") or []
    if not stages:
        return []
    rows = [[s["stage"], s["status"], f"{float(s['seconds']):.2f} s", s.get("detail", "")] for s in stages]
    return (
        table(["stage", "status", "time", "detail"], rows)
        + _shadow_lines(report)
        + _perf_lines(stages)
        + _swap_lines(report)
    )


def _shadow_lines(report: Doc) -> list[str]:
    """The shadow replay per model (candidate against serving on production's captured requests),
    and the first divergent requests, inputs truncated."""
    shadows = report.get("shadow") or []
    if not shadows:
        return []
    rows = [
        [
            s["model"],
            f"v{s['candidate']} vs v{s['serving']}" if s.get("serving") else f"v{s['candidate']}",
            s.get("judged", 0),
            f"{s['diverged']} ({s['divergence']:.1%})" if s.get("judged") else "-",
            f"{s['floor']} ({s['floor_rate']:.1%})" if s.get("judged") else "-",
            s.get("verdict", ""),
        ]
        for s in shadows
    ]
    lines = [
        "Shadow replay (production's captured requests):",
        "",
        *table(["model", "candidate", "requests", "diverged", "noise floor", "verdict"], rows),
    ]
    for shadow in shadows:
        first = shadow.get("first") or []
        if first:
            lines += [f"First divergent requests of {cell(shadow['model'])}:", ""]
            lines += table(
                ["request", "inputs", "serving answered", "candidate answered"],
                [
                    [f["request_id"], _tensors(f["inputs"]), _tensors(f["serving"]), _tensors(f["candidate"])]
                    for f in first
                ],
            )
    return lines


def _tensors(found: object) -> str:
    if not isinstance(found, dict):
        return str(found)
    return "; ".join(f"{name} {value}" for name, value in found.items())


def _swap_lines(report: Doc) -> list[str]:
    """Memory headroom before each load (replica, device, free vs needed), leaks, footprints
    measured, and the notes (a re-created serving version, a model without warmup)."""
    headroom = report.get("headroom") or {}
    mib = 2**20
    rows = [
        [
            c["replica"],
            c["model"],
            c["device"],
            f"{c['free_bytes'] / mib:.0f} MiB",
            f"{c['needed_bytes'] / mib:.0f} MiB" if c.get("checked") else "measured at this load",
            "ok" if c["ok"] else "refused",
        ]
        for c in headroom.get("checks") or []
    ]
    lines = (
        [
            "Memory headroom before each load:",
            "",
            *table(["replica", "model", "memory", "free", "needs", "verdict"], rows),
        ]
        if rows
        else []
    )
    lines += [
        f"> **leak:** {cell(leak['replica'])} kept {leak['leaked_bytes'] / mib:.0f} MiB after the failed "
        f"load of {cell(leak['model'])}: fenced off for the rest of the promotion; restart it"
        for leak in headroom.get("leaks") or []
    ]
    lines += [
        f"- footprint of {cell(f['model'])} v{cell(f['version'])}: {f['bytes'] / mib:.0f} MiB "
        f"({cell(f['kind'])})"
        for f in headroom.get("footprints") or []
    ]
    lines += [f"- {cell(note)}" for note in report.get("notes") or []]
    return [*lines, ""] if lines else []


def _perf_lines(stages: list[Doc]) -> list[str]:
    """The quality gate's performance check: candidate against serving, per model."""
    found = [p for s in stages for p in ((s.get("report") or {}).get("perf") or [])]
    if not found:
        return []

    def side(figures: Doc | None) -> str:
        if not figures:
            return "-"
        p50, p95 = figures.get("p50_ms"), figures.get("p95_ms")
        return f"v{figures['version']}: p50 {p50:.1f} ms, p95 {p95:.1f} ms"

    rows = [
        [
            p["model"],
            side(p["candidate"]),
            side(p.get("serving")),
            "-" if p.get("p95_ratio") is None else f"x{p['p95_ratio']:.2f} (limit x{p['threshold']:.2f})",
            p.get("verdict", ""),
        ]
        for p in found
    ]
    return [
        "",
        "Performance check on the canary (interleaved, same golden requests):",
        "",
        *table(["model", "candidate", "serving", "p95 ratio", "verdict"], rows),
    ]


def _diff_lines(changes: list[Doc]) -> list[str]:
    if not changes:
        return ["Contract: unchanged.", ""]
    rows = [[c["kind"], c.get("tensor") or "-", c["impact"], c.get("old"), c.get("new")] for c in changes]
    return [
        "Contract diff against what serves now:",
        "",
        *table(["change", "tensor", "impact", "old", "new"], rows),
    ]


def _error_lines(doc: Doc) -> list[str]:
    if not doc.get("error"):
        return []
    first, *rest = [line.strip() for line in str(doc["error"]).splitlines() if line.strip()]
    lines = [f"> **error:** {cell(first)}", *(f"> - {cell(line)}" for line in rest)]
    if doc.get("fix"):
        lines += [">", f"> **fix:** {cell(doc['fix'])}"]
    return [*lines, ""]
