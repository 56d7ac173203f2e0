"""The GitHub Actions workflows, run for real with act on one local stack (tests/act/harness.py).

In file order, like a team's week: a merge to main after a template change promotes the changed
model to staging and then production takes exactly what staging serves; a pull request with a
contract-breaking change fails its plan naming the tensor; a manual run whose input carries shell
metacharacters executes none of them.  Before those, the static checks of the workflow files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mlreg.cli.main import app
from mlreg.cli.report import render
from tests.act.harness import ENSEMBLE, ROOT, WorkflowStack, workflow_stack
from tests.cli import CliRunner
from tests.integration.stacks import seed_registry

pytestmark = pytest.mark.integration

CHANGED = "table_data_preprocess"
INJECTION = 'x"; touch PWNED; echo "'


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, s3_server: Any, template_build: Any
) -> Iterator[WorkflowStack]:
    """The session's S3 server (a bucket of the stack's own); MLflow and Triton the stack's own; the
    session's template build registered (the run's one export) instead of a second export."""
    with workflow_stack(tmp_path_factory.mktemp("workflows"), s3=s3_server, build=template_build) as running:
        yield running


def test_static_checks_pass_zizmor_actionlint_and_the_workflow_schema() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "tests" / "act" / "lint-workflows.sh")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No findings to report" in done.stdout
    assert "ok -- validation done" in done.stdout
    workflows = len(list((ROOT / ".github" / "workflows").glob("*.yml")))  # each one linted
    assert f"actionlint: {workflows} file(s), 0 finding(s)" in done.stdout


def test_promotion_jobs_run_where_mlreg_runner_says_and_can_promote_in_the_cluster() -> None:
    """README "Reaching the fleet from CI": the runner label from a repository variable (default
    GitHub-hosted), and production's Job launched from infra/k8s's template."""
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "promote.yml").read_text())
    for name in ("staging", "production", "manual"):
        assert workflow["jobs"][name]["runs-on"] == "${{ vars.MLREG_RUNNER || 'ubuntu-latest' }}", name
    steps = {step.get("id"): step for step in workflow["jobs"]["production"]["steps"]}
    assert steps["promote"]["if"] == "vars.MLREG_PROMOTE_IN_CLUSTER != 'true'"
    in_cluster = steps["promote_in_cluster"]
    assert in_cluster["if"] == "vars.MLREG_PROMOTE_IN_CLUSTER == 'true'"
    assert "--from=cronjob/mlreg-promote" in in_cluster["run"]
    assert 'logs "job/$JOB" > production.json' in in_cluster["run"]
    template = yaml.safe_load_all((ROOT / "infra" / "k8s" / "base" / "promote-job.yaml").read_text())
    assert ("CronJob", "mlreg-promote") in {(d["kind"], d["metadata"]["name"]) for d in template}


def test_report_cells_cannot_break_the_table_or_inject_html() -> None:
    doc = {"ok": False, "error": "model '<b>a|b</b>' not found\n  second line", "fix": "pass a | name"}
    lines = render(doc)
    assert "> **error:** model '&lt;b&gt;a\\|b&lt;/b&gt;' not found" in lines
    assert "> - second line" in lines
    assert "> **fix:** pass a \\| name" in lines


def test_a_contract_error_in_the_template_is_reported_naming_model_and_tensor(tmp_path: Path) -> None:
    template = tmp_path / "template"
    shutil.copytree(ROOT / "model_repository_template", template)
    config = template / ENSEMBLE / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 256", "max_batch_size: 0"))
    runner = CliRunner()
    validate = runner.invoke(app, ["validate", str(template), "--json"])
    assert validate.exit_code == 1
    (tmp_path / "validate.json").write_text(validate.stdout)
    report = runner.invoke(app, ["report", str(tmp_path / "validate.json"), "--markdown"])
    assert report.exit_code == 0, report.output
    assert "## mlreg validate" in report.stdout
    assert f"| error | {ENSEMBLE} | table_data_input_1 | in ensemble {ENSEMBLE}, tensor" in report.stdout


def test_from_alias_lists_only_the_versions_the_target_alias_lacks(tmp_path: Path) -> None:
    from mlreg.ops.promote_many import versions_from_alias

    registry = _registry(tmp_path)
    client = registry.connection.client
    for name, staging, production in (("a", "2", "1"), ("b", "1", "1"), ("c", "1", None)):
        client.create_registered_model(name)
        for _ in range(2):
            client.create_model_version(name, source=str(tmp_path))
        client.set_registered_model_alias(name, "staging", staging)
        if production:
            client.set_registered_model_alias(name, "production", production)
    client.create_registered_model("d")  # no alias at all
    assert versions_from_alias(registry.models, "staging", "production") == [("a", "2"), ("c", "1")]


def _registry(tmp_path: Path) -> Any:
    """The embedded registry of ``tmp_path/.mlreg``, empty (a copy: tests/integration/stacks.py)."""
    from registry.mlflow import MlflowRegistry
    from registry.settings import Settings

    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    seed_registry(settings)
    return MlflowRegistry(settings)


def _registry_state(tmp_path: Path) -> tuple[Any, Callable[[], dict[str, tuple[int, dict[str, str]]]]]:
    """A sqlite registry under ``tmp_path/.mlreg``: scorer v1, v2 (staging -> 2, local -> 1) and
    ranker v1 (staging -> 1); and a snapshot function of every model's version count and aliases."""
    registry = _registry(tmp_path)
    client = registry.connection.client
    for name, count, aliases in (
        ("scorer", 2, {"staging": "2", "local": "1"}),
        ("ranker", 1, {"staging": "1"}),
    ):
        client.create_registered_model(name)
        for _ in range(count):
            client.create_model_version(name, source=str(tmp_path))
        for alias, version in aliases.items():
            client.set_registered_model_alias(name, alias, version)

    def state() -> dict[str, tuple[int, dict[str, str]]]:
        return {
            m.name: (len(registry.models.versions(m.name)), registry.models.aliases(m.name))
            for m in client.search_registered_models()
        }

    return registry, state


def _promote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / ".mlreg"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return CliRunner().invoke(app, ["promote", *args])


@pytest.mark.parametrize("model", [[], ["scorer"]])
def test_from_alias_that_no_version_holds_exits_4_naming_it_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: list[str]
) -> None:
    registry, state = _registry_state(tmp_path)
    before = state()
    result = _promote(tmp_path, monkeypatch, *model, "--from-alias", "nope")
    assert result.exit_code == 4, result.output
    assert "Nothing to promote" not in result.output
    if model:
        assert (
            f"error: model 'scorer' has no alias 'nope' in MLflow ({registry.uri}); "
            "its aliases: local, staging" in result.stderr
        )
        assert "fix: pass one of its aliases, or see 'mlreg versions scorer'" in result.stderr
    else:
        assert (
            f"error: alias 'nope' names no version of any registered model in MLflow ({registry.uri})"
            in result.stderr
        )
        assert "fix: check the alias (each environment's alias is in mlreg.toml" in result.stderr
    assert state() == before  # nothing registered, no alias moved


def test_from_alias_with_a_model_that_is_not_registered_exits_4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, state = _registry_state(tmp_path)
    before = state()
    result = _promote(tmp_path, monkeypatch, "nosuch", "--from-alias", "staging")
    assert result.exit_code == 4, result.output
    assert f"error: model 'nosuch' is not registered in MLflow ({registry.uri})" in result.stderr
    assert state() == before


def test_from_alias_with_a_model_promotes_only_that_model(tmp_path: Path) -> None:
    from mlreg.ops.promote_many import versions_from_alias

    registry, state = _registry_state(tmp_path)
    before = state()
    assert versions_from_alias(registry.models, "staging", "local") == [("ranker", "1"), ("scorer", "2")]
    assert versions_from_alias(registry.models, "staging", "local", "ranker") == [("ranker", "1")]
    assert versions_from_alias(registry.models, "staging", "production", "scorer") == [("scorer", "2")]
    registry.models.set_alias("scorer", "production", "2")
    assert versions_from_alias(registry.models, "staging", "production", "scorer") == []  # held already
    assert state()["ranker"] == before["ranker"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["scorer", "--version", "2", "--from-alias", "staging"],
            "error: --version and --from-alias/--from-file exclude each other",
        ),
        (
            ["scorer", "--from-file", "exported.json"],
            "error: MODEL 'scorer' and --from-file exclude each other",
        ),
        (
            ["--from-alias", "local"],
            "error: --from-alias 'local' is the alias of the environment promoted to",
        ),
    ],
)
def test_from_alias_refusals_are_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    _, state = _registry_state(tmp_path)
    before = state()
    (tmp_path / "exported.json").write_text(json.dumps({"versions": [{"model": "scorer", "version": "2"}]}))
    monkeypatch.chdir(tmp_path)
    result = _promote(tmp_path, monkeypatch, *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "fix: " in result.stderr
    assert state() == before


def test_promote_help_says_what_model_does_with_from_alias() -> None:
    result = CliRunner().invoke(app, ["promote", "--help"])
    text = " ".join(result.output.replace("│", " ").split())
    assert "with MODEL, only MODEL's" in text
    assert "An alias no version holds is an error (exit 4)" in text
    assert "takes no MODEL" in text


def test_push_promotes_the_changed_model_to_staging(stack: WorkflowStack) -> None:
    head = stack.commit(
        "tune the table preprocessor", {f"model_repository_template/{CHANGED}/1/model.py": "\n# tuned\n"}
    )
    run = stack.act(
        "push", "promote.yml", {"ref": "refs/heads/main", "after": head, "repository": {"name": "repo"}}
    )
    stack.runs["push"] = run
    assert run.job_result("staging") == "success", run.output[-6000:]
    assert stack.aliases(CHANGED, "staging") == "2"
    assert stack.serving("staging", CHANGED) == ["2"]
    summary = run.summary("staging")
    assert "## mlreg promotion: `staging`" in summary
    assert "| stage | status | time | detail |" in summary
    assert (
        f"| {CHANGED} | v2 | promoted | [{CHANGED} v2]({stack.mlflow_url}/#/models/{CHANGED}/versions/2)"
        in summary
    )
    report = json.loads((stack.artifacts / "promotion-reports-staging" / "staging.json").read_text())
    assert [(p["model"], p["version"], p["ok"]) for p in report["promotions"]] == [(CHANGED, "2", True)]


def test_production_job_promotes_the_versions_the_staging_alias_holds(stack: WorkflowStack) -> None:
    """Production never re-exports (nor registers anything): every version MLflow gained during the
    merge's run is the one the ``staging`` alias holds, so the staging job registered it (the
    production job moves only ``production``); and the production job has no export step."""
    import yaml

    run = stack.runs["push"]  # the same merge: the production job ran after the staging job
    assert run.job_result("production") == "success", run.output[-6000:]
    for model in (CHANGED, ENSEMBLE):
        assert stack.aliases(model, "production") == stack.aliases(model, "staging"), model
    assert stack.serving("production", CHANGED) == ["2"]
    summary = run.summary("production")
    assert "## mlreg promotion: `production`" in summary
    assert f"| {ENSEMBLE} | v{stack.aliases(ENSEMBLE, 'staging')} | promoted |" in summary
    assert f"| {CHANGED} | v2 | promoted with its ensemble |" in summary

    before = {(m, v) for m, vs in run.versions_before.items() for v in vs}
    now = {(m, v) for m, vs in stack.versions().items() for v in vs}
    assert before <= now
    new = now - before  # staging's export of the change, and the ensemble version pinning it
    assert new == {(CHANGED, "2"), (ENSEMBLE, stack.aliases(ENSEMBLE, "staging"))}, new
    assert {(model, stack.aliases(model, "staging")) for model, _ in new} == new  # production's: none
    workflow = yaml.safe_load((stack.repo / ".github" / "workflows" / "promote.yml").read_text())  # act's
    commands = [str(step.get("run", "")) for step in workflow["jobs"]["production"]["steps"]]
    assert not [c for c in commands if "mlreg export" in c or "mlreg register" in c]


def test_pull_request_with_a_breaking_change_fails_the_plan_naming_the_tensor(stack: WorkflowStack) -> None:
    config = f"model_repository_template/{ENSEMBLE}/config.pbtxt"
    alias_before, serving_before = stack.aliases(ENSEMBLE, "staging"), stack.serving("staging", ENSEMBLE)
    subprocess.run(["git", "checkout", "-qb", "rename-input"], cwd=stack.repo, check=True)
    try:
        stack.replace(config, 'name: "image_preprocess_input"', 'name: "image_bytes"')
        stack.replace(config, 'value: "image_preprocess_input" }', 'value: "image_bytes" }')
        head = stack.commit("rename the image input", {})
        payload = {
            "pull_request": {
                "number": 7,
                "head": {"ref": "rename-input", "sha": head},
                "base": {"ref": "main"},
            }
        }
        run = stack.act("pull_request", "plan.yml", payload)
    finally:
        subprocess.run(["git", "checkout", "-q", "main"], cwd=stack.repo, check=True)
    assert run.returncode != 0
    assert run.job_result("plan") == "failure"
    summary = run.summary("plan")
    assert f"### {ENSEMBLE} v" in summary
    assert "| input-removed | image_preprocess_input | breaking |" in summary
    assert "breaks the contract of the serving version" in summary
    assert stack.aliases(ENSEMBLE, "staging") == alias_before  # a plan changes nothing serving
    assert stack.serving("staging", ENSEMBLE) == serving_before


def test_dispatch_input_with_shell_metacharacters_executes_nothing(stack: WorkflowStack) -> None:
    inputs = {"action": "promote", "model": INJECTION, "version": "1", "environment": "staging"}
    run = stack.act("workflow_dispatch", "promote.yml", {"inputs": inputs})
    assert run.job_result("manual") == "failure"
    assert list(Path(stack.root).rglob("PWNED")) == []
    assert f"error: model name '{INJECTION}' cannot be stored" in run.output  # data, never code
    summary = run.summary("manual")
    assert "**error:**" in summary
    assert "**fix:**" in summary
