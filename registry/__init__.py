"""mlreg's registry package: what a model version *is*."""

__version__ = "0.1.0"
