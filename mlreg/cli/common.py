"""What every command shares: its options (``Annotated`` aliases) and the run's ``Settings``.

A command declares ``as_json: JsonFlag = False``, ``env: EnvName = "local"``,
``version: ModelVersion``, takes ``ctx: typer.Context`` and asks

- ``settings_of(ctx)`` for the ``Settings`` the root callback built once (a ``SettingsError``
  about the environment surfaces here, so ``mlreg X --help`` works whatever the environment), and
- ``Output(as_json)`` (``mlreg.cli.output``) for where its results go.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from mlreg.cli.output import RUN
from registry.errors import SettingsError
from registry.settings import Settings, env_flag

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON document on stdout (for CI).")]
EnvName = Annotated[str, typer.Option("--env", "-e", help="Environment (mlreg.toml).")]
ModelVersion = Annotated[str, typer.Option("--version", "-V", help="The registered version.")]
ModelName = Annotated[str, typer.Argument(metavar="MODEL", help="The registered model's name.")]


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
