"""``mlreg relay`` end to end on the MLflow-native stack (tests/integration/nativestack.py: a real
tritonserver, the embedded registry, image_model v1/v2; one worker runs this module with
test_mlflow_native.py and test_browser.py): a real ``mlflow server`` on the stack's registry with
webhooks allowed to a loopback relay, the webhook created by ``mlreg relay register``, a real
``mlreg relay serve`` process, and an alias moved through MLflow's REST API (what the UI calls):
MLflow delivers the signed event, the relay promotes the stack's ``local`` environment in-process
(the same verb as ``mlreg promote``), records the rollback target in the store, and the version's
tags in MLflow name the promotion's run.

The MLflow server is this module's own (not the stack's UI server): webhooks to 127.0.0.1 need
``MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true`` and ``MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https`` in the
*server's* environment, and a secret needs ``MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY`` (FACTS.md).
Reconcile runs every 600 s here, so what promotes is the delivered event (the job's source says so).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlreg.relay import record
from mlreg.relay.queue import Queue
from pipelines.devstack import local_mlflow
from pipelines.devstack.local_triton import free_port
from pipelines.storage import open_store
from tests.integration import forkcli
from tests.integration.nativestack import NativeStack

MODEL = "image_model"
DEADLINE_S = 240.0


@pytest.fixture
def webhook_server(
    native_stack: NativeStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A real `mlflow server` on the stack's registry file that may deliver webhooks to loopback."""
    from cryptography.fernet import Fernet

    monkeypatch.setenv("MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS", "true")
    monkeypatch.setenv("MLFLOW_WEBHOOK_ALLOWED_SCHEMES", "http,https")
    monkeypatch.setenv("MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY", Fernet.generate_key().decode())
    settings = native_stack.settings
    server, process = local_mlflow.start_mlflow(
        settings.tracking_uri, settings.artifact_root, tmp_path / "mlflow.log", serve_artifacts=False
    )
    try:
        yield server.url
    finally:
        local_mlflow.stop_mlflow(server.pid, process)


def _until(what: str, check: object, deadline: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.25)
    raise AssertionError(f"{what} within {deadline:.0f} s")


def test_an_alias_moved_through_mlflows_rest_api_promotes_the_environment_through_a_real_webhook(
    native_stack: NativeStack, webhook_server: str, tmp_path: Path
) -> None:
    settings = native_stack.settings
    toml = settings.home.parent / "mlreg.toml"
    assert not toml.exists()  # the stack's project has none: this test's is removed after it
    secret = secrets.token_hex(24)
    toml.write_text(
        '[environments.local]\nfollows = "champion"\n\n'
        '[relay]\nsecret = "env:MLREG_RELAY_SECRET"\ninterval = 600\n'
    )
    env = {**native_stack.env, "MLREG_RELAY_SECRET": secret, "MLREG_NO_PROGRESS": "1"}
    port = free_port()
    log = (tmp_path / "relay.log").open("w")
    relay = forkcli.popen(
        ["relay", "serve", "--port", str(port)],
        env=env,
        cwd=settings.home.parent,
        stdout=log.fileno(),
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}/webhook"
        _until("the relay answers /healthz", lambda: _answers(f"http://127.0.0.1:{port}/healthz"), 60)
        registered = forkcli.run(
            ["relay", "register", url, "--json"],
            env={**env, "MLFLOW_TRACKING_URI": webhook_server},
            cwd=Path.cwd(),
            timeout=120,
        )
        assert registered.returncode == 0, registered.stderr
        assert secret not in registered.stdout + registered.stderr
        doc = json.loads(registered.stdout)
        assert (doc["action"], doc["url"], doc["events"]) == ("created", url, ["model_version_alias.created"])
        from mlflow import MlflowClient

        [hook] = [h for h in MlflowClient(webhook_server).list_webhooks() if h.name == "mlreg-relay"]
        assert (hook.url, [str(e) for e in hook.events]) == (url, ["model_version_alias.created"])

        before = native_stack.serving(MODEL)
        target = "1" if before == ["2"] else "2"
        moved = urllib.request.Request(
            f"{webhook_server}/api/2.0/mlflow/registered-models/alias",
            data=json.dumps({"name": MODEL, "alias": "champion", "version": target}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(moved, timeout=30) as answer:
            assert answer.status == 200
        _until(
            f"{MODEL} v{target} serving on the stack's Triton",
            lambda: native_stack.serving(MODEL) == [target],
        )
        queue = Queue(settings.home / "relay" / "queue.db")
        _until("the relay's job finished", lambda: queue.counts().get("done") == 1, 60)
        shown = forkcli.run(["relay", "status", "--json"], env=env, cwd=Path.cwd(), timeout=180)
        assert shown.returncode == 0, shown.stderr
    finally:
        relay.terminate()
        relay.wait(60)
        log.close()
        toml.unlink()
    event = queue.last_event()
    assert event is not None
    assert (event["model"], event["alias"], event["version"], event["outcome"]) == (
        MODEL,
        "champion",
        target,
        "local: queued",
    )
    [job] = queue.recent_jobs(1)
    assert (job["source"], job["state"], job["environment"], job["version"]) == (
        "event",
        "done",
        "local",
        target,
    )
    stored = record.read(open_store(settings.local_repository).objects, "local", MODEL)
    assert (stored.deployed, stored.previous) == (target, before[0])  # the rollback target
    run_id = job["note"].rsplit(" ", 1)[-1]
    tags = native_stack.registry.models.version_tags(MODEL, target)
    assert tags["promotion_run_local"] == run_id  # the version in the MLflow UI links the promotion's run
    assert native_stack.registry.models.aliases(MODEL)["champion"] == target
    assert secret not in (tmp_path / "relay.log").read_text()
    [local] = json.loads(shown.stdout)["environments"]
    [row] = [r for r in local["models"] if r["model"] == MODEL]
    assert (row["alias"], row["serving"], row["recorded"]["previous"]) == (target, target, before[0])
    text = _version_page(native_stack, target, settings.home / "screenshots" / f"relay-{MODEL}-v{target}.png")
    assert run_id in text  # the version's page in the MLflow UI names the promotion's run
    assert "champion" in text


def _version_page(stack: NativeStack, version: str, shot: Path) -> str:
    """The version's page in the MLflow UI (the stack's own server), in a real headless Chromium
    (Debian's, as test_browser.py drives it): its screenshot kept, its text returned."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: run .ci/system-deps.sh"
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=flags)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(f"{stack.ui_url}/#/models/{MODEL}/versions/{version}")
            page.get_by_text("promotion_run_local").wait_for(timeout=60_000)
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
            return str(page.inner_text("body"))
        finally:
            browser.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False
