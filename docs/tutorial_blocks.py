"""The runnable blocks of the tutorial pages, as tests/integration/test_tutorial.py runs them.

The fence's info string says what a block is (docs/mkdocs.yml's header):

- ```` ```bash ````: a script, run whole (``bash -e``), in the page's folder;
- ```` ```console ````: ``$ command`` lines, each run on its own, each followed by lines of the
  output it must print (each line somewhere in its stdout or stderr; runs of spaces count as
  one, and ``…`` stands for any text within the line);
- any other fence (``text``, ``toml``, ``sh``...) is not run; ``bash``/``console``/``sh``/``shell``
  fences appear nowhere but on tutorial pages, and tutorial pages use no ``sh``/``shell`` fence
  (``tests/unit/test_docs.py``), so a shell block of a tutorial is always a block that runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SITE = Path(__file__).resolve().parent / "site_src"
TUTORIALS = SITE / "tutorial"  # every page here is a tutorial: its shell blocks run in a test
RUN = ("bash", "console")  # the fences that run
SHELL = (*RUN, "sh", "shell", "shell-session", "zsh")  # fences of shell commands
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
ANY = "…"  # in an expected output line: any text


@dataclass(frozen=True)
class Step:
    """One thing to run: a bash script, or one console command and the output it must print."""

    page: str
    kind: str  # "bash" | "console"
    command: str
    expected: tuple[str, ...] = ()

    def missing(self, output: str) -> list[str]:
        """The expected lines ``output`` does not print (stdout and stderr are two streams, so
        each line is looked for anywhere, not in order)."""
        lines = [_squeeze(line) for line in output.splitlines()]
        return [want for want in self.expected if not any(matches(want, line) for line in lines)]


def _squeeze(text: str) -> str:
    return " ".join(text.split())


def matches(expected: str, line: str) -> bool:
    """``line`` holds ``expected``, where ``…`` stands for any text (spaces squeezed on both)."""
    pattern = ".*?".join(re.escape(part) for part in _squeeze(expected).split(ANY))
    return re.search(pattern, _squeeze(line)) is not None


def fences(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block of a page, in order."""
    return [(match.group(1), match.group(2)) for match in FENCE.finditer(text)]


def pages() -> list[Path]:
    """The tutorial pages, in name order."""
    return sorted(TUTORIALS.glob("*.md"))


def steps(page: Path) -> list[Step]:
    """What ``page`` runs, in order."""
    found: list[Step] = []
    for info, body in fences(page.read_text(encoding="utf-8")):
        if info == "bash":
            found.append(Step(page.name, "bash", body))
        elif info == "console":
            found += console(page.name, body)
    return found


def console(page: str, body: str) -> list[Step]:
    """A console block's commands, each with the output lines under it."""
    commands: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif line.strip():
            if not commands:
                raise ValueError(f"{page}: a console block starts with output, not '$ ': {line!r}")
            commands[-1][1].append(line)
    return [Step(page, "console", command, tuple(expected)) for command, expected in commands]
