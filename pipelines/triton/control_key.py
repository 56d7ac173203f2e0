"""The key that unlocks Triton's model-control API on the replicas mlreg drives.

Every Triton mlreg starts (``mlreg stack up``, infra/compose, infra/k8s) restricts its
model-repository, trace and statistics endpoints, on HTTP and gRPC alike, to requests that carry
``mlreg-control-key: <key>`` (Triton's "Limit Endpoint Access"; on gRPC Triton expects the header
under its ``triton-grpc-protocol-`` prefix). Inference, health and metadata stay open.

Where a process finds the key, first match wins:

1. the environment's ``control_key`` in mlreg.toml: ``"env:VAR"`` (that variable) or a file path
   (relative to mlreg.toml; a mounted Secret in Kubernetes);
2. ``MLREG_CONTROL_KEY`` (the value) or ``MLREG_CONTROL_KEY_FILE`` (a file holding it);
3. ``$MLREG_HOME/control.key``: what ``mlreg stack up`` generates (mode 0600) for the local stack.

A ``ControlKey`` never shows its value: ``str``/``repr`` name where it came from, so an error, a
log line, ``--json`` or an MLflow run can say which key was used without echoing it.

Wherever it comes from, a key is one printable word (whitespace around it is dropped, inside it is
refused: Triton's flag ``header=value`` would take a different key than the one sent).  A key file
that group or others may read or write is refused with the ``chmod 600`` fix, as ssh refuses such a
private key (a Kubernetes Secret mounted as a file: ``defaultMode: 0400``).
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from registry.errors import UsageError

HEADER = "mlreg-control-key"  # the HTTP header; Triton's flags name it
GRPC_HEADER = "triton-grpc-protocol-" + HEADER  # what Triton's gRPC frontend reads for that header
RESTRICTED = "model-repository,trace,statistics"
KEY_ENV = "MLREG_CONTROL_KEY"
KEY_FILE_ENV = "MLREG_CONTROL_KEY_FILE"
LOCAL_KEY_FILE = "control.key"
REFUSED = "This protocol is restricted"  # Triton's gRPC answer (UNAVAILABLE) to a missing or wrong key
REFUSED_HTTP = "This API is restricted"  # its HTTP answer (403)


@dataclass(frozen=True)
class ControlKey:
    value: str = field(repr=False)
    origin: str  # "MLREG_CONTROL_KEY", "/run/secrets/mlreg/control-key", ...

    def __str__(self) -> str:
        return f"the control key from {self.origin}"

    def grpc_headers(self) -> dict[str, str]:
        return {GRPC_HEADER: self.value}

    def http_headers(self) -> dict[str, str]:
        return {HEADER: self.value}


def restriction_args(key: str) -> list[str]:
    """Triton's arguments restricting its control endpoints to ``key`` on both protocols."""
    return [
        f"--http-restricted-api={RESTRICTED}:{HEADER}={key}",
        f"--grpc-restricted-protocol={RESTRICTED}:{HEADER}={key}",
    ]


def control_key(
    home: Path | None = None,
    named: str = "",
    base: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> ControlKey | None:
    """The key to send, or None when nothing names one (the replicas are then expected open).

    ``named``: the environment's ``control_key`` (``env:VAR`` or a path relative to ``base``).
    """
    env = os.environ if environ is None else environ
    if named:
        if named.startswith("env:"):
            var = named[4:]
            if not env.get(var):
                raise UsageError(
                    f"the environment's control_key names ${var}, which is not set",
                    fix=f"export {var} with the replicas' control key (never put it in mlreg.toml)",
                )
            return _checked(env[var], f"${var}")
        path = Path(named).expanduser()
        return _from_file(path if path.is_absolute() or base is None else base / path)
    if env.get(KEY_ENV):
        return _checked(env[KEY_ENV], f"${KEY_ENV}")
    if env.get(KEY_FILE_ENV):
        return _from_file(Path(env[KEY_FILE_ENV]).expanduser())
    if home is not None and (home / LOCAL_KEY_FILE).is_file():
        return _from_file(home / LOCAL_KEY_FILE)
    return None


def local_key(home: Path, environ: Mapping[str, str] | None = None) -> ControlKey:
    """The local stack's key: ``MLREG_CONTROL_KEY`` when set, else ``home/control.key``, generated
    (mode 0600) the first time."""
    env = os.environ if environ is None else environ
    if env.get(KEY_ENV):
        return _checked(env[KEY_ENV], f"${KEY_ENV}")
    path = home / LOCAL_KEY_FILE
    if not path.is_file():
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
    return _from_file(path)


def _from_file(path: Path) -> ControlKey:
    try:
        with path.open() as handle:  # the mode of the file read (not of a name swapped meanwhile)
            mode = os.fstat(handle.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise UsageError(
                    f"the control key file {path} is open to others (mode {stat.S_IMODE(mode):04o}): "
                    "anyone on this machine who can read it can drive the replicas; it was not used",
                    fix=f"chmod 600 {path} (as ssh asks of a private key; a Kubernetes Secret mounted "
                    "as a file: defaultMode: 0400)",
                )
            value = handle.read(MAX_KEY_FILE + 1)
    except OSError as exc:
        raise UsageError(
            f"cannot read the control key from {path}: {exc.strerror or exc}",
            fix="point control_key / MLREG_CONTROL_KEY_FILE at the file holding the replicas' key",
        ) from None
    except UnicodeDecodeError:
        value = "\0"  # not text: refused below, never echoed
    return _checked(value, str(path))


MAX_KEY_FILE = 4096  # a key is one word; a file longer than this holds something else


def _checked(value: str, origin: str) -> ControlKey:
    """``value`` stripped, refused when empty or with whitespace or control characters inside
    (the value itself is never echoed: only where it came from)."""
    key = value.strip()
    if not key or len(key) > MAX_KEY_FILE or any(c.isspace() for c in key) or not key.isprintable():
        raise UsageError(
            f"{origin} does not hold a control key (empty, or whitespace inside); it was not sent",
            fix="set the key alone, one word ('openssl rand -hex 32' makes one)",
        )
    return ControlKey(key, origin)
