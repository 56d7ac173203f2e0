"""Issue 44 items 1-3: the model folder is one closed, verified unit.

The plant test is generated: a planted file at every position Triton's loader and the python
stub's import system search -- the model folder, the version folder, a subfolder of each, a
version folder without a manifest, a non-canonical version folder, ``warmup/`` -- under every name
that matters there (``<v>.py``, ``__init__.py``, a shadowing module, a ``.pth``, the model's own
``model.py``, a data file), plus a sourceless ``<v>.pyc`` and, on a local store, a symbolic link and
a hard link; on a local store and on S3 (a real moto_server).  Each is refused by the verifier
before any load (``verify_version``, ``verify_load``, a real ``Fleet`` whose replica never hears a
load) and named by the folder check ``mlreg status`` runs.  The positive control runs the same
plant with the check bypassed: the model folder localized as Triton does (S3: every object under
the model's prefix), then imported the way Triton 2.51's python stub imports a version (the version
folder, the model folder, then the backend folder appended to ``sys.path``; ``import <v>.model``)
in a subprocess -- the planted code runs where the rule says it would.
"""

from __future__ import annotations

import json
import os
import py_compile
import select
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.plan import serving_versions
from pipelines.core.undo import UndoLog
from pipelines.fleet.fleet import Change, Fleet
from pipelines.promote.integrity import folder_problems
from pipelines.storage import Repository, open_store
from pipelines.storage.closed_world import folder_entries, unexpected
from pipelines.storage.local import sweep_temps
from pipelines.storage.push import push_model
from registry.errors import StorageError
from tests.fakes import FakeTarget
from tests.unit.worlds import MEMBER, World

MODEL, VERSION = "scorer", "9"
CONFIG = f'name: "{MODEL}"\nbackend: "python"\nversion_policy {{ specific {{ versions: [ {VERSION} ] }} }}\n'
MODEL_PY = "import triton_python_backend_utils as pb_utils\n\nSOURCE = 'verified'\n"
PLANTED = "print('PLANTED-RAN')\n__path__ = []\n"  # runs on import; a package, so the import goes on
UTILS = "SOURCE = 'the backend'\n"

# -- the positions, generated -------------------------------------------------------------------

WHERE = ("", f"{VERSION}/", f"{VERSION}/sub/", "sub/", "99/", f"0{VERSION}/", "warmup/")
NAMES = (
    f"{VERSION}.py",
    "__init__.py",
    "triton_python_backend_utils.py",
    "numpy.py",
    "x.pth",
    "model.py",
    "x.bin",
)
# What the stub's import runs when it loads v9 (sys.path: 9/, the model folder, the backend's):
# a module 9.py beside 9/ (a module beats a namespace folder), 9/__init__.py (a regular package),
# the utils module model.py imports, found in 9/ or the model folder before the backend's folder,
# and 9/model.py itself.  numpy.py is not: site-packages come first on sys.path.
IMPORTED = {
    f"{VERSION}.py",
    "triton_python_backend_utils.py",
    f"{VERSION}/{VERSION}.py",
    f"{VERSION}/__init__.py",
    f"{VERSION}/triton_python_backend_utils.py",
    f"{VERSION}/model.py",
    f"{VERSION}.pyc",
    f"{VERSION}.py@symlink",
    f"{VERSION}/model.py@hardlink",
    "triton_python_backend_utils.py@hardlink",
}


@dataclass(frozen=True)
class Plant:
    path: str  # under the model folder
    kind: str = "file"  # file | pyc | symlink | hardlink (of the covered 9/model.py, same bytes)

    @property
    def id(self) -> str:
        return self.path if self.kind in {"file", "pyc"} else f"{self.path}@{self.kind}"

    @property
    def named(self) -> str:
        """How the refusal names it."""
        if self.path.startswith("99/"):
            return f"{MODEL}/99/"
        if self.path.startswith(f"{VERSION}/"):
            return self.path[len(VERSION) + 1 :]
        return f"{MODEL}/{self.path}"


def positions(local: bool) -> list[Plant]:
    plants = [Plant(where + name) for where in WHERE for name in NAMES]
    plants.append(Plant(f"{VERSION}.pyc", "pyc"))
    if local:  # only a local folder has links
        plants += [
            Plant(f"{VERSION}.py", "symlink"),
            Plant(f"{VERSION}/sub", "symlink"),
            Plant(f"{VERSION}/model.py", "hardlink"),
            Plant("triton_python_backend_utils.py", "hardlink"),
        ]
    return plants


# -- the stores ---------------------------------------------------------------------------------


@pytest.fixture(params=["local", "s3"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Repository:
    if kind == "local":
        return open_store(tmp_path / "store")
    from pipelines.devstack import local_s3

    server = request.getfixturevalue("s3_server")
    bucket = f"cw-{uuid.uuid4().hex[:12]}"
    local_s3.create_bucket(server.endpoint, bucket)
    return open_store(server.store_uri(bucket, "models"))


def _seed(store: Repository, tmp_path: Path) -> Path:
    """scorer v9 pushed as mlreg pushes it (manifest with the config, the config last)."""
    folder = tmp_path / "src" / MODEL
    (folder / VERSION).mkdir(parents=True)
    (folder / VERSION / "model.py").write_text(MODEL_PY)
    (folder / "config.pbtxt").write_text(CONFIG)
    push_model(store, folder)
    store.versions.verify_version(MODEL, VERSION)  # clean: verifies
    return folder


def _plant(store: Repository, plant: Plant, tmp_path: Path) -> None:
    key = f"{MODEL}/{plant.path}"
    if plant.kind == "file":
        store.objects.write(key, PLANTED.encode())
        return
    if plant.kind == "pyc":
        source = tmp_path / "planted.py"
        source.write_text(PLANTED)
        compiled = tmp_path / "planted.pyc"
        py_compile.compile(str(source), str(compiled), doraise=True)
        store.objects.write(key, compiled.read_bytes())
        return
    root = Path(store.uri)
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    target = root / key
    if plant.kind == "symlink":
        if plant.path.endswith(".py"):
            (outside / "planted.py").write_text(PLANTED)
            target.symlink_to(outside / "planted.py")
        else:
            (outside / "x.py").write_text(PLANTED)
            target.symlink_to(outside, target_is_directory=True)
        return
    # a hard link: of the covered file, with the very bytes it was verified with (only the link
    # count tells), or of a planted module
    other = outside / f"linked-{plant.path.replace('/', '-')}"
    if target.exists():
        other.write_bytes(target.read_bytes())
        target.unlink()
    else:
        other.write_text(PLANTED)
    os.link(other, target)


def _write_through_hard_link(plant: Plant, tmp_path: Path) -> None:
    """The threat of a hard link: its bytes change through the name mlreg does not watch."""
    if plant.kind == "hardlink":
        (tmp_path / "outside" / f"linked-{plant.path.replace('/', '-')}").write_text(PLANTED)


# -- the positive control: what Triton's python stub would run ------------------------------------

STUB = """
import importlib, sys
version_folder, model_folder, backend_folder = sys.argv[1:4]
sys.path.append(version_folder)  # pb_stub.cc: the version folder, the model folder, the backend's
sys.path.append(model_folder)
sys.path.append(backend_folder)
sys.dont_write_bytecode = True
try:
    importlib.import_module(sys.argv[4] + ".model")
except Exception as exc:
    print("import failed:", type(exc).__name__)
"""
# STUB, once per folder, without a new interpreter each time (~110 imports in the plant tests, a
# fresh ``python -I`` 0.1-0.3 s each): one ``python -I`` interpreter, started with nothing of its
# own imported but ``os`` and ``json``, forks a child per request; the child -- the interpreter as
# ``python -I`` starts it, sys.path and sys.modules untouched -- runs STUB's very code with its
# stdout and stderr in a file, and the server answers with the child's exit status.  Every wait is
# bounded (the child's 60 s, as subprocess.run's timeout was; the answer's 90 s).
STUB_SERVER = """
import json, os, sys, time
code = compile(sys.argv[1], "<stub>", "exec")
for line in sys.stdin:
    args, out = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv[1:] = args
        try:
            exec(code, {"__name__": "__main__"})
        except BaseException:
            import traceback
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    deadline, status = time.monotonic() + 60, None
    while status is None and time.monotonic() < deadline:
        done, code_ = os.waitpid(pid, os.WNOHANG)
        status = code_ if done else time.sleep(0.002)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    print(json.dumps("timeout" if status is None else status), flush=True)
"""


class Stub:
    """The STUB_SERVER process: ``runs_planted(folder, tmp_path)`` imports ``<v>.model`` from
    ``folder`` as Triton's python stub does and says whether the planted code ran."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-c", STUB_SERVER, STUB],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def runs_planted(self, folder: Path, tmp_path: Path) -> bool:
        backend = tmp_path / "backend"
        backend.mkdir(exist_ok=True)
        (backend / "triton_python_backend_utils.py").write_text(UTILS)
        out = tmp_path / f"stub-{uuid.uuid4().hex[:8]}.out"
        args = [str(folder / VERSION), str(folder), str(backend), VERSION]
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps([args, str(out)]) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], 90)
        assert ready, "the stub server did not answer within 90 s"
        status = json.loads(self.process.stdout.readline())
        assert status == 0, f"the stub's import ended with {status}"
        output = out.read_text()
        assert "Traceback" not in output, output
        return "PLANTED-RAN" in output

    def close(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process.stdout.close()


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    server = Stub()
    try:
        yield server
    finally:
        server.close()


def _localized(store: Repository, tmp_path: Path) -> Path:
    """The model folder as Triton reads it: a local store's own folder; on S3 every object under
    the model's prefix copied to a local folder (core's LocalizePath; read a few at a time)."""
    if not store.uri.startswith("s3://"):
        return Path(store.uri) / MODEL
    dest = tmp_path / "localized" / MODEL
    keys = store.objects.list_prefix(f"{MODEL}/")
    with ThreadPoolExecutor(max_workers=8) as pool:
        read = list(pool.map(store.objects.read, keys))
    for key, data in zip(keys, read, strict=True):
        assert data is not None
        (dest / key[len(MODEL) + 1 :]).parent.mkdir(parents=True, exist_ok=True)
        (dest / key[len(MODEL) + 1 :]).write_bytes(data)
    return dest


def test_the_clean_folder_imports_only_what_was_verified(tmp_path: Path, stub: Stub) -> None:
    """The control's control: nothing planted, nothing planted runs (and the stub's import works)."""
    store = open_store(tmp_path / "store")
    _seed(store, tmp_path)
    assert not stub.runs_planted(_localized(store, tmp_path), tmp_path)
    assert folder_entries(store.objects, MODEL, (VERSION,)) == []


# -- the generated plant test ----------------------------------------------------------------------


def _calls_of_a_refused_move(store: Repository) -> list[str]:
    """A real Fleet's move of v9 onto a replica (a fake Triton that records each call): refused
    with a StorageError; the calls the replica heard."""
    sent: list[str] = []
    replica = FakeTarget("r0:8001", lambda target, call: sent.append(call.method), ready=lambda *_: True)
    undo = UndoLog(gpu=False, journal=store.session)
    with Fleet(store, ["r0:8001"], lambda url: replica, 10, undo=undo) as fleet, pytest.raises(StorageError):
        fleet.move("r0:8001", Change(MODEL, CONFIG, (VERSION,)))
    return sent


def test_every_planted_position_is_refused_before_any_load_and_runs_when_the_check_is_bypassed(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, stub: Stub
) -> None:
    store = _store(kind, tmp_path, request)
    _seed(store, tmp_path)
    clean = _snapshot(store)
    ran: set[str] = set()
    plants = positions(kind == "local")
    for index, plant in enumerate(plants):
        here = tmp_path / str(index)
        here.mkdir()
        _plant(store, plant, here)
        store.versions.distrusted.clear()  # one run per plant: what the last one learnt of v9 forgotten
        # refused by the verifier (what every load path calls), naming the entry
        with pytest.raises(StorageError) as caught:
            store.versions.verify_version(MODEL, VERSION)
        assert plant.named in caught.value.message, (plant, caught.value.message)
        # before any load (``verify_load``, which every Fleet load calls): the replica hears none
        assert "load" not in _calls_of_a_refused_move(store)
        # named by what `mlreg status` reads (nothing hashed) -- but a covered file's new bytes
        # (9/model.py rewritten in place), which only hashing sees: verify names those above
        if plant.id != f"{VERSION}/model.py":
            entries = [f"{MODEL}/{rel}" for rel, _ in folder_entries(store.objects, MODEL, (VERSION,))]
            assert any(plant.named in entry for entry in entries), (plant, entries)
        # the positive control: bypass the check, read the folder as Triton does
        _write_through_hard_link(plant, here)
        localized = _localized(store, here)
        if stub.runs_planted(localized, here):
            ran.add(plant.id)
        else:  # not imported by the stub: still in what Triton reads (the model folder it localizes)
            assert plant.path in {p.relative_to(localized).as_posix() for p in localized.rglob("*")}, plant
        _restore(store, clean, plant)
    assert ran == {p.id for p in plants} & IMPORTED
    store.versions.distrusted.clear()
    store.versions.verify_load(MODEL, (VERSION,))  # every plant gone again: the clean folder loads


def _snapshot(store: Repository) -> dict[str, bytes | None]:
    return {key: store.objects.read(key) for key in store.objects.list_prefix(f"{MODEL}/")}


def _restore(store: Repository, clean: dict[str, bytes | None], plant: Plant) -> None:
    """The model folder as seeded: a local one copied back whole (links and all gone), on S3 the
    planted keys deleted and the one written over put back."""
    if not store.uri.startswith("s3://"):
        shutil.rmtree(Path(store.uri) / MODEL)
        for key, data in clean.items():
            (Path(store.uri) / key).parent.mkdir(parents=True, exist_ok=True)
            (Path(store.uri) / key).write_bytes(data or b"")
        return
    store.objects.delete_keys([key for key in store.objects.list_prefix(f"{MODEL}/") if key not in clean])
    if f"{MODEL}/{plant.path}" in clean:
        store.objects.write(f"{MODEL}/{plant.path}", clean[f"{MODEL}/{plant.path}"] or b"")


def test_a_hard_link_of_a_covered_file_with_the_verified_bytes_is_refused(tmp_path: Path) -> None:
    """Same bytes, so the digest check alone passes; the link count says another name can change
    them after the check -- and writing through it does change what Triton imports."""
    store = open_store(tmp_path / "store")
    _seed(store, tmp_path)
    plant = Plant(f"{VERSION}/model.py", "hardlink")
    _plant(store, plant, tmp_path)
    with pytest.raises(StorageError, match=r"model\.py is a hard link \(2 names\)"):
        store.versions.verify_version(MODEL, VERSION)
    assert store.versions.check_version(
        MODEL, VERSION, hashing="all", closed_world=False
    ).ok  # bytes alone pass


# -- verbs: store verify and status name it ------------------------------------------------------------


def test_store_verify_and_status_name_every_unexpected_entry(tmp_path: Path) -> None:
    from mlreg.ops.store_verify import store_verify

    store = open_store(tmp_path / "store")
    _seed(store, tmp_path)
    for path in (f"{VERSION}.py", "numpy.py", "99/model.py", "sub/x.pth"):
        store.objects.write(f"{MODEL}/{path}", PLANTED.encode())
    report = store_verify(str(tmp_path / "store"), MODEL)
    found = {(c.model, c.version, c.status) for _, c in report.checks}
    assert found == {(MODEL, VERSION, "unexpected entries"), (MODEL, "99", "incomplete")}
    failure = report.failure()
    assert failure is not None
    for named in (f"{MODEL}/{VERSION}.py", f"{MODEL}/numpy.py", f"{MODEL}/99/", f"{MODEL}/sub/x.pth"):
        assert named in failure.message
    lines = folder_problems(store.objects, MODEL, [VERSION])
    assert [line.split(" ", 1)[0] for line in lines] == [
        f"{MODEL}/{VERSION}.py",
        f"{MODEL}/99/",
        f"{MODEL}/numpy.py",
        f"{MODEL}/sub/x.pth",
    ]
    assert all("every load of scorer is refused" in line for line in lines)
    from mlreg.ops.store_ls import store_ls

    rows = {row["version"]: row for row in store_ls(store).versions}
    assert rows[VERSION]["state"] == "unexpected entries"
    assert any(line.startswith(f"{MODEL}/numpy.py ") for line in rows[VERSION]["problems"])


def test_status_rows_carry_the_entries_as_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlreg.ops import status
    from pipelines.promote.environments import Environment
    from tests.fakes import FakeRegistry

    store = open_store(tmp_path / "store")
    _seed(store, tmp_path)
    store.objects.write(f"{MODEL}/{VERSION}.py", PLANTED.encode())
    registry = FakeRegistry()
    registry.tags = {(MODEL, VERSION): {}}
    registry.alias_map = {MODEL: {"local": VERSION}}
    url = "127.0.0.1:8001"
    monkeypatch.setattr(status, "probe_targets", lambda *args: ({url: {MODEL: {VERSION: "READY"}}}, {}))
    env = Environment("local", str(tmp_path / "store"), (url,), "local", gpu=False)
    rows = status.model_status(Any, env, registry, [MODEL])  # type: ignore[arg-type]
    assert [d for d in rows[0]["drift"] if d.startswith(f"{MODEL}/{VERSION}.py ")] != []


# -- the allow-list's other side ------------------------------------------------------------------------


def test_what_mlreg_writes_is_allowed(tmp_path: Path) -> None:
    """Manifest, signature, the empty bytecode guard, an empty version folder and several verified
    versions: nothing is unexpected, and a load of two versions verifies."""
    store = open_store(tmp_path / "store")
    folder = _seed(store, tmp_path)
    store.versions.put_version(MODEL, "10", folder / VERSION)
    store.objects.write(f"{MODEL}/{VERSION}/.mlreg-signature.json", b"{}")
    (tmp_path / "store" / MODEL / "11").mkdir()
    assert (tmp_path / "store" / MODEL / VERSION / "__pycache__").is_file()  # the guard
    stamps = {f"{MODEL}/": [0, "", None, 0], f"{MODEL}/{VERSION}/": [0, "", None, 0]}  # S3 folder markers
    assert unexpected(MODEL, stamps, [], {VERSION: store.versions.read_manifest(MODEL, VERSION)}) == []
    assert unexpected(MODEL, {f"{MODEL}/sub/": [5, "", None, 0]}, [], {}) != []  # one with bytes is not
    assert folder_entries(store.objects, MODEL, (VERSION,)) == []
    store.versions.verify_load(MODEL, (VERSION, "10"))


def test_a_file_listed_in_another_versions_manifest_is_not_named_but_one_outside_is(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    folder = _seed(store, tmp_path)
    store.versions.put_version(MODEL, "10", folder / VERSION)
    store.objects.write(f"{MODEL}/10/extra.py", PLANTED.encode())
    assert folder_entries(store.objects, MODEL, (VERSION,)) == [
        ("10/extra.py", "is not listed in the manifest of 10/")
    ]
    with pytest.raises(StorageError, match=r"scorer/10/extra\.py is not listed in the manifest of 10/"):
        store.versions.verify_version(MODEL, VERSION)  # Triton localizes the whole folder: v10's litter too


# -- EXECUTION_ENV_PATH ---------------------------------------------------------------------------------


def _env_config(path: str) -> str:
    return CONFIG + f'parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{path}" }} }}\n'


def test_an_execution_environment_in_another_version_folder_is_refused_at_the_load(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    folder = _seed(store, tmp_path)
    (folder / VERSION / "env.tar.gz").write_bytes(b"archive")
    store.versions.put_version(MODEL, "10", folder / VERSION)
    store.session.write_config(MODEL, _env_config("$$TRITON_MODEL_DIRECTORY/10/env.tar.gz"))
    with pytest.raises(StorageError, match=r"lies in version folder 10/, which this load does not load"):
        store.versions.verify_load(MODEL, (VERSION,))
    store.versions.verify_load(MODEL, ("10",))  # its own folder, listed in its manifest: loads
    store.session.write_config(MODEL, _env_config("$$TRITON_MODEL_DIRECTORY/10/other.tar.gz"))
    with pytest.raises(StorageError, match=r"is not a file listed in the manifest of 10/"):
        store.versions.verify_load(MODEL, ("10",))
    store.session.write_config(MODEL, _env_config("/opt/env.tar.gz"))
    with pytest.raises(StorageError, match=r"lies outside the model's version folders"):
        store.versions.verify_load(MODEL, ("10",))


def test_validate_refuses_an_execution_environment_in_a_version_folder_the_model_lacks(
    tmp_path: Path,
) -> None:
    from registry.contracts.validate import validate_path

    folder = tmp_path / "repo" / MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL_PY)
    (folder / "config.pbtxt").write_text(
        _env_config("$$TRITON_MODEL_DIRECTORY/99/env.tar.gz").replace("[ 9 ]", "[ 1 ]")
    )
    errors = [f for f in validate_path(folder).findings if f.is_error and f.rule == "paths"]
    assert [f.message for f in errors] == [
        "parameter EXECUTION_ENV_PATH '$$TRITON_MODEL_DIRECTORY/99/env.tar.gz' lies in version folder 99/, "
        "which this model folder does not hold (its version folders: 1/): Triton would run another "
        "version's (or an unverified) execution environment"
    ]
    assert "$$TRITON_MODEL_DIRECTORY/1/env.tar.gz" in errors[0].fix
    (folder / "config.pbtxt").write_text(
        _env_config("$$TRITON_MODEL_DIRECTORY/1/env.tar.gz").replace("[ 9 ]", "[ 1 ]")
    )
    assert [f for f in validate_path(folder).findings if f.is_error and f.rule == "paths"] == []


# -- item 3: no way to finish a version with other bytes -------------------------------------------------


def _objects(store: Repository) -> dict[str, bytes | None]:
    return {key: store.objects.read(key) for key in store.objects.list_prefix("")}


@pytest.mark.parametrize("how", ["manifest removed", "manifest truncated"])
def test_a_push_never_finishes_a_version_without_its_manifest_with_other_bytes(
    kind: str, how: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = _store(kind, tmp_path, request)
    folder = _seed(store, tmp_path)
    manifest = f"{MODEL}/{VERSION}/.mlreg-manifest.json"
    registered = store.versions.read_manifest(MODEL, VERSION)
    assert registered is not None
    if how == "manifest removed":
        store.objects.delete(manifest)
    else:
        store.objects.write(manifest, b'{"files": ')
    (folder / VERSION / "model.py").write_text(MODEL_PY.replace("verified", "rewritten"))
    before = _objects(store)
    digests = {(MODEL, VERSION): registered.digest}
    with pytest.raises(StorageError) as caught:
        push_model(store, folder, registered=lambda m, v: digests.get((m, v)))
    assert "is not what MLflow registered" in caught.value.message
    assert "nothing was sent" in caught.value.message
    assert f"mlreg store repair {MODEL} {VERSION}" in (caught.value.fix or "")
    assert _objects(store) == before  # byte-identical: nothing sent, nothing finished
    with pytest.raises(StorageError, match="MLflow registers no digest for it"):
        push_model(store, folder, registered=lambda m, v: None)
    assert _objects(store) == before
    # the registered bytes finish it
    (folder / VERSION / "model.py").write_text(MODEL_PY)
    push_model(store, folder, registered=lambda m, v: digests.get((m, v)))
    assert store.versions.verify_version(MODEL, VERSION, registered.digest).digest == registered.digest


def test_a_new_version_needs_no_registry(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    _seed(store, tmp_path)  # pushed with registered=None: nothing was stored under scorer/9/
    assert store.versions.read_manifest(MODEL, VERSION) is not None


# -- issue 45 item 8: an interrupted upload leaves nothing in a version folder -------------------------


def test_an_interrupted_upload_leaves_no_temporary_file_in_the_model_folder(tmp_path: Path) -> None:
    """A signal mid-copy (raised from the progress callback, as mlreg's handler raises): the
    temporary file is at the store's root, and removed; the version folder holds nothing partial."""
    store = open_store(tmp_path / "store")
    source = tmp_path / "big"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(3 << 20))

    class Interrupted(BaseException):
        pass

    def cut(sent: int) -> None:
        raise Interrupted

    with pytest.raises(Interrupted):
        store.versions.put_version(MODEL, "1", source, progress=cut)
    leftovers = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert [p for p in leftovers if ".tmp" in p.name or ".mlreg-tmp." in p.name] == []
    assert not (tmp_path / "store" / MODEL / "1" / "weights.bin").exists()


def test_temporary_files_of_a_gone_process_are_swept_from_the_root_only(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = root / f".mlreg-tmp.{dead.stdout.strip()}.abcd1234"
    mine = root / f".mlreg-tmp.{os.getpid()}.abcd1234"
    other = root / "notes.mlreg-tmp.1.txt"
    for path in (gone, mine, other):
        path.write_bytes(b"partial")
        os.utime(path, (1, 1))  # untouched for long
    fresh = root / f".mlreg-tmp.{dead.stdout.strip()}.fresh000"
    fresh.write_bytes(b"being written")
    assert sweep_temps(root) == [gone]
    assert {p.name for p in root.iterdir()} == {mine.name, other.name, fresh.name}


# -- every version a load config names is verified: the kept serving one too ---------------------


def _deployed(tmp_path: Path) -> World:
    world = World(tmp_path)
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    return world


def test_a_kept_serving_version_that_does_not_verify_is_never_named_by_a_load(tmp_path: Path) -> None:
    """Issue 44's repro (--no-way-back with the serving v1 changed in the store and in the
    registry): the swap used to load [1, 2], and Triton re-created v1 from the changed files.  Now
    the promotion goes ahead without overlap -- no load names v1 -- and v2 serves."""
    world = _deployed(tmp_path)
    stored = world.store_root / "net" / "1" / "model.py"
    stored.write_text(stored.read_text().replace("# version", "#-version"))
    registered = world.registry.root / "net" / "1" / "model" / "model.py"
    registered.write_text(registered.read_text() + "# lost\n")
    world.promote("net", "2", no_way_back=True)
    loads = [(url, versions) for _, url, model, versions in world.loads() if model == "net"]
    assert loads != []
    assert all("1" not in versions for _, versions in loads), loads
    assert serving_versions(world.config("net")) == ["2"]


def test_a_load_holds_each_version_to_the_digest_it_verified_with(tmp_path: Path) -> None:
    """A version verified against MLflow's digest, then rewritten consistently (files and manifest
    agree again, as whoever can write the store can do): the next load names it and is refused --
    and so is a version that did not verify earlier in this run, whatever it holds now."""
    store = open_store(tmp_path / "store")
    folder = _seed(store, tmp_path)
    registered = store.versions.verify_version(
        MODEL, VERSION, store.versions.read_manifest(MODEL, VERSION).digest
    )  # type: ignore[union-attr]
    other = open_store(tmp_path / "store")  # another writer: a store object of its own
    (folder / VERSION / "model.py").write_text(MODEL_PY.replace("verified", "rewritten"))
    other.versions.put_version(MODEL, VERSION, folder / VERSION)  # files and a manifest that agree
    assert other.versions.verify_version(MODEL, VERSION).digest != registered.digest  # self-consistent
    with pytest.raises(StorageError, match=r"does not match the digest registered in MLflow"):
        store.versions.verify_load(MODEL, (VERSION,))
    assert store.versions.refused(MODEL, VERSION)  # and from now on, in this run, refused as such
    with pytest.raises(StorageError, match=r"did not verify earlier in this run"):
        store.versions.verify_load(MODEL, ("10",), CONFIG)  # the config names v9: held to it too
