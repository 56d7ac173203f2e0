"""A table drawn without ``rich`` where it draws the same lines (issue 48: answers in a second).

``rich``'s import costs ~0.1 s of a read-only command's ~0.3 s.  The tables mlreg prints
(``render_table``: no box, no outer padding, two spaces between columns, nothing wrapped) are
columns padded to their widest cell; ``plain_lines`` draws those lines itself when every cell is
printable ASCII (one character, one column) and the table fits the width, and returns None
otherwise (wide or combining characters, a table wider than the terminal: rich shrinks it).
On a terminal the header is bold and the title italic, as rich draws them.
tests/component/test_fast_reads.py checks the lines against rich's own on the same tables.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

BOLD, ITALIC, RESET = "\x1b[1m", "\x1b[3m", "\x1b[0m"
GAP = "  "  # rich's padding (0, 1) between two columns, none at the edges (pad_edge=False)


def _plain(cell: str) -> bool:
    return cell.isascii() and cell.isprintable()


def _widths(columns: Sequence[str], cells: list[list[str]]) -> list[int] | None:
    """Each column's width, or None when a cell is not printable ASCII or a row is ragged."""
    if any(len(row) != len(columns) or not all(map(_plain, row)) for row in cells):
        return None
    return [max(len(row[i]) for row in cells) for i in range(len(columns))]


def plain_lines(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None,
    right: Collection[str],
    width: int,
    terminal: bool,
) -> list[str] | None:
    """The table's lines (right-stripped, as ``render_table`` prints them), or None where rich
    must draw it."""
    cells = [list(columns), *(list(row) for row in rows)]
    widths = _widths(columns, cells)
    if widths is None or (title is not None and not _plain(title)):
        return None
    total = sum(widths) + len(GAP) * (len(widths) - 1)
    if total > width or (title and len(title) > total):  # rich shrinks the table, wraps a title
        return None

    def line(row: list[str]) -> str:
        padded = (
            cell.rjust(w) if name in right else cell.ljust(w)
            for cell, w, name in zip(row, widths, columns, strict=True)
        )
        return GAP.join(padded).rstrip()

    lines = [f"{BOLD}{line(cells[0])}{RESET}" if terminal else line(cells[0])]
    lines += [line(row) for row in cells[1:]]
    if title:
        lines.insert(0, f"{ITALIC}{title}{RESET}" if terminal else title)
    return lines


__all__ = ["plain_lines"]
