"""The relay's GitHub paths against a local stand-in of GitHub's dispatch API (a real HTTP server on
127.0.0.1 that records what it is sent): the dispatch names a workflow file that exists in
.github/workflows and declares every input it is sent (a choice input holds the value); the token
goes only in the Authorization header, never into a note, the queue or a message; a dispatched
version is not dispatched again while its run has time to serve it.  And the ``[relay]`` settings
of mlreg.toml: what is refused, naming the key."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlreg.relay import record
from mlreg.relay.actions import GitHub
from mlreg.relay.config import Target, load
from pipelines.storage.base import Repository
from registry.errors import UsageError
from registry.settings import Settings
from tests.conftest import ROOT
from tests.unit.relay_world import MODEL, Clock, StandIn, delivery, home_with_registry, make_relay, set_alias

TOKEN = "ghp_relaytesttoken0123456789"


class GitHubStandIn(BaseHTTPRequestHandler):
    """POST /repos/O/R/actions/workflows/W/dispatches: 204 and the request kept (``status``: what to
    answer instead; a 401 echoes the Authorization header back, as a careless proxy might)."""

    seen: list[dict[str, Any]] = []
    status = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).seen.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body)}
        )
        echo = json.dumps({"message": "Bad credentials", "got": self.headers.get("Authorization")}).encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(echo) if self.status != 204 else 0))
        self.end_headers()
        if self.status != 204:
            self.wfile.write(echo)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def github() -> Iterator[str]:
    GitHubStandIn.seen, GitHubStandIn.status = [], 204
    server = ThreadingHTTPServer(("127.0.0.1", 0), GitHubStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _relay(settings: Settings, tmp: Path, api: str, action: str, standin: StandIn, clock: Clock):  # type: ignore[no-untyped-def]
    workflow = {"dispatch": "promote.yml", "pin": "gitops-pr.yml"}[action]
    target = Target(action, "acme/models", workflow, "main", "env:RELAY_TEST_GITHUB_TOKEN", api)
    relay = make_relay(settings, tmp / "store", standin, clock, targets={"production": target})
    github = GitHub(settings, relay.config)
    relay.deployer_for = lambda env: _Dispatching(github, standin)
    return relay


class _Dispatching:
    """The real GitHub deployer; what serves read from the stand-in (the CI run would move the
    environment's alias minutes later: not what this test is about)."""

    def __init__(self, github: GitHub, standin: StandIn) -> None:
        self.github, self.standin = github, standin

    def serving(self, env: str, model: str) -> str:
        return self.standin.serving(env, model)

    def deploy(self, env: str, model: str, version: str):  # type: ignore[no-untyped-def]
        return self.github.deploy(env, model, version)


def _workflow_inputs(name: str) -> dict[str, Any]:
    path = ROOT / ".github" / "workflows" / name
    assert path.is_file(), f"the dispatch names {name}, which .github/workflows does not hold"
    doc = yaml.safe_load(path.read_text())
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on:` key as True
    return on["workflow_dispatch"]["inputs"]


@pytest.mark.parametrize("action", ["dispatch", "pin"])
def test_a_move_dispatches_the_workflow_with_inputs_it_declares(
    action: str,
    github: str,
    registry_state: Callable[[str], Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELAY_TEST_GITHUB_TOKEN", TOKEN)
    settings = home_with_registry(registry_state("a_v1_production"), tmp_path / "home", 3)
    clock, standin = Clock(), StandIn(served={MODEL: "1"})
    relay = _relay(settings, tmp_path, github, action, standin, clock)
    set_alias(settings.home / "mlflow.db", MODEL, "champion", "2")
    assert relay.receive(*delivery(MODEL, "champion", "2", clock.now))[0] == 202
    assert [state for _, state in relay.drain()] == ["dispatched"]
    (sent,) = GitHubStandIn.seen
    workflow = {"dispatch": "promote.yml", "pin": "gitops-pr.yml"}[action]
    assert sent["path"] == f"/repos/acme/models/actions/workflows/{workflow}/dispatches"
    assert sent["auth"] == f"Bearer {TOKEN}"
    assert sent["body"]["ref"] == "main"
    declared = _workflow_inputs(workflow)
    assert set(sent["body"]["inputs"]) <= set(declared)
    assert all(
        declared[name].get("required") is not True or name in sent["body"]["inputs"] for name in declared
    )
    for name, value in sent["body"]["inputs"].items():
        if declared[name].get("type") == "choice":
            assert value in declared[name]["options"], f"{name}={value} is not one of the workflow's choices"
    expected = {"action": "promote", "model": MODEL, "version": "2", "environment": "production"}
    assert sent["body"]["inputs"] == (
        expected if action == "dispatch" else {"environment": "production", "pins": "a=2"}
    )
    stored = record.read(Repository.local(tmp_path / "store").objects, "production", MODEL)
    assert (stored.deployed, stored.previous) == ("2", "1")
    # reconcile within the grace: the alias still differs from what serves, the run is under way
    relay.reconcile()
    assert [state for _, state in relay.drain()] == ["noop"]
    assert len(GitHubStandIn.seen) == 1


def test_a_refused_dispatch_never_writes_the_token(
    github: str, registry_state: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_TEST_GITHUB_TOKEN", TOKEN)
    GitHubStandIn.status = 401
    settings = home_with_registry(registry_state("a_v1_production"), tmp_path / "home", 3)
    clock, standin = Clock(), StandIn(served={MODEL: "1"})
    relay = _relay(settings, tmp_path, github, "dispatch", standin, clock)
    set_alias(settings.home / "mlflow.db", MODEL, "champion", "2")
    relay.reconcile()
    assert [state for _, state in relay.drain()] == ["failed"]
    assert GitHubStandIn.seen[0]["auth"] == f"Bearer {TOKEN}"  # the stand-in did get it, and echoed it
    (job,) = relay.queue.recent_jobs(1)
    assert "GitHub answered 401" in job["note"]
    assert TOKEN not in job["note"]
    assert TOKEN.encode() not in (settings.home / "relay" / "queue.db").read_bytes()
    assert (
        Repository.local(tmp_path / "store").objects.read(record.key("production", MODEL)) is None
    )  # nothing recorded


def test_the_workflow_the_dispatch_names_declares_the_environment_choice() -> None:
    inputs = _workflow_inputs("promote.yml")
    assert {"action", "model", "version", "environment"} <= set(inputs)
    assert "promote" in inputs["action"]["options"]
    assert set(_workflow_inputs("gitops-pr.yml")) >= {"environment", "pins"}


def _toml(tmp_path: Path, text: str) -> Settings:
    (tmp_path / "mlreg.toml").write_text(text)
    (tmp_path / ".mlreg").mkdir(exist_ok=True)
    return Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})


def test_follows_and_the_relay_table_are_read_and_bad_values_named(tmp_path: Path) -> None:
    base = '[environments.production]\nstore = "s"\nfollows = "champion"\n'
    settings = _toml(tmp_path, base + '[relay]\nsecret = "env:X"\ninterval = 5\n')
    config = load(settings)
    assert (config.follows, config.interval, config.target("production").action) == (
        {"production": "champion"},
        5.0,
        "promote",
    )
    bad = {
        'follows = "two words"': "follows must be an MLflow alias name",
        '[relay]\nsecrets = "env:X"': "unknown key(s) secrets",
        '[relay.environments.production]\naction = "deploy"': "action must be one of",
        '[relay.environments.production]\naction = "dispatch"\nrepository = "acme/models"\n'
        'api = "http://example.com"': "must be an https URL",
        '[relay.environments.staging]\naction = "promote"': "follows no alias",
        "[relay]\ninterval = 0": "interval must be a number of seconds",
    }
    for text, message in bad.items():
        head = (
            base.replace('follows = "champion"\n', text + "\n")
            if text.startswith("follows")
            else base + text + "\n"
        )
        with pytest.raises(UsageError) as refused:
            load(_toml(tmp_path, head))
        assert message in refused.value.message, text


def test_the_secret_is_named_never_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _toml(tmp_path, '[relay]\nsecret = "env:RELAY_TEST_SECRET"\n')
    monkeypatch.delenv("RELAY_TEST_SECRET", raising=False)
    with pytest.raises(UsageError) as missing:
        load(settings).secret()
    assert "RELAY_TEST_SECRET" in missing.value.message
    monkeypatch.setenv("RELAY_TEST_SECRET", "s3cr3t-value")
    assert load(settings).secret() == b"s3cr3t-value"
    (tmp_path / "hook.key").write_text("from-a-file\n")
    assert load(_toml(tmp_path, '[relay]\nsecret = "hook.key"\n')).secret() == b"from-a-file"


def test_a_version_dispatched_before_is_dispatched_again_once_something_else_served_since(
    github: str, registry_state: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_TEST_GITHUB_TOKEN", TOKEN)
    settings = home_with_registry(registry_state("a_v1_production"), tmp_path / "home", 3)
    clock, standin = Clock(), StandIn(served={MODEL: "1"})
    relay = _relay(settings, tmp_path, github, "dispatch", standin, clock)
    db = settings.home / "mlflow.db"
    for version in ("2", "3", "2"):  # each run serves before the next move (the CI promotion)
        set_alias(db, MODEL, "champion", version)
        relay.receive(*delivery(MODEL, "champion", version, clock.now))
        assert [state for _, state in relay.drain()] == ["dispatched"], version
        standin.served[MODEL] = version
        clock.now += 1.0  # well within the grace
    assert [sent["body"]["inputs"]["version"] for sent in GitHubStandIn.seen] == ["2", "3", "2"]
    set_alias(db, MODEL, "champion", "3")
    relay.reconcile()
    assert [state for _, state in relay.drain()] == ["dispatched"]  # 3 from 2: sent
    standin.served[MODEL] = "1"  # before its run served 3, someone promoted 1 by hand
    relay.reconcile()
    assert [state for _, state in relay.drain()] == ["dispatched"]  # what it left from is gone: again
    assert [sent["body"]["inputs"]["version"] for sent in GitHubStandIn.seen][3:] == ["3", "3"]
