"""The S3 store (any S3 endpoint through boto3).

botocore's and boto3's errors are translated in one place, :func:`_translating`, into
:class:`StorageError` naming what was tried on which key (credentials, a missing bucket, an
unreachable endpoint each get their own fix); boto3 and botocore are imported in one place,
:func:`_sdk`, on the first request.  :class:`S3Objects` holds the object primitives,
a :class:`~pipelines.storage.base.Repository` holds them.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
import re
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pipelines.storage.manifest import DigestCache, Stamp
from pipelines.storage.objects import (
    CHUNK,
    LOCK_PREFIX,
    UNJOURNALED,
    LockState,
    ObjectStore,
    Progress,
)
from registry.errors import StorageError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
RETRIES = 3  # botocore's retries of a request (standard mode: 4 attempts in all)
MULTIPART_CHUNK = 16 << 20
MAX_CONCURRENCY = 8
COPY_PART = 1 << 30  # server-side copies in one request up to 1 GiB (S3 allows 5 GiB)
AUTH_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "403",
    "InvalidClientTokenId",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidToken",
    "TokenRefreshRequired",
    "RequestExpired",
}
TOKEN_CODES = {
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidToken",
    "TokenRefreshRequired",
    "RequestExpired",
}
CODE_IN_TEXT = re.compile(r"An error occurred \((\w+)\) when calling")
EXISTS_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
UNSUPPORTED_CODES = {"NotImplemented", "InvalidArgument", "501"}  # a conditional delete refused


def object_stamp(size: Any, etag: Any, version_id: Any, last_modified: Any) -> Stamp:
    """What proves an object's bytes unchanged: size, ETag, VersionId ("null" when the bucket keeps
    no versions) and LastModified in whole seconds (set by the server, not by clients)."""
    return [int(size), str(etag), str(version_id or "null"), int(last_modified.timestamp())]


@functools.cache
def _sdk() -> SimpleNamespace:
    """boto3, its transfer manager and botocore: imported here only, on the first request."""
    import boto3.s3.transfer  # lazy: ~0.2 s of import time a store only named never pays
    from boto3.exceptions import Boto3Error  # lazy: part of boto3 (~0.2 s), above
    from botocore import config, exceptions  # lazy: ~0.12 s (config), loaded with boto3 above
    from botocore import session as botocore_session  # lazy: ~0.1 s, part of boto3 (above)

    return SimpleNamespace(
        boto3=boto3,
        Config=config.Config,
        botocore_session=botocore_session,
        TransferConfig=boto3.s3.transfer.TransferConfig,
        ClientError=exceptions.ClientError,
        NoCredentialsError=exceptions.NoCredentialsError,
        errors=(exceptions.ClientError, exceptions.BotoCoreError, Boto3Error),
        unsent=(exceptions.EndpointConnectionError, exceptions.ConnectTimeoutError),
    )


class _Outcome:
    """What ``_translating`` let through: the S3 error code the caller accepts ("" when none)."""

    code = ""


@contextmanager
def _translating(
    store: S3Objects, what: str, key: str, accept: Collection[str] = (), every: bool = False
) -> Iterator[_Outcome]:
    """The block's requests, with the one translation of the SDK's errors into StorageError (trying
    to ``what`` on ``key``).  An S3 error whose code is in ``accept`` (e.g. ``MISSING_CODES``) ends
    the block quietly, named in the outcome's ``code``.  ``every``: any other exception too (a body
    streamed, whose connection errors are not botocore's); a StorageError always passes as it is."""
    outcome = _Outcome()
    try:
        yield outcome
    except StorageError:
        raise
    except Exception as exc:
        sdk = _sdk()
        if not every and not isinstance(exc, sdk.errors):
            raise
        code = _error_code(exc)[0] if isinstance(exc, sdk.ClientError) else ""
        if code and code in accept:
            outcome.code = code
            return
        raise _translation(store, what, key, exc) from exc


def _translation(store: S3Objects, what: str, key: str, exc: Exception) -> StorageError:
    where = f"{store.uri} ({store.endpoint_url or 'AWS'})"
    code, message = _error_code(exc)
    sdk = _sdk()
    if code in AUTH_CODES:
        return StorageError(
            f"{where}: credentials rejected while trying to {what} '{key}' ({code}: {message})",
            fix=_credentials_fix(code),
            key=key,
        )
    if isinstance(exc, sdk.ClientError) and code == "NoSuchBucket":
        return StorageError(
            f"{where}: bucket '{store.bucket}' does not exist",
            fix="create the bucket or correct the store URI",
            key=key,
        )
    if isinstance(exc, sdk.ClientError):
        return StorageError(
            f"{where}: cannot {what} '{key}': {code}: {message}",
            fix="read the message above; rerun to resume",
            key=key,
        )
    if isinstance(exc, sdk.NoCredentialsError):
        return StorageError(
            f"{where}: no AWS credentials found",
            fix="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile)",
        )
    cause = exc.__cause__ or exc
    return StorageError(
        f"{where}: cannot {what} '{key}': {type(cause).__name__}: {cause}",
        fix="check the endpoint is reachable, then rerun: files already stored are not sent again",
        key=key,
    )


class _Client:
    """One boto3 S3 client, made by the first thread that asks for it."""

    def __init__(
        self, endpoint_url: str | None, region: str | None, read_timeout: float, retries: int
    ) -> None:
        self._args = (endpoint_url, region, read_timeout, retries)
        self._client: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._client is None:
                sdk = _sdk()
                endpoint_url, region, read_timeout, retries = self._args
                config = sdk.Config(
                    connect_timeout=CONNECT_TIMEOUT_S,
                    read_timeout=read_timeout,
                    retries={"max_attempts": retries, "mode": "standard"},
                    s3={"addressing_style": "path" if endpoint_url else "auto"},
                    max_pool_connections=MAX_CONCURRENCY * 2,
                )
                self._client = _session(sdk).client(
                    "s3", endpoint_url=endpoint_url, region_name=region, config=config
                )
            return self._client


_LOADERS: dict[object, Any] = {}  # botocore's data loader per AWS_DATA_PATH, shared by the sessions
_LOADERS_LOCK = threading.Lock()


def _session(sdk: SimpleNamespace) -> Any:
    """A new boto3 session (its credentials, region and profile resolved for it, as before) whose
    botocore data loader is the process's: the loader caches the JSON it parses -- S3's service
    model, the endpoints and the endpoint rule set, the same files for every client -- which each
    new session parsed again (~0.1 s of CPU per client, 90 % of making one; each store makes its
    own client, and a promotion opens several stores)."""
    core = sdk.botocore_session.Session()
    data_path = core.get_config_variable("data_path")
    with _LOADERS_LOCK:
        loader = _LOADERS.get(data_path)
        if loader is None:
            loader = _LOADERS[data_path] = core.get_component("data_loader")
        else:
            core.register_component("data_loader", loader)
        session = sdk.boto3.session.Session(botocore_session=core)
        paths = loader.search_paths  # boto3 appends its data folder to the loader's per session:
        paths[:] = list(dict.fromkeys(paths))  # once is what it needs
    return session


class S3Objects(ObjectStore):
    """The objects under ``prefix`` in an S3 bucket."""

    clock_grain = 1.0  # LastModified and Date are whole seconds

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        uri: str | None = None,
        read_timeout: float = READ_TIMEOUT_S,
        retries: int = RETRIES,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.uri = uri or f"s3://{bucket}/{self.prefix}"
        self.digests = DigestCache(None)
        self._versioning: bool | None = None
        self._client = _Client(endpoint_url, region, read_timeout, retries)

    def relocate(self, folder: str) -> None:
        """Beside the prefix Triton reads, in the same bucket (``beside_prefix``)."""
        self.prefix, self.uri = beside_prefix(self.bucket, self.prefix, self.uri, folder)

    def place_beside(self, folder: str) -> tuple[S3Objects, str]:
        """At the bucket's root (no place beside it): the root's objects and keys ``<folder>.*``."""
        if self.prefix:
            return self.beside(folder), ""
        other = copy.copy(self)
        other.journal = UNJOURNALED
        return other, f"{folder}."

    def write_stamp(self, key: str) -> datetime | None:
        """LastModified (whole seconds), by a HEAD; None when the object is absent."""
        head = self._head("inspect", key)
        return None if head is None else head["LastModified"]

    @property
    def client(self) -> Any:
        """The boto3 client, made on first use (importing boto3 and reading botocore's service
        models takes ~0.3 s: a store only named, e.g. an archive's URI in a plan, never pays it);
        one for the store and its archive."""
        return self._client.get()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    @contextmanager
    def _changing(self, key: str) -> Iterator[None]:
        """A write or delete of ``key``: noted as a change unless the request provably never
        reached the store (refused connection, connect timeout)."""
        new = self.journal.note_change(key)
        try:
            yield
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc, StorageError) else exc
            if new and isinstance(cause, _sdk().unsent):
                self.journal.unsent_change(key)
            raise

    def _pages(self, what: str, prefix: str, operation: str, **args: Any) -> list[dict[str, Any]]:
        """Every page of a listing (``operation``: list_objects_v2, list_object_versions)."""
        paginator = self.client.get_paginator(operation)
        with _translating(self, what, prefix):
            return list(paginator.paginate(Bucket=self.bucket, **args))

    # -- primitives ----------------------------------------------------------------------------

    def check(self) -> None:
        """Fail fast when the bucket is missing, the endpoint down or the credentials wrong."""
        with _translating(self, "reach", ""):
            self.client.head_bucket(Bucket=self.bucket)

    def is_empty(self) -> bool:
        base = f"{self.prefix}/" if self.prefix else ""
        with _translating(self, "list", ""):
            found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=base, MaxKeys=1)
        return not found.get("Contents")

    def read(self, key: str) -> bytes | None:
        found = self.read_versioned(key)
        return None if found is None else found[0]

    def write(self, key: str, data: bytes) -> None:
        with self._changing(key), _translating(self, "write", key):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def create(self, key: str, data: bytes) -> bool:
        return self._put_if(key, data, IfNoneMatch="*")

    def replace(self, key: str, data: bytes, token: str) -> bool:
        """S3 conditional write: If-Match the ETag that was read."""
        return self._put_if(key, data, IfMatch=token)

    def _put_if(self, key: str, data: bytes, **condition: str) -> bool:
        """A conditional write (If-None-Match / If-Match); False when the condition fails."""
        refused = MISSING_CODES | EXISTS_CODES
        with self._changing(key), _translating(self, "write", key, refused, every=True) as outcome:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition)
        return not outcome.code

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        found = self._get(key)
        return None if found is None else (found[0], str(found[1]["ETag"]))

    def lock_state(self, key: str) -> LockState | None:
        """The object, its ETag, its LastModified and the server's clock (the response's Date)."""
        found = self._get(key)
        if found is None:
            return None
        data, response = found
        return data, str(response["ETag"]), response["LastModified"].timestamp(), _server_now(response)

    def _get(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """The object's bytes and the GET's response; None when it does not exist."""
        with _translating(self, "read", key, MISSING_CODES, every=True) as outcome:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            data = bytes(response["Body"].read())
        return None if outcome.code else (data, response)

    def delete_if_unchanged(self, key: str, token: str) -> None:
        """S3 conditional delete (If-Match); where the endpoint has none, a plain delete.  Gone, or
        taken over meanwhile: not ours to delete."""
        passing = MISSING_CODES | EXISTS_CODES | UNSUPPORTED_CODES
        with _translating(self, "delete", key, passing) as outcome:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key), IfMatch=token)
        if outcome.code in UNSUPPORTED_CODES:
            self.delete(key)

    def delete(self, key: str) -> None:
        with self._changing(key), _translating(self, "delete", key):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_keys(self, keys: list[str]) -> None:
        """Batched (DeleteObjects, at most 1000 keys a request), in order."""
        for start in range(0, len(keys), 1000):  # S3's most keys per request
            batch = keys[start : start + 1000]
            for key in batch:
                self.journal.note_change(key)  # fenced: nothing deleted under a lock this store lost
            objects = [{"Key": self._key(k)} for k in batch]
            with _translating(self, "delete", batch[0]):
                found = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True}
                )
            for error in (found.get("Errors") or [])[:1]:
                raise StorageError(
                    f"{self.uri}: cannot delete '{self._rel(error.get('Key', ''))}': "
                    f"{error.get('Code', '')}: {error.get('Message', '')}",
                    fix="read the message above; rerun to resume",
                    key=self._rel(error.get("Key", "")),
                )

    def list_prefix(self, prefix: str) -> list[str]:
        pages = self._pages("list", prefix, "list_objects_v2", Prefix=self._key(prefix))
        return sorted(self._rel(o["Key"]) for page in pages for o in page.get("Contents", []))

    def listing(self, prefix: str = "") -> list[tuple[str, int, float]]:
        """(key, size, LastModified in epoch seconds) of every object under ``prefix``: one listing
        (what is not a repository's, e.g. the trace files a shadow replay reads)."""
        pages = self._pages("list", prefix, "list_objects_v2", Prefix=self._key(prefix))
        return [
            (self._rel(o["Key"]), int(o["Size"]), o["LastModified"].timestamp())
            for page in pages
            for o in page.get("Contents", [])
        ]

    def children(self, prefix: str) -> list[str]:
        base = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        pages = self._pages("list", prefix, "list_objects_v2", Prefix=base, Delimiter="/")
        return sorted(
            p["Prefix"][len(base) :].rstrip("/") for page in pages for p in page.get("CommonPrefixes", [])
        )

    def lock_models(self) -> list[str]:
        with _translating(self, "list", LOCK_PREFIX):
            found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(LOCK_PREFIX))
        keys = [self._rel(o["Key"]) for o in found.get("Contents", [])]
        return sorted(
            k[len(LOCK_PREFIX) : -len(".json")] for k in keys if k.endswith(".json") and "/" not in k
        )

    def stored_digest(self, key: str) -> str | None:
        head = self._head("inspect", key)
        digest = head.get("Metadata", {}).get("sha256") if head is not None else None
        return str(digest) if digest else None

    def _head(self, what: str, key: str) -> dict[str, Any] | None:
        """The object's metadata (HEAD); None when it does not exist."""
        with _translating(self, what, key, MISSING_CODES, every=True) as outcome:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        return None if outcome.code else dict(head)

    def cache_key(self, key: str) -> str:
        return f"s3:{self.endpoint_url or 'aws'}/{self.bucket}/{self._key(key)}"

    def object_stamps(self, prefix: str) -> dict[str, Stamp]:
        """One listing under ``prefix``: of the object versions (the latest of each key) when the
        bucket keeps versions, else a plain listing (VersionId "null", as S3 reports it then)."""
        if not self._versioned():
            pages = self._pages("list", prefix, "list_objects_v2", Prefix=self._key(prefix))
            return {
                self._rel(o["Key"]): object_stamp(o["Size"], o["ETag"], None, o["LastModified"])
                for page in pages
                for o in page.get("Contents", [])
            }
        pages = self._pages("list", prefix, "list_object_versions", Prefix=self._key(prefix))
        return {
            self._rel(o["Key"]): object_stamp(o["Size"], o["ETag"], o.get("VersionId"), o["LastModified"])
            for page in pages
            for o in page.get("Versions", [])
            if o.get("IsLatest")
        }

    def _versioned(self) -> bool:
        """Whether the bucket keeps object versions (asked once).  Where the question is refused,
        no: stamps then carry VersionId "null", which only costs re-hashing on a versioned bucket."""
        if self._versioning is None:
            status = None
            try:
                with _translating(self, "inspect", ""):
                    status = self.client.get_bucket_versioning(Bucket=self.bucket).get("Status")
            except StorageError:
                status = None
            self._versioning = status in {"Enabled", "Suspended"}
        return self._versioning

    def hash_object(self, key: str) -> tuple[str, Stamp] | None:
        """Stream the object through sha256 (nothing kept in memory or on disk)."""
        digest = hashlib.sha256()
        with _translating(self, "read", key, MISSING_CODES, every=True) as outcome:
            found = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            for chunk in found["Body"].iter_chunks(CHUNK):
                digest.update(chunk)
        if outcome.code:
            return None
        stamp = object_stamp(
            found["ContentLength"], found["ETag"], found.get("VersionId"), found["LastModified"]
        )
        return digest.hexdigest(), stamp

    # -- uploads and copies ----------------------------------------------------------------------

    def put_file(self, key: str, path: Path, sha256: str, progress: Progress | None) -> None:
        config = _sdk().TransferConfig(
            multipart_threshold=MULTIPART_CHUNK,
            multipart_chunksize=MULTIPART_CHUNK,
            max_concurrency=MAX_CONCURRENCY,
            use_threads=True,
        )
        size = path.stat().st_size
        extra = {"Metadata": {"sha256": sha256}}
        try:
            with self._changing(key), _translating(self, "upload", key):
                self.client.upload_file(
                    str(path), self.bucket, self._key(key), ExtraArgs=extra, Callback=progress, Config=config
                )
        except StorageError:
            if size >= MULTIPART_CHUNK:
                abort_uploads(self, key)  # parts of an interrupted multipart upload are billed
            raise
        with _translating(self, "verify", key):
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        if int(head["ContentLength"]) != size or head.get("Metadata", {}).get("sha256") != sha256:
            raise StorageError(
                f"{self.uri}: '{key}' was stored with the wrong size or digest", fix="push again", key=key
            )
        # the digest of what was just sent, remembered for the object's ETag/VersionId/LastModified
        stamp = object_stamp(head["ContentLength"], head["ETag"], head.get("VersionId"), head["LastModified"])
        self.digests.remember(self.cache_key(key), stamp, sha256)

    def copy_object_to(self, key: str, dest: ObjectStore, dest_key: str, size: int | None = None) -> None:
        """Server-side when ``dest`` is on the same endpoint (no byte through this machine): one
        CopyObject for an object known to be under COPY_PART, else a managed (multipart) copy."""
        if not isinstance(dest, S3Objects) or dest.endpoint_url != self.endpoint_url:
            super().copy_object_to(key, dest, dest_key, size)
            return
        source = {"Bucket": self.bucket, "Key": self._key(key)}
        target = {"Bucket": dest.bucket, "Key": dest._key(dest_key)}
        dest.journal.note_change(dest_key)
        with _translating(self, "copy", key):
            if size is not None and size < COPY_PART:
                self.client.copy_object(CopySource=source, **target)
                return
            config = _sdk().TransferConfig(multipart_threshold=COPY_PART, multipart_chunksize=COPY_PART)
            self.client.copy(source, target["Bucket"], target["Key"], Config=config)

    def before_upload(self, prefix: str) -> None:
        """Abort the multipart uploads an earlier, interrupted upload under ``prefix`` left behind
        (S3 keeps, and bills, their parts until aborted): the caller holds the model's lock."""
        abort_uploads(self, prefix, quiet=False)


def abort_uploads(objects: S3Objects, prefix: str, quiet: bool = True) -> list[str]:
    """Abort every incomplete multipart upload of a key starting with ``prefix``; best effort
    when ``quiet`` (after a failure the store may be unreachable: the next upload retries)."""
    aborted: list[str] = []
    try:
        with _translating(objects, "abort the incomplete uploads under", prefix):
            found = objects.client.list_multipart_uploads(Bucket=objects.bucket, Prefix=objects._key(prefix))
            for upload in found.get("Uploads", []):
                objects.client.abort_multipart_upload(
                    Bucket=objects.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                aborted.append(objects._rel(upload["Key"]))
    except StorageError as exc:
        if not quiet:
            raise
        log.info("incomplete uploads under %s not aborted now: %s", prefix, exc.__cause__ or exc)
    if aborted:
        log.info("aborted incomplete multipart uploads: %s", ", ".join(aborted))
    return aborted


def beside_prefix(bucket: str, prefix: str, uri: str, folder: str) -> tuple[str, str]:
    """(prefix, uri) of ``s3://bucket/<parent>/<folder>/<name>/``, beside ``prefix`` in the same
    bucket (a move is a server-side copy).  A store at the bucket's root has no place beside it."""
    if not prefix:
        raise StorageError(
            f"{uri}: a store at the root of bucket '{bucket}' has no place for an archive "
            "(Triton lists every folder at its root as a model)",
            fix="serve the repository from a prefix (s3://bucket/prefix), or set keep = 0 for its "
            "environment in mlreg.toml",
        )
    parent, _, name = prefix.rpartition("/")
    moved = f"{parent}/{folder}/{name}" if parent else f"{folder}/{name}"
    base = uri.rstrip("/")
    root = base[: -len(prefix)] if base.endswith(prefix) else f"s3://{bucket}/"
    return moved, root + moved


def _server_now(response: dict[str, Any]) -> float | None:
    """The server's clock when it answered (the HTTP Date header), None when it sent none."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date).timestamp() if date else None
    except (TypeError, ValueError):
        return None


def _error_code(exc: Exception) -> tuple[str, str]:
    """S3's error code and message: from a ClientError, or from the text boto3's transfer errors
    (S3UploadFailedError) carry it in."""
    if isinstance(exc, _sdk().ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        return code, str(error.get("Message", "") or code)
    found = CODE_IN_TEXT.search(str(exc))
    return (found.group(1), str(exc)) if found else ("", str(exc))


def _credentials_fix(code: str) -> str:
    if code in TOKEN_CODES:
        return (
            "the session token is invalid or expired: get fresh credentials (aws sso login, a new "
            "AWS_SESSION_TOKEN, or the role's refreshed profile), then rerun"
        )
    return "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile in use, then rerun"
