"""The one error hierarchy of mlreg.

Every error says what is wrong, where, and what to do next (``fix``).  The CLI
prints ``error: <message>`` and ``fix: <fix>`` and exits with the class's
``exit_code``; ``MLREG_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations


class MlregError(Exception):
    """Base class: a failure the user can act on."""

    exit_code = 10

    def __init__(self, message: str, *, fix: str | None = None, **context: object) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.context = context

    def __str__(self) -> str:
        return self.message if not self.fix else f"{self.message} (fix: {self.fix})"


class UsageError(MlregError):
    """Bad arguments or options."""

    exit_code = 2


class ContractError(MlregError):
    """A model does not fit its config.pbtxt or its ensemble."""

    exit_code = 3


class RegistryError(MlregError):
    """MLflow tracking / registry failures."""

    exit_code = 4


class StorageError(MlregError):
    """Object storage (local folder or S3) failures."""

    exit_code = 5


class TritonError(MlregError):
    """A Triton server refused or failed a request."""

    exit_code = 6


class StackError(MlregError):
    """The local stack (tritonserver process) cannot start, stop or be found."""

    exit_code = 7


class PromotionError(MlregError):
    """A promotion stage failed."""

    exit_code = 8


class MissingDependencyError(MlregError):
    """An optional dependency (an extra) is not installed."""

    exit_code = 9

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the Python package '{module}', which is not installed",
            fix=f"pip install 'mlreg[{extra}]' (or run 'make install')",
        )


class TemplateError(MlregError):
    """The model repository template cannot be built."""

    exit_code = 11


class SettingsError(MlregError):
    """The environment cannot be used: an MLREG_* variable, MLFLOW_TRACKING_URI or the state folder."""

    exit_code = 12


class Terminated(BaseException):
    """SIGTERM, SIGHUP (a closed terminal or SSH session) or SIGQUIT, raised where the process was
    by the CLI's handler.  Like ``KeyboardInterrupt`` it is not an ``Exception``: no library code
    swallows it, and a promotion puts back what it changed."""

    def __init__(self, signal_name: str = "SIGTERM") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


INTERRUPT_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129, "SIGQUIT": 131}  # 128 + signal number


class OutputClosedError(MlregError):
    """Whatever read mlreg's output stopped reading (a closed pipe: ``mlreg status | head -1``)."""

    exit_code = 141  # the shell's code for a process ended by SIGPIPE (128 + 13)


EXIT_CODES: dict[str, int] = {
    cls.__name__: cls.exit_code
    for cls in (
        MlregError,
        UsageError,
        ContractError,
        RegistryError,
        StorageError,
        TritonError,
        StackError,
        PromotionError,
        MissingDependencyError,
        TemplateError,
        SettingsError,
        OutputClosedError,
    )
}
"""One error class, one exit code, in every command (a CLI test pins the table)."""
