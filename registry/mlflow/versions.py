"""Registered models and their versions: lookups, aliases, tags, and a version's files.

The embedded registry answers reads from its database file (``registry.mlflow.sqlite``) without
importing MLflow; anything else asks MLflow through the connection's one translation point.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from registry.contracts.config import CONFIG_NAME
from registry.errors import RegistryError
from registry.mlflow import sqlite
from registry.mlflow.connection import MlflowConnection
from registry.mlflow.environ import global_tracking_uri
from registry.mlflow.runs import download
from registry.settings import redact_uri

NOT_FOUND, CHECK_NAME = sqlite.NOT_FOUND, sqlite.CHECK_NAME  # shared with registry.mlflow.reads


def not_found(exc: RegistryError) -> bool:
    """``exc`` says MLflow has no such model or version (its code, as ``translate`` keeps it)."""
    return NOT_FOUND in str(exc.context.get("code", ""))


class MlflowVersions:
    """Registered models, versions, aliases and tags over one connection: the registry's reader
    and writer (``registry.ports.RegistryReader``, ``RegistryWriter``)."""

    def __init__(self, connection: MlflowConnection) -> None:
        self.connection = connection

    @property
    def uri(self) -> str:
        """Where the registry is (MLflow's tracking URI)."""
        return self.connection.uri

    def warm_up(self) -> None:
        """MLflow imported and its client opened in the background (``MlflowConnection.warm_up``)."""
        self.connection.warm_up()

    def ping(self) -> None:
        """RegistryError unless the registry answers (``MlflowConnection.ping``)."""
        self.connection.ping()

    @property
    def _client(self) -> Any:
        return self.connection.client

    def ensure_model(self, name: str, description: str) -> None:
        call = self.connection.call
        try:
            call("model lookup", lambda: self._client.get_registered_model(name))
        except RegistryError as exc:
            if not not_found(exc):
                raise
            call(
                "model registration",
                lambda: self._client.create_registered_model(
                    name, tags={"mlreg": "1"}, description=description
                ),
            )

    def create_version(
        self,
        name: str,
        source: str,
        run_id: str,
        tags: dict[str, str],
        description: str,
        model_id: str | None = None,
    ) -> str:
        call = self.connection.call
        # the embedded store resolves ``models:/<id>`` with MLflow's global tracking URI
        with global_tracking_uri(self.connection.uri if model_id else None):
            version = call(
                "version creation",
                lambda: self._client.create_model_version(
                    name, source, run_id=run_id, tags=tags, description=description, model_id=model_id
                ),
            )
        if model_id:  # the logged model lists its registered versions (as mlflow.register_model does)
            link = json.dumps([{"name": name, "version": str(version.version)}])
            call(
                "model tag update",
                lambda: self._client.set_logged_model_tags(model_id, {"mlflow.modelVersions": link}),
            )
        return str(version.version)

    def find_by_tag(self, name: str, key: str, value: str, like: bool = False) -> list[Any]:
        query = f"name='{name}' and tags.`{key}` {'LIKE' if like else '='} '{value}'"
        return list(self.connection.call("version search", lambda: self._client.search_model_versions(query)))

    def versions(self, name: str) -> list[Any]:
        """Every version of ``name`` (``.version``, ``.tags``, ``.run_id``, ``.source``,
        ``.creation_timestamp``); the embedded registry answers from its database."""
        found = self.connection.local(partial(sqlite.model_versions, self.connection.uri, name))
        if found is not None:
            return list(found)
        return list(
            self.connection.call(
                "version search",
                lambda: self._client.search_model_versions(f"name='{name}'", max_results=200_000),
            )
        )

    def version(self, name: str, version: str) -> Any:
        return self.connection.call("version lookup", lambda: self._client.get_model_version(name, version))

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        """The tags of ``name`` ``version``; the embedded registry answers from its database
        without importing MLflow (a promotion reads the digests of the versions it may go back to)."""
        local, uri = self.connection.local, self.connection.uri
        record = local(partial(sqlite.model_version, uri, name, version))
        if record is not None:
            return dict(record.tags)
        if local(partial(sqlite.version_absent, uri, name, version)):  # e.g. a hand-written folder
            raise RegistryError(
                f"MLflow ({redact_uri(uri)}): {name} v{version} is not a registered version",
                fix=CHECK_NAME,
                code=NOT_FOUND,
            )
        return dict(self.version(name, version).tags or {})

    def registered_model(self, name: str) -> Any:
        """MLflow's ``RegisteredModel`` ``name`` (its tags, aliases and description)."""
        return self.connection.call("model lookup", lambda: self._client.get_registered_model(name))

    def aliases(self, name: str) -> dict[str, str]:
        """alias -> version (read from the registered model: version searches drop aliases); the
        embedded registry answers from its database without importing MLflow."""
        local, uri = self.connection.local, self.connection.uri
        record = local(partial(sqlite.registered_model, uri, name))
        if record is not None:
            return dict(record.aliases)
        if local(partial(sqlite.model_absent, uri, name)):
            raise RegistryError(
                f"MLflow ({redact_uri(uri)}): model lookup failed: registered model '{name}' not found",
                fix=CHECK_NAME,
                code=NOT_FOUND,
            )
        model = self.registered_model(name)
        return {alias: str(version) for alias, version in (model.aliases or {}).items()}

    def alias_versions(self, alias: str) -> dict[str, str]:
        """Every registered model whose ``alias`` names a version -> that version (the embedded
        registry answers from its database)."""
        held = self.connection.local(partial(sqlite.alias_holders, self.connection.uri, alias))
        if held is not None:
            return dict(sorted(held.items()))
        found: dict[str, str] = {}
        token: str | None = None
        while True:  # paged: 100 registered models a page
            page = self.connection.call(
                "model search", partial(self._client.search_registered_models, page_token=token)
            )
            for model in page:
                version = dict(getattr(model, "aliases", None) or {}).get(alias)
                if version is not None:
                    found[str(model.name)] = str(version)
            token = page.token
            if not token:
                return dict(sorted(found.items()))

    def require_model(self, name: str) -> dict[str, str]:
        """``name``'s aliases; a RegistryError saying so when it is not a registered model."""
        try:
            return self.aliases(name)
        except RegistryError as exc:
            if not not_found(exc):
                raise
            # "did you mean" where the embedded registry's file lists the names (no MLflow import)
            refusal = self.connection.local(partial(sqlite.unregistered, self.connection.uri, name))
            raise refusal from exc

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.connection.call(
            "alias update", lambda: self._client.set_registered_model_alias(name, alias, version)
        )

    def delete_alias(self, name: str, alias: str) -> None:
        self.connection.call("alias removal", lambda: self._client.delete_registered_model_alias(name, alias))

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self.connection.call(
            "tag update", lambda: self._client.set_model_version_tag(name, version, key, value)
        )

    def delete_version_tag(self, name: str, version: str, key: str) -> None:
        self.connection.call("tag removal", lambda: self._client.delete_model_version_tag(name, version, key))

    def delete_version(self, name: str, version: str) -> None:
        self.connection.call("version deletion", lambda: self._client.delete_model_version(name, version))

    def delete_model(self, name: str) -> None:
        self.connection.call("model deletion", lambda: self._client.delete_registered_model(name))

    def update_version_description(self, name: str, version: str, description: str) -> None:
        self.connection.call(
            "version update",
            lambda: self._client.update_model_version(name, version, description=description),
        )

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]:
        """``name`` ``version`` as a Triton model folder ``dest`` (``config.pbtxt`` + ``<version>/``,
        replacing what was there); returns the version's tags.  The embedded registry's artifacts
        are local files, copied without importing MLflow; otherwise they are downloaded."""
        record = self.connection.local(partial(sqlite.model_version, self.connection.uri, name, version))
        local = record.local_source() if record else None
        if record is not None and local is not None and (local.parent / CONFIG_NAME).is_file():
            _fresh(dest)
            shutil.copy2(local.parent / CONFIG_NAME, dest / CONFIG_NAME)
            if local.is_dir():
                shutil.copytree(local, dest / version)
            else:
                (dest / version).mkdir()
            return dict(record.tags)
        mv = self.version(name, version)
        _fresh(dest)
        with tempfile.TemporaryDirectory(prefix=f".download-{name}-{version}-", dir=dest.parent) as tmp:
            fetched = Path(tmp)
            download(self.connection, str(mv.run_id), CONFIG_NAME, fetched)
            shutil.copy2(fetched / CONFIG_NAME, dest / CONFIG_NAME)
            try:
                download(self.connection, str(mv.run_id), "model", fetched)
                shutil.copytree(fetched / "model", dest / version)
            except (RegistryError, OSError):
                (dest / version).mkdir(exist_ok=True)  # an ensemble's version folder: nothing logged
        return dict(mv.tags or {})


def _fresh(folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
