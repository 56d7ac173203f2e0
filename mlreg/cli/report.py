"""`mlreg report FILE.json [--markdown]`: a JSON document of mlreg rendered for people.

Reads what ``mlreg promote --json`` (one promotion, or a batch from ``--from-file`` / ``--from-alias``),
``mlreg export --json`` and ``mlreg validate --json`` wrote, or the error document any ``--json``
command prints on failure.  ``--markdown`` gives the tables a CI job appends to
``$GITHUB_STEP_SUMMARY``: per model the plan, the stages, the contract diff, the error and its fix,
links to the MLflow version and the promotion run (the sections: :mod:`mlreg.cli.markdown`).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path

import typer

from mlreg.cli.markdown import (
    Doc,
    _diff_lines,
    _error_lines,
    _plan_lines,
    _stage_lines,
    cell,
    table,
)
from mlreg.cli.sink import Output
from mlreg.cli.verdict_lines import verdict_lines
from registry.errors import UsageError


def _mlflow_links(mlflow: str, model: str, version: str, run_id: str, registered: bool = True) -> str:
    if not registered:
        return f"{model} v{version} (planned: not registered yet)"
    if not mlflow.startswith(("http://", "https://")):
        return f"{model} v{version}" + (f", run {run_id}" if run_id else "")
    base = mlflow.rstrip("/")
    links = f"[{model} v{version}]({base}/#/models/{model}/versions/{version})"
    return links + (f", [promotion run]({base}/#/runs/{run_id})" if run_id else "")


def _result(entry: Doc) -> str:
    if entry.get("skipped"):
        return "skipped (an earlier promotion failed)"
    if entry.get("held"):
        return "promoted with its ensemble"
    report = entry.get("report") or {}
    stages = [s["stage"] for s in report.get("stages", [])]
    if not entry.get("ok", report.get("ok")):
        return "rolled back" if report.get("rolled_back") else "failed"
    if stages and stages[0] == "noop":
        return "already serving"
    return "planned" if (report.get("plan") or {}).get("dry_run") or "record" not in stages else "promoted"


def render_batch(doc: Doc) -> list[str]:
    mode = "plan (dry run)" if doc.get("dry_run") else "promotion"
    title = f"## mlreg {mode}: `{cell(doc.get('environment'))}` (alias `{cell(doc.get('alias'))}`)"
    entries = doc.get("promotions") or []
    if not entries:
        return [title, "", "Nothing to promote: every version is already where it belongs.", ""]
    mlflow = str(doc.get("mlflow") or "")
    rows = [
        [
            e["model"],
            f"v{e['version']}",
            _result(e),
            _mlflow_links(
                mlflow,
                e["model"],
                e["version"],
                (e.get("report") or {}).get("promotion_run", ""),
                e.get("registered", True),
            ),
        ]
        for e in entries
    ]
    lines = [title, "", *table(["model", "version", "result", "MLflow"], rows)]
    for entry in entries:
        if entry.get("skipped") or entry.get("held"):
            continue
        report = entry.get("report") or {}
        lines += [f"### {cell(entry['model'])} v{cell(entry['version'])}", ""]
        lines += _plan_lines(report) + _stage_lines(report) + verdict_lines(report)
        lines += _diff_lines(entry.get("contract_diff") or []) if "contract_diff" in entry else []
        lines += _error_lines(entry)
    return lines


def render_promotion(doc: Doc) -> list[str]:
    plan = doc.get("plan") or {}
    entry = {
        "model": plan.get("model", "?"),
        "version": plan.get("version", "?"),
        "ok": doc.get("ok"),
        "report": doc,
        "error": doc.get("error"),
    }
    batch = {"environment": plan.get("environment"), "alias": "-", "promotions": [entry]}
    return render_batch(batch)


def render_export(doc: Doc) -> list[str]:
    def registered(v: Doc) -> str:
        if v.get("planned"):
            return "no (dry run: would be new)"
        return "new" if v.get("created") else "already registered"

    rows = [
        [v["model"], f"v{v['version']}", registered(v), v["validation"]] for v in doc.get("versions") or []
    ]
    title = "## mlreg export (dry run: nothing registered)" if doc.get("dry_run") else "## mlreg export"
    lines = [title, "", *table(["model", "version", "registered", "validation"], rows)]
    for v in doc.get("versions") or []:
        lines += [f"> **error:** {cell(v['model'])}: {cell(line)}" for line in v.get("findings") or []]
    return lines


def render_validate(doc: Doc) -> list[str]:
    verdict = "passed" if doc.get("ok") else f"{doc.get('errors', 0)} error(s)"
    rows = [
        [f.get("severity"), f.get("model"), f.get("tensor"), f.get("message"), f.get("fix")]
        for f in doc.get("findings") or []
    ]
    lines = [f"## mlreg validate `{cell(doc.get('path'))}`: {verdict}", ""]
    return lines + (table(["severity", "model", "tensor", "finding", "fix"], rows) if rows else [])


def render_error(doc: Doc) -> list[str]:
    return ["## mlreg: failed", "", *_error_lines(doc)]


RENDERERS: list[tuple[str, Callable[[Doc], bool], Callable[[Doc], list[str]]]] = [
    ("a promotion batch", lambda d: d.get("kind") == "promotions", render_batch),
    ("a promotion", lambda d: "plan" in d and "stages" in d, render_promotion),
    ("an export", lambda d: "versions" in d, render_export),
    ("a validation", lambda d: "findings" in d and "path" in d, render_validate),
    ("an error", lambda d: d.get("ok") is False and "error" in d, render_error),
]
MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError)


def render(doc: Doc, source: str = "the document") -> list[str]:
    """``doc`` as markdown lines; a UsageError naming ``source`` when mlreg did not write it (an
    unknown shape, or a known one with a key missing or of the wrong type)."""
    for kind, matches, renderer in RENDERERS:
        if matches(doc):
            try:
                return renderer(doc)
            except MALFORMED as exc:
                raise UsageError(
                    f"{source}: not {kind} report as mlreg writes it: {_malformed(exc)}",
                    fix="pass the unedited file a '--json' command of mlreg wrote "
                    "(mlreg promote, export or validate --json)",
                ) from exc
    raise UsageError(
        f"{source}: not a document mlreg writes (promote, export or validate --json)",
        fix="pass the file a '--json' command of mlreg wrote",
    )


def _malformed(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"key {exc} is missing"
    return f"a value has the wrong type or form ({type(exc).__name__}: {exc})"


def plain(lines: list[str]) -> list[str]:
    """The markdown without its table rules and emphasis, for a terminal."""
    out = []
    for line in lines:
        if line.startswith("|---"):
            continue
        text = line.strip("| ").replace(" | ", "  ") if line.startswith("|") else line
        out.append(html.unescape(text.replace("**", "").replace("\\|", "|").lstrip("#> ")))
    return out


def report_cmd(
    path: Path = typer.Argument(..., help="A JSON document an mlreg '--json' command wrote."),
    markdown: bool = typer.Option(False, "--markdown", help="Markdown tables (a CI job summary)."),
) -> None:
    """Render a promotion, plan, export or validation report (a failed one too) for people.

    Example: mlreg report promotion.json --markdown >> "$GITHUB_STEP_SUMMARY"
    """
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{path}: cannot read a JSON document: {exc}", fix="pass a file a --json command wrote"
        ) from exc
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: not a document mlreg writes", fix="pass a file a --json command wrote")
    lines = render(doc, str(path))
    Output().line("\n".join(lines if markdown else plain(lines)))


__all__ = ["plain", "render", "render_batch", "report_cmd"]
