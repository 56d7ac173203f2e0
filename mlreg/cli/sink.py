"""Where a command's results go: ``Output`` -- one JSON document (``--json``) or what people read:
``rich`` tables (``render_table``), ``key value`` fields and plain lines -- and ``RUN``, what the
error handler (:mod:`mlreg.cli.failures`) needs to know about the command that runs now.

Whatever passes through here has the credentials of every URI in it masked
(``registry.settings.redact_uri``).  Importing this module stays cheap (``mlreg --help`` loads it):
``rich`` is imported only when a table is drawn.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import typer

from mlreg.cli.table import plain_lines
from registry.settings import env_flag, redact_data, redact_uri


class _Run:
    """What the error handler needs to know about the command that runs now."""

    def __init__(self) -> None:
        self.json = False
        self.emitted = False
        self.debug: bool | None = None  # the Settings' value once the root callback read it
        self.home: str | None = None  # MLREG_HOME: a file error under it is a SettingsError

    def reset(self, argv: Sequence[str]) -> None:
        options = argv[: list(argv).index("--")] if "--" in argv else argv
        self.json = "--json" in options
        self.emitted = False
        self.debug = None
        self.home = None

    @property
    def debugging(self) -> bool:
        return env_flag("MLREG_DEBUG") if self.debug is None else self.debug


RUN = _Run()


def render_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    title: str | None = None,
    right: Collection[str] = (),
) -> None:
    """Print ``rows`` under ``columns`` as a ``rich`` table on stdout (``right``: right-aligned columns).

    Cells are never cut or wrapped when stdout is not a terminal, so ``grep``/``awk`` see whole rows.
    """
    cells = [["-" if cell is None or cell == "" else redact_uri(str(cell)) for cell in row] for row in rows]
    terminal = sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if terminal else 10_000
    plain = plain_lines(columns, cells, title=title, right=right, width=width, terminal=terminal)
    if plain is not None:  # the same lines rich draws, without its ~0.1 s import (mlreg.cli.table)
        for line in plain:
            typer.echo(line)
        return
    from rich.console import Console  # lazy: rich costs ~0.1 s, paid only where plain_lines cannot
    from rich.table import Table  # lazy: with the console, rich's ~0.1 s

    table = Table(title=title, box=None, pad_edge=False, header_style="bold", title_justify="left")
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row_cells in cells:
        table.add_row(*row_cells)
    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=terminal, soft_wrap=not terminal).print(table)
    for line in buffer.getvalue().splitlines():
        typer.echo(line.rstrip())


class Output:
    """One command's results: a JSON document with ``--json``, else lines and tables for people."""

    def __init__(self, as_json: bool = False) -> None:
        self.json = as_json

    def document(self, data: object) -> None:
        """The command's one JSON document (stdout)."""
        RUN.emitted = True
        plain = json.loads(json.dumps(data, default=str))  # what default=str makes of objects, too
        typer.echo(json.dumps(redact_data(plain), indent=2))

    def result(self, data: object, human: Callable[[], None]) -> None:
        """``data`` as JSON with ``--json``, else whatever ``human`` prints."""
        if self.json:
            self.document(data)
        else:
            human()

    def line(self, text: str = "") -> None:
        if not self.json:
            typer.echo(redact_uri(text))

    def note(self, text: str) -> None:
        """A line about progress (stderr), never mixed into a JSON document."""
        if not self.json:
            typer.echo(redact_uri(text), err=True)

    def table(
        self,
        columns: Sequence[str],
        rows: Iterable[Sequence[object]],
        *,
        title: str | None = None,
        right: Collection[str] = (),
    ) -> None:
        if not self.json:
            render_table(columns, rows, title=title, right=right)

    def fields(self, pairs: Mapping[str, object], indent: int = 2) -> None:
        """``key  value`` lines, keys aligned."""
        if self.json or not pairs:
            return
        width = max(len(k) for k in pairs)
        for key, value in pairs.items():
            typer.echo(redact_uri(f"{' ' * indent}{key:<{width}}  {value}"))
