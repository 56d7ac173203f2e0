"""One local stack for running the workflows with act, shared by the tests and the benchmark.

A real ``moto_server`` holds the ``staging`` and ``production`` Triton repositories (one bucket,
two prefixes), one real ``tritonserver`` per environment reads its prefix, a real ``mlflow
server`` is the registry.  The S3 server may be one the caller runs (the test session's): the
stack then keeps to a bucket of its own.  The MLflow server is always the stack's own: the
workflows register the template's models under their real names, which a shared registry
could already hold (tests/integration/test_registry.py exports ``table_data_model`` into the
session's server), and MLflow has no per-tenant namespace that mlreg's reads would honour.  The
project under test is a scratch git repository holding the template, the workflows and an
``mlreg.toml`` naming those stores and servers.

act runs a workflow's jobs on this machine (``-P ubuntu-latest=-self-hosted``, no Docker); the
actions that would need the network are mapped with ``--local-repository`` to the local
stand-ins next to this file.  No cache or artifact server is started.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.devstack import local_mlflow, local_s3, local_triton
from pipelines.triton.control import TritonControl
from pipelines.triton.control_key import ControlKey
from registry.settings import Settings
from registry.template import BuildResult

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
ACT = VENV_BIN / "act"
RUNNER_LABEL = "mlreg-fleet"  # an Actions Runner Controller scale set's name (README: CI set-up)
STANDINS = {
    "actions/setup-python": "setup-python",
    "aws-actions/configure-aws-credentials": "configure-aws-credentials",
    "actions/upload-artifact": "upload-artifact",
}
ENSEMBLE = "ensemble_multi_modal_model"
GIT = [
    "git",
    "-c",
    "user.name=mlreg-tests",
    "-c",
    "user.email=tests@mlreg.invalid",
    "-c",
    "commit.gpgsign=false",
]


def local_repositories(workflow: str, standins: Mapping[str, str] = STANDINS) -> list[str]:
    """``--local-repository owner/name@SHA=stand-in`` for every pinned action ``workflow`` uses
    (actions/checkout excepted: act checks out the local repository itself).  Only the workflow
    act runs: ci.yml's actions/cache, say, has no stand-in and needs none here.  ``standins``:
    action -> folder under tests/act (release.yml's are in tests/act/release.py)."""
    text = (ROOT / ".github" / "workflows" / workflow).read_text()
    args = []
    for repo, sha in sorted(set(re.findall(r"uses: ([\w.-]+/[\w.-]+)@([0-9a-f]{40})", text))):
        if repo != "actions/checkout":
            args += ["--local-repository", f"{repo}@{sha}={ROOT / 'tests' / 'act' / standins[repo]}"]
    return args


@dataclass
class ActRun:
    returncode: int
    seconds: float
    records: list[dict[str, object]]
    versions_before: dict[str, list[str]] = field(default_factory=dict)  # MLflow's, as act started

    def summary(self, job: str) -> str:
        """The job's ``$GITHUB_STEP_SUMMARY`` (act's JSON log carries it whole)."""
        return "".join(
            str(r["content"]) for r in self.records if r.get("command") == "summary" and r.get("jobID") == job
        )

    @property
    def output(self) -> str:
        return "".join(str(r.get("msg", "")) + ("" if r.get("raw_output") else "\n") for r in self.records)

    def job_result(self, job: str) -> str:
        results = [str(r["jobResult"]) for r in self.records if r.get("jobID") == job and "jobResult" in r]
        return results[-1] if results else "not run"

    def job_seconds(self, job: str) -> float:
        """From the job's first to its last log record (act stamps whole seconds)."""
        stamps = [str(r["time"]) for r in self.records if r.get("jobID") == job and "time" in r]
        if not stamps:
            return 0.0
        parse = lambda s: time.mktime(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S"))  # noqa: E731
        return parse(stamps[-1]) - parse(stamps[0])


@dataclass
class WorkflowStack:
    root: Path  # scratch folder
    repo: Path  # the project under test (a git repository)
    mlflow_url: str
    targets: dict[str, str]  # environment -> Triton gRPC URL
    bucket: str  # the S3 bucket holding the environments' repositories
    control_key: str  # the replicas' model-control key: the jobs' secret MLREG_CONTROL_KEY
    runs: dict[str, ActRun] = field(default_factory=dict)

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    def env(self) -> dict[str, str]:
        """The environment of a direct ``mlreg`` run: what the workflows' jobs see."""
        return {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.root / "home"),
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "MLREG_CONTROL_KEY": self.control_key,
            "MLREG_NO_PROGRESS": "1",
            "MLREG_TEMPLATE_DIR": "model_repository_template",
            "TF_CPP_MIN_LOG_LEVEL": "3",
            **local_s3.CREDENTIALS,
        }

    def mlreg(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(VENV_BIN / "mlreg"), *args], cwd=self.repo, env=self.env(), capture_output=True, text=True
        )
        if check and done.returncode != 0:
            raise AssertionError(f"mlreg {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}")
        return done

    def commit(self, message: str, edits: dict[str, str]) -> str:
        """Append text to template files and commit; returns the commit."""
        for rel, text in edits.items():
            path = self.repo / rel
            path.write_text(path.read_text() + text)
        subprocess.run([*GIT, "add", "-A"], cwd=self.repo, check=True)
        subprocess.run([*GIT, "commit", "-qm", message], cwd=self.repo, check=True)
        return self.head()

    def replace(self, rel: str, old: str, new: str) -> None:
        path = self.repo / rel
        assert old in path.read_text(), (rel, old)
        path.write_text(path.read_text().replace(old, new))

    def head(self) -> str:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=self.repo, capture_output=True, text=True, check=True
        ).stdout.strip()

    def act(self, event: str, workflow: str, payload: Mapping[str, object]) -> ActRun:
        """Run ``workflow``'s jobs for ``event`` with act in host mode; the JSON log is parsed."""
        event_file = self.root / f"event-{event}.json"
        event_file.write_text(json.dumps(payload))
        # the replicas' key as the environments' secret, from a file only this user reads (never on
        # act's command line); the plan environment is given none (the workflow reads it nowhere else)
        secret_file = self.root / "act.secrets"
        secret_file.touch(mode=0o600)
        secret_file.write_text(f"MLREG_CONTROL_KEY={self.control_key}\n")
        command = [
            str(ACT),
            event,
            "-W",
            f".github/workflows/{workflow}",
            "-e",
            str(event_file),
            "-P",
            "ubuntu-latest=-self-hosted",
            # promote.yml's jobs run where vars.MLREG_RUNNER says (a self-hosted runner in the
            # cluster): set, as a team reaching a private fleet sets it, and mapped to this machine
            "--var",
            f"MLREG_RUNNER={RUNNER_LABEL}",
            "-P",
            f"{RUNNER_LABEL}=-self-hosted",
            "--no-cache-server",
            "--json",
            *local_repositories(workflow),
            "-s",
            f"MLFLOW_TRACKING_URI={self.mlflow_url}",
            "-s",
            "AWS_ROLE_ARN=arn:aws:iam::123456789012:role/mlreg-deploy",
            "-s",
            "AWS_REGION=us-east-1",
            "--secret-file",
            str(secret_file),
        ]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.root / "home"),
            "MLREG_ACT_ARTIFACTS": str(self.artifacts),
            "MLREG_ACT_VENV": str(VENV_BIN.parent),
        }
        before = self.versions()
        began = time.perf_counter()
        done = subprocess.run(command, cwd=self.repo, env=env, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - began
        records = []
        for line in done.stdout.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                records.append({"msg": line})
        records += [{"msg": line} for line in done.stderr.splitlines()]
        return ActRun(done.returncode, seconds, records, before)

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.mlflow_url, registry_uri=self.mlflow_url)

    def aliases(self, model: str, alias: str) -> str | None:
        return dict(self._client().get_registered_model(model).aliases or {}).get(alias)

    def versions(self) -> dict[str, list[str]]:
        """Every registered model's versions, as MLflow lists them now."""
        client = self._client()
        return {
            m.name: sorted(
                (str(v.version) for v in client.search_model_versions(f"name='{m.name}'")), key=int
            )
            for m in client.search_registered_models()
        }

    def serving(self, env: str, model: str) -> list[str]:
        key = ControlKey(self.control_key, "the workflow stack")
        with TritonControl(self.targets[env], timeout=10, key=key) as triton:
            states = triton.model_states().get(model, {})
        return sorted((v for v, s in states.items() if s == "READY"), key=int)


def _toml(s3: local_s3.S3Server, bucket: str, targets: dict[str, str]) -> str:
    return "".join(
        f'[environments.{env}]\nstore = "{s3.store_uri(bucket, env)}"\n'
        f'targets = ["{url}"]\nalias = "{env}"\ngpu = false\n\n'
        for env, url in targets.items()
    )


def _placeholders(s3: local_s3.S3Server, bucket: str, prefixes: tuple[str, ...]) -> None:
    """S3 has no empty folders, and Triton refuses a repository path that does not exist."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    for prefix in prefixes:
        client.put_object(Bucket=bucket, Key=f"{prefix}/.mlreg-keep", Body=b"")


def _project(repo: Path, toml: str) -> None:
    repo.mkdir(parents=True)
    shutil.copytree(
        ROOT / "model_repository_template",
        repo / "model_repository_template",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    shutil.copytree(ROOT / ".github", repo / ".github")
    (repo / "mlreg.toml").write_text(toml)
    (repo / ".gitignore").write_text(".mlreg/\n__pycache__/\n*.json\n")
    subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "the template"], cwd=repo, check=True)


@contextmanager
def workflow_stack(
    root: Path, s3: local_s3.S3Server | None = None, build: BuildResult | None = None
) -> Iterator[WorkflowStack]:
    """The stack, with the template exported and ensemble v1 serving in staging and production.
    ``s3``: a running S3 server to use (a bucket of the stack's own is made there); else one is
    started for the stack.  ``build``: the test session's template build, registered as ``mlreg
    export`` registers it (tests/integration/stacks.py) instead of a second export (a TensorFlow
    export: most of the stack's set-up); None: ``mlreg export`` in the project.  Either way the
    workflows' own ``mlreg export --changed`` re-exports the whole template and must find every
    unchanged model's bytes registered already.  MLflow and both tritonservers start at once.
    The tritonservers' control API is locked to a key of the stack's own, as production replicas
    are (a promotion refuses a replica anyone can drive): the workflows' promotion jobs get it
    as the secret ``MLREG_CONTROL_KEY``."""
    for key, value in local_s3.CREDENTIALS.items():
        os.environ.setdefault(key, value)
    (root / "home").mkdir(parents=True, exist_ok=True)
    bucket = f"workflows-{uuid.uuid4().hex[:12]}"
    key = secrets.token_urlsafe(24)
    with ExitStack() as stop:
        if s3 is None:
            s3, s3_process = local_s3.start_s3(root / "logs" / "moto.log")
            stop.callback(local_s3.stop_s3, s3.pid, s3_process)
        local_s3.create_bucket(s3.endpoint, bucket)
        _placeholders(s3, bucket, ("staging", "production"))
        mlflow, targets = _start_servers(stop, root, s3, bucket, key)
        stack = WorkflowStack(root, root / "repo", mlflow.url, targets, bucket, key)
        _project(stack.repo, _toml(s3, bucket, targets))
        if build is None:
            stack.mlreg("export")
        else:
            _register_build(stack, build)
        for env in targets:
            stack.mlreg("promote", ENSEMBLE, "--version", "1", "--env", env, "--skip-quality")
        shutil.rmtree(stack.repo / ".mlreg", ignore_errors=True)  # act copies the work tree
        yield stack


def _start_servers(
    stop: ExitStack, root: Path, s3: local_s3.S3Server, bucket: str, key: str
) -> tuple[local_mlflow.MlflowServer, dict[str, str]]:
    """MLflow and one tritonserver per environment, started at once (each start waits for its own
    server; one after the other they added up); every one that started is stopped on exit, also
    when another failed to start (its error is raised after)."""
    standins = Settings.from_env().backends_source
    envs = ("staging", "production")
    with ThreadPoolExecutor(1 + len(envs)) as pool:
        mlflow_start = pool.submit(
            local_mlflow.start_mlflow,
            f"sqlite:///{root / 'mlflow.db'}",
            root / "mlflow-artifacts",
            root / "logs" / "mlflow.log",
            serve_artifacts=True,
        )
        triton_starts = {
            env: pool.submit(
                local_triton.start_server,
                s3.store_uri(bucket, env),
                root / f"triton-{env}",
                standins,
                control_key=key,
            )
            for env in envs
        }
    if mlflow_start.exception() is None:
        server, process = mlflow_start.result()
        stop.callback(local_mlflow.stop_mlflow, server.pid, process)
    servers: list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes] | None]] = [
        start.result() for start in triton_starts.values() if start.exception() is None
    ]
    stop.callback(local_triton.stop_all, servers)  # whichever started, all at once
    mlflow, _ = mlflow_start.result()  # a failed start raises here, the started ones stopped on exit
    return mlflow, {env: start.result()[0].grpc_url for env, start in triton_starts.items()}


def _register_build(stack: WorkflowStack, build: BuildResult) -> None:
    """The session's build registered in the stack's MLflow as ``mlreg export`` registers it."""
    from registry.mlflow import MlflowRegistry
    from tests.integration.stacks import register_template

    env = {"MLFLOW_TRACKING_URI": stack.mlflow_url, "MLREG_HOME": str(stack.root / "register-home")}
    settings = Settings.from_env(env=env, cwd=stack.repo)
    register_template(MlflowRegistry(settings), build, stack.root / "exports")
