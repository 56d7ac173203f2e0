"""The CLI reference page, generated from the ``mlreg`` command itself so it never drifts.

Walks the command tree typer builds from ``mlreg.cli.main.app`` (every group, command, argument
and option, with the help text, default and environment variable ``--help`` shows) and writes
Markdown.  Two ways in:

- a mkdocs hook (``hooks:`` in ``docs/mkdocs.yml``): ``on_files`` adds the page
  ``reference/cli.md`` to every build, so the site's reference is the code's;
- a script: ``python docs/cli_reference.py [OUT.md]`` prints (or writes) the same page.
"""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAGE = "reference/cli.md"  # where the page lands in the site (docs/mkdocs.yml's nav names it)


@dataclass(frozen=True)
class Entry:
    """One command (or group) of the tree: its words after ``mlreg``, the click command, its context."""

    path: tuple[str, ...]
    command: Any
    context: Any

    @property
    def name(self) -> str:
        return " ".join(("mlreg", *self.path))

    @property
    def is_group(self) -> bool:
        return hasattr(self.command, "commands")


def root() -> Any:
    """The click command typer builds for ``mlreg`` (typer 0.29 vendors click: no isinstance on it)."""
    import typer.main  # lazy: only when the page is made

    from mlreg.cli.main import app

    return typer.main.get_command(app)


def walk(command: Any | None = None) -> Iterator[Entry]:
    """Every command of the tree, depth first, in name order (a group before its commands)."""
    command = command if command is not None else root()
    yield from _walk(command, (), command.context_class(command, info_name="mlreg"))


def _walk(command: Any, path: tuple[str, ...], context: Any) -> Iterator[Entry]:
    entry = Entry(path, command, context)
    yield entry
    if not entry.is_group:
        return
    for name in sorted(command.commands):
        child = command.commands[name]
        if getattr(child, "hidden", False):
            continue
        yield from _walk(child, (*path, name), child.context_class(child, info_name=name, parent=context))


def options(entry: Entry) -> list[tuple[str, str, str]]:
    """(kind, names, help) of each argument and option, as ``--help`` words them."""
    rows = []
    for param in entry.command.params:
        if getattr(param, "hidden", False):
            continue
        record = param.get_help_record(entry.context)
        kind = "option" if param.param_type_name == "option" else "argument"
        if record is None:  # an argument typer shows no help for
            names, text = param.make_metavar(entry.context), ""
        else:
            names, text = record
        rows.append((kind, names, text))
    return rows


def _cell(text: str, code: bool = False) -> str:
    """Text safe in a Markdown table cell: one line, pipes escaped, HTML escaped outside code."""
    text = " ".join(text.split())
    return (text if code else html.escape(text, quote=False)).replace("|", "\\|")


EXAMPLE = re.compile(r"(?:^|\n\n|  )Examples?:")


def _help(entry: Entry) -> str:
    """The command's help: its paragraphs, then its examples as one code block."""
    text = (entry.command.help or "").strip()
    found = EXAMPLE.search(text)
    body, examples = (text[: found.start()], text[found.start() :]) if found else (text, "")
    parts = [html.escape(" ".join(p.split()), quote=False) for p in body.split("\n\n") if p.strip()]
    lines = [
        " ".join(piece.split())
        for chunk in re.split(r"Examples?:", examples)
        for piece in chunk.split("\n\n")
        if piece.strip()
    ]
    if lines:
        parts.append("Example" + ("s" if len(lines) > 1 else "") + ":")
        parts.append("```text\n" + "\n".join(lines) + "\n```")
    return "\n\n".join(parts)


def section(entry: Entry) -> str:
    """One command's section: heading, usage, help, its arguments and options as a table."""
    level = "#" * min(2 + len(entry.path[:-1]) if entry.path else 2, 4)
    usage = " ".join(entry.command.collect_usage_pieces(entry.context))
    parts = [f"{level} `{entry.name}`", "", f"```text\nUsage: {entry.name} {usage}\n```", ""]
    helped = _help(entry)
    if helped:
        parts += [helped, ""]
    if entry.is_group:
        children = [
            name for name in sorted(entry.command.commands) if not entry.command.commands[name].hidden
        ]
        parts += ["Commands: " + ", ".join(f"`{name}`" for name in children), ""]
    rows = options(entry)
    if rows:
        parts += ["| | name | what |", "| --- | --- | --- |"]
        parts += [f"| {kind} | `{_cell(names, code=True)}` | {_cell(text)} |" for kind, names, text in rows]
        parts.append("")
    epilog = getattr(entry.command, "epilog", None)
    if epilog:
        parts += [html.escape(" ".join(epilog.split()), quote=False), ""]
    return "\n".join(parts)


def markdown() -> str:
    """The whole page."""
    entries = list(walk())
    parts = [
        "# CLI reference",
        "",
        "Generated from the `mlreg` command itself at every build of this site "
        "(`docs/cli_reference.py`): each command, argument and option as `--help` shows it. "
        "Every command prints one JSON document on stdout with `--json`; failures exit with "
        "the codes listed under [Operations](../operations.md#exit-codes).",
        "",
        "Commands: " + ", ".join(f"`{entry.name}`" for entry in entries[1:] if not entry.is_group),
        "",
    ]
    parts += [section(entry) for entry in entries]
    return "\n".join(parts)


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: the reference page, made now from the code."""
    from mkdocs.structure.files import File  # lazy: mkdocs is there only when the site is built

    files.append(File.generated(config, PAGE, content=markdown()))
    return files


def main(argv: list[str]) -> int:
    text = markdown()
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
