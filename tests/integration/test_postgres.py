"""MLflow on a real PostgreSQL, as infra/compose runs it, with mlreg's CLI driving it.

A private PostgreSQL cluster (Debian's ``postgresql``: initdb + pg_ctl in a temporary folder,
password authentication, 127.0.0.1 and a free port), the MLflow server started with the command
line of ``infra/compose/compose.yaml`` (only the database host, the listen address and the port
differ: compose's service names resolve inside compose only), its artifacts in an S3 bucket of a
real moto_server. The store is prepared as compose does (bucket, ``mlreg store init``), a local
tritonserver reads it over S3, and the CLI runs export -> register -> promote -> history, then
two promotions of different models at once. The quality gate is skipped (--skip-quality): it
starts scratch servers and is covered by tests/integration/test_promote.py.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from pipelines.devstack import local_s3
from pipelines.devstack.local_triton import free_port, http_ok
from tests.conftest import ROOT, TEMPLATE
from tests.integration import forkcli
from tests.integration.infra import compose

pytestmark = pytest.mark.integration

DATABASE = "mlflow"
USER = "mlflow"
MODEL_BUCKET = "pg-models"
MLFLOW_BUCKET = "pg-mlflow"


# --- PostgreSQL ----------------------------------------------------------------------------------


@dataclass
class Postgres:
    port: int
    password: str
    data: Path

    def connect(self, database: str = DATABASE) -> Any:
        import psycopg2

        return psycopg2.connect(
            host="127.0.0.1", port=self.port, user=USER, password=self.password, dbname=database
        )

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with self.connect() as conn, conn.cursor() as cursor:
            cursor.execute(sql)
            return list(cursor.fetchall())


def pg_bindir() -> Path:
    found = shutil.which("pg_config")
    if found:
        bindir = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False).stdout
        if (Path(bindir.strip()) / "initdb").is_file():
            return Path(bindir.strip())
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not candidates:
        pytest.fail("PostgreSQL not found: bash .ci/system-deps.sh installs Debian's postgresql")
    return candidates[-1].parent


def as_server_user(command: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the postgres account then."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


def _owned_by_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(path, account.pw_uid, account.pw_gid)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    bindir = pg_bindir()
    # not under pytest's tmp folder: that one is private to this user, the server runs as postgres
    root = Path(tempfile.mkdtemp(prefix="mlreg-pg-"))
    _owned_by_server_user(root)
    password = secrets.token_hex(12)
    pwfile = root / "password"
    pwfile.write_text(password + "\n")
    _owned_by_server_user(pwfile)
    data = root / "data"
    run = subprocess.run(
        as_server_user(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-locale",
                "-E",
                "UTF8",
                "--no-instructions",
                "--no-sync",
            ]
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    port = free_port()
    options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={root} -c fsync=off"
    log = root / "postgres.log"
    ctl = [str(bindir / "pg_ctl"), "-D", str(data)]
    start = subprocess.run(
        as_server_user([*ctl, "-l", str(log), "-w", "-t", "60", "-o", options, "start"]),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert start.returncode == 0, start.stdout + start.stderr + log.read_text(errors="replace")
    server = Postgres(port, password, data)
    try:
        conn = server.connect("postgres")
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {DATABASE}")
        conn.close()
        yield server
    finally:
        subprocess.run(
            as_server_user([*ctl, "-m", "fast", "stop"]), capture_output=True, timeout=60, check=False
        )
        shutil.rmtree(root, ignore_errors=True)


# --- the MLflow server with compose's command line -----------------------------------------------


def mlflow_command(db: Postgres, port: int) -> tuple[list[str], dict[str, str]]:
    """compose's mlflow service (command + environment) for this machine's servers."""
    service = compose(
        {
            "POSTGRES_USER": USER,
            "POSTGRES_PASSWORD": db.password,
            "POSTGRES_DB": DATABASE,
            "MLFLOW_BUCKET": MLFLOW_BUCKET,
            "MINIO_ROOT_USER": "unused",
            "MLFLOW_WORKERS": "1",  # compose's knob: one worker on this 2-core machine
            "MINIO_ROOT_PASSWORD": "unused",
            # .env.example's placeholder is no Fernet key: MLflow refuses to start on it, as an operator's
            # server would until they generate one (its comment says how)
            "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": Fernet.generate_key().decode(),
        }
    )["services"]["mlflow"]
    command = list(service["command"])
    replaced = {"--host": "127.0.0.1", "--port": str(port)}  # bind 127.0.0.1 only, a free port
    for flag, value in replaced.items():
        command[command.index(flag) + 1] = value
    backend = command.index("--backend-store-uri") + 1
    assert "@postgres:5432/" in command[backend]
    command[backend] = command[backend].replace("@postgres:5432/", f"@127.0.0.1:{db.port}/")
    exe = Path(sys.executable).parent / command[0]
    command[0] = str(exe) if exe.is_file() else command[0]
    env = {k: str(v) for k, v in service["environment"].items()}
    return command, env


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM stops the MLflow server and its workers (FACTS.md); SIGKILL the group after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Platform:
    db: Postgres
    mlflow_url: str
    mlflow_command: list[str]
    s3_endpoint: str
    store: str
    project: Path
    env: dict[str, str]

    def mlreg(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = forkcli.run(args, cwd=self.project, env=self.env, timeout=300)
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.mlreg(*args, "--json").stdout)


@pytest.fixture(scope="module")
def platform(
    postgres: Postgres, s3_server: local_s3.S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    for bucket in (MODEL_BUCKET, MLFLOW_BUCKET):  # compose: the `buckets` service
        local_s3.create_bucket(s3_server.endpoint, bucket)
    root = tmp_path_factory.mktemp("postgres-platform")
    port = free_port()
    command, service_env = mlflow_command(postgres, port)
    server_env = {
        **os.environ,
        **service_env,
        **local_s3.CREDENTIALS,
        "MLFLOW_S3_ENDPOINT_URL": s3_server.endpoint,  # compose: http://minio:9000
    }
    server_env.pop("MLFLOW_TRACKING_URI", None)
    log = root / "mlflow.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=server_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not http_ok(f"{url}/health", timeout=2):
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.3)
        project = root / "project"
        project.mkdir()
        store = s3_server.store_uri(MODEL_BUCKET, "production")
        env = {
            **os.environ,
            **local_s3.CREDENTIALS,
            "MLREG_HOME": str(project / ".mlreg"),
            "MLFLOW_TRACKING_URI": url,
            "MLREG_NO_PROGRESS": "1",
            "PYTHONPATH": str(ROOT),
        }
        yield Platform(postgres, url, command, s3_server.endpoint, store, project, env)
    finally:
        stop(process)


@pytest.fixture(scope="module")
def triton(platform: Platform) -> Iterator[str]:
    """compose's order: store-init, then Triton on the S3 repository; the environment names it."""
    init = platform.json("store", "init", "--store", platform.store)
    assert init["created"] is True
    up = platform.json("stack", "up", "--repository", platform.store, "--no-ui")
    try:
        assert up["repository"] == platform.store
        (platform.project / "mlreg.toml").write_text(
            f'[environments.production]\nstore = "{platform.store}"\n'
            f'targets = ["{up["grpc_url"]}"]\nalias = "production"\ngpu = false\n'
        )
        yield str(up["grpc_url"])
    finally:
        platform.mlreg("stack", "down", check=False)


# --- tests ---------------------------------------------------------------------------------------


def test_the_compose_mlflow_server_keeps_its_registry_in_postgresql(platform: Platform) -> None:
    assert platform.mlflow_command[1:3] == ["server", "--backend-store-uri"]
    assert platform.mlflow_command[3].startswith(f"postgresql+psycopg2://{USER}:")
    assert "--serve-artifacts" in platform.mlflow_command
    tables = {
        row[0] for row in platform.db.query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    }
    assert {"experiments", "runs", "registered_models", "model_versions", "alembic_version"} <= tables


def test_export_register_then_two_promotions_at_once_both_record(platform: Platform, triton: str) -> None:
    exported = platform.json("export", "image_preprocess")
    assert [(v["model"], v["version"]) for v in exported["versions"]] == [("image_preprocess", "1")]
    registered = platform.json("register", "table_data_preprocess", str(TEMPLATE / "table_data_preprocess"))
    assert [(v["model"], v["version"]) for v in registered["versions"]] == [("table_data_preprocess", "1")]

    models = ("table_data_preprocess", "image_preprocess")
    runs = [
        forkcli.popen(
            ["promote", model, "--version", "1", "--env", "production", "--skip-quality", "--json"],
            cwd=platform.project,
            env=platform.env,
        )
        for model in models
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    for run, (out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out + err
        assert json.loads(out)["ok"] is True

    # history as users read it, and both promotion runs in PostgreSQL's tables
    [row] = platform.json("history", "table_data_preprocess", "--env", "production")["promotions"]
    assert (row["to"], row["result"], row["environment"]) == ("1", "promoted", "production"), row
    recorded = platform.db.query(
        "SELECT model.value, result.value FROM tags model"
        " JOIN tags result ON result.run_uuid = model.run_uuid AND result.key = 'result'"
        " JOIN runs r ON r.run_uuid = model.run_uuid"
        " JOIN experiments e ON e.experiment_id = r.experiment_id"
        " WHERE model.key = 'mlreg_model' AND e.name = 'mlreg-promotions'"
    )
    assert sorted(recorded) == sorted((model, "promoted") for model in models)
    # the registry's state is PostgreSQL's, the runs' artifacts are in the S3 bucket
    aliases = set(platform.db.query("SELECT name, alias, version FROM registered_model_aliases"))
    assert {(model, "production", 1) for model in models} <= aliases
    import boto3

    s3 = boto3.client("s3", endpoint_url=platform.s3_endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=MLFLOW_BUCKET).get("Contents", [])]
    assert sum(k.startswith("artifacts/") and k.endswith("/config.pbtxt") for k in keys) >= 2, keys[:5]
    # and Triton serves both from the S3 store
    from pipelines.triton.control import TritonControl

    with TritonControl(triton) as control:
        states = control.model_states()
    assert {model: states.get(model) for model in models} == {model: {"1": "READY"} for model in models}
