"""A real browser on the MLflow UI: what a person sees of image_model version 2, of the run that
promoted it and of a run the contract check refused (issue 48, item 6: they link each other).

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

from registry.register import find_candidate, register
from registry.settings import PROMOTIONS_EXPERIMENT
from tests.conftest import ROOT, TEMPLATE
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


def open_page(browser: Any, url: str, shot: Path, wait_for: str = "") -> str:
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.goto(url)
    if wait_for:  # a run page: its description rendered
        page.get_by_text(wait_for).first.wait_for()
    elif "/versions/" in url:  # the Schema section lists the tensors once expanded
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
    commit = native_stack.registry.models.version("image_model", "2").tags["git_commit"]
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
    run = native_stack.registry.models.version_tags("image_model", "2")["promotion_run_local"]
    assert f"local: promoted — run {run[:8]}" in version  # the version page links its promotion run
    _copy_to_docs(shots, ("image_model-v2.png", "image_model.png"))


def test_the_promotion_run_and_a_refused_run_link_their_versions_and_carry_the_figures(
    native_stack: NativeStack, deployed: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    """The run that promoted image_model v2 lasts the promotion, links the version and its verdict
    and carries the stages' figures as metrics; a promotion the contract check refused is a FAILED
    run saying why, linking the version it tried, whose page names the refusal."""
    from playwright.sync_api import sync_playwright

    assert deployed.returncode == 0, deployed.stderr[-3000:]
    registry = native_stack.registry
    promoted = registry.models.version_tags("image_model", "2")["promotion_run_local"]
    folder = tmp_path / "table_data_preprocess"  # a version whose contract breaks the ensemble's
    shutil.copytree(TEMPLATE / "table_data_preprocess", folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 3 ]", "dims: [ 4 ]", 1))
    tried = register(registry, find_candidate(folder)).version
    refusal = native_stack.mlflow(
        "deployments", "create", "-t", "mlreg", "--name", "table_data_preprocess",
        "-m", f"models:/table_data_preprocess/{tried}",
    )  # fmt: skip
    assert refusal.returncode != 0, refusal.stdout[-2000:]
    [refused] = [
        r["run_id"]
        for r in registry.runs.promotions("table_data_preprocess")
        if r.get("result") == "refused" and r.get("to") == tried
    ]
    experiment = registry.runs.experiment_id(PROMOTIONS_EXPERIMENT)
    run = registry.connection.client.get_run(promoted)
    assert run.info.end_time - run.info.start_time > 1000 * _stage_seconds(run.data.metrics)
    shots = native_stack.settings.home / "screenshots"
    ui = native_stack.ui_url
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=FLAGS)
        try:
            page_of_run = open_page(
                browser,
                f"{ui}/#/experiments/{experiment}/runs/{promoted}",
                shots / "promotion-run.png",
                wait_for="promotion of image_model v2",
            )
            page_of_refusal = open_page(
                browser,
                f"{ui}/#/experiments/{experiment}/runs/{refused}",
                shots / "refused-run.png",
                wait_for="contract check failed",
            )
            tried_page = open_page(
                browser,
                f"{ui}/#/models/table_data_preprocess/versions/{tried}",
                shots / "refused-version.png",
                wait_for="Promotions",
            )
        finally:
            browser.close()
    assert "promoted: promotion of image_model v2 to local" in page_of_run
    assert "verdict.json" in page_of_run
    assert "deploy_seconds" in page_of_run  # the stages' figures, as metrics
    assert f"refused: promotion of table_data_preprocess v{tried} to local" in page_of_refusal
    assert f"table_data_preprocess v{tried}" in page_of_refusal
    assert f"local: refused — run {refused[:8]}" in tried_page
    _copy_to_docs(shots, ("promotion-run.png", "refused-run.png"))


def _stage_seconds(metrics: dict[str, float]) -> float:
    """The seconds the promotion's stages took, summed from the run's ``<stage>_seconds`` (a stage's
    name is one word; ``perf_<model>_load_seconds`` and the like are figures within a stage)."""
    stages = {key: value for key, value in metrics.items() if key.count("_") == 1}
    return sum(value for key, value in stages.items() if key.endswith("_seconds"))


def _copy_to_docs(shots: Path, names: tuple[str, ...]) -> None:
    docs = os.environ.get("DOCS_SCREENSHOTS")  # the docs' copies, taken by this run (asserted above)
    if docs:
        for shot in names:
            shutil.copyfile(shots / shot, Path(docs) / shot)
