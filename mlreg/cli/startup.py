"""Two of typer's costs a run of ``mlreg`` need not pay; output stays typer's own, word for word.

- **pydantic** (~0.06 s of import, and its adapters' building).  typer 0.29 converts every
  parameter's value through a pydantic ``TypeAdapter`` built on first use
  (``typer._coercion.build_runtime_param``), so any command taking a path, a string or a number
  imports pydantic: ~0.07 s of the ~0.19 s ``mlreg validate`` cost as a whole process (measured
  with ``benchmarks/startup.py --compare``).  For a ``str``, ``bool``, ``int`` or ``Path``
  parameter with no custom parser, what pydantic returns for an ordinary value is a one-liner
  (``Path(value)``, ``int("42")``): those values are converted here, and every other value (and
  type) goes to typer's own adapter, built then, once: its error messages are unchanged.
- **Reading each signature twice** (~7 ms of ``mlreg --help``).  Building the click tree, typer
  reads every command's signature (annotations evaluated) once for its parameters and again for
  their names (``typer.main.get_params_from_function``); the second read is served from the first.

``install()`` puts both in place once (``mlreg.cli.main``); a typer without these hooks (older or
newer than 0.29) is left as it is.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer.core
import typer.main

try:  # typer's private coercion layer (0.29): absent elsewhere, and then nothing is installed
    from typer._coercion import RuntimeParam, build_runtime_param
except ImportError:  # pragma: no cover - another typer
    RuntimeParam = build_runtime_param = None  # type: ignore[assignment,misc]

PLAIN = (str, bool, int, Path)
_UNSURE = object()  # a value left to pydantic


def install() -> bool:
    """Put both hooks in place (once); False where this typer has not the first."""
    _read_signatures_once()
    current = getattr(typer.core, "build_runtime_param", None)
    if build_runtime_param is None or current is not build_runtime_param:
        return current is plain_runtime_param
    typer.core.build_runtime_param = plain_runtime_param
    return True


def _read_signatures_once() -> None:
    """typer's ``get_params_from_function`` answering each function from its first reading."""
    read = getattr(typer.main, "get_params_from_function", None)
    if read is None or getattr(read, "reads_once", False):
        return
    seen: dict[Any, Any] = {}

    def read_once(func: Any) -> Any:
        try:
            return seen[func]
        except KeyError:
            seen[func] = params = read(func)
            return params
        except TypeError:  # an unhashable callable: read each time
            return read(func)

    read_once.reads_once = True  # type: ignore[attr-defined]
    typer.main.get_params_from_function = read_once


def plain_runtime_param(descriptor: Any) -> Any:
    """typer's runtime parameter for ``descriptor``: a ``PlainParam`` for the plain types."""
    info = descriptor.parameter_info
    if descriptor.annotation in PLAIN and descriptor.file_annotation is None and info.parser is None:
        return plain_param_class()(
            parameter_info=info, annotation=descriptor.annotation, descriptor=descriptor
        )
    return build_runtime_param(descriptor)


def plain_value(annotation: Any, info: Any, value: Any) -> Any:
    """What typer's pydantic adapter would return for ``value``, or ``_UNSURE``."""
    if annotation is str or annotation is bool:
        return value if type(value) is annotation else _UNSURE
    if annotation is int:
        return _integer(value, info)
    return _path(value, info)


def _integer(value: Any, info: Any) -> Any:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        value = int(value)  # what int() and pydantic read alike (no sign, space, "_" nor "5.0")
    if type(value) is not int or info.clamp:
        return _UNSURE
    in_range = (info.min is None or value >= info.min) and (info.max is None or value <= info.max)
    return value if in_range else _UNSURE  # out of range: pydantic's message


def _path(value: Any, info: Any) -> Any:
    """``Path(value)`` where typer's checks can fail only as they would on it (its message
    quotes the value as typed: any check that could fail is left to typer)."""
    checks = info.exists or info.resolve_path or info.writable or info.allow_dash
    if checks or not (info.file_okay and info.dir_okay) or info.path_type not in (None, Path):
        return _UNSURE
    if not isinstance(value, str) or not value:
        return _UNSURE
    path = Path(value)
    if info.readable and os.path.exists(path) and not os.access(path, os.R_OK):
        return _UNSURE  # typer's "... is not readable."
    return path


@functools.cache  # made on the first command run (`mlreg --help` runs none)
def plain_param_class() -> type:
    @dataclass(frozen=True)
    class PlainParam(RuntimeParam):
        """A plain value converted here; anything else by typer's adapter, built on first need."""

        descriptor: Any = None
        typer_param: list[Any] = field(default_factory=list, compare=False)  # the adapter, once

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            plain = plain_value(self.annotation, self.parameter_info, value)
            if plain is not _UNSURE:
                return plain
            if not self.typer_param:
                self.typer_param.append(build_runtime_param(self.descriptor))
            return self.typer_param[0]._coerce_value(value, param=param, ctx=ctx)

    return PlainParam
