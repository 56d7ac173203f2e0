"""The S3 store (any S3 endpoint through boto3). botocore errors are translated here only."""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from pipelines.storage.base import (
    ARCHIVE,
    CHUNK,
    CONFIG,
    LOCK_PREFIX,
    DigestCache,
    Progress,
    RepositoryStore,
    Stamp,
    check_part,
)
from pipelines.storage.verify import MANIFEST
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


def object_stamp(size: Any, etag: Any, version_id: Any, last_modified: Any) -> Stamp:
    """What proves an object's bytes unchanged: size, ETag, VersionId ("null" when the bucket keeps
    no versions) and LastModified in whole seconds (set by the server, not by clients)."""
    return [int(size), str(etag), str(version_id or "null"), int(last_modified.timestamp())]


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
                import boto3
                from botocore.config import Config

                endpoint_url, region, read_timeout, retries = self._args
                config = Config(
                    connect_timeout=CONNECT_TIMEOUT_S,
                    read_timeout=read_timeout,
                    retries={"max_attempts": retries, "mode": "standard"},
                    s3={"addressing_style": "path" if endpoint_url else "auto"},
                    max_pool_connections=MAX_CONCURRENCY * 2,
                )
                self._client = boto3.session.Session().client(
                    "s3", endpoint_url=endpoint_url, region_name=region, config=config
                )
            return self._client


class S3Store(RepositoryStore):
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

    @property
    def client(self) -> Any:
        """The boto3 client, made on first use (importing boto3 and reading botocore's service
        models takes ~0.3 s: a store only named, e.g. an archive's URI in a plan, never pays it);
        one for the store and its archive."""
        return self._client.get()

    # -- helpers -------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _translate(self, what: str, key: str, exc: Exception) -> StorageError:
        from botocore.exceptions import ClientError, NoCredentialsError

        where = f"{self.uri} ({self.endpoint_url or 'AWS'})"
        code, message = _error_code(exc)
        if code in AUTH_CODES:
            return StorageError(
                f"{where}: credentials rejected while trying to {what} '{key}' ({code}: {message})",
                fix=_credentials_fix(code),
                key=key,
            )
        if isinstance(exc, ClientError):
            if code in {"NoSuchBucket"}:
                return StorageError(
                    f"{where}: bucket '{self.bucket}' does not exist",
                    fix="create the bucket or correct the store URI",
                    key=key,
                )
            return StorageError(
                f"{where}: cannot {what} '{key}': {code}: {message}",
                fix="read the message above; rerun to resume",
                key=key,
            )
        if isinstance(exc, NoCredentialsError):
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

    def _call(self, what: str, key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except (ClientError, BotoCoreError, Boto3Error) as exc:
            raise self._translate(what, key, exc) from exc

    @contextmanager
    def _changing(self, key: str) -> Iterator[None]:
        """A write or delete of ``key``: noted as a change unless the request provably never
        reached the store (refused connection, connect timeout)."""
        from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

        known = key in self.changed_keys
        self.note_change(key)
        try:
            yield
        except Exception as exc:
            cause = exc.__cause__ if isinstance(exc, StorageError) else exc
            if isinstance(cause, (EndpointConnectionError, ConnectTimeoutError)) and not known:
                self.changed_keys.discard(key)
            raise

    @staticmethod
    def _missing(exc: Exception) -> bool:
        from botocore.exceptions import ClientError

        return isinstance(exc, ClientError) and str(exc.response.get("Error", {}).get("Code")) in {
            "NoSuchKey",
            "404",
            "NotFound",
        }

    # -- primitives ----------------------------------------------------------------------------

    def check(self) -> None:
        """Fail fast when the bucket is missing, the endpoint down or the credentials wrong."""
        self._call("reach", "", self.client.head_bucket, Bucket=self.bucket)

    def is_empty(self) -> bool:
        base = f"{self.prefix}/" if self.prefix else ""
        found = self._call(
            "list", "", self.client.list_objects_v2, Bucket=self.bucket, Prefix=base, MaxKeys=1
        )
        return not found.get("Contents")

    def read(self, key: str) -> bytes | None:
        found = self.read_versioned(key)
        return None if found is None else found[0]

    def write(self, key: str, data: bytes) -> None:
        with self._changing(key):
            self._call(
                "write", key, self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data
            )

    def write_config(self, model: str, text: str) -> None:
        """Written so that its LastModified is later than the config it replaces: Triton (2.51) takes
        a model folder whose newest LastModified (whole seconds) did not grow since its last load as
        unchanged, and a load of it is a no-op -- so a promotion within the same second as the
        previous one's last config write would not load (seen here: back-to-back promotions of a
        small model).  Costs two HEADs, and a wait of under a second only in that case."""
        key = f"{check_part(model, 'model name')}/{CONFIG}"
        before = self._last_modified(key)
        while True:
            super().write_config(model, text)
            after = self._last_modified(key)
            if before is None or after is None or after > before:
                return
            time.sleep(max(0.05, 1.0 - (time.time() % 1.0)))  # to the next whole second

    def _last_modified(self, key: str) -> Any:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key))["LastModified"]
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise self._translate("inspect", key, exc) from exc
        except Exception as exc:
            raise self._translate("inspect", key, exc) from exc

    def create(self, key: str, data: bytes) -> bool:
        return self._put_if(key, data, IfNoneMatch="*")

    def _put_if(self, key: str, data: bytes, **condition: str) -> bool:
        """A conditional write (If-None-Match / If-Match); False when the condition fails."""
        from botocore.exceptions import ClientError

        try:
            with self._changing(key):
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition)
        except ClientError as exc:
            if self._missing(exc) or str(exc.response.get("Error", {}).get("Code")) in EXISTS_CODES:
                return False
            raise self._translate("write", key, exc) from exc
        except Exception as exc:
            raise self._translate("write", key, exc) from exc
        return True

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        try:
            found = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return bytes(found["Body"].read()), str(found["ETag"])
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise self._translate("read", key, exc) from exc
        except Exception as exc:
            raise self._translate("read", key, exc) from exc

    def replace(self, key: str, data: bytes, token: str) -> bool:
        """S3 conditional write: If-Match the ETag that was read."""
        return self._put_if(key, data, IfMatch=token)

    def delete_if_unchanged(self, key: str, token: str) -> None:
        """S3 conditional delete (If-Match); where the endpoint has none, a plain delete."""
        from botocore.exceptions import ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key), IfMatch=token)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code"))
            if self._missing(exc) or code in EXISTS_CODES:
                return  # gone, or taken over meanwhile: not ours to delete
            if code in {"NotImplemented", "InvalidArgument", "501"}:
                self.delete(key)
                return
            raise self._translate("delete", key, exc) from exc

    def delete(self, key: str) -> None:
        with self._changing(key):
            self._call("delete", key, self.client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def delete_version(self, model: str, version: str) -> None:
        """Batched (DeleteObjects): the files, then the manifest (an interrupted delete is incomplete)."""
        keys = self.list_prefix(f"{model}/{version}/")
        manifest = f"{model}/{version}/{MANIFEST}"
        for batch in ([k for k in keys if k != manifest], [manifest]):
            for start in range(0, len(batch), 1000):  # S3's most keys per request
                objects = [{"Key": self._key(k)} for k in batch[start : start + 1000]]
                if not objects:
                    continue
                for key in batch[start : start + 1000]:
                    self.note_change(key)  # fenced: nothing deleted under a lock this store lost
                found = self._call(
                    "delete",
                    batch[start],
                    self.client.delete_objects,
                    Bucket=self.bucket,
                    Delete={"Objects": objects, "Quiet": True},
                )
                errors = found.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise StorageError(
                        f"{self.uri}: cannot delete '{self._rel(first.get('Key', ''))}': "
                        f"{first.get('Code', '')}: {first.get('Message', '')}",
                        fix="read the message above; rerun to resume",
                        key=self._rel(first.get("Key", "")),
                    )

    def list_prefix(self, prefix: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        keys: list[str] = []
        pages = self._call(
            "list", prefix, lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)))
        )
        for page in pages:
            keys.extend(self._rel(o["Key"]) for o in page.get("Contents", []))
        return sorted(keys)

    def children(self, prefix: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        base = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        pages = self._call(
            "list", prefix, lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=base, Delimiter="/"))
        )
        names: list[str] = []
        for page in pages:
            names.extend(p["Prefix"][len(base) :].rstrip("/") for p in page.get("CommonPrefixes", []))
        return sorted(names)

    def archive(self) -> RepositoryStore:
        """``s3://bucket/<parent>/.mlreg-archive/<name>/``: beside the prefix Triton reads, in the same
        bucket (a move is a server-side copy); the same client.  A store at the bucket's root has
        no place beside it."""
        if not self.prefix:
            raise StorageError(
                f"{self.uri}: a store at the root of bucket '{self.bucket}' has no place for an archive "
                "(Triton lists every folder at its root as a model)",
                fix="serve the repository from a prefix (s3://bucket/prefix), or set keep = 0 for its "
                "environment in mlreg.toml",
            )
        parent, _, name = self.prefix.rpartition("/")
        archive = copy.copy(self)
        archive.prefix = f"{parent}/{ARCHIVE}/{name}" if parent else f"{ARCHIVE}/{name}"
        base = self.uri.rstrip("/")
        root = base[: -len(self.prefix)] if base.endswith(self.prefix) else f"s3://{self.bucket}/"
        archive.uri = root + archive.prefix
        archive.fenced_with(self)  # a model's lock lost: its archived copies are not changed either
        return archive

    def copy_object_to(self, key: str, dest: RepositoryStore, dest_key: str, size: int | None = None) -> None:
        """Server-side when ``dest`` is on the same endpoint (no byte through this machine): one
        CopyObject for an object known to be under COPY_PART, else a managed (multipart) copy."""
        if not isinstance(dest, S3Store) or dest.endpoint_url != self.endpoint_url:
            super().copy_object_to(key, dest, dest_key, size)
            return
        source = {"Bucket": self.bucket, "Key": self._key(key)}
        target = {"Bucket": dest.bucket, "Key": dest._key(dest_key)}
        dest.note_change(dest_key)
        if size is not None and size < COPY_PART:
            self._call("copy", key, self.client.copy_object, CopySource=source, **target)
            return
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=COPY_PART, multipart_chunksize=COPY_PART)
        self._call("copy", key, self.client.copy, source, target["Bucket"], target["Key"], Config=config)

    def put_file(self, key: str, path: Path, sha256: str, progress: Progress | None) -> None:
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=MULTIPART_CHUNK,
            multipart_chunksize=MULTIPART_CHUNK,
            max_concurrency=MAX_CONCURRENCY,
            use_threads=True,
        )
        size = path.stat().st_size
        try:
            with self._changing(key):
                self._call(
                    "upload",
                    key,
                    self.client.upload_file,
                    str(path),
                    self.bucket,
                    self._key(key),
                    ExtraArgs={"Metadata": {"sha256": sha256}},
                    Callback=progress,
                    Config=config,
                )
        except StorageError:
            if size >= MULTIPART_CHUNK:
                self._abort_uploads(key)  # parts of an interrupted multipart upload are billed
            raise
        head = self._call("verify", key, self.client.head_object, Bucket=self.bucket, Key=self._key(key))
        if int(head["ContentLength"]) != size or head.get("Metadata", {}).get("sha256") != sha256:
            raise StorageError(
                f"{self.uri}: '{key}' was stored with the wrong size or digest", fix="push again", key=key
            )
        # the digest of what was just sent, remembered for the object's ETag/VersionId/LastModified
        stamp = object_stamp(head["ContentLength"], head["ETag"], head.get("VersionId"), head["LastModified"])
        self.digests.remember(self.cache_key(key), stamp, sha256)

    def stored_digest(self, key: str) -> str | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise self._translate("inspect", key, exc) from exc
        digest = head.get("Metadata", {}).get("sha256")
        return str(digest) if digest else None

    def cache_key(self, key: str) -> str:
        return f"s3:{self.endpoint_url or 'aws'}/{self.bucket}/{self._key(key)}"

    def object_stamps(self, prefix: str) -> dict[str, Stamp]:
        """One listing under ``prefix``: of the object versions (the latest of each key) when the
        bucket keeps versions, else a plain listing (VersionId "null", as S3 reports it then)."""
        if not self._versioned():
            return self._plain_stamps(prefix)
        paginator = self.client.get_paginator("list_object_versions")
        pages = self._call(
            "list", prefix, lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)))
        )
        stamps: dict[str, Stamp] = {}
        for page in pages:
            for obj in page.get("Versions", []):
                if obj.get("IsLatest"):
                    stamps[self._rel(obj["Key"])] = object_stamp(
                        obj["Size"], obj["ETag"], obj.get("VersionId"), obj["LastModified"]
                    )
        return stamps

    def _versioned(self) -> bool:
        """Whether the bucket keeps object versions (asked once).  Where the question is refused,
        no: stamps then carry VersionId "null", which only costs re-hashing on a versioned bucket."""
        if self._versioning is None:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                status = self.client.get_bucket_versioning(Bucket=self.bucket).get("Status")
            except (ClientError, BotoCoreError):
                status = None
            self._versioning = status in {"Enabled", "Suspended"}
        return self._versioning

    def _plain_stamps(self, prefix: str) -> dict[str, Stamp]:
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call(
            "list", prefix, lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)))
        )
        return {
            self._rel(o["Key"]): object_stamp(o["Size"], o["ETag"], None, o["LastModified"])
            for page in pages
            for o in page.get("Contents", [])
        }

    def hash_object(self, key: str) -> tuple[str, Stamp] | None:
        """Stream the object through sha256 (nothing kept in memory or on disk)."""
        import hashlib

        from botocore.exceptions import ClientError

        digest = hashlib.sha256()
        try:
            found = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            for chunk in found["Body"].iter_chunks(CHUNK):
                digest.update(chunk)
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise self._translate("read", key, exc) from exc
        except Exception as exc:
            raise self._translate("read", key, exc) from exc
        stamp = object_stamp(
            found["ContentLength"], found["ETag"], found.get("VersionId"), found["LastModified"]
        )
        return digest.hexdigest(), stamp

    # -- incomplete multipart uploads ------------------------------------------------------------

    def before_upload(self, prefix: str) -> None:
        """Abort the multipart uploads an earlier, interrupted upload under ``prefix`` left behind
        (S3 keeps, and bills, their parts until aborted): the caller holds the model's lock."""
        self._abort_uploads(prefix, quiet=False)

    def _abort_uploads(self, prefix: str, quiet: bool = True) -> list[str]:
        """Abort every incomplete multipart upload of a key starting with ``prefix``; best effort
        when ``quiet`` (after a failure the store may be unreachable: the next upload retries)."""
        from botocore.exceptions import BotoCoreError, ClientError

        aborted: list[str] = []
        try:
            found = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self._key(prefix))
            for upload in found.get("Uploads", []):
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                aborted.append(self._rel(upload["Key"]))
        except (ClientError, BotoCoreError) as exc:
            if not quiet:
                raise self._translate("abort the incomplete uploads under", prefix, exc) from exc
            log.info("incomplete uploads under %s not aborted now: %s", prefix, exc)
        if aborted:
            log.info("aborted incomplete multipart uploads: %s", ", ".join(aborted))
        return aborted

    # -- locks -----------------------------------------------------------------------------------

    def lock_state(self, key: str) -> tuple[bytes, str, float | None, float | None] | None:
        """The lock object, its ETag, its LastModified and the server's clock (the response's Date)."""
        from botocore.exceptions import ClientError

        try:
            found = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            data = bytes(found["Body"].read())
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise self._translate("read", key, exc) from exc
        except Exception as exc:
            raise self._translate("read", key, exc) from exc
        return data, str(found["ETag"]), found["LastModified"].timestamp(), _server_now(found)

    def lock_models(self) -> list[str]:
        base = self._key(LOCK_PREFIX)
        found = self._call("list", LOCK_PREFIX, self.client.list_objects_v2, Bucket=self.bucket, Prefix=base)
        keys = [self._rel(o["Key"]) for o in found.get("Contents", [])]
        return sorted(
            k[len(LOCK_PREFIX) : -len(".json")] for k in keys if k.endswith(".json") and "/" not in k
        )


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
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
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
