"""Entry point of the ``mlreg`` command."""

from __future__ import annotations

import copy
import gc
import os
import sys
from typing import Annotated

import typer

from mlreg.cli import (
    analysis,
    fleet,
    ledger,
    promote,
    registry,
    relay,
    report,
    shadow,
    stack,
    startup,
    store,
    template,
    triton,
    versions,
)
from mlreg.cli.common import AppState
from mlreg.cli.failures import INTERNAL_ERROR_EXIT, INTERRUPTED_EXIT, MlregGroup, silence_stdout
from mlreg.cli.init import init_cmd
from mlreg.cli.validate import diff_cmd, validate_cmd
from registry import __version__, background
from registry.errors import EXIT_CODES, INTERRUPT_EXIT_CODES
from registry.settings import QUIET_TENSORFLOW, redact_uri

EXIT_CODES_HELP = (
    "Exit codes: 0 done; 1 findings, drift or a breaking change; "
    + "; ".join(f"{code} {name}" for name, code in sorted(EXIT_CODES.items(), key=lambda item: item[1]))
    + f"; {INTERNAL_ERROR_EXIT} internal error (a bug); {INTERRUPTED_EXIT} interrupted."
)
startup.install()  # no pydantic for plain values (~0.06 s a command), signatures read once (~7 ms)
app = typer.Typer(
    name="mlreg",
    cls=MlregGroup,
    epilog=EXIT_CODES_HELP,
    help="Model registry and promotion pipeline for NVIDIA Triton Inference Server.\n\n"
    "Examples:\n\n"
    "  mlreg template build .mlreg/model_repository\n\n"
    "  mlreg stack up --load ensemble_multi_modal_model\n\n"
    "  mlreg validate model_repository_template",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion/--show-completion: bash, zsh, fish (~1 ms a run)
    rich_markup_mode=None,  # plain help: rich's help renderer alone costs ~0.1 s per `--help`
)
app.add_typer(template.app, name="template")
app.add_typer(stack.app, name="stack")
app.add_typer(store.app, name="store")
app.add_typer(triton.app, name="triton")
app.add_typer(fleet.app, name="fleet")
app.add_typer(analysis.app, name="analysis")
app.add_typer(shadow.app, name="shadow")
app.add_typer(ledger.app, name="ledger")
app.add_typer(relay.app, name="relay")
app.command("init")(init_cmd)
app.command("validate")(validate_cmd)
app.command("diff")(diff_cmd)
app.command("export")(registry.export_cmd)
app.command("register")(registry.register_cmd)
app.command("sign")(registry.sign_cmd)
app.command("k8s-annotations")(registry.k8s_annotations_cmd)
app.command("versions")(versions.versions_cmd)
app.command("show")(versions.show_cmd)
app.add_typer(versions.alias_app, name="alias")
app.command("promote")(promote.promote_cmd)
app.command("rollback")(promote.rollback_cmd)
app.command("status")(promote.status_cmd)
app.command("history")(promote.history_cmd)
app.command("report")(report.report_cmd)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlreg {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    ctx.obj = state = AppState.from_env()
    debug = state.settings.debug if state.settings is not None else False
    _configure_logging(verbose or debug, quiet_tensorflow=not debug)


def _redacting(record: object) -> bool:
    """A logging filter: the record's message with every URI's credentials masked."""
    import logging  # lazy: ~3 ms that `mlreg --help` never pays (it runs no command)

    assert isinstance(record, logging.LogRecord)
    message = record.getMessage()
    redacted = redact_uri(message)
    if redacted != message:
        record.msg, record.args = redacted, ()
    return True


def _configure_logging(verbose: bool, quiet_tensorflow: bool) -> None:
    """Log level for mlreg and MLflow; TensorFlow's start-up lines (C++ and absl) silenced here and in every
    child process (exporters, tf2onnx, tritonserver's stand-in backend) unless MLREG_DEBUG is on."""
    import logging  # lazy: ~3 ms that `mlreg --help` never pays (it runs no command)

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    for handler in logging.getLogger().handlers:  # no credential of a URI in a log line either
        handler.addFilter(_redacting)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "INFO" if verbose else "WARNING")  # its own handler
    if quiet_tensorflow:
        for key, value in QUIET_TENSORFLOW.items():
            os.environ.setdefault(key, value)
        for noisy in ("absl", "tensorflow", "tf2onnx", "h5py"):
            logging.getLogger(noisy).setLevel(logging.ERROR)


def only_the_named(argv: list[str]) -> typer.Typer:
    """``app`` holding only the command or group ``argv`` starts with, for ``mlreg validate ...``
    and the like: typer builds the click tree of every registered command from its signature
    on each run (~18 ms, measured; one command's ~1 ms).  ``app`` itself where ``argv`` starts
    with anything else (``--help``, an option, a name it does not hold): what the user sees
    then lists or names the others."""
    name = argv[0] if argv else ""
    commands = [info for info in app.registered_commands if info.name == name]
    groups = [info for info in app.registered_groups if info.name == name]
    if len(commands) + len(groups) != 1:
        return app
    named = copy.copy(app)  # the same settings, root callback and group class
    named.registered_commands, named.registered_groups = commands, groups
    return named


INTERRUPTED = {INTERRUPTED_EXIT, *INTERRUPT_EXIT_CODES.values()}


def main() -> None:
    code: object = None
    try:
        only_the_named(sys.argv[1:])()
    except SystemExit as exc:
        code = exc.code
        raise
    finally:
        # a warm-up still importing races Python's exit handlers; interrupted, the user waits
        # half a second at most (a second Ctrl-C: not at all)
        try:
            background.settle(0.5 if code in INTERRUPTED else background.SETTLE_S)
        except KeyboardInterrupt:
            pass
        # Every object is garbage at exit; sweeping MLflow's and SQLAlchemy's object graph
        # at interpreter shutdown costs over a second per command (measured).  Output is
        # flushed first; open files and connections still close as their references drop.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (BrokenPipeError, ValueError):
                silence_stdout()  # else Python reports the closed pipe again at exit
        gc.freeze()
