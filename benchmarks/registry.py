"""The registry against a real `mlflow server`, side by side with a bare MLflow baseline.

(a) `mlreg register` of the image_model version (a whole CLI process) vs a baseline process doing
    only `mlflow.log_artifacts` + `create_model_version`.  Target: <= 1.3x the baseline.
(b) `mlreg versions MODEL` (a whole CLI process) on a model with 1,000 versions.  Target: < 2 s.
(c) `mlflow deployments create -t mlreg` vs `mlreg promote` for the same swap (image_model v1 -> v2
    on the local stack), whole processes, alternating.  Target: <= 1.2x.

    .venv/bin/python benchmarks/registry.py [--runs 3] [--only register|deployments] [--quality]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.devstack import local_mlflow  # noqa: E402
from registry import template  # noqa: E402
from registry.settings import Settings  # noqa: E402

BASELINE = """
import sys
import mlflow
from mlflow.tracking import MlflowClient
name, folder = sys.argv[1], sys.argv[2]
mlflow.set_experiment("baseline")
with mlflow.start_run() as run:
    mlflow.log_artifacts(folder, "model")
client = MlflowClient()
client.create_registered_model(name)
client.create_model_version(name, f"{run.info.artifact_uri}/model", run.info.run_id)
"""


def timed(command: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    elapsed = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{command[:4]} failed:\n{proc.stderr[-2000:]}")
    return elapsed


def renamed_copy(source: Path, name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(source, target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "image_model"', f'name: "{name}"'))
    return target


def bench_register(args: argparse.Namespace, work: Path, built: Path) -> list[str]:
    """(a) register vs the bare baseline, (b) versions on many versions, against a real server."""
    server, process = local_mlflow.start_mlflow(
        f"sqlite:///{work / 'mlflow.db'}", work / "artifacts", work / "mlflow.log", serve_artifacts=True
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": server.url, "MLREG_HOME": str(work / "home")}
    try:
        ours, base = [], []
        for i in range(args.runs):
            base.append(
                timed(
                    [sys.executable, "-c", BASELINE, f"baseline_{i}", str(built / "image_model" / "1")], env
                )
            )
            folder = renamed_copy(built / "image_model", f"image_model_{i}", work / "copies")
            ours.append(timed([sys.executable, "-m", "mlreg", "register", folder.name, str(folder)], env))
        listing = many_versions(args, server.url, env)
    finally:
        local_mlflow.stop_mlflow(server.pid, process)
    ratio = statistics.median(ours) / statistics.median(base)
    return [
        f"(a) register image_model (an MLflow Model: LoggedModel + MLmodel + signature), "
        f"median of {args.runs} whole processes:",
        f"    mlreg register                                {statistics.median(ours):6.2f} s",
        f"    baseline log_artifacts + create_model_version {statistics.median(base):6.2f} s",
        f"    ratio {ratio:.2f} (target <= 1.3)",
        f"(b) mlreg versions on {args.versions} versions: {statistics.median(listing):.2f} s (target < 2)",
    ]


def many_versions(args: argparse.Namespace, url: str, env: dict[str, str]) -> list[float]:
    import logging

    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri=url)
    client.create_registered_model("many_versions")
    exp = client.create_experiment("many")
    run = client.create_run(exp)
    source = f"{run.info.artifact_uri}/model"
    for _ in range(args.versions):
        client.create_model_version(
            "many_versions", source, run_id=run.info.run_id, tags={"validation": "passed"}
        )
    return [
        timed([sys.executable, "-m", "mlreg", "versions", "many_versions"], env) for _ in range(args.runs)
    ]


def bench_deployments(args: argparse.Namespace, work: Path, built: Path) -> list[str]:
    """(c) the same swap (image_model v1 -> v2 on the local stack) by `mlflow deployments create
    -t mlreg` and by `mlreg promote`, alternating; v1 is put back (untimed) after each."""
    from pipelines.devstack.stack import stack_down, stack_up

    home = work / "stack" / ".mlreg"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["MLREG_HOME"] = str(home)
    settings = Settings.from_env(env={"MLREG_HOME": str(home), "PATH": os.environ["PATH"]})
    settings.local_repository.mkdir(parents=True)
    stack_up(settings)
    quality = [] if args.quality else ["--skip-quality"]
    plugin_quality = [] if args.quality else ["-C", "skip_quality=true"]
    mlreg = [sys.executable, "-m", "mlreg"]
    try:
        second = renamed_copy(built / "image_model", "image_model", work / "second")
        (second / "1" / "model" / "assets").mkdir(exist_ok=True)
        (second / "1" / "model" / "assets" / "release.txt").write_text("second release\n")
        timed([*mlreg, "register", "image_model", str(built / "image_model")], env)
        timed([*mlreg, "register", "image_model", str(second)], env)
        timed([*mlreg, "promote", "image_model", "--version", "1", *quality], env)
        ours, plugin, api, startup = [], [], [], []
        create = [
            "deployments",
            "create",
            "-t",
            "mlreg",
            "--name",
            "image_model",
            "-m",
            "models:/image_model/2",
        ]
        config = "{}" if args.quality else "{'skip_quality': 'true'}"
        for _ in range(args.runs):
            ours.append(timed([*mlreg, "promote", "image_model", "--version", "2", *quality], env))
            timed([*mlreg, "promote", "image_model", "--version", "1", *quality], env)
            plugin.append(timed([sys.executable, "-m", "mlflow", *create, *plugin_quality], env))
            timed([*mlreg, "promote", "image_model", "--version", "1", *quality], env)
            api.append(timed([sys.executable, "-c", PLUGIN_API.format(config=config)], env))
            timed([*mlreg, "promote", "image_model", "--version", "1", *quality], env)
            startup.append(timed([sys.executable, "-m", "mlflow", "deployments", "help", "-t", "mlreg"], env))
    finally:
        stack_down(settings)
    ratio = statistics.median(plugin) / statistics.median(ours)
    gate = "with" if args.quality else "without"
    return [
        f"(c) image_model v1 -> v2 on the local stack ({gate} the quality gate), median of {args.runs}:",
        f"    mlflow deployments create -t mlreg       {statistics.median(plugin):6.2f} s",
        f"    mlreg promote                            {statistics.median(ours):6.2f} s",
        f"    ratio {ratio:.2f} (target <= 1.2)",
        f"    the plugin's Python API in a process     {statistics.median(api):6.2f} s "
        f"(ratio {statistics.median(api) / statistics.median(ours):.2f})",
        f"    the mlflow CLI's own start (deployments help -t mlreg) {statistics.median(startup):6.2f} s",
    ]


PLUGIN_API = """
from mlflow.deployments import get_deploy_client
get_deploy_client("mlreg").create_deployment("image_model", "models:/image_model/2", config={config})
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--versions", type=int, default=1000)
    parser.add_argument("--only", choices=["register", "deployments"], help="one part only")
    parser.add_argument("--quality", action="store_true", help="(c) with the quality gate")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-registry-"))
    built = work / "built"
    template.build(Settings.from_env().template_dir, built, models=["image_model"], device="gpu")
    lines = []
    if args.only in (None, "register"):
        lines += bench_register(args, work, built)
    if args.only in (None, "deployments"):
        lines += bench_deployments(args, work, built)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
