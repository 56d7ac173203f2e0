"""`mlreg status` speaks one numbering: MLflow versions in every column, Triton folders beside them.

A member's promotion re-points its ensemble: the ensemble is registered as a new version (its
``member_<name>`` tags pin the new member) but keeps serving from its Triton folder.  The store is
a real local folder; the registry is tests/fakes.py's, the servers' answers a stub of probe_targets.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mlreg.ops import status, status_replicas, status_rows, status_views
from pipelines.core.plan import desired_config
from pipelines.promote.environments import Environment
from pipelines.storage import open_store
from tests.fakes import FakeRegistry

URL = "triton-0:8001"
PROBE_TARGETS = status.probe_targets  # ``world`` stubs it
MEMBER = """name: "net"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
ENSEMBLE = """name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling {
  step [
    { model_name: "net" model_version: NET
      input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } }
  ]
}
"""


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """After a promotion of net v2: net serves folder 2; ens, re-pointed to net v2, was registered
    as v2 and serves from folder 1 (its v1 pinned net v1)."""
    store = open_store(tmp_path / "store")
    store.session.write_config("net", desired_config(MEMBER, ["2"], gpu=False))
    store.session.write_config("ens", desired_config(ENSEMBLE.replace("NET", "2"), ["1"], gpu=False))
    for folder in ("net/2", "ens/1"):
        (tmp_path / "store" / folder).mkdir(parents=True)
    registry = FakeRegistry()
    registry.tags = {
        ("net", "1"): {},
        ("net", "2"): {},
        ("ens", "1"): {"member_net": "1"},
        ("ens", "2"): {"member_net": "2"},
    }
    registry.alias_map = {"net": {"local": "2"}, "ens": {"local": "2"}}
    live: dict[str, Any] = {URL: {"net": {"2": "READY"}, "ens": {"1": "READY"}}}
    pins: dict[str, Any] = {URL: {"ens": {"net": "2"}}}
    monkeypatch.setattr(status, "probe_targets", lambda *args: (live, pins))
    env = Environment("local", str(tmp_path / "store"), (URL,), "local", gpu=False)
    return SimpleNamespace(store=store, registry=registry, live=live, pins=pins, env=env)


def rows(world: SimpleNamespace) -> dict[str, dict[str, Any]]:
    found = status.model_status(SimpleNamespace(), world.env, world.registry, ["net", "ens"])  # type: ignore[arg-type]
    return {row["model"]: row for row in found}


def test_a_re_pointed_ensemble_reads_as_its_registered_version_with_its_folder(
    world: SimpleNamespace,
) -> None:
    ens = rows(world)["ens"]
    assert ens["alias"] == "2"
    assert (ens["desired"], ens["desired_folders"]) == (["2"], ["1"])
    assert (ens["serving"], ens["serving_folders"]) == ({URL: ["2"]}, {URL: ["1"]})
    assert ens["drift"] == []  # a consistent fleet never looks like drift


def test_a_model_s_folder_is_its_registered_version(world: SimpleNamespace) -> None:
    net = rows(world)["net"]
    assert (net["alias"], net["desired"], net["desired_folders"]) == ("2", ["2"], ["2"])
    assert (net["serving"], net["serving_folders"]) == ({URL: ["2"]}, {URL: ["2"]})
    assert net["drift"] == []


def test_a_target_pinning_the_old_member_serves_the_old_registered_version(world: SimpleNamespace) -> None:
    world.pins[URL]["ens"] = {"net": "1"}  # the replica still runs the ensemble as registered in v1
    ens = rows(world)["ens"]
    assert (ens["serving"], ens["serving_folders"]) == ({URL: ["1"]}, {URL: ["1"]})
    assert ens["drift"] == [f"{URL} pins net v1, the store's config pins v2"]


def test_the_store_pinning_what_the_alias_does_not_is_drift_and_named_by_its_version(
    world: SimpleNamespace,
) -> None:
    world.store.session.write_config("ens", desired_config(ENSEMBLE.replace("NET", "1"), ["1"], gpu=False))
    ens = rows(world)["ens"]
    assert (ens["desired"], ens["desired_folders"]) == (["1"], ["1"])  # v1 pins net v1
    assert ens["serving"] == {URL: ["2"]}  # what the replica loaded still pins net v2
    assert ens["drift"] == [
        "alias local=v2 pins net v2, the store's config pins v1",
        f"{URL} pins net v2, the store's config pins v1",
    ]


def test_a_target_serving_another_folder_is_drift_in_both_numberings(world: SimpleNamespace) -> None:
    world.live[URL] = {"net": {"1": "READY"}, "ens": {"2": "READY"}}
    found = rows(world)
    assert found["net"]["drift"] == [f"{URL} serves v1, store wants v2"]
    assert found["ens"]["drift"] == [f"{URL} serves v2, store wants v2 [1]"]  # same pins, other folder


def test_a_target_that_lost_a_model_serves_nothing(world: SimpleNamespace) -> None:
    world.live[URL] = {"net": {"2": "READY"}}  # a replica restarted without the ensemble
    found = rows(world)
    assert found["ens"]["drift"] == [  # not "vnothing"; and the command that loads it there (issue 45)
        f"{URL} serves nothing, store wants v2 [1]",
        f"{URL} serves nothing of ens: to load what the store wants there, run "
        "'mlreg promote ens --version 2 --env local'",
    ]


def test_an_ensemble_no_registered_version_explains_reads_unknown(world: SimpleNamespace) -> None:
    world.store.session.write_config("ens", desired_config(ENSEMBLE.replace("NET", "7"), ["1"], gpu=False))
    ens = rows(world)["ens"]
    assert (ens["desired"], ens["desired_folders"]) == (["?"], ["1"])


def test_an_unreachable_registry_is_drift_and_leaves_the_ensemble_s_versions_unknown(
    world: SimpleNamespace,
) -> None:
    world.registry.down = True
    found = rows(world)
    assert (found["net"]["alias"], found["net"]["desired"]) == ("", ["2"])
    assert (found["ens"]["desired"], found["ens"]["serving"]) == (["?"], {URL: ["?"]})
    assert found["ens"]["drift"] == [
        "MLflow unreachable: MLflow (memory://registry): ping failed: connection refused"
    ]


def test_an_unreachable_target_keeps_its_reason_in_both_numberings(world: SimpleNamespace) -> None:
    world.live[URL] = "unreachable: connection refused"
    ens = rows(world)["ens"]
    assert ens["serving"] == ens["serving_folders"] == {URL: "unreachable: connection refused"}
    assert ens["drift"] == [f"{URL} unreachable: connection refused"]
    assert (
        ens.serving
        == ens.serving_folders
        == {URL: status_rows.Unreachable("unreachable: connection refused")}
    )
    assert ens.serving_labels() == {URL: "unreachable: connection refused"}


def test_a_row_is_typed_and_its_document_keeps_the_json_fields_in_order(world: SimpleNamespace) -> None:
    ens, net = rows(world)["ens"], rows(world)["net"]
    assert isinstance(ens, status.ModelRow)
    assert (ens.alias, ens.desired, ens.desired_folders, ens.pins) == ("2", ["2"], ["1"], {"net": "2"})
    assert list(ens.to_dict()) == [
        "model",
        "alias",
        "desired",
        "desired_folders",
        "serving",
        "serving_folders",
        "drift",
        "pins",
        "target_pins",
    ]
    assert net.to_dict() == {
        "model": "net",
        "alias": "2",
        "desired": ["2"],
        "desired_folders": ["2"],
        "serving": {URL: ["2"]},
        "serving_folders": {URL: ["2"]},
        "drift": [],
    }
    assert (net["drift"], net.get("pins"), net.get("store", "-")) == ([], None, "-")  # read as a dict


def test_labels_show_the_folder_only_where_it_differs() -> None:
    assert status_rows.labels(["2"], ["1"]) == "2 [1]"
    assert status_rows.labels(["2", "3"], ["2", "3"]) == "2,3"
    assert status_rows.labels([], []) == ""


def test_the_status_table_shows_versions_with_folders_in_brackets(
    world: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlreg.cli.sink import Output
    from mlreg.cli.status import status_table

    status_table(Output(), [rows(world)["net"], rows(world)["ens"]])
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert lines[:3] == [
        ["MODEL", "ALIAS", "DESIRED", "SERVING"],
        ["net", "2", "2", f"{URL}:", "2"],
        ["ens", "2", "2", "[1]", f"{URL}:", "2", "[1]"],
    ]


# -- a store that does not answer: what Triton serves is still said --------------------------------

URL2 = "triton-1:8001"
# the settings probe_targets reads (no control key under that home)
TIMEOUTS: Any = SimpleNamespace(triton_timeout=1.0, home=Path("/nonexistent/.mlreg"))
FROZEN = "S3 (s3://models/repo): cannot list '': ReadTimeoutError: Read timeout on endpoint URL"


class FrozenStore:
    """An S3 store whose every request timed out (as S3Objects raises it: the upload's fix)."""

    uri = "s3://models/repo"
    asked = 0

    def _frozen(self, *args: object) -> Any:
        from registry.errors import StorageError

        self.asked += 1
        raise StorageError(
            FROZEN, fix="check the endpoint is reachable, then rerun: files already stored are not sent again"
        )

    list_models = read_config = list_versions = locks = read = _frozen

    @property
    def objects(self) -> FrozenStore:  # the repository's parts: each as frozen
        return self

    session = versions = objects


@pytest.fixture
def frozen(world: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """``world`` on a frozen store, its two replicas tests/fakes.py's FakeTargets probed for real:
    triton-0 serves net v2 and ens (folder 1, pinning net v2), triton-1 still net v1."""
    from tests.fakes import FakeTarget

    first, second = FakeTarget(URL), FakeTarget(URL2)
    first.states = {"net": {"2": "READY"}, "ens": {"1": "READY"}}
    first.ensembles = {"ens": {"net": "2"}}
    second.states = {"net": {"1": "READY"}}
    targets = {URL: first, URL2: second}
    monkeypatch.setattr(status, "probe_targets", PROBE_TARGETS)  # the real one, over the fakes
    world.store = FrozenStore()
    monkeypatch.setattr(status, "status_store", lambda uri: world.store)
    monkeypatch.setattr(status_replicas, "triton_connector", lambda settings, key=None: targets.__getitem__)
    world.env = Environment("s3", FrozenStore.uri, (URL, URL2), "local", gpu=False)
    return world


def test_a_frozen_store_leaves_what_each_replica_serves_and_says_why(frozen: SimpleNamespace) -> None:
    found = status.environment_status(TIMEOUTS, frozen.env, frozen.registry)
    rows = {row["model"]: row for row in found.rows}
    assert sorted(rows) == ["ens", "net"]  # what serves and what the alias names, though unlisted
    assert rows["net"]["serving"] == {URL: ["2"], URL2: ["1"]}
    assert (rows["ens"]["serving"], rows["ens"]["serving_folders"]) == (
        {URL: ["2"], URL2: []},
        {URL: ["1"], URL2: []},
    )
    for row in rows.values():
        assert (row["desired"], row["store"]) == ([], f"store unreachable: {FROZEN}")
        assert row["drift"] == [f"store unreachable: {FROZEN}"]  # no "store wants nothing"
    assert (found.store_error, found.locks) == (FROZEN, [])
    assert frozen.store.asked == 1  # one request timed out: the store is not asked per model
    assert "then rerun 'mlreg status'" in found.store_fix
    assert "files already stored" not in found.store_fix  # the upload's fix is not status's


def test_the_status_table_of_a_frozen_store_lists_each_replica(
    frozen: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlreg.cli.sink import Output
    from mlreg.cli.status import status_table

    found = status.environment_status(TIMEOUTS, frozen.env, frozen.registry, ["net"])
    status_table(Output(), found.rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["net", "2", "-", f"{URL}:", "2;", f"{URL2}:", "1"]  # desired unknown
    assert lines[2] == f"net drift: store unreachable: {FROZEN}"


def test_status_gives_up_on_an_s3_store_within_seconds() -> None:
    store = status.status_store("s3://127.0.0.1:9/models/repo")
    config = store.objects.client.meta.config  # type: ignore[attr-defined]
    assert (config.connect_timeout, config.read_timeout) == (5, status_views.STORE_READ_TIMEOUT_S)
    assert config.retries["total_max_attempts"] == 1 + status_views.STORE_RETRIES == 2  # not 4 x 60 s


# -- a store that lost a model's folder: Triton still serves it (issue 38, item 9) -------------------


class LostFolderTarget:
    """A Triton after the store lost a model's folder (tests/fakes.py's FakeTarget inside): its
    repository index drops the model, which still answers by name -- loaded from Triton folder 1,
    its config as Triton's JSON gives it (int64 versions as strings)."""

    def __init__(self, url: str, lost: set[str]) -> None:
        from tests.fakes import FakeTarget

        self.fake, self.lost, self.url = FakeTarget(url), lost, url
        self.fake.states = {"net": {"2": "READY"}, "ens": {"1": "READY"}}
        self.fake.ensembles = {"ens": {"net": "2"}}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)

    def model_states(self) -> dict[str, dict[str, str]]:
        return {m: v for m, v in self.fake.model_states().items() if m not in self.lost}

    def model_config(self, model: str) -> dict[str, Any]:
        if model not in self.fake.states:
            from registry.errors import TritonError

            raise TritonError(f"{self.url}: Request for unknown model: '{model}' is not found")
        versions = sorted(self.fake.states[model])
        return self.fake.model_config(model) | {"version_policy": {"specific": {"versions": versions}}}


@pytest.fixture
def lost(world: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """``world`` after the store's ``ens/`` folder was deleted while both replicas serve ens
    (folder 1, registered v2 pinning net v2): their repository index no longer lists it."""
    import shutil

    shutil.rmtree(Path(world.env.store) / "ens")
    targets = {url: LostFolderTarget(url, {"ens"}) for url in (URL, URL2)}
    monkeypatch.setattr(status, "probe_targets", PROBE_TARGETS)  # the real one, over the targets
    monkeypatch.setattr(status_replicas, "triton_connector", lambda settings, key=None: targets.__getitem__)
    world.env = Environment("local", world.env.store, (URL, URL2), "local", gpu=False)
    return world


def test_status_says_what_triton_serves_of_an_ensemble_the_store_lost(lost: SimpleNamespace) -> None:
    found = status.environment_status(TIMEOUTS, lost.env, lost.registry)
    ens = {row["model"]: row for row in found.rows}["ens"]
    assert (ens["serving"], ens["serving_folders"]) == ({URL: ["2"], URL2: ["2"]}, {URL: ["1"], URL2: ["1"]})
    assert ens["target_pins"] == {URL: {"net": "2"}, URL2: {"net": "2"}}
    assert ens["drift"][0] == (
        "the store has no ens/config.pbtxt (alias names v2, v2 [1] serves): a restarted replica cannot "
        "load it; the store lost its folder; Triton still serves v2 [1] (promote v2 again to put it back)"
    )
    assert "nothing serves it" not in " ".join(ens["drift"])


def test_mlreg_status_exits_1_showing_what_serves_an_ensemble_the_store_lost(
    lost: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from mlreg.cli.main import app
    from mlreg.ops import status as status_op
    from mlreg.ops.context import Context
    from tests.cli import CliRunner

    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    context = Context(TIMEOUTS, lost.env, lost.registry)
    monkeypatch.setattr(status_op, "context", lambda settings, name: context)
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 1, result.output
    lines = [line.split() for line in result.output.splitlines()]
    assert ["ens", "2", "-", f"{URL}:", "2", "[1];", f"{URL2}:", "2", "[1]"] in lines
    assert "ens drift: the store has no ens/config.pbtxt (alias names v2, v2 [1] serves)" in result.output
    assert "Triton still serves v2 [1]" in result.output
