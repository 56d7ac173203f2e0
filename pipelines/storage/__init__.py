"""Repository stores: ``open_store(uri)`` for a local path, ``s3://bucket/prefix``,
``s3://host:port/bucket/prefix`` or ``s3://http(s)://host:port/bucket/prefix`` (Triton's syntax).

Before Triton loads a version: ``store.versions.verify_version(model, version, expected_digest)`` (raises
StorageError naming each file that does not match; ``expected_digest`` is the version's
``artifact_digest`` tag in MLflow).  ``ensure_root(uri)`` marks a fresh S3 prefix so Triton can
start on it.  See :mod:`pipelines.storage.base` for what is verified and how digests are reused.

A store URI never carries credentials: ``s3://KEY:SECRET@host/bucket/p`` (or ``user@``) is refused
where it enters (``check_store_uri``: ``open_store`` and an environment's ``store``), since a URI is
printed, recorded in MLflow and raised; boto3 and Triton read them from the environment
(``AWS_ACCESS_KEY_ID``...).  ``MODEL_NAME_MAX`` is the longest model name every store can lock."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.storage.base import DigestCache, Manifest, ObjectStore, Repository, UploadResult, lock_key
from registry.errors import MlregError, RegistryError, StorageError
from registry.settings import redact_uri

__all__ = [
    "MODEL_NAME_MAX",
    "Manifest",
    "Repository",
    "S3Location",
    "UploadResult",
    "check_model_name_fits",
    "check_store_uri",
    "ensure_root",
    "open_objects",
    "open_store",
    "parse_s3_uri",
]

HOST_PORT = re.compile(r"^[A-Za-z0-9.\-]+:\d+$")
CREDENTIALS_FIX = (
    "remove them from the URI: boto3 and Triton read AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
    "(or AWS_PROFILE, an instance or pod role) from the environment"
)
NAME_MAX = 255  # bytes in one file name (ext4, xfs, btrfs, APFS) -- a local store's lock is one
# The longest file name a store makes of a model name: the lock ``lock_key(model)``, created through
# a temporary file beside it (pipelines/storage/local.py ``create``: ".<lock>.new<pid>.<8 hex>",
# a pid of up to 7 digits: Linux's largest pid_max, 4194304).
LOCK_TEMP_OVERHEAD = len(".") + len(".new") + len("4194304") + len(".") + 8
MODEL_NAME_MAX = NAME_MAX - len(lock_key("")) - LOCK_TEMP_OVERHEAD


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str
    endpoint_url: str | None


def parse_s3_uri(uri: str) -> S3Location:
    rest = uri[len("s3://") :]
    endpoint = None
    for scheme in ("http://", "https://"):
        if rest.startswith(scheme):
            host, _, rest = rest[len(scheme) :].partition("/")
            endpoint = scheme + host
    if endpoint is None:
        first, _, remainder = rest.partition("/")
        if HOST_PORT.match(first):
            endpoint, rest = f"http://{first}", remainder
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise StorageError(
            f"store URI '{redact_uri(uri)}' names no bucket",
            fix="use s3://bucket/prefix or s3://host:port/bucket/prefix",
        )
    return S3Location(bucket, prefix.strip("/"), endpoint)


def check_store_uri(uri: str, where: str = "", error: type[MlregError] = StorageError) -> str:
    """``uri`` unless it carries credentials -- a user info (``KEY:SECRET@``, ``user@``) or a
    secret query parameter -- which ``error`` refuses, quoting the URI redacted (``where``: the
    setting it came from).  A local path is never refused: it is no URI."""
    if "://" not in uri or redact_uri(uri) == uri:
        return uri
    place = f"{where}: " if where else ""
    raise error(
        f"{place}the store URI '{redact_uri(uri)}' carries credentials; mlreg takes none from a URI "
        "(it would print and record them)",
        fix=CREDENTIALS_FIX,
    )


def check_model_name_fits(name: str) -> str:
    """``name`` if every store can lock it (its lock file's name, made of the model name, fits
    ``NAME_MAX`` bytes: see ``MODEL_NAME_MAX``), else a RegistryError saying how long it may be --
    checked before anything is registered, since a version no store can lock can never be promoted."""
    size = len(name.encode())
    if size <= MODEL_NAME_MAX:
        return name
    shown = name if len(name) <= 40 else f"{name[:32]}...{name[-4:]}"
    raise RegistryError(
        f"model name '{shown}' is {size} characters long: a store locks a model in a file named "
        f"'{lock_key('<name>')}', and a file name holds at most {NAME_MAX} bytes, so a model name "
        f"may have at most {MODEL_NAME_MAX} characters",
        fix=f"shorten the model's name to {MODEL_NAME_MAX} characters or fewer: config.pbtxt's name "
        "and its folder's name alike",
    )


def open_objects(
    uri: str | Path,
    region: str | None = None,
    digest_cache: Path | None = None,
    *,
    patience: tuple[float, int] | None = None,
) -> ObjectStore:
    """The objects at ``uri`` (no repository: what is not one, e.g. a capture's trace files);
    ``digest_cache`` (a JSON file) spares re-hashing unchanged files; ``patience`` (read timeout
    in seconds, retries) bounds each S3 request (default: the upload's)."""
    text = check_store_uri(str(uri))
    objects: ObjectStore
    if text.startswith("s3://"):
        from pipelines.storage import s3  # lazy: ~10 ms of import a local store never pays

        loc = parse_s3_uri(text)
        read, retries = patience or (s3.READ_TIMEOUT_S, s3.RETRIES)
        objects = s3.S3Objects(loc.bucket, loc.prefix, loc.endpoint_url, region, text, read, retries)
    elif "://" in text:
        raise StorageError(
            f"unsupported store URI '{redact_uri(text)}'",
            fix="use a local folder or an s3:// URI (gs:// and as:// are not supported yet)",
        )
    else:
        from pipelines.storage.local import LocalObjects  # lazy: ~7 ms an S3 store never pays

        objects = LocalObjects(Path(text))
    objects.digests = DigestCache(digest_cache)
    return objects


def open_store(
    uri: str | Path,
    region: str | None = None,
    digest_cache: Path | None = None,
    *,
    patience: tuple[float, int] | None = None,
) -> Repository:
    """The repository at ``uri``: :func:`open_objects` held by a :class:`Repository`."""
    return Repository(open_objects(uri, region, digest_cache, patience=patience))


def ensure_root(uri: str | Path, region: str | None = None) -> bool:
    """Write the root marker when the repository holds no object at all (a fresh S3 prefix, on
    which Triton refuses to start); True when it was written.  A local folder needs none."""
    store = open_store(uri, region)
    if not store.objects.is_empty():
        return False
    return store.init_root()
