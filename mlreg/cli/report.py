"""`mlreg report FILE.json [--markdown]`: a JSON document of mlreg rendered for people.

Reads what ``mlreg promote --json`` (one promotion, or a batch from ``--from-file`` /
``--from-alias``), ``mlreg export --json`` and ``mlreg validate --json`` wrote, or the
error document any ``--json`` command prints on failure.  ``--markdown`` gives the tables a
CI job appends to ``$GITHUB_STEP_SUMMARY``: per model the plan (uploads, config changes,
servers, re-pointed ensembles), the stages, the contract diff, the error and its fix, links
to the MLflow version and the promotion run.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from mlreg.cli.output import handle_errors, rollout_line

if TYPE_CHECKING:
    from registry.settings import Settings

Doc = dict[str, Any]


def cell(value: object) -> str:
    """One table cell: user-supplied text can neither break the table nor inject HTML."""
    text = html.escape("" if value is None else str(value), quote=False).replace("|", "\\|")
    return " ".join(text.split()) or "-"


def table(headers: list[str], rows: Iterable[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


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
        lines += _plan_lines(report) + _stage_lines(report)
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
    from registry.errors import UsageError

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


def _plain(lines: list[str]) -> list[str]:
    """The markdown without its table rules and emphasis, for a terminal."""
    out = []
    for line in lines:
        if line.startswith("|---"):
            continue
        text = line.strip("| ").replace(" | ", "  ") if line.startswith("|") else line
        out.append(html.unescape(text.replace("**", "").replace("\\|", "|").lstrip("#> ")))
    return out


@handle_errors
def report_cmd(
    path: Path = typer.Argument(..., help="A JSON document an mlreg '--json' command wrote."),
    markdown: bool = typer.Option(False, "--markdown", help="Markdown tables (a CI job summary)."),
) -> None:
    """Render a promotion, plan, export or validation report (a failed one too) for people.

    Example: mlreg report promotion.json --markdown >> "$GITHUB_STEP_SUMMARY"
    """
    from registry.errors import UsageError

    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{path}: cannot read a JSON document: {exc}", fix="pass a file a --json command wrote"
        ) from exc
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: not a document mlreg writes", fix="pass a file a --json command wrote")
    lines = render(doc, str(path))
    typer.echo("\n".join(lines if markdown else _plain(lines)))


def promote_many_cmd(
    settings: Settings,
    env: str,
    from_alias: str | None,
    from_file: Path | None,
    as_json: bool,
    model: str | None = None,
    **options: Any,
) -> None:
    """``mlreg promote [MODEL] --from-alias A | --from-file F --env E``: several versions, members
    first; MODEL limits --from-alias to that model and is refused with --from-file."""
    from mlreg.cli.output import emit_json
    from mlreg.service import environment
    from mlreg.workflow import planned_from_export, promote_many, versions_from_alias, versions_from_export
    from registry.errors import UsageError
    from registry.mlflow import MlflowRegistry

    if bool(from_alias) == bool(from_file):
        raise UsageError("--from-alias and --from-file exclude each other", fix="pass one of them")
    if from_file is not None:
        if model:
            raise UsageError(
                f"MODEL '{model}' and --from-file exclude each other: the file lists the versions",
                fix=f"drop MODEL, or promote it alone: mlreg promote {model} --version N --env {env}",
            )
        pairs = versions_from_export(from_file)
        planned = planned_from_export(from_file)
    else:
        target = environment(settings, env).alias
        pairs = versions_from_alias(MlflowRegistry(settings), str(from_alias), target, model or None)
        planned = None

    def on_stage(stage: str, status: str, seconds: float, detail: str) -> None:
        typer.echo(f"{'✓' if status == 'ok' else '✗'} {stage:<9} {seconds:6.2f}s  {detail}", err=True)

    batch = promote_many(
        settings, env, pairs, on_stage=on_stage, ensembles_first=bool(from_alias), planned=planned, **options
    )
    doc = batch.to_dict()
    if as_json:
        emit_json(doc)
    else:
        typer.echo("\n".join(_plain(render_batch(doc))))
    failed = [p for p in batch.promotions if not p["ok"] and not p.get("skipped")]
    for entry in failed:
        typer.echo(f"error: {entry['model']} v{entry['version']}: {entry['error']}", err=True)
        if entry.get("fix"):
            typer.echo(f"fix: {entry['fix']}", err=True)
    if failed:
        raise typer.Exit(int(failed[0].get("exit_code", 1)))
