"""pipelines/storage/s3.py's clients: one parse of botocore's data per process, credentials per client."""

from __future__ import annotations

import pytest

from pipelines.storage import s3


def _client(monkeypatch: pytest.MonkeyPatch, key: str) -> object:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", f"secret-{key}")
    return s3.S3Objects("bucket", "prefix", endpoint_url="http://127.0.0.1:9", region="us-east-1").client


def test_each_store_s_client_resolves_its_own_credentials_and_shares_the_parsed_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    first, second = _client(monkeypatch, "first"), _client(monkeypatch, "second")
    assert first is not second
    credentials = [c._request_signer._credentials for c in (first, second)]  # type: ignore[attr-defined]
    assert [(c.access_key, c.secret_key) for c in credentials] == [
        ("first", "secret-first"),
        ("second", "secret-second"),
    ]  # the environment as each client was made: nothing cached across sessions but the models
    assert all(c.meta.endpoint_url == "http://127.0.0.1:9" for c in (first, second))  # type: ignore[attr-defined]
    assert all(hasattr(c, "upload_file") for c in (first, second))  # boto3's managed transfers
    (shared,) = s3._LOADERS.values()  # one loader: AWS_DATA_PATH unset
    assert shared.search_paths == list(dict.fromkeys(shared.search_paths))  # boto3's folder once
    models = [c.meta.service_model._service_description for c in (first, second)]  # type: ignore[attr-defined]
    assert models[0] is models[1]  # the JSON parsed once, not per client
