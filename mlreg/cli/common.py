"""What every command shares: its options (``Annotated`` aliases) and the run's ``Settings``.

A command declares ``as_json: JsonFlag = False``, ``env: EnvName = "local"``,
``version: ModelVersion`` (or ``VersionArg``; another version option takes
``callback=positive_version``: ``--version -1`` says "a positive version number"),
takes ``ctx: typer.Context`` and asks

- ``settings_of(ctx)`` for the ``Settings`` the root callback built once (a ``SettingsError``
  about the environment surfaces here, so ``mlreg X --help`` works whatever the environment), and
- ``Output(as_json)`` (``mlreg.cli.sink``) for where its results go.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from mlreg.cli.sink import RUN
from registry.errors import SettingsError, UsageError
from registry.settings import Settings, env_flag


def positive_version(param: typer.CallbackParam, value: str | None) -> str | None:
    """A version option's or argument's value: a positive whole number, as MLflow numbers versions
    (``007`` reads 7); None when it was not given."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        name = param.opts[0] if param.param_type_name == "option" else (param.metavar or "VERSION")
        raise UsageError(
            f"{name} {value!r} is not a positive version number",
            fix="pass a registered version: 1, 2, 3... ('mlreg versions MODEL' lists them)",
        )
    return str(int(text))


JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON document on stdout (for CI).")]
EnvName = Annotated[str, typer.Option("--env", "-e", help="Environment (mlreg.toml).")]
ModelVersion = Annotated[
    str, typer.Option("--version", "-V", help="The registered version.", callback=positive_version)
]
VersionArg = Annotated[
    str, typer.Argument(metavar="VERSION", help="The registered version.", callback=positive_version)
]
ModelName = Annotated[str, typer.Argument(metavar="MODEL", help="The registered model's name.")]
STORE_HELP = (
    "Store URI: a folder, s3://bucket/prefix or s3://host:port/bucket/prefix "
    "(default: .mlreg/model_repository)."
)
StoreUri = Annotated[str | None, typer.Option("--store", "-s", help=STORE_HELP)]
Force = Annotated[bool, typer.Option("--force", help="Register even when identical bytes are registered.")]
SignKey = Annotated[
    str | None,
    typer.Option(
        "--sign-key",
        envvar="MLREG_SIGNING_KEY",
        metavar="PATH",
        help="Sign the version (OpenSSF model signing): an EC private key in PEM, or 'sigstore' for "
        "keyless signing with the ambient OIDC identity (GitHub Actions).",
    ),
]
SignCert = Annotated[
    str | None,
    typer.Option(
        "--sign-cert",
        envvar="MLREG_SIGNING_CERT",
        metavar="PATH",
        help="With --sign-key: the key's certificate (PEM), to sign with a certificate.",
    ),
]
SignChain = Annotated[
    str | None,
    typer.Option(
        "--sign-chain",
        envvar="MLREG_SIGNING_CHAIN",
        metavar="PATH",
        help="With --sign-cert: the certificates up to the root (PEM).",
    ),
]


@dataclass
class AppState:
    """``ctx.obj`` of every command: the settings read once from the environment."""

    settings: Settings | None
    problem: SettingsError | None = None

    @classmethod
    def from_env(cls) -> AppState:
        try:
            settings = Settings.from_env()
        except SettingsError as exc:
            RUN.debug = env_flag("MLREG_DEBUG")
            return cls(None, exc)
        RUN.debug = settings.debug
        RUN.home = str(settings.home)
        return cls(settings)


def settings_of(ctx: typer.Context, *, state: bool = True) -> Settings:
    """The run's settings; with ``state`` (the default) the state folder (MLREG_HOME) must be usable."""
    app = ctx.find_root().obj
    if not isinstance(app, AppState):  # a command called without the root callback
        app = AppState.from_env()
    if app.problem is not None:
        raise app.problem
    assert app.settings is not None
    if state:
        app.settings.check_home()
    return app.settings
