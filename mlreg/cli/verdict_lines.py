"""The verdict section of ``mlreg report --markdown``: every check's and guard's record of a
promotion (pipelines/core/check.py), its one-line reason and an aborted promotion's time to safe."""

from __future__ import annotations

from mlreg.cli.markdown import Doc, cell, table


def verdict_lines(report: Doc) -> list[str]:
    """Every check's and guard's verdict (pipelines/core/check.py), the promotion's one-line
    reason, and an aborted promotion's time to safe."""
    found = [v for v in report.get("verdicts") or [] if isinstance(v, dict)]
    if not found:
        return []
    rows = [
        [
            v.get("name"),
            f"{v.get('subject', '')}: {v.get('measured', '')}".strip(": "),
            figure(v.get("value")),
            figure(v.get("threshold")),
            v.get("sample"),
            ("observed: would have refused " if v.get("note") else "") + str(v.get("result", "")),
            v.get("fix") or v.get("why"),
        ]
        for v in found
    ]
    lines = table(["name", "measured", "value", "threshold", "sample", "result", "fix"], rows)
    if report.get("reason"):
        lines += [f"**Reason:** {cell(report['reason'])}", ""]
    safe = report.get("time_to_safe")
    if isinstance(safe, dict):
        lines += [
            f"Time to safe: every replica back {figure(safe.get('whole_fleet_seconds'))} s after "
            f"detection (p95 per replica {figure(safe.get('p95_replica_seconds'))} s; not back: "
            f"{cell(', '.join(safe.get('not_back') or [])) if safe.get('not_back') else 'none'}).",
            "",
        ]
    return lines


def figure(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else ("-" if value is None else str(value))
