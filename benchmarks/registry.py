"""The registry against a real `mlflow server`, side by side with a bare MLflow baseline.

(a) `mlreg register` of the image_model version (a whole CLI process) vs a baseline process doing
    only `mlflow.log_artifacts` + `create_model_version`.  Target: <= 1.3x the baseline.
(b) `mlreg versions MODEL` (a whole CLI process) on a model with 1,000 versions.  Target: < 2 s.

    .venv/bin/python benchmarks/registry.py [--runs 3]
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

from pipelines import local_mlflow  # noqa: E402
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--versions", type=int, default=1000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-registry-"))
    built = work / "built"
    template.build(Settings.from_env().template_dir, built, models=["image_model"], device="gpu")
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
        import logging

        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        client = MlflowClient(tracking_uri=server.url)
        client.create_registered_model("many_versions")
        exp = client.create_experiment("many")
        run = client.create_run(exp)
        source = f"{run.info.artifact_uri}/model"
        for _ in range(args.versions):
            client.create_model_version(
                "many_versions", source, run_id=run.info.run_id, tags={"validation": "passed"}
            )
        listing = [
            timed([sys.executable, "-m", "mlreg", "versions", "many_versions"], env) for _ in range(args.runs)
        ]
    finally:
        local_mlflow.stop_mlflow(server.pid, process)
    ratio = statistics.median(ours) / statistics.median(base)
    print(f"(a) register image_model, median of {args.runs} whole processes:")
    print(f"    mlreg register                          {statistics.median(ours):6.2f} s")
    print(f"    baseline log_artifacts + create_model_version {statistics.median(base):6.2f} s")
    print(f"    ratio {ratio:.2f} (target <= 1.3)")
    print(f"(b) mlreg versions on {args.versions} versions: {statistics.median(listing):.2f} s (target < 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
