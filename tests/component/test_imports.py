"""`mlreg validate` stays light: none of the heavy dependencies is imported (dvc's test_imports pattern),
nor pydantic and rich, which typer would load.

Each check runs in a fresh interpreter (a subprocess), so what this test process has already
imported does not count; the CLI runs in-process there through its real entry point, and
``sys.modules`` is read afterwards.  The checks whose command is known up front run beside the
suite (``BACKGROUND``, tests/component/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.component.conftest import Background, Finished

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "tensorflow",
    "keras",
    "tf2onnx",
    "mlflow",
    "sqlalchemy",
    "boto3",
    "botocore",
    "grpc",
    "tritonclient.grpc",
    "tritonclient.utils",
    "onnx",
    "onnxruntime",
    "numpy",
    "pandas",
    "great_expectations",
    "pytriton",
    # typer coerces parameters through pydantic (~0.06 s); mlreg/cli/startup.py converts plain
    # paths, strings and numbers itself, and typer's help is plain text (no rich)
    "pydantic",
    "rich",
)
RUN_CLI = """
import json, sys
from mlreg.cli.main import main
heavy, sys.argv = sys.argv[1].split(","), ["mlreg", *sys.argv[2:]]
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({"exit": code, "heavy": sorted(m for m in heavy if m in sys.modules)}))
"""


def cli_result(proc: subprocess.CompletedProcess[str]) -> tuple[dict[str, object], str]:
    """The CLI's last line (exit code and heavy modules found) and what it printed before it."""
    assert proc.returncode == 0, proc.stderr
    *printed, last = proc.stdout.strip().splitlines()
    return json.loads(last), "\n".join(printed)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", RUN_CLI, ",".join(HEAVY), *args]


def run_cli(*args: str) -> tuple[dict[str, object], str]:
    return cli_result(
        subprocess.run(cli(*args), capture_output=True, text=True, cwd=ROOT, check=False, timeout=120)
    )


def test_validate_of_the_built_template_imports_no_heavy_module(standin_repository: Path) -> None:
    result, printed = run_cli("validate", str(standin_repository))
    assert result == {"exit": 0, "heavy": []}
    # the stand-in artifacts declare their configs' own tensors, so no mismatch can be found here:
    # what this shows is that reading them (the ONNX model, both SavedModels) imports nothing heavy;
    # that a mismatch is found is test_validate.py's test_an_output_name_the_artifact_does_not_have
    assert "6 model(s) checked: 0 error(s)" in printed


def test_validate_of_the_source_template_imports_no_heavy_module(background: Finished) -> None:
    result, printed = cli_result(background("validate the source template"))
    assert result == {"exit": 0, "heavy": []}
    assert "6 model(s) checked: 0 error(s)" in printed


def test_help_imports_no_heavy_module(background: Finished) -> None:
    result, printed = cli_result(background("help"))
    assert result == {"exit": 0, "heavy": []}
    assert "validate" in printed


PB2_THEN_GRPC = """
import sys
from registry.contracts.config import model_config_pb2, parse_config
config = parse_config('name: "m" max_batch_size: 4 instance_group [{ kind: KIND_GPU }]')
assert "grpc" not in sys.modules and "tritonclient.grpc" not in sys.modules
import tritonclient.grpc
from tritonclient.grpc import service_pb2
assert tritonclient.grpc.model_config_pb2 is model_config_pb2()
print(service_pb2.ModelConfigResponse(config=config).config.instance_group[0].kind)
"""


def test_the_config_schema_loads_without_grpc_and_is_the_one_tritonclient_uses(background: Finished) -> None:
    """Loaded first without gRPC, the schema is the same module (and classes) tritonclient.grpc gets."""
    proc = background("schema then grpc")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"  # KIND_GPU, carried into tritonclient's own message


NAMED_S3_STORE = """
import sys
from pipelines.storage import open_store
store = open_store("s3://bucket/models/staging")
print(store.archive().uri, "boto3" in sys.modules)
"""


def test_an_s3_store_only_named_imports_no_boto3(background: Finished) -> None:
    """A plan names stores and their archives; the boto3 client is made on first use."""
    proc = background("named s3 store")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["s3://bucket/models/.mlreg-archive/staging", "False"]


BACKGROUND = {
    "named s3 store": Background([sys.executable, "-c", NAMED_S3_STORE]),
    "validate the source template": Background(cli("validate", str(ROOT / "model_repository_template"))),
    "help": Background(cli("--help")),
    "schema then grpc": Background([sys.executable, "-c", PB2_THEN_GRPC]),
}


READ_ONLY_VERBS = """
import json, sys
import mlreg.ops.status, mlreg.ops.history, mlreg.ops.promote, mlreg.cli.status
from pipelines.promote.environments import load_environments
from registry.settings import Settings
environments = load_environments(Settings.from_env(env={"MLREG_HOME": sys.argv[1]}))
print(json.dumps({"environments": sorted(environments), "numpy": "numpy" in sys.modules}))
"""


def test_the_read_only_verbs_and_the_settings_loader_import_no_numpy(tmp_path: Path) -> None:
    """``status``, ``history`` and a refused ``promote`` answer in a second (issue 48): their modules
    and the settings loader (which imports every registered check) leave numpy (~0.15 s) to the
    functions that compute with it."""
    done = subprocess.run(
        [sys.executable, "-c", READ_ONLY_VERBS, str(tmp_path / "home")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"environments": ["local"], "numpy": False}
