"""GitOps writers (issue 45 item 4): ``mlreg fleet pin`` loses no update when two processes pin
one file at once, and ``fleet sync`` judges an ensemble's pins by its *registered* config,
refusing an inconsistent file before any change, in the dry run and the real run alike.

The race is run by real processes (this machine's ``flock`` and ``os.replace``); the registry of
the consistency checks is a real embedded MLflow (sqlite), written by MLflow in a subprocess (a
fast test never imports MLflow, tests/unit/conftest.py)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mlreg.ops import fleet_pins as fleet
from registry.errors import RegistryError, UsageError
from tests.component.conftest import SCRATCH, Background, Finished
from tests.conftest import ROOT
from tests.fakes import FakeRegistry

PYTHON_MODEL = 'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
ENV = {"PYTHONPATH": str(ROOT)}
MODELS_EACH = 12  # pins per process: each one a read, a change and a write of the same file

RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from mlreg.ops import fleet_pins as fleet
    from tests.fakes import FakeRegistry

    path, me, go, root = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    names = [f"{who}_{i}" for who in ("a", "b") for i in range(int(sys.argv[5]))]
    registry = FakeRegistry(root)
    for name in names:  # the file names both processes' models: each must be registered here
        registry.add(name, "1", 'name: "%s"\\nbackend: "python"\\nmax_batch_size: 0\\n' % name)
    (go.parent / f"ready-{me}").touch()
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    for name in names:
        if name.startswith(me):
            fleet.pin(None, path, {name: "1"}, "production", registry=registry)
    """
)


UNLOCKED_PIN = (  # the old path (read, modify, write; no lock): the positive control
    "def unlocked_pin(fleet, settings, path, pins, env, registry):\n"
    "    found = fleet.read_fleet(path, missing_ok=True)\n"
    "    found.environment = env\n"
    "    found.models.update(pins)\n"
    "    fleet._require_registered(registry, found.models, str(path))  # as the old pin did\n"
    "    found.digest = fleet._digest(path.read_bytes()) if path.exists() else ''\n"
    "    path.parent.mkdir(parents=True, exist_ok=True)\n"
    "    partial = path.with_name('.' + path.name + '.' + str(__import__('os').getpid()))\n"
    "    partial.write_text(fleet.render(found))\n"
    "    __import__('os').replace(partial, path)\n"
) + RACER.replace("fleet.pin(", "unlocked_pin(fleet, ")
# The race, run beside the suite (tests/component/conftest.py ``background``: two interpreters' imports
# and set-up are most of its cost): in its scratch folder, per attempt, the two racers started,
# both set up (imports, registries), then ``go``; each attempt's exit codes, errors, the file's
# text and what its folder holds after.  The unlocked control tries up to three times (a race:
# lost in nearly every run) and stops at the first lost pin.
RACE = textwrap.dedent(
    """
    import json, subprocess, sys, time, tomllib
    from pathlib import Path

    racer, lock, attempts, each = sys.argv[1], sys.argv[2] == "lock", int(sys.argv[3]), sys.argv[4]
    runs = []
    for attempt in range(attempts):
        folder = Path(f"race-{attempt}").resolve()
        folder.mkdir()
        path = folder / "fleet" / "production.toml"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", racer, str(path), me, str(folder / "go"), str(folder / f"reg-{me}")]
                + [each],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for me in ("a", "b")
        ]
        deadline = time.monotonic() + 60  # both set up (imports, registries): both wait on go now
        while time.monotonic() < deadline and not all((folder / f"ready-{me}").exists() for me in "ab"):
            time.sleep(0.01)
        (folder / "go").touch()
        codes, errors = [], []
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            codes.append(proc.returncode)
            errors.append(err[-2000:])
        text = path.read_text() if path.exists() else ""
        left = sorted(p.name for p in path.parent.iterdir()) if path.parent.exists() else []
        runs.append({"codes": codes, "errors": errors, "text": text, "left": left})
        if lock or len(tomllib.loads(text).get("models", {})) < 2 * int(each):
            break
    print(json.dumps(runs))
    """
)


def _race(background: Finished, name: str, tmp_path: Path) -> list[tuple[dict[str, Any], fleet.FleetFile]]:
    """Each attempt of the race ``name`` (BACKGROUND), and the file it left as ``fleet`` reads it."""
    done = background(name)
    assert done.returncode == 0, done.stderr[-3000:]
    found = []
    for attempt, run in enumerate(json.loads(done.stdout.strip().splitlines()[-1])):
        path = tmp_path / f"run-{attempt}" / "production.toml"
        path.parent.mkdir()
        path.write_text(run["text"])
        found.append((run, fleet.read_fleet(path)))
    return found


def test_two_pin_processes_on_one_file_lose_no_update(tmp_path: Path, background: Finished) -> None:
    [(run, pinned)] = _race(background, "race", tmp_path)
    assert run["codes"] == [0, 0], run["errors"]
    wanted = {f"{who}_{i}": "1" for who in ("a", "b") for i in range(MODELS_EACH)}
    assert pinned.models == wanted  # every pin of both processes is in the file
    assert pinned.environment == "production"
    assert run["left"] == ["production.toml"]  # no lock or temp file left


def test_the_old_unlocked_path_loses_updates_in_the_same_race(tmp_path: Path, background: Finished) -> None:
    """The positive control: the same two processes through the old read-modify-write (no lock)
    lose pins -- what the test above would catch."""
    lost = 0
    for run, pinned in _race(background, "unlocked race", tmp_path):  # at most three attempts
        assert run["codes"] == [0, 0], run["errors"]
        lost += 2 * MODELS_EACH - len(pinned.models)
    assert lost > 0


def test_a_writer_that_takes_no_lock_changing_the_file_meanwhile_refuses_the_pin(tmp_path: Path) -> None:
    registry = FakeRegistry(tmp_path / "registry")
    for name in ("a", "b"):
        registry.add(name, "1", PYTHON_MODEL.format(name=name))
    path = tmp_path / "production.toml"
    fleet.pin(None, path, {"a": "1"}, "production", registry=registry)  # type: ignore[arg-type]
    read = fleet.read_fleet(path)
    path.write_text(path.read_text() + "# an editor's line\n")  # someone else's write, no lock
    edited = path.read_bytes()
    read.models["b"] = "1"
    with pytest.raises(UsageError, match="production.toml changed while it was being pinned"):
        fleet.write_fleet(read)
    assert path.read_bytes() == edited  # nothing written over it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["production.toml", "registry"]


def test_a_writer_holding_the_folder_past_the_wait_refuses_a_pin(tmp_path: Path) -> None:
    path = tmp_path / "production.toml"
    path.write_text('environment = "production"\n[models]\na = 1\n')
    before = path.read_bytes()
    with fleet.locked(path), pytest.raises(UsageError, match="another writer has held its folder for 0.2 s"):
        with fleet.locked(path, wait=0.2):
            pass
    assert path.read_bytes() == before


# -- the registered config decides (a real embedded MLflow) -----------------------------------------

SCORER = 'name: "scorer"\nbackend: "python"\nmax_batch_size: 0\n'
SCORING = """name: "scoring"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [ { model_name: "scorer" model_version: VERSION
  input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }
"""
# Run beside the suite (tests/component/conftest.py BACKGROUND), in a folder of its own: MLflow registers
# scorer v1, v2 and scoring v1 (pinning scorer v1), v2 (pinning scorer v2) -- each version's
# config.pbtxt logged to its run, scoring's tags lying (member_scorer = 2, no platform) -- then the
# file pinning scoring = 1 and scorer = 2 is synced (dry run, real run) and pinned onto.
JUDGE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from mlreg.ops import fleet_pins as fleet
    from pipelines.core.options import Options
    from registry.errors import MlregError
    from registry.mlflow import MlflowRegistry
    from registry.settings import Settings

    configs = {("scorer", "1"): sys.argv[1], ("scorer", "2"): sys.argv[1]}
    configs |= {("scoring", v): sys.argv[2].replace("VERSION", v) for v in ("1", "2")}
    settings = Settings.from_env(env={"MLREG_HOME": str(Path("home").resolve())})
    registry = MlflowRegistry(settings)
    client = registry.connection.client
    # where mlreg's embedded registry keeps artifacts (registry/mlflow/runs.py): local files
    experiment = client.create_experiment("exports", artifact_location=settings.artifact_root.as_uri())
    for (name, version), text in configs.items():
        if version == "1":
            client.create_registered_model(name)
        run = client.create_run(experiment)
        Path("config.pbtxt").write_text(text)
        client.log_artifact(run.info.run_id, "config.pbtxt")
        tags = {"member_scorer": "2"} if name == "scoring" else {}
        client.create_model_version(name, run.info.artifact_uri + "/model", run.info.run_id, tags=tags)
    path = Path("fleet/local.toml").resolve()
    path.parent.mkdir()
    path.write_text('environment = "local"\\n[models]\\nscoring = 1\\nscorer = 2\\n')
    found = {"file": str(path), "before": path.read_text()}
    pinned = fleet.read_fleet(path).models
    for name, call in (
        ("dry", lambda: fleet.sync(settings, path, "local", Options(dry_run=True))),
        ("real", lambda: fleet.sync(settings, path, "local")),
        ("pin", lambda: fleet.pin(settings, path, {"scorer": "2"})),
        ("registered", lambda: fleet.registered_pins(registry.models, pinned, {m: {} for m in pinned})),
    ):
        try:
            answer = call()
            found[name] = answer if name == "registered" else "passed"
        except MlregError as exc:
            found[name] = f"{type(exc).__name__}: {exc.message}"
    for version in ("1", "2"):  # the embedded registry's file read in place: the bytes a fetch copies
        dest = Path(f"fetched-{version}/scoring")
        dest.mkdir(parents=True)
        registry.models.fetch_version("scoring", version, dest)
        read = fleet._embedded_config(registry.models, "scoring", version)
        found[f"in place v{version}"] = read is not None and read == (dest / "config.pbtxt").read_text()
    configs = {}  # where the tag lookups of a pin found each version's config (read there)
    fleet._require_registered(registry.models, pinned, str(path), configs)
    found["noted"] = sorted(configs)
    fetched = Path("fetched-1/scoring/config.pbtxt").read_text()
    found["noted as fetched"] = configs["scoring"].read_text() == fetched
    found["after"] = path.read_text()
    found["aliases"] = {m: registry.models.aliases(m) for m in ("scorer", "scoring")}
    found["versions"] = {m: len(registry.models.versions(m)) for m in ("scorer", "scoring")}
    found["store"] = sorted(p.name for p in settings.local_repository.glob("*"))
    print(json.dumps(found))
    """
)
BACKGROUND = {
    "registered pins": Background([sys.executable, "-c", JUDGE, SCORER, SCORING], cwd=SCRATCH, env=ENV),
    "race": Background(
        [sys.executable, "-c", RACE, RACER, "lock", "1", str(MODELS_EACH)], cwd=SCRATCH, env=ENV
    ),
    "unlocked race": Background(
        [sys.executable, "-c", RACE, UNLOCKED_PIN, "nolock", "3", str(MODELS_EACH)], cwd=SCRATCH, env=ENV
    ),
}


def test_sync_reads_an_ensembles_pins_from_its_registered_config_and_refuses_before_any_change(
    background: Finished,
) -> None:
    done = background("registered pins")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    refused = f"UsageError: {found['file']}: scoring v1 pins scorer v1, the file pins scorer = 2"
    for name in ("dry", "real", "pin"):  # the dry run as the real run, and a pin onto that file
        assert str(found[name]).startswith(refused), found
    assert found["registered"] == {"scoring": {"scorer": "1"}}  # the config's pin, not the tag's 2
    assert (found["in place v1"], found["in place v2"]) == (True, True)  # read in place, as fetched
    assert (found["noted"], found["noted as fetched"]) == (["scorer", "scoring"], True)
    assert found["after"] == found["before"]  # the file as it was
    assert found["aliases"] == {"scorer": {}, "scoring": {}}  # nothing promoted
    assert found["versions"] == {"scorer": 2, "scoring": 2}  # no ensemble version registered
    assert found["store"] == []  # nothing written to the store


def test_a_registry_without_local_files_is_read_through_one_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the registered configs are not the embedded registry's files (here the fake's
    memory:// registry; a tracking server), they are fetched -- every one of a pin into one
    temporary folder, removed once; a version whose tag says it is no ensemble is not read."""
    registry = FakeRegistry(tmp_path / "registry")
    registry.add("scorer", "1", SCORER)
    for ensemble in ("scoring", "scoring_b"):
        registry.add(ensemble, "1", SCORING.replace("VERSION", "1").replace('"scoring"', f'"{ensemble}"'))
    fetched: list[Path] = []
    fetch = registry.fetch_version

    def counted(name: str, version: str, dest: Path) -> dict[str, str]:
        fetched.append(dest)
        return fetch(name, version, dest)

    monkeypatch.setattr(registry, "fetch_version", counted)
    pins = {"scorer": "1", "scoring": "1", "scoring_b": "1"}
    found = fleet.registered_pins(registry, pins, {"scorer": {"platform": "python"}})  # type: ignore[arg-type]
    assert found == {"scoring": {"scorer": "1"}, "scoring_b": {"scorer": "1"}}
    assert [dest.name for dest in fetched] == ["scoring", "scoring_b"]  # scorer's not read
    assert len({dest.parents[1] for dest in fetched}) == 1  # one temporary folder for the pin
    assert not fetched[0].parents[1].exists()  # removed on leaving


def test_a_registered_config_over_the_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = FakeRegistry(tmp_path / "registry")
    registry.add("scoring", "1", SCORING.replace("VERSION", "1"))
    monkeypatch.setattr(fleet, "MAX_CONFIG_BYTES", 64)
    with pytest.raises(RegistryError, match="scoring v1: its registered config.pbtxt is over the 64 bytes"):
        fleet.registered_pins(registry, {"scoring": "1"}, {})  # type: ignore[arg-type]


def test_a_pin_from_an_alias_with_mlflow_down_says_mlflow_is_unreachable(tmp_path: Path) -> None:
    """No ping before a pin's lookups: the alias lookup that fails asks whether MLflow answers."""
    registry = FakeRegistry(tmp_path / "registry")
    registry.down = True
    path = tmp_path / "production.toml"
    with pytest.raises(RegistryError, match="MLflow \\(memory://registry\\) is unreachable, so the versions"):
        fleet.pin(None, path, {}, "production", from_alias="staging", registry=registry)  # type: ignore[arg-type]
    assert not path.exists()  # nothing written


# -- issue 45 review, F8: a folder that cannot be locked, and the compare-and-swap's last check ------


@pytest.mark.parametrize("code", ["ENOLCK", "EBADF", "EOPNOTSUPP"])
def test_a_folder_the_filesystem_cannot_lock_refuses_the_pin_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """NFS without lock support answers flock with ENOLCK/EBADF (a fault this machine's local
    disk cannot provoke: flock is replaced by one that fails so).  Before: a raw OSError.  Now a
    UsageError naming the folder and the filesystem's answer; nothing written."""
    import errno
    import fcntl

    registry = FakeRegistry(tmp_path / "registry")
    registry.add("a", "1", PYTHON_MODEL.format(name="a"))
    path = tmp_path / "gitops" / "production.toml"
    path.parent.mkdir()
    path.write_text('environment = "production"\n[models]\n')
    before = path.read_bytes()

    def refuses(fd: int, op: int) -> None:
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(fcntl, "flock", refuses)
    with pytest.raises(UsageError) as refused:
        fleet.pin(None, path, {"a": "1"}, "production", registry=registry)  # type: ignore[arg-type]
    assert (
        f"its folder {path.parent} cannot be locked ({os.strerror(getattr(errno, code))}"
        in refused.value.message
    )
    assert "nothing was written" in refused.value.message
    assert "local disk" in str(refused.value.fix)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["production.toml"]


def test_a_writer_that_renames_a_file_in_after_the_digest_was_checked_refuses_the_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer without a lock (``git pull``: a rename) lands between the digest check and the
    rename.  Before: the digest of the bytes read matched, the pin's rename overwrote the other
    write.  Now the file's identity is checked again last: refused, the other write kept."""
    registry = FakeRegistry(tmp_path / "registry")
    for name in ("a", "b"):
        registry.add(name, "1", PYTHON_MODEL.format(name=name))
    path = tmp_path / "production.toml"
    fleet.pin(None, path, {"a": "1"}, "production", registry=registry)  # type: ignore[arg-type]
    read = fleet.read_fleet(path)
    read.models["b"] = "1"
    digest = fleet._digest
    theirs = path.read_text() + "c = 1\n"

    def then_pulled(data: bytes) -> str:
        found = digest(data)
        pulled = tmp_path / ".pulled"
        pulled.write_text(theirs)
        os.replace(pulled, path)  # git's write: a new file renamed in
        return found

    monkeypatch.setattr(fleet, "_digest", then_pulled)
    with pytest.raises(UsageError, match="production.toml changed while it was being pinned"):
        fleet.write_fleet(read)
    assert path.read_text() == theirs
