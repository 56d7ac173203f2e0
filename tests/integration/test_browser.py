"""A real browser on the MLflow UI: what a person sees of image_model version 2.

Headless Debian Chromium (installed by .ci/system-deps.sh), driven by Playwright with
``executable_path``, opens the UI (a real `mlflow server` of the local stack) after
`mlflow deployments create -t mlreg` promoted image_model v2 (the session stack of
test_mlflow_native.py).  The screenshots stay under the stack's MLREG_HOME (``screenshots/``);
with ``DOCS_SCREENSHOTS=docs/site_src/assets/screenshots`` they are copied there too, for the
docs' MLflow UI page (``docs/site_src/mlflow-ui.md``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.integration.nativestack import NativeStack

pytestmark = pytest.mark.integration

# the flags this machine needs (no sandbox as root; no traffic beyond 127.0.0.1)
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]


def chromium() -> str:
    """Debian's chromium; installed from the project's own list when missing."""
    found = shutil.which("chromium")
    if found is None:
        subprocess.run([str(ROOT / ".ci" / "system-deps.sh")], check=True, timeout=900)
        found = shutil.which("chromium")
    assert found, "chromium is missing: run .ci/system-deps.sh"
    return found


def open_page(browser: Any, url: str, shot: Path) -> str:
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.goto(url)
    if "/versions/" in url:  # the Schema section lists the tensors once expanded
        page.get_by_text("Inputs (1)").click()
        page.get_by_text("Outputs (1)").click()
        page.get_by_text("output (required)").wait_for()
    else:
        page.get_by_text("Environments").wait_for()
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    return str(page.inner_text("body"))


def test_the_ui_shows_the_signature_the_commit_and_where_version_2_serves(
    native_stack: NativeStack,
    deployed: subprocess.CompletedProcess[str],
) -> None:
    from playwright.sync_api import sync_playwright

    assert deployed.returncode == 0, deployed.stderr[-3000:]
    commit = native_stack.registry.version("image_model", "2").tags["git_commit"]
    assert len(commit) == 40  # the checkout's commit (its exporter is in this repository)
    shots = native_stack.settings.home / "screenshots"
    ui = native_stack.ui_url
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=FLAGS)
        try:
            version = open_page(
                browser, f"{ui}/#/models/image_model/versions/2", shots / "image_model-v2.png"
            )
            model = open_page(browser, f"{ui}/#/models/image_model", shots / "image_model.png")
        finally:
            browser.close()
    assert "image (required)" in version
    assert "Tensor (dtype: float32, shape: [-1,3,256,256])" in version
    assert "output (required)" in version
    assert "Tensor (dtype: float32, shape: [-1,10])" in version
    assert commit in version
    assert "serving_local" in version
    assert native_stack.grpc_url in version
    assert "local\t2\t" in model  # the registered model's environments table
    assert (shots / "image_model-v2.png").stat().st_size > 10_000
    docs = os.environ.get("DOCS_SCREENSHOTS")  # the docs' copies, taken by this run (asserted above)
    if docs:
        for shot in ("image_model-v2.png", "image_model.png"):
            shutil.copyfile(shots / shot, Path(docs) / shot)
