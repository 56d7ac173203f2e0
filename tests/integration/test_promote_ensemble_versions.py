"""An ensemble served from a Triton folder other than 1, re-pointed by a member's promotion.

Real parts: the embedded MLflow registry, two local-folder stores, two tritonservers (staging and
production). Staging re-points the ensemble when a member is promoted and registers the re-pointed
config as ensemble v2; ``promote --from-alias staging --env production`` then serves ensemble v2
from production's folder "2"; a member's promotion in production re-points it again, and the
re-pointed config must register as a plain version (``config.pbtxt`` + ``1/``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipelines.core.context import Options
from pipelines.core.plan import Role, serving_versions
from pipelines.core.reports import PromotionResult
from pipelines.promote.environments import environment
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.triton.control import TritonControl
from registry.mlflow import MlflowRegistry
from registry.settings import Settings
from tests.integration.stacks import mlreg_process, register_model, stack_settings, tritons
from tests.unit.worlds import ENSEMBLE, MEMBER

pytestmark = pytest.mark.integration

SCALED = """import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.source, self.target = config["input"][0]["name"], config["output"][0]["name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, self.source).as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.target, x * {scale})]))
        return responses
"""
ENVS = ("staging", "production")


@dataclass
class World:
    settings: Settings
    registry: MlflowRegistry
    urls: dict[str, str]
    work: Path
    env_vars: dict[str, str]

    def register(self, name: str, config: str, scale: float | None = None) -> str:
        folder = self.work / f"{name}-{len(list(self.work.iterdir()))}"
        files: dict[str, str | bytes] = {} if scale is None else {"model.py": SCALED.format(scale=scale)}
        return register_model(self.registry, folder, name, config, files)

    def promote(self, env: str, model: str, version: str) -> PromotionResult:
        target = environment(self.settings, env)
        return Promotion(self.settings, target, self.registry, Options(skip_quality=True)).run(model, version)

    def store(self, env: str) -> str:
        return str(self.settings.home.parent / env)

    def ensemble_output(self, env: str) -> np.ndarray:
        with TritonControl(self.urls[env]) as triton:
            out = triton.infer("ens", {"IN": np.array([1.0, 2.0], np.float32)}, ["OUT"])
        return out["OUT"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("ensemble-versions")
    settings, env_vars = stack_settings(root)
    for env in ENVS:
        (root / env).mkdir()
    with tritons(settings, root, [root / env for env in ENVS]) as servers:
        urls = {env: info.grpc_url for env, (info, _) in zip(ENVS, servers, strict=True)}
        (root / "mlreg.toml").write_text(
            "".join(
                f'[environments.{env}]\nstore = "{root / env}"\ntargets = ["{urls[env]}"]\n'
                f'alias = "{env}"\ngpu = false\n'
                for env in ENVS
            )
        )
        (root / "work").mkdir()
        yield World(settings, MlflowRegistry(settings), urls, root / "work", env_vars)


def test_a_member_promotion_repoints_an_ensemble_served_from_folder_2(world: World) -> None:
    assert world.register("pre", MEMBER.format(name="pre", src="IN", dst="MID"), 1.0) == "1"
    assert world.register("net", MEMBER.format(name="net", src="MID", dst="OUT"), 1.0) == "1"
    assert world.register("ens", ENSEMBLE) == "1"
    world.promote("staging", "ens", "1")
    assert world.register("net", MEMBER.format(name="net", src="MID", dst="OUT"), 2.0) == "2"
    world.promote("staging", "net", "2")  # ens re-pointed to net v2, registered as ens v2
    assert world.registry.models.aliases("ens")["staging"] == "2"

    args = ("promote", "--from-alias", "staging", "--env", "production", "--skip-quality")
    with mlreg_process(world.env_vars, *args) as process:
        try:
            _, stderr = process.communicate(timeout=300)
        finally:
            process.kill()  # a no-op once it has ended: a hung promotion does not outlive the test
    assert process.returncode == 0, stderr
    production = open_store(world.store("production"))
    assert serving_versions(production.read_config("ens")) == ["2"]  # registered v2, Triton folder 2
    np.testing.assert_allclose(world.ensemble_output("production"), [2.0, 4.0])

    assert world.register("net", MEMBER.format(name="net", src="MID", dst="OUT"), 3.0) == "3"
    result = world.promote("production", "net", "3")

    assert [(s.model, s.version, s.role) for s in result.plan.steps] == [
        ("net", "3", Role.MODEL),
        ("ens", "3", Role.ENSEMBLE),  # registered as ens v3, served from folder 3 (one number)
    ]
    np.testing.assert_allclose(world.ensemble_output("production"), [3.0, 6.0])
    np.testing.assert_allclose(world.ensemble_output("staging"), [2.0, 4.0])
    registered = world.registry.models.aliases("ens")["production"]
    assert registered == "3"
    assert serving_versions(production.read_config("ens")) == [registered]
    assert world.registry.models.version("ens", registered).tags["validation"] == "passed"
