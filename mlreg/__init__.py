"""mlreg, the application: the ``mlreg`` command and the one place that composes
``registry`` (what a model version is) and ``pipelines`` (how a version moves)."""

from registry import __version__

__all__ = ["__version__"]
