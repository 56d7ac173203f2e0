"""The desired versions of an environment as a file in git: ``fleet/<env>.toml``.

    environment = "production"     # optional: the mlreg.toml environment it is for
    [models]
    ensemble_multi_modal_model = 2
    image_model = 3

GitOps: the plan job writes it (``pin``: versions named, or every version another environment's
alias holds) and opens a pull request; merging it changes the file in git, and the engine that
syncs the environment (an Argo CD PostSync hook Job, infra/gitops/) runs ``sync``, whose exit code
is the environment's health: 0 when every pinned version serves there and its alias names it.

``sync`` refuses before any change a file pinning a version MLflow does not hold, and a file
whose ensemble version pins a member at another version than the file does (an ensemble
promotion brings its pinned members: such a file could never be reached, and would flip-flop).
An ensemble's pins are read from its *registered* config (the version's ``config.pbtxt`` in
MLflow's artifacts): that is what a promotion loads, whatever tags the version carries.  MLflow
that cannot be reached is said as such (never "a version MLflow does not hold").

``pin`` writes the file like any store object: under an exclusive lock of its folder (``flock``:
two ``fleet pin`` at once run one after the other, each on what the other wrote) and a
compare-and-swap on the file's digest (a writer that takes no lock -- an editor, ``git pull`` --
changing it meanwhile refuses the pin, nothing written).  ``pin`` against ``pin`` loses no update.
Against a writer that takes no lock, POSIX has no compare-and-rename: the digest is checked, then
the file's identity (inode, size, mtime) is checked again right before the rename; what remains is
the one system call between that last check and the rename.  A folder that cannot be locked
(NFS without lock support, a filesystem refusing ``flock``) refuses the pin, naming it.
It promotes only what differs (the alias names another version, or ``mlreg status`` finds drift),
ensembles first as ``promote --from-alias`` does (an ensemble's promotion brings the member
versions it pins; each member the file pins is then already held), so a second run is a no-op.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import itertools
import json
import os
import re
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlreg.ops.context import context, open_registry
from mlreg.ops.promote_many import promote_many
from pipelines.core.options import Options
from pipelines.ledger.recorder import operation
from registry.errors import MlregError, RegistryError, UsageError
from registry.register import check_model_name
from registry.settings import Settings, redact_uri

if TYPE_CHECKING:
    from registry.mlflow.sqlite import VersionRecord
    from registry.ports import RegistryReader

KEYS = ("environment", "models")
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
DRIFT_EXIT = 1  # 'mlreg status' drift: the promotions ran, the environment does not serve the file
LOCK_WAIT_S = 120.0  # how long a pin waits for another writer of the folder (its MLflow lookups included)
NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"  # MLflow's error code for a version it does not hold
CONFIG = "config.pbtxt"  # a version's Triton config, as MLflow registered it
MAX_CONFIG_BYTES = 4 << 20  # a registered config.pbtxt is kilobytes: a bigger one is not read


@dataclass
class FleetFile:
    path: Path
    environment: str | None
    models: dict[str, str]  # model -> version
    header: list[str] = field(default_factory=list)  # the comment lines the file starts with
    digest: str = ""  # sha256 of the bytes read ("": no file): what a pin's compare-and-swap expects


def read_fleet(path: Path, missing_ok: bool = False) -> FleetFile:
    """``path`` parsed and checked; ``missing_ok``: an absent file reads as an empty one."""
    if missing_ok and not path.exists():
        return FleetFile(path, None, {})
    try:
        raw = path.read_bytes()
        text = raw.decode()
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(
            f"{path}: cannot read the desired versions: {exc}",
            fix="write [models] with one line per model: image_model = 3",
        ) from exc
    unknown = [key for key in data if key not in KEYS]
    if unknown:
        hints = [_did_you_mean(key, KEYS) for key in unknown]
        raise UsageError(
            f"{path}: unknown key(s) {', '.join(hints)}", fix='keep environment = "E" and [models]'
        )
    environment = data.get("environment")
    if environment is not None and (not isinstance(environment, str) or not environment.strip()):
        raise UsageError(
            f"{path}: environment must be a name, not {environment!r}", fix='environment = "production"'
        )
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise UsageError(f"{path}: models must be a table, not {models!r}", fix="[models]\nimage_model = 3")
    pins = {_model(path, name): _version(path, name, value) for name, value in models.items()}
    header = _leading_comments(text)
    return FleetFile(path, environment.strip() if environment else None, pins, header, _digest(raw))


def render(fleet: FleetFile) -> str:
    lines = list(fleet.header)
    if lines:
        lines.append("")
    if fleet.environment:
        lines += [f"environment = {json.dumps(fleet.environment)}", ""]
    lines.append("[models]")
    lines += [f"{_key(name)} = {int(version)}" for name, version in sorted(fleet.models.items())]
    return "\n".join(lines) + "\n"


def write_fleet(fleet: FleetFile) -> None:
    """Replace the file in one step (a reader never sees half of it), only if it still holds the
    bytes it was read from (``fleet.digest``): otherwise UsageError, nothing written."""
    fleet.path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{fleet.path.name}.", suffix=".tmp", dir=fleet.path.parent)
    partial = Path(name)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(render(fleet))
        seen = _identity(fleet.path)
        found = _digest(fleet.path.read_bytes()) if seen is not None else ""
        if found != fleet.digest or _identity(fleet.path) != seen:  # the identity again, last
            raise UsageError(
                f"{fleet.path} changed while it was being pinned (another writer): nothing was written",
                fix="run the command again (it pins onto what the file holds now)",
            )
        os.replace(partial, fleet.path)
    finally:
        partial.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(path: Path, wait: float = LOCK_WAIT_S) -> Iterator[None]:
    """An exclusive lock of ``path``'s folder while a pin reads, changes and writes ``path`` (the
    folder, not a lock file: nothing is left in the git tree); a writer holding it longer than
    ``wait`` seconds refuses this one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError as exc:
        raise _unlockable(path, exc) from None
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise UsageError(
                        f"{path}: another writer has held its folder for {wait:g} s: nothing was written",
                        fix="let the other 'mlreg fleet pin' finish, then run the command again",
                    ) from None
                time.sleep(0.005)
            except OSError as exc:  # ENOLCK, EBADF, EOPNOTSUPP...: the filesystem locks nothing
                raise _unlockable(path, exc) from None
        yield
    finally:
        os.close(fd)  # lets the lock go


def _unlockable(path: Path, exc: OSError) -> UsageError:
    """The refusal when ``path``'s folder cannot be locked: named, with the filesystem's answer."""
    why = exc.strerror or type(exc).__name__
    return UsageError(
        f"{path}: its folder {path.parent} cannot be locked ({why}: the filesystem there -- NFS "
        "without lock support? -- refuses flock), so a pin could lose another's update: nothing was written",
        fix="run 'mlreg fleet pin' in a clone on a local disk (git carries the change to the others)",
    )


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime in ns) of ``path``; None when there is no file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- pin: what the plan job writes ------------------------------------------------------------------


@dataclass
class PinResult:
    fleet: FleetFile
    changes: list[dict[str, str | None]]  # {"model", "from", "to"}
    written: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "fleet-pin",
            "file": str(self.fleet.path),
            "environment": self.fleet.environment,
            "changed": bool(self.changes),
            "changes": self.changes,
            "models": dict(sorted(self.fleet.models.items())),
        }


def parse_pins(pins: Sequence[str]) -> dict[str, str]:
    """``MODEL=VERSION`` arguments (a VERSION must be a positive whole number)."""
    found = {}
    for pin in pins:
        name, eq, version = pin.partition("=")
        if not eq:
            raise UsageError(f"{pin!r} is not MODEL=VERSION", fix="e.g. image_model=3")
        found[_model(Path("(command line)"), name.strip())] = _version(Path("(command line)"), name, version)
    return found


def pin(
    settings: Settings,
    path: Path,
    pins: Mapping[str, str],
    env_name: str | None = None,
    from_alias: str | None = None,
    registry: RegistryReader | None = None,
) -> PinResult:
    """``path`` with ``pins`` (after every version ``from_alias`` holds, when given) written in;
    each pinned version must be registered.  Nothing is written when nothing changes.  The file is
    read, changed and written under ``locked`` (and a compare-and-swap on its digest)."""
    if not pins and not from_alias:
        raise UsageError("nothing to pin", fix="pass MODEL=VERSION (repeatable) or --from-alias ALIAS")
    registry = registry or open_registry(settings).models
    # no ping first: a lookup that fails asks whether MLflow answers (``require_reachable``), so
    # MLflow down is still named as such, and a pin that finds what it needs costs no extra call
    wanted = {**(_alias_pins(registry, from_alias, str(path)) if from_alias else {}), **pins}
    with locked(path):
        fleet = read_fleet(path, missing_ok=True)
        if env_name and fleet.environment and env_name != fleet.environment:
            raise UsageError(
                f"{path} is for environment '{fleet.environment}', not '{env_name}'",
                fix=f"drop --env, or pin into the file of '{env_name}'",
            )
        fleet.environment = fleet.environment or env_name or path.stem
        changed = {m: v for m, v in wanted.items() if fleet.models.get(m) != v}
        changes: list[dict[str, str | None]] = [
            {"model": m, "from": fleet.models.get(m), "to": v} for m, v in sorted(changed.items())
        ]
        fleet.models.update(changed)
        # every pin registered (the changed ones with the rest), reachable: as sync would judge it
        configs: dict[str, Path] = {}
        tags = _require_registered(registry, fleet.models, str(path), configs)
        refuse_unreachable_pins(fleet, registered_pins(registry, fleet.models, tags, configs))
        written = bool(changes) or not path.exists()
        if written:
            write_fleet(fleet)
    return PinResult(fleet, changes, written)


def _alias_pins(registry: RegistryReader, alias: str, where: str) -> dict[str, str]:
    """model -> the version ``alias`` holds, for every registered model; an alias naming none is
    an error (a typo would pin nothing); a lookup that fails while MLflow does not answer is
    MLflow unreachable."""
    try:
        wanted = registry.alias_versions(alias)
    except RegistryError as exc:
        require_reachable(registry, where, exc)
        raise
    if not wanted:
        raise RegistryError(
            f"alias '{alias}' names no version of any registered model in MLflow "
            f"({redact_uri(registry.uri)})",
            fix="check the alias ('mlreg versions MODEL' lists a model's aliases)",
        )
    return dict(wanted)


# -- sync: what the hook Job runs -----------------------------------------------------------------


@dataclass
class SyncResult:
    fleet: FleetFile
    environment: str
    alias: str
    dry_run: bool
    moved: list[tuple[str, str]]
    batch: dict[str, Any] | None = None  # mlreg.ops.promote_many.BatchResult.to_dict() when anything moved
    health: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [p for p in (self.batch or {}).get("promotions", []) if not p["ok"] and not p.get("skipped")]

    @property
    def healthy(self) -> bool:
        return all(row["ok"] for row in self.health)

    @property
    def ok(self) -> bool:
        return not self.failed and (self.dry_run or self.healthy)

    @property
    def exit_code(self) -> int:
        if self.failed:
            return int(self.failed[0].get("exit_code", 1))
        return 0 if self.ok else DRIFT_EXIT

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "fleet-sync",
            "ok": self.ok,
            "file": str(self.fleet.path),
            "environment": self.environment,
            "alias": self.alias,
            "dry_run": self.dry_run,
            "pins": dict(sorted(self.fleet.models.items())),
            "moved": [{"model": m, "version": v} for m, v in self.moved],
            "promotions": (self.batch or {}).get("promotions", []),
            "health": self.health,
        }


def sync(
    settings: Settings,
    path: Path,
    env_name: str | None = None,
    options: Options | None = None,
) -> SyncResult:
    """Make ``env_name`` (else the file's ``environment``) serve what ``path`` pins, promoting as
    ``options`` say (``dry_run``: plan only)."""
    options = options or Options()
    dry_run = options.dry_run
    fleet = read_fleet(path)
    name = _environment(fleet, env_name)
    ctx = context(settings, name)
    require_reachable(ctx.registry.models, str(path))
    configs: dict[str, Path] = {}
    tags = _require_registered(ctx.registry.models, fleet.models, str(path), configs)
    refuse_unreachable_pins(fleet, registered_pins(ctx.registry.models, fleet.models, tags, configs))
    before = _health(settings, ctx, fleet) if fleet.models else []
    moved = [(row["model"], row["pinned"]) for row in before if not row["ok"]]
    result = SyncResult(fleet, name, ctx.env.alias, dry_run, moved, health=before)
    if not moved:
        return result
    with operation("sync"):  # the ledger's events say which verb sent the calls
        batch = promote_many(settings, name, moved, options, ensembles_first=True)
    result.batch = batch.to_dict()
    if not dry_run and not result.failed:
        result.health = _health(settings, ctx, fleet)
    return result


def _environment(fleet: FleetFile, env_name: str | None) -> str:
    if env_name and fleet.environment and env_name != fleet.environment:
        raise UsageError(
            f"{fleet.path} is for environment '{fleet.environment}', not '{env_name}'",
            fix=f"sync it with --env {fleet.environment} (or without --env)",
        )
    name = env_name or fleet.environment
    if not name:
        raise UsageError(
            f"{fleet.path} names no environment", fix='pass --env E, or write environment = "E" in the file'
        )
    return name


def _require_registered(
    registry: RegistryReader, pins: Mapping[str, str], where: str, configs: dict[str, Path] | None = None
) -> dict[str, dict[str, str]]:
    """Each pinned version's tags; every version MLflow does not hold named in one RegistryError.
    A lookup that failed for another reason while MLflow does not answer is MLflow unreachable.
    ``configs``: filled with model -> the file the embedded registry keeps that version's
    ``config.pbtxt`` in, where the tags' own record says so (``registered_pins`` reads it there)."""
    tags: dict[str, dict[str, str]] = {}
    missing: list[str] = []
    for model, version in sorted(pins.items()):
        try:
            tags[model] = _version_tags(registry, model, version, configs)
        except RegistryError as exc:
            if exc.context.get("code") != NOT_FOUND:
                require_reachable(registry, where, exc)
            missing.append(f"{model} v{version} ({exc.message})")
    if missing:
        raise RegistryError(
            f"{where} pins version(s) MLflow does not hold: {'; '.join(missing)}",
            fix="pin registered versions ('mlreg versions MODEL' lists them); nothing was changed",
        )
    return tags


def _version_tags(
    registry: RegistryReader, model: str, version: str, configs: dict[str, Path] | None
) -> dict[str, str]:
    """``registry.version_tags``; with ``configs``, the embedded registry's record is read here as
    ``version_tags`` reads it first (the same tags), so that the one read also says where the
    version's registered ``config.pbtxt`` lies (``_config_beside``): noted in ``configs``."""
    record = _embedded_record(registry, model, version) if configs is not None else None
    if record is None:  # not the embedded registry, or its file does not hold the version
        return registry.version_tags(model, version)
    config = _config_beside(record)
    if config is not None and configs is not None:
        configs[model] = config
    return dict(record.tags)


def require_reachable(registry: RegistryReader, where: str, failed: RegistryError | None = None) -> None:
    """RegistryError "MLflow is unreachable" unless ``registry`` answers now (one bounded call);
    ``failed``: the lookup that made us ask (a registry that answers lets the caller say what that
    lookup found missing)."""
    try:
        registry.ping()
    except RegistryError as exc:
        raise RegistryError(
            f"MLflow ({redact_uri(registry.uri)}) is unreachable, so the versions {where} pins cannot "
            f"be checked: {exc.message}",
            fix="start the tracking server or check MLFLOW_TRACKING_URI, then run again; nothing was changed",
            code="UNREACHABLE",
        ) from (failed or exc)


def registered_pins(
    registry: RegistryReader,
    pins: Mapping[str, str],
    tags: Mapping[str, Mapping[str, str]],
    configs: Mapping[str, Path] | None = None,
) -> dict[str, dict[str, str]]:
    """Each pinned ensemble version -> the member versions its registered config pins (a member it
    follows at -1: the latest registered version, what a promotion of it loads).  Read from the
    version's ``config.pbtxt`` in MLflow's artifacts, never from tags (``tags``: each version's, as
    ``_require_registered`` read them: one whose registration says another platform -- the
    ``platform`` tag, written from that same config -- is not read; ``configs``: where it noted the
    embedded registry's files)."""
    from registry.contracts.config import parse_config  # lazy: protobuf's text format

    found: dict[str, dict[str, str]] = {}
    with _config_reader(registry, configs) as registered_config:
        for model, version in sorted(pins.items()):
            if tags.get(model, {}).get("platform", "ensemble") != "ensemble":
                continue
            config = parse_config(registered_config(model, version))
            if config.platform == "ensemble":
                steps = [(s.model_name, int(s.model_version)) for s in config.ensemble_scheduling.step]
                found[model] = {m: str(v) if v > 0 else _latest(registry, m) for m, v in steps}
    return found


@contextlib.contextmanager
def _config_reader(
    registry: RegistryReader, configs: Mapping[str, Path] | None
) -> Iterator[Callable[[str, str], str]]:
    """``read(model, version)``: the ``config.pbtxt`` MLflow registered for that version.  The
    embedded registry's file is read where it lies (``configs``' path for the model when the tag
    lookups noted one, else ``_embedded_config``), the very file ``fetch_version`` would copy; any
    other is fetched (``fetch_version``) into one temporary folder for the whole pin, made on the
    first such read and removed once on leaving (a folder made and removed, and the version's
    record read again, per ensemble cost a pin ~1.6x its time: benchmarks/fleet_pin.py)."""
    with contextlib.ExitStack() as stack:
        made: list[Path] = []  # the one temporary folder, once the first fetch made it
        fetches = itertools.count()  # each fetched version in its own numbered subfolder

        def read(model: str, version: str) -> str:
            if configs is None:
                text = _embedded_config(registry, model, version)
            else:
                noted = configs.get(model)
                text = _config_text(noted, model, version) if noted is not None and noted.is_file() else None
            if text is not None:
                return text
            if not made:
                made.append(Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlreg-fleet-"))))
            folder = made[0] / str(next(fetches)) / model
            folder.mkdir(parents=True)
            registry.fetch_version(model, version, folder)
            return _config_text(folder / CONFIG, model, version)

        yield read


def _embedded_record(registry: RegistryReader, model: str, version: str) -> VersionRecord | None:
    """The embedded registry's record of ``model`` ``version`` (its sqlite file, as the registry's
    own ``version_tags`` and ``fetch_version`` read it first); None for any other registry."""
    from registry.mlflow import sqlite  # lazy: sqlite3, only where a pin reads the registry

    return sqlite.model_version(registry.uri, model, version)


def _config_beside(record: VersionRecord) -> Path | None:
    """Where the embedded registry keeps the registered ``config.pbtxt`` of ``record``'s version:
    beside its local source (what ``fetch_version`` copies); None when its artifacts are not
    local files."""
    local = record.local_source()
    return local.parent / CONFIG if local is not None else None


def _embedded_config(registry: RegistryReader, model: str, version: str) -> str | None:
    """The registered config of ``model`` ``version`` read where the embedded registry keeps it
    (``_config_beside`` its record).  None where the registry is not the embedded one or its file
    does not lead to that config: the caller then fetches it as MLflow serves it."""
    record = _embedded_record(registry, model, version)
    config = _config_beside(record) if record is not None else None
    if config is None or not config.is_file():
        return None
    return _config_text(config, model, version)


def _config_text(path: Path, model: str, version: str) -> str:
    """The registered config at ``path``, read with a bound (a config is kilobytes)."""
    fix = f"check the version's artifacts in MLflow ('mlreg show {model} {version}')"
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
        if len(data) <= MAX_CONFIG_BYTES:
            return data.decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise RegistryError(
            f"{model} v{version}: its registered config.pbtxt cannot be read ({exc})", fix=fix
        ) from exc
    raise RegistryError(
        f"{model} v{version}: its registered config.pbtxt is over the {MAX_CONFIG_BYTES:,} bytes mlreg reads",
        fix=fix,
    )


def _latest(registry: RegistryReader, model: str) -> str:
    versions = [int(v.version) for v in registry.versions(model)]
    return str(max(versions)) if versions else "0"


def refuse_unreachable_pins(fleet: FleetFile, pinned: Mapping[str, Mapping[str, str]]) -> None:
    """An ensemble version pinning a member at another version than the file pins that member
    (``pinned``: each ensemble's registered pins, ``registered_pins``)."""
    found = []
    for ensemble, members in sorted(pinned.items()):
        for member, version in sorted(members.items()):
            wanted = fleet.models.get(member)
            if wanted is not None and version != wanted:
                found.append(
                    f"{ensemble} v{fleet.models[ensemble]} pins {member} v{version}, the file pins "
                    f"{member} = {wanted}"
                )
    if found:
        raise UsageError(
            f"{fleet.path}: {'; '.join(found)}: promoting the ensemble brings the versions it pins",
            fix="pin the ensemble version that pins those members ('mlreg versions ENSEMBLE'; "
            "'mlreg fleet pin --from-alias staging' copies a consistent set), or leave the ensemble "
            "out of the file (a member's promotion re-points it); nothing was changed",
        )


def _health(settings: Settings, ctx: Any, fleet: FleetFile) -> list[dict[str, Any]]:
    """Per pinned model: the alias and what serves, from ``mlreg status``'s rows."""
    from mlreg.ops.status import environment_status  # lazy: numpy and the promotion package

    rows = {
        row.model: row for row in environment_status(settings, ctx.env, ctx.registry, list(fleet.models)).rows
    }
    health = []
    for model, version in sorted(fleet.models.items()):
        row = rows.get(model)
        alias, drift = (row.alias, list(row.drift)) if row is not None else ("", [])
        if alias != version:
            drift.insert(0, f"alias {ctx.env.alias} names v{alias or 'nothing'}, the file pins v{version}")
        health.append({"model": model, "pinned": version, "alias": alias, "ok": not drift, "drift": drift})
    return health


# -- small parts ------------------------------------------------------------------------------------


def _model(path: Path, name: str) -> str:
    try:
        return check_model_name(name)
    except MlregError as exc:
        raise UsageError(f"{path}: {exc.message}", fix=exc.fix) from exc


def _version(path: Path, model: str, value: object) -> str:
    text = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else ""
    if not (text.isascii() and text.isdigit() and int(text) > 0):
        raise UsageError(
            f"{path}: {model} = {value!r} is not a positive version number",
            fix=f"write {model} = 3 (the registered version, a whole number)",
        )
    return str(int(text))


def _key(name: str) -> str:
    return name if BARE_KEY.match(name) else json.dumps(name)


def _leading_comments(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def _did_you_mean(key: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    return f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)
