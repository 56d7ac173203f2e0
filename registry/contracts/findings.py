"""Structured findings: what every check returns (the CLI renders them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "warning"]
# "triton": Triton itself refuses the config (its wording); "mlreg": a fault or a policy mlreg adds
# beyond Triton (a config Triton loads but that fails at inference, or a practice mlreg asks for).
Origin = Literal["triton", "mlreg"]


def printable(text: str) -> str:
    """A name safe to print even when it came from a non-UTF-8 file name."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class Finding:
    severity: Severity
    rule: str
    model: str
    message: str
    fix: str = ""
    tensor: str | None = None
    version: str | None = None
    expected: str | None = None
    actual: str | None = None
    file: str | None = None
    origin: Origin = "triton"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def line(self) -> str:
        where = printable(self.model) + (f"/{printable(self.tensor)}" if self.tensor else "")
        label = "[mlreg] " if self.origin == "mlreg" else ""
        text = f"{where}: {label}{printable(self.message)}"
        return f"{text} — fix: {self.fix}" if self.fix else text

    def to_dict(self) -> dict[str, Any]:
        return {k: (printable(v) if isinstance(v, str) else v) for k, v in asdict(self).items()}


def error(rule: str, model: str, message: str, fix: str = "", **where: Any) -> Finding:
    return Finding("error", rule, model, message, fix, **where)


def warning(rule: str, model: str, message: str, fix: str = "", **where: Any) -> Finding:
    return Finding("warning", rule, model, message, fix, **where)


def shape_text(shape: tuple[int | str, ...] | list[int] | None) -> str:
    if shape is None:
        return "[unknown rank]"
    return "[" + ",".join(str(d) for d in shape) + "]"
