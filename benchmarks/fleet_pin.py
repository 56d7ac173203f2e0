"""``mlreg fleet pin`` with its lock vs without (issue 45 item 4), side by side in one run.

A real embedded MLflow registry (sqlite, in a temporary MLREG_HOME): five python models and one
ensemble ``scoring`` over ``scorer``, each version's ``config.pbtxt`` logged to its run as
``mlreg export`` does.  A fleet file pins the six of them; each round pins one model to the other
of its two versions (the file changes every time), once through each path, in alternating order:

- **old**: today's path reconstructed -- read the file, change it, look every pin up in MLflow
  (``_require_registered``), judge the ensemble's pins from its ``member_`` tags, write a fixed
  temporary file and ``os.replace`` it: no lock, no compare-and-swap;
- **lock**: the old path inside ``fleet.locked`` with the compare-and-swap of ``write_fleet``
  (the lock's own cost);
- **new**: ``mlreg.ops.fleet_pins.pin`` as it ships: the lock, the compare-and-swap, and the ensemble's pins
  read from its registered config (the embedded registry's ``config.pbtxt`` read where it lies; from
  a tracking server, every one a pin reads fetched into one temporary folder).

MLflow is imported and warmed before timing (the CLI pays that import on both paths alike).
Figures on stdout, one a line (``<label>  <number> <unit>``): the median seconds of each path and
the ratios lock/old and new/old of those medians (target: <= 1.2x), then the median of the
per-round ratios (the three paths of a round run back to back: a shared machine's load swings tilt
the medians of wall times less there); then, for scale, the median wall time of the command a user
runs (``mlreg fleet pin FILE MODEL=V``, a fresh process each, ``--cli`` runs).

    timeout 600 .venv/bin/python benchmarks/fleet_pin.py [--rounds 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlreg.ops import fleet_pins as fleet  # noqa: E402
from registry.mlflow import MlflowRegistry  # noqa: E402
from registry.settings import Settings  # noqa: E402

MODELS = ("scorer", "image_model", "text_model", "table_model", "prep")
PYTHON = 'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
ENSEMBLE = """name: "scoring"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "scorer" model_version: {version}
  input_map {{ key: "IN" value: "IN" }} output_map {{ key: "OUT" value: "OUT" }} }} ] }}
"""


def registered(home: Path) -> MlflowRegistry:
    """MLflow with every model at v1 and v2 (``scoring`` vN pinning ``scorer`` vN, its member
    tag saying so too, as an exported ensemble's does)."""
    registry = MlflowRegistry(Settings.from_env(env={"MLREG_HOME": str(home)}))
    client = registry.connection.client
    # artifacts as local files, where the embedded registry keeps them (MLREG_HOME/artifacts)
    experiment = client.create_experiment("exports", artifact_location=(home / "artifacts").as_uri())
    configs = {(m, v): PYTHON.format(name=m) for m in MODELS for v in ("1", "2")}
    configs |= {("scoring", v): ENSEMBLE.format(version=v) for v in ("1", "2")}
    for (name, version), text in configs.items():
        if version == "1":
            client.create_registered_model(name)
        run = client.create_run(experiment)
        config = home / "config.pbtxt"
        config.write_text(text)
        client.log_artifact(run.info.run_id, str(config))
        tags = (
            {"platform": "ensemble", "member_scorer": version}
            if name == "scoring"
            else {"platform": "python"}
        )
        client.create_model_version(name, run.info.artifact_uri + "/model", run.info.run_id, tags=tags)
    return registry


def old_pin(registry: MlflowRegistry, path: Path, pins: dict[str, str], lock: bool) -> None:
    """Today's pin, reconstructed (``lock``: inside the new lock, with the compare-and-swap)."""
    if lock:
        with fleet.locked(path):
            _old_body(registry, path, pins, swap=True)
    else:
        _old_body(registry, path, pins, swap=False)


def _old_body(registry: MlflowRegistry, path: Path, pins: dict[str, str], swap: bool) -> None:
    found = fleet.read_fleet(path, missing_ok=True)
    found.environment = found.environment or path.stem
    found.models.update(pins)
    tags = fleet._require_registered(registry.models, found.models, str(path))
    for ensemble in found.models:  # the tag-based check of today
        for key, pinned in tags[ensemble].items():
            member = key.removeprefix("member_")
            if key.startswith("member_") and found.models.get(member, pinned) != pinned:
                raise SystemExit(f"inconsistent: {ensemble} pins {member} v{pinned}")
    if swap:
        fleet.write_fleet(found)
        return
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(fleet.render(found))
    os.replace(partial, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--cli", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-fleet-pin-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        registry = registered(home)
        path = Path(tmp) / "fleet" / "production.toml"
        every = {m: "1" for m in (*MODELS, "scoring")}
        fleet.pin(None, path, every, "production", registry=registry.models)  # type: ignore[arg-type]  # warm: MLflow imported
        paths: dict[str, Callable[[dict[str, str]], object]] = {
            "old": lambda pins: old_pin(registry, path, pins, lock=False),
            "lock": lambda pins: old_pin(registry, path, pins, lock=True),
            "new": lambda pins: fleet.pin(None, path, pins, registry=registry.models),  # type: ignore[arg-type]
        }
        times: dict[str, list[float]] = {name: [] for name in paths}
        for index in range(args.rounds):
            order = list(paths) if index % 2 == 0 else list(reversed(paths))
            for name in order:
                model = MODELS[1 + index % (len(MODELS) - 1)]  # never scorer: scoring pins it
                version = "2" if fleet.read_fleet(path).models[model] == "1" else "1"
                began = time.perf_counter()
                paths[name]({model: version})
                times[name].append(time.perf_counter() - began)
                assert fleet.read_fleet(path).models[model] == version
        median = {name: statistics.median(values) for name, values in times.items()}
        for name in paths:
            print(f"fleet pin {name} (median of {args.rounds})  {median[name] * 1000:.2f} ms")
            spread = ", ".join(f"{v * 1000:.1f}" for v in sorted(times[name])[:: max(1, args.rounds // 10)])
            print(f"  {name} deciles: {spread} ms", file=sys.stderr)
        print(f"ratio lock/old  {median['lock'] / median['old']:.3f} x")
        print(f"ratio new/old  {median['new'] / median['old']:.3f} x  (target <= 1.2)")
        for name in ("lock", "new"):
            rounds = statistics.median(n / o for n, o in zip(times[name], times["old"], strict=True))
            print(f"ratio {name}/old, median of per-round ratios  {rounds:.3f} x")
        print(
            f"mlreg fleet pin, the command (median of {args.cli})  {cli_seconds(home, path, args.cli):.2f} s"
        )


def cli_seconds(home: Path, path: Path, runs: int) -> float:
    env = {**os.environ, "MLREG_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    took = []
    for index in range(runs):
        began = time.perf_counter()
        command = [str(ROOT / ".venv" / "bin" / "mlreg"), "fleet", "pin", str(path), f"prep={1 + index % 2}"]
        subprocess.run(command, env=env, check=True, capture_output=True, timeout=120)
        took.append(time.perf_counter() - began)
    return statistics.median(took)


if __name__ == "__main__":
    main()
