"""jsonschema's IRI format check made on first use, not when great_expectations is imported.

great_expectations imports altair, altair imports jsonschema, and jsonschema's format module
imports ``rfc3987_syntax`` where it is installed (jsonschema's ``format-nongpl`` extra: Jupyter's
jupyter-events pulls it in, and this project's dev extras through cyclonedx-python-lib).  That
import builds ~30 Earley parsers of the RFC 3987 grammar: ~2 s of CPU, a third of the quality
gate's import, for a check ("format": "iri") nothing on the gate's path asks for.

:func:`defer` puts a stand-in module in ``sys.modules`` before that import: jsonschema registers
its IRI checks as it would, and the first use of any of the package's names (a check of an
"iri" format, or any code importing it later in the process) imports the real package and
answers from it -- the same results, paid for only when asked.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

PACKAGE = "rfc3987_syntax"


class _Deferred(types.ModuleType):
    """``rfc3987_syntax`` until a name of it is used; then the real package, in its place."""

    def __init__(self) -> None:
        super().__init__(
            PACKAGE, "The real rfc3987_syntax, imported on first use (pipelines/checks/lazy_iri.py)."
        )
        self._lock = threading.Lock()
        self._real: types.ModuleType | None = None

    def real(self) -> types.ModuleType:
        with self._lock:
            if self._real is None:
                if sys.modules.get(PACKAGE) is self:
                    del sys.modules[PACKAGE]  # the import below finds the package itself
                self._real = importlib.import_module(PACKAGE)
            return self._real

    def is_valid_syntax(self, term: str, value: str) -> bool:
        """jsonschema's ``from rfc3987_syntax import is_valid_syntax``: the real one, on first call.
        A package that cannot be imported (a dependency broken) answers as jsonschema does where
        it is missing: it registers no IRI check then, so every value passes."""
        try:
            real = self.real()
        except ImportError:
            return True
        return bool(real.is_valid_syntax(term, value))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import machinery's probes (__path__, __spec__ ...)
            raise AttributeError(name)
        return getattr(self.real(), name)


def defer() -> bool:
    """The stand-in in ``sys.modules`` where the package is installed and not imported yet, before
    great_expectations is imported; False (nothing done) otherwise."""
    if PACKAGE in sys.modules:
        return False
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None:
        return False
    stand_in = _Deferred()
    stand_in.__spec__ = spec  # find_spec and submodule imports see the real package's
    stand_in.__path__ = list(spec.submodule_search_locations or [])
    sys.modules[PACKAGE] = stand_in
    return True
