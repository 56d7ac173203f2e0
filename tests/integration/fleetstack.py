"""The fleet of python-backend models that test_fleet.py, test_perf_check.py and
test_bake_metrics.py run their own tritonservers for: ``scorer`` (Y = X * its version, failing or
slow on demand) behind the ensemble ``scoring``, and :class:`FleetStack`, what a module's stack of
replicas on one store offers its tests.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionResult
from pipelines.devstack import local_triton
from pipelines.promote.environments import environment
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.triton.control import TritonControl
from registry.mlflow import MlflowRegistry
from registry.settings import Settings
from tests.integration.stacks import ready_versions, refusal_state, register_model

SCORER = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.factor = float(args["model_version"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if FAILS and float(x[0]) > 0.5:  # raised: Triton counts an error *response* as a success
                raise ValueError("scorer: value out of the trained range")
            time.sleep(DELAY)
            y = (x * self.factor).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
"""
ENSEMBLE_CONFIG = """name: "scoring"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "scorer" model_version: 1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
"""


# The fleet environment's bake: long enough for the traffic threads to send each replica dozens of
# requests (each is a few ms); a test whose claim needs more of them (one request a second) says so.
BAKE_SECONDS = 1


def scorer(tag: str, fails: bool = False, delay: float = 0.0) -> str:
    """The scorer's model.py; ``tag`` makes each version's bytes differ."""
    return f"FAILS = {fails}  # {tag}\nDELAY = {delay}\n" + SCORER


@dataclass
class FleetStack:
    settings: Settings
    registry: MlflowRegistry
    store: str
    urls: list[str]
    work: Path
    root: Path
    servers: list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]]

    def write_environment(
        self,
        max_latency_ratio: float = 50,
        min_requests: int = 5,
        queue_ratio: float | None = None,
        bake_seconds: int = BAKE_SECONDS,
    ) -> None:
        """The ``fleet`` environment; by default latency is not judged (a cold python stub on 2 busy
        cores answers its first requests many times slower).  ``queue_ratio``: the bake's checks
        written as a ``[bake] checks`` list, the queue time's ratio among them."""
        self.urls[:] = [info.grpc_url for info, _ in self.servers]
        metrics = ", ".join(f'"{info.grpc_url}" = "{info.metrics_url}"' for info, _ in self.servers)
        targets = ", ".join(f'"{url}"' for url in self.urls)
        bake = (
            f"min_requests = {min_requests}\nmax_latency_ratio = {max_latency_ratio}\n"
            if queue_ratio is None
            else ""
        )
        checks = (
            ""
            if queue_ratio is None
            else "[environments.fleet.bake]\nchecks = ["
            f'{{ metric = "requests", min = {min_requests} }}, {{ metric = "failure_ratio", max = 0.01 }}, '
            f'{{ metric = "latency_ratio", max = {max_latency_ratio} }}, '
            f'{{ metric = "queue_ratio", max = {queue_ratio} }}]\n'
        )
        (self.root / "mlreg.toml").write_text(
            f'[environments.fleet]\nstore = "{self.store}"\ntargets = [{targets}]\ngpu = false\n'
            f"canary = 1\nwaves = [50, 100]\nbake_seconds = {bake_seconds}\nmax_parallel = 2\n"
            f"{bake}metrics = {{ {metrics} }}\n{checks}"
        )

    def promote(self, model: str, version: str, connect: Any = None) -> PromotionResult:
        env = environment(self.settings, "fleet")
        options = Options(skip_quality=True)
        return Promotion(self.settings, env, self.registry, options, connect=connect).run(model, version)

    def register(
        self, model: str, config: str, source: str | None, members: dict[str, str] | None = None
    ) -> str:
        folder = self.work / f"{model}-{len(list(self.work.iterdir()))}"
        files: dict[str, str | bytes] = {} if source is None else {"model.py": source}
        return register_model(self.registry, folder, model, config, files, members=members)

    def serving(self, url: str, model: str) -> dict[str, str]:
        with TritonControl(url) as triton:
            return triton.model_states().get(model, {})

    def ready(self, url: str, model: str) -> list[str]:
        return ready_versions(url, model)

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """On a failure, say which replicas still run and what each serves, how a dead one's log
        ends (a replica that dies where the test did not kill it is Triton's own story: its log is
        the evidence), and what the store and the alias want."""
        try:
            yield
        except Exception as exc:
            lines = []
            for info, process in self.servers:
                state = "runs" if process.poll() is None else f"exited {process.returncode}"
                lines.append(f"{info.grpc_url}: {state}")
                if process.poll() is None:
                    lines.append(f"    {self._states(info.grpc_url)}")
                else:
                    tail = Path(info.log_path).read_text(errors="replace").splitlines()[-15:]
                    lines.extend(f"    {line}" for line in tail)
            lines.append(f"store wants scorer {self._wanted()}; aliases {self._aliases()}")
            raise AssertionError(f"{exc}\nreplicas:\n" + "\n".join(lines)) from exc

    def _states(self, url: str) -> str:
        try:
            with TritonControl(url, timeout=5) as triton:
                states = triton.model_states()
        except Exception as exc:  # a diagnostic: it must never hide the failure it explains
            return f"(states unreadable: {exc})"
        return f"scorer {states.get('scorer', {})}, scoring {states.get('scoring', {})}"

    def _wanted(self) -> str:
        try:
            return str(serving_versions(open_store(self.store).read_config("scorer")))
        except Exception as exc:  # a diagnostic: it must never hide the failure it explains
            return f"(unreadable: {exc})"

    def _aliases(self) -> str:
        try:
            return str(self.registry.models.aliases("scorer"))
        except Exception as exc:  # a diagnostic: it must never hide the failure it explains
            return f"(unreadable: {exc})"

    def state(self, urls: list[str] | None = None) -> dict[str, Any]:
        """What a refused promotion must leave alone (stacks.refusal_state) on ``urls`` (default:
        every replica): the store's objects, each replica's whole index and pins, every alias."""
        return refusal_state(self.store, self.urls if urls is None else urls, self.registry)

    def pinned(self, url: str) -> int:
        """The scorer version the ensemble pins on ``url`` (-1: the latest loaded)."""
        with TritonControl(url) as triton:
            return int(triton.model_config("scoring")["ensemble_scheduling"]["step"][0]["model_version"])
