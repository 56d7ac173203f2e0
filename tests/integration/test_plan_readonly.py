"""A pull request's plan writes nothing: ``mlreg export --dry-run`` and ``mlreg promote --from-file
--dry-run`` on a real tritonserver and the embedded MLflow registry.

plan.yml runs the pull request's code with a read-only MLflow token and a store role that can only
read: the export numbers the versions it would register without registering them, the plan is made
from those files, and MLflow (models, versions, aliases, runs), the store and what serves are the
same afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mlreg.cli.main import app
from mlreg.ops.promote import promote
from pipelines.core.options import Options
from pipelines.devstack.stack import stack_down, stack_up
from registry.export import export_models
from registry.mlflow import MlflowRegistry
from registry.settings import Settings
from tests.cli import CliRunner
from tests.conftest import TEMPLATE
from tests.integration.stacks import ENSEMBLE, refusal_state, seed_registry

pytestmark = pytest.mark.integration

MODEL = "table_data_preprocess"  # a python-backend model: no exporter to run


@dataclass
class Stack:
    settings: Settings
    registry: MlflowRegistry
    url: str
    template: Path
    env: dict[str, str]

    def state(self) -> dict[str, Any]:
        """What a plan must leave alone: MLflow's models, versions and runs, and what any refusal
        must (stacks.refusal_state): the sha256 of every object of the store, Triton's whole index
        and pins, every alias of every model."""
        client = self.registry.connection.client
        experiments = [e.experiment_id for e in client.search_experiments()]
        return {
            "versions": {
                m.name: sorted(str(v.version) for v in self.registry.models.versions(m.name))
                for m in client.search_registered_models()
            },
            "runs": len(client.search_runs(experiments)) if experiments else 0,
            **refusal_state(self.settings.local_repository, [self.url], self.registry),
        }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("plan")
    template = root / "template"
    shutil.copytree(TEMPLATE, template)
    env = {"MLREG_HOME": str(root / ".mlreg"), "MLREG_TEMPLATE_DIR": str(template)}
    settings = Settings.from_env(env={**env, "PATH": os.environ["PATH"]})
    settings.local_repository.mkdir(parents=True)
    seed_registry(settings)
    status = stack_up(settings, ui=False)
    registry = MlflowRegistry(settings)
    try:
        assert [r.version for r in export_models(settings, registry, [MODEL])] == ["1"]
        promote(settings, "local", MODEL, "1", Options(skip_quality=True))
        model_py = template / MODEL / "1" / "model.py"
        model_py.write_text(model_py.read_text() + "\n# a pull request's change\n")
        assert status.info is not None
        yield Stack(settings, registry, status.info.grpc_url, template, env)
    finally:
        stack_down(settings)


@pytest.fixture
def mlreg(stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    for key, value in stack.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return lambda *args: CliRunner().invoke(app, list(args))


def test_a_plan_registers_nothing_and_plans_the_version_it_would_register(stack: Stack, mlreg: Any) -> None:
    before = stack.state()
    exported = mlreg("export", MODEL, "--changed", "--against", "local", "--dry-run", "--json")
    assert exported.exit_code == 0, exported.output
    doc = json.loads(exported.stdout)
    assert doc["dry_run"] is True
    [entry] = doc["versions"]
    assert (entry["model"], entry["version"], entry["created"]) == (MODEL, "2", True)
    assert entry["planned"]["tags"]["validation"] == "passed"
    assert stack.state() == before  # nothing registered, no run, no alias
    Path("exported.json").write_text(exported.stdout)

    plan = mlreg(
        "promote", "--from-file", "exported.json", "--env", "local", "--dry-run", "--skip-quality", "--json"
    )
    assert plan.exit_code == 0, plan.output
    batch = json.loads(plan.stdout)
    [promotion] = batch["promotions"]
    assert (promotion["model"], promotion["version"], promotion["ok"]) == (MODEL, "2", True)
    assert promotion["registered"] is False
    assert [s["stage"] for s in promotion["report"]["stages"]] == ["resolve", "validate", "preflight"]
    [step] = promotion["report"]["plan"]["steps"]
    assert (step["model"], step["version"], step["from"], step["upload"]) == (MODEL, "2", ["1"], True)
    assert stack.state() == before  # nothing uploaded, loaded, registered or recorded
    Path("plan.json").write_text(plan.stdout)

    report = mlreg("report", "plan.json", "--markdown")
    assert report.exit_code == 0, report.output
    assert f"| {MODEL} | v2 | planned | {MODEL} v2 (planned: not registered yet) |" in report.stdout


def test_a_planned_version_cannot_be_promoted_for_real(stack: Stack, mlreg: Any) -> None:
    exported = mlreg("export", MODEL, "--dry-run", "--json")
    assert exported.exit_code == 0, exported.output
    Path("exported.json").write_text(exported.stdout)
    before = stack.state()
    result = mlreg("promote", "--from-file", "exported.json", "--env", "local", "--skip-quality")
    assert result.exit_code == 2, result.output
    assert (
        f"error: {MODEL} v2: planned by 'mlreg export --dry-run', not registered: only a plan can use them"
        in result.stderr
    )
    assert "fix: pass --dry-run, or run 'mlreg export --changed --json' (it registers)" in result.stderr
    assert stack.state() == before


def test_a_plan_whose_export_is_stale_is_refused(stack: Stack, mlreg: Any) -> None:
    exported = mlreg("export", MODEL, "--dry-run", "--json")
    assert exported.exit_code == 0, exported.output
    Path("exported.json").write_text(exported.stdout)
    registered = mlreg("export", MODEL, "--json")  # v2 registered since the plan's export
    assert json.loads(registered.stdout)["versions"][0]["version"] == "2"
    before = stack.state()
    plan = mlreg("promote", "--from-file", "exported.json", "--env", "local", "--dry-run", "--skip-quality")
    assert plan.exit_code == 4, plan.output
    assert f"error: {MODEL} version 2 was registered in MLflow (" in plan.stderr
    assert "fix: run 'mlreg export --dry-run' again, then the plan" in plan.stderr
    assert stack.state() == before


def test_the_plan_registry_numbers_after_mlflow_and_writes_nothing(tmp_path: Path) -> None:
    from registry.errors import RegistryError
    from registry.export import PlanRegistry, member_versions
    from registry.register import find_candidate, register

    settings = Settings.from_env(env={"MLREG_HOME": str(tmp_path / ".mlreg")})
    seed_registry(settings)
    registry = MlflowRegistry(settings)
    assert register(registry, find_candidate(TEMPLATE / MODEL)).version == "1"
    client = registry.connection.client

    def state() -> tuple[list[str], dict[str, str], int]:
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        return (
            [str(v.version) for v in registry.models.versions(MODEL)],
            registry.models.aliases(MODEL),
            len(runs),
        )

    before = state()
    changed = tmp_path / MODEL
    shutil.copytree(TEMPLATE / MODEL, changed)
    (changed / "1" / "model.py").write_text((changed / "1" / "model.py").read_text() + "\n# changed\n")
    plan = PlanRegistry(registry)
    first = register(plan, find_candidate(changed))  # type: ignore[arg-type]
    assert (first.version, first.created, first.run_id) == ("2", True, "")
    again = register(plan, find_candidate(changed))  # type: ignore[arg-type]
    assert (again.version, again.created) == ("2", False)  # identical bytes: the planned version
    same = register(plan, find_candidate(TEMPLATE / MODEL))  # type: ignore[arg-type]
    assert (same.version, same.created) == ("1", False)  # identical bytes: the registered version
    assert sorted(str(v.version) for v in plan.models.versions(MODEL)) == ["1", "2"]
    ensemble = tmp_path / ENSEMBLE
    shutil.copytree(TEMPLATE / ENSEMBLE, ensemble)
    config = ensemble / "config.pbtxt"
    following = f'model_name: "{MODEL}"\n      model_version: -1'
    config.write_text(config.read_text().replace(f'model_name: "{MODEL}"\n      model_version: 1', following))
    assert member_versions(plan.models, ensemble)[MODEL] == "2"  # the latest, planned, version
    tags = plan.models.fetch_version(MODEL, "2", tmp_path / "fetched")
    assert tags["validation"] == "passed"
    assert (tmp_path / "fetched" / "2" / "model.py").read_text().endswith("# changed\n")
    with pytest.raises(RegistryError, match="a plan \\(--dry-run\\) writes nothing to MLflow: alias staging"):
        plan.models.set_alias(MODEL, "staging", "2")
    assert state() == before  # MLflow: no version, alias or run added
