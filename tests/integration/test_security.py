"""What runs is what was verified, and only mlreg can change it: the local stack's model-control API
locked to the key in MLREG_HOME, a planted bytecode cache never executed, a config pointing Triton
outside the version folder refused (issue 33).

One stack for the module: ``mlreg stack up``'s, started without ``MLREG_CONTROL_KEY`` (the suite
sets one for every other module), so the key is the one generated into ``MLREG_HOME/control.key``
and every client here finds it the way a user's shell would.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import shutil
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from mlreg.cli.main import app
from pipelines.core.reports import PromotionFailed
from pipelines.devstack.stack import running_server
from pipelines.storage import open_store
from pipelines.triton import control as triton_module
from pipelines.triton import control_key
from pipelines.triton.control import PROBE_PREFIX, TritonControl
from pipelines.triton.control_key import ControlKey, local_key
from registry.contracts import rules
from registry.errors import TritonError
from tests.cli import CliRunner
from tests.integration.stacks import (
    SCORER_CONFIG,
    SCORER_MODEL,
    LocalStack,
    local_stack,
    register_model,
    register_scorer,
    s3_repository,
    tritons,
)

X = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
# the bytecode a planted cache holds: the scorer answering minus X times its version
EVIL_MODEL = SCORER_MODEL.replace('self.factor = float(args["model_version"])', "self.factor = -1.0")
ESCAPING = 'default_model_filename: "../../../../../../../tmp/evil/model.py"\n'


@dataclass
class Secure:
    stack: LocalStack
    root: Path
    key: ControlKey

    @property
    def http_url(self) -> str:
        info = running_server(self.stack.settings)
        assert info is not None
        return info.http_url

    def control(self) -> TritonControl:
        return TritonControl(self.stack.url, key=self.key)

    def answers(self, model: str = "scorer") -> list[float]:
        with TritonControl(self.stack.url) as triton:  # no key: inference stays open
            return [float(v) for v in triton.infer(model, {"X": X}, ["Y"])["Y"]]

    def cli(self, *args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(app, list(args), env=self.stack.env_vars)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    root = tmp_path_factory.mktemp("secure")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(control_key.KEY_ENV, raising=False)
        with local_stack(None, root / ".mlreg") as stack:
            register_scorer(stack.registry, root / "work", "v1")
            yield Secure(stack, root, local_key(stack.settings.home))


def _http_load(url: str, model: str, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(
        f"{url}/v2/repository/models/{model}/load", data=b"{}", headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def test_the_local_stacks_control_api_takes_only_the_key_in_mlreg_home(
    secure: Secure, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = secure.stack.settings.home / control_key.LOCAL_KEY_FILE
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert secure.key.origin == str(key_file)
    # HTTP: no key, a wrong key -> 403; nothing loaded
    for headers in ({}, {control_key.HEADER: "wrong"}):
        status, body = _http_load(secure.http_url, "scorer", headers)
        assert (status, control_key.REFUSED_HTTP in body) == (403, True), body
    # gRPC: Triton answers UNAVAILABLE, which mlreg must not retry as a restart
    client = grpcclient.InferenceServerClient(secure.stack.url)
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("scorer")
    finally:
        client.close()
    assert (str(refused.value.status()), control_key.REFUSED in str(refused.value.message())) == (
        "StatusCode.UNAVAILABLE",
        True,
    )
    slept: list[float] = []
    monkeypatch.setattr("pipelines.triton.control.time.sleep", slept.append)  # counts the retries' waits
    with TritonControl(secure.stack.url, key=ControlKey("not-the-key", "a test")) as wrong:
        with pytest.raises(TritonError) as error:
            wrong.load("scorer")
    assert error.value.context["status"] == "unauthorised"
    assert f"replica {secure.stack.url} refused the load call: not authorised" in error.value.message
    assert "not-the-key" not in error.value.message + str(error.value.fix)
    assert slept == []  # refused once, never retried
    with secure.control() as triton:
        assert "scorer" not in triton.model_states()  # none of those calls loaded it


def test_a_promotion_with_the_key_serves_and_never_echoes_the_key(secure: Secure) -> None:
    code, out, err = secure.cli("promote", "scorer", "--version", "1", "--json")
    assert code == 0, out + err
    assert secure.answers() == [1.0, 2.0, 3.0, 4.0]  # inference needs no key
    code, status_json, status_err = secure.cli("status", "--json")
    assert code == 0, status_json + status_err
    assert json.loads(status_json)["open_control"] == []
    code, status_text, _ = secure.cli("status")
    assert "takes model-control calls from anyone" not in status_text
    secret = secure.key.value.encode()
    assert secret not in (out + err + status_json + status_err + status_text).encode()
    key_file = secure.stack.settings.home / control_key.LOCAL_KEY_FILE
    leaked = [
        str(path)
        for path in secure.root.rglob("*")
        if path.is_file() and path != key_file and secret in path.read_bytes()
    ]
    assert leaked == []  # MLflow's database and artifacts, the reports, Triton's log, the store


def test_a_replica_whose_control_api_is_open_is_flagged_by_status_and_refuses_a_promotion(
    secure: Secure,
) -> None:
    """Issue 44's repro: a hand-started tritonserver without the restriction flags among an
    environment's targets.  ``status`` flags it; a real ``promote --json`` is refused before any
    change (nothing loaded there, the store as it was); with ``open_control = "allow"`` it is
    promoted with a note in the JSON and in the MLflow run's report."""
    settings = secure.stack.settings
    toml = secure.root / "mlreg.toml"
    store = open_store(str(settings.local_repository))
    with tritons(
        settings, secure.root, [settings.local_repository], name="open", open_control=True
    ) as servers:
        url = servers[0][0].grpc_url
        section = f'[environments.open]\nstore = "{settings.local_repository}"\ntargets = ["{url}"]\n'
        toml.write_text(section)
        try:
            _, out, err = secure.cli("status", "--env", "open", "--json")
            _, text, _ = secure.cli("status", "--env", "open")
            config_before = store.read_config("scorer")
            refused, refused_out, refused_err = secure.cli(
                "promote", "scorer", "-V", "1", "--env", "open", "--json"
            )
            with TritonControl(url, key=None) as opened:
                loaded_after_refusal = opened.model_states()
            config_after = store.read_config("scorer")
            toml.write_text(section + 'open_control = "allow"\n')
            allowed, allowed_out, allowed_err = secure.cli(
                "promote", "scorer", "-V", "1", "--env", "open", "--json"
            )
            with TritonControl(url, key=None) as opened:
                ready = opened.is_ready("scorer", "1")
        finally:
            toml.unlink()
    assert json.loads(out)["open_control"] == [url], out + err
    assert f"warning: {url} takes model-control calls from anyone" in text
    assert refused != 0, refused_out + refused_err
    assert f"{url} take(s) model-control calls from anyone" in refused_out + refused_err
    # nothing loaded on the open replica: Triton's index lists each model of its repository, an
    # unloaded one with no version and no state ({'': ''}); a load, even one taken back, would list
    # the version with its state (READY, or UNAVAILABLE once unloaded)
    assert loaded_after_refusal.get("scorer", {}) in ({}, {"": ""}), loaded_after_refusal
    assert all(v == {"": ""} for v in loaded_after_refusal.values()), loaded_after_refusal  # nor else
    assert config_after == config_before  # nor written to the store
    assert allowed == 0, allowed_out + allowed_err
    note = f"{url} takes model-control calls from anyone"
    result = json.loads(allowed_out)
    assert any(n.startswith(note) and 'open_control = "allow"' in n for n in result["notes"]), result["notes"]
    assert ready
    run = secure.stack.registry.runs.promotions("scorer", "open")[0]["run_id"]
    report = secure.stack.registry.runs.download(run, "report.json", secure.root / "open-run")
    assert any(n.startswith(note) for n in json.loads(report.read_text())["notes"])  # in the MLflow run
    with secure.control() as triton:  # the probe loaded nothing on the locked local stack either
        assert [m for m in triton.model_states() if m.startswith(PROBE_PREFIX)] == []


# a model whose every import leaves a mark: Triton imports model.py when it loads the model
MARKING_MODEL = """open({marker!r}, "a").write("imported\\n")


class TritonPythonModel:
    def execute(self, requests):
        return []
"""
OLD_PROBE = "__mlreg_unauthenticated_probe__"  # the fixed name the probe once loaded (review F5)


def test_the_open_control_probe_runs_no_model_a_store_holds(
    secure: Secure, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe of ``control_api_open`` never loads: on a real open tritonserver whose repository
    holds a planted model under the very name the probe will use (and under the fixed name it once
    loaded), it answers "open", and neither plant was loaded (listed in the repository index with
    no version) nor imported (no marker).  The locked stack answers "not open".  Positive control:
    a keyless load of a plant -- what the probe once sent -- imports its model.py."""
    name = triton_module.probe_name()
    assert name != triton_module.probe_name()  # a fresh name per probe: nobody can plant it ahead
    monkeypatch.setattr(triton_module, "probe_name", lambda: name)  # ... except this test
    repository = secure.root / "probe-repository"
    markers: dict[str, Path] = {}
    for model in (name, OLD_PROBE):
        markers[model] = secure.root / f"{model}.imported"
        (repository / model / "1").mkdir(parents=True)
        (repository / model / "config.pbtxt").write_text(SCORER_CONFIG.replace('"scorer"', f'"{model}"'))
        (repository / model / "1" / "model.py").write_text(MARKING_MODEL.format(marker=str(markers[model])))
    with tritons(
        secure.stack.settings, secure.root, [repository], name="probe", open_control=True
    ) as servers:
        url = servers[0][0].grpc_url
        answers = (triton_module.control_api_open(url), triton_module.control_api_open(secure.stack.url))
        with TritonControl(url, key=None) as opened:
            states = opened.model_states()
            imported = [model for model, marker in markers.items() if marker.exists()]
            opened.load(OLD_PROBE)  # the positive control: the old probe's keyless load
            control = (opened.is_ready(OLD_PROBE, "1"), markers[OLD_PROBE].exists())
    assert answers == (True, False)  # open; the locked local stack
    assert {model: states.get(model) for model in markers} == {name: {"": ""}, OLD_PROBE: {"": ""}}
    assert imported == []
    assert control == (True, True)  # the plant is live code: a load runs it


def _timestamp_pyc(source: str, like: Path) -> bytes:
    """``source`` compiled as a timestamp cache claiming ``like``'s mtime and size: the form Python
    trusts for a local file without reading it."""
    stat = like.stat()
    code = compile(source, str(like), "exec")
    header = importlib.util.MAGIC_NUMBER + struct.pack(
        "<III", 0, int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size
    )
    return header + marshal.dumps(code)


def test_a_planted_bytecode_cache_never_runs(secure: Secure) -> None:
    """Positive control first: the planted form runs on this Triton when nothing removes it."""
    stack, repo = secure.stack, secure.stack.settings.local_repository
    cache = f"__pycache__/model.{_stub_cache_tag()}.pyc"
    control = repo / "planted"
    shutil.copytree(repo / "scorer", control, ignore=shutil.ignore_patterns("__pycache__"))
    (control / "config.pbtxt").write_text(SCORER_CONFIG.replace('"scorer"', '"planted"'))
    (control / "1" / "__pycache__").mkdir()
    (control / "1" / cache).write_bytes(_timestamp_pyc(EVIL_MODEL, control / "1" / "model.py"))
    try:
        with secure.control() as triton:
            triton.load("planted")
        assert secure.answers("planted") == [-1.0, -2.0, -3.0, -4.0]  # the cache ran, not model.py
    finally:
        with secure.control() as triton:
            triton.unload("planted")
        shutil.rmtree(control)

    version = register_scorer(stack.registry, secure.root / "work", "v2")
    assert stack.promote("scorer", version).ok
    with secure.control() as triton:
        assert {v for v, s in triton.model_states()["scorer"].items() if s == "READY"} == {version}
    planted = repo / "scorer" / "1" / cache
    assert planted.parent.read_bytes() == b""  # the store's guard: the stub could write no cache
    planted.parent.unlink()  # someone with write access to the store replaces it with a cache
    planted.parent.mkdir()
    planted.write_bytes(_timestamp_pyc(EVIL_MODEL, repo / "scorer" / "1" / "model.py"))
    result = stack.promote("scorer", "1")  # back to v1: verified, its cache removed, then loaded
    assert result.ok, result.error
    assert secure.answers() == [1.0, 2.0, 3.0, 4.0]
    assert not planted.exists()  # removed before the load, and the empty guard put back
    assert planted.parent.read_bytes() == b""


def _stub_cache_tag() -> str:
    """The cache tag of the Python the python backend's stub embeds (the virtualenv's)."""
    import sys

    return sys.implementation.cache_tag


def test_a_config_pointing_triton_outside_the_version_folder_is_refused(
    secure: Secure, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = secure.root / "evil"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(SCORER_MODEL)
    (folder / "config.pbtxt").write_text(SCORER_CONFIG.replace('"scorer"', '"evil"') + ESCAPING)
    code, out, err = secure.cli("validate", str(folder.parent), "--json")
    assert code == 1, out + err
    assert "default_model_filename '../../../../../../../tmp/evil/model.py' leaves the version folder" in out
    code, out, err = secure.cli("register", "evil", str(folder))
    assert code == 3, out + err
    assert "leaves the version folder" in out + err
    assert "not registered" in out + err
    assert secure.stack.registry.models.versions("evil") == []  # nothing written, not even as failed
    # a version an older mlreg (without the rule) registered: the promotion's validation refuses it
    with monkeypatch.context() as older:
        older.setattr(rules, "check_paths", lambda entry: iter(()))
        version = register_model(
            secure.stack.registry,
            secure.root / "old",
            "evil",
            SCORER_CONFIG.replace('"scorer"', '"evil"') + ESCAPING,
            {"model.py": SCORER_MODEL},
        )
    assert secure.stack.registry.models.version_tags("evil", version)["validation"] == "passed"
    with pytest.raises(PromotionFailed) as refused:
        secure.stack.promote("evil", version)
    result = refused.value.result
    assert (result.failed_stage, result.rollback) == ("validate", "not needed"), result.stage_names()
    assert "leaves the version folder" in result.error
    with secure.control() as triton:
        assert "evil" not in triton.model_states()
    assert not (secure.stack.settings.local_repository / "evil").exists()


def _unchecked_hash_pyc(source: str) -> bytes:
    """``source`` compiled as an unchecked-hash cache: Python runs it without looking at model.py
    (the form that survives Triton copying an S3 folder to local disk, which resets mtimes)."""
    code = compile(source, "model.py", "exec")
    return importlib.util.MAGIC_NUMBER + struct.pack("<I", 0b01) + b"\0" * 8 + marshal.dumps(code)


def test_a_planted_bytecode_cache_on_s3_is_removed_before_a_load(s3_server: Any, tmp_path: Path) -> None:
    """The same removal on S3, where Triton copies the version folder, cache and all, before the
    stub imports it (the replica side is the local store's test above)."""
    store = open_store(s3_repository(s3_server, "planted"))
    source = tmp_path / "1"
    source.mkdir()
    (source / "model.py").write_text(SCORER_MODEL)
    store.versions.put_version("scorer", "1", source)
    planted = "scorer/1/__pycache__/model.cpython-311.pyc"
    store.objects.write(planted, _unchecked_hash_pyc(EVIL_MODEL))
    assert store.versions.verify_version("scorer", "1").bytecode == [planted]  # a check reads only
    assert planted in store.objects.list_prefix("scorer/1/")
    assert store.versions.drop_bytecode("scorer", "1") == [planted]  # what a promotion does before its loads
    assert store.objects.list_prefix("scorer/1/") == ["scorer/1/.mlreg-manifest.json", "scorer/1/model.py"]
