"""README "Signed model versions": ``mlreg sign`` of a version never signed, whose ``signed_by`` tag
cannot be written (MLflow refuses), removes the signature file it put into the version's run --
the version stays unsigned, with no signature beside it that no tag vouches for.

The registry is tests/fakes.py's (registered files as folders) with its run's artifacts in a local
folder, as an embedded MLflow keeps them; the tag write fails as MLflow down would make it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from registry.errors import RegistryError
from registry.register import sign_registered
from registry.signing import SIGNATURE_ARTIFACT, SIGNED_BY_TAG, SigningKey
from tests.fakes import FakeRegistry, FakeRuns
from tests.unit.worlds import MEMBER


class RunFolders(FakeRuns):
    """Each run keeps its artifacts under ``root/runs/<run id>``."""

    def artifact_uri(self, run_id: str) -> str:
        return (self.registry.root / "runs" / run_id).as_uri()

    def log_artifacts(self, run_id: str, folder: Path, path: str | None = None) -> None:
        shutil.copytree(folder, self.registry.root / "runs" / run_id, dirs_exist_ok=True)


class LocalRuns(FakeRegistry):
    """Each version's run keeps its artifacts under ``root/runs/<run id>`` (``runs``:
    ``RunFolders``); ``fail_tags`` names the version tags MLflow refuses to write."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.runs = RunFolders(self)
        self.fail_tags: set[str] = set()
        self.descriptions: dict[tuple[str, str], str] = {}

    def fetch_version(self, name: str, version: str, dest: Path) -> dict[str, str]:
        dest.mkdir(parents=True, exist_ok=True)  # as the MLflow adapter makes it
        return super().fetch_version(name, version, dest)

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        if key in self.fail_tags:
            raise RegistryError(f"MLflow ({self.uri}): set_version_tag failed: connection refused")
        super().set_version_tag(name, version, key, value)

    def version(self, name: str, version: str) -> Any:
        found = super().version(name, version)
        found.description = self.descriptions.get((name, version), "")
        return found

    def update_version_description(self, name: str, version: str, text: str) -> None:
        self.descriptions[(name, version)] = text


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    private = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "release.pem"
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return SigningKey(path)


def test_a_failed_first_signature_is_removed_and_the_version_stays_unsigned(
    tmp_path: Path, key: SigningKey
) -> None:
    registry = LocalRuns(tmp_path / "registry")
    registry.add("net", "1", MEMBER.format(name="net", src="MID", dst="OUT"))
    run = registry.models.version("net", "1").run_id
    written = tmp_path / "registry" / "runs" / run / SIGNATURE_ARTIFACT
    registry.fail_tags.add(SIGNED_BY_TAG)
    with pytest.raises(RegistryError, match="set_version_tag failed"):
        sign_registered(registry, "net", "1", key)
    assert not written.exists()  # the signature it wrote is gone again
    assert SIGNED_BY_TAG not in registry.models.version_tags("net", "1")  # and the version is unsigned
    registry.fail_tags.clear()  # the same signing, MLflow answering: signed, file and tag
    signed_by = sign_registered(registry, "net", "1", key)
    assert written.is_file()
    assert registry.models.version_tags("net", "1")[SIGNED_BY_TAG] == signed_by
    assert f"signed by {signed_by}" in registry.descriptions[("net", "1")]
