"""Store retention on moto S3, side by side in one run (issue 22).

A python-backend model with WEIGHTS bytes of weights per version (default 8 MB) is promoted 12
times to two environments, each a prefix of one moto_server bucket read by its own tritonserver:
``keep2`` (retention, keep = 2) and ``off`` (keep = 0: today's behaviour, every version stays under
Triton's prefix).  The promotions alternate between the two (which one goes first alternates too),
so a busy machine weighs on both alike.  Quality gate skipped; one replica each.

Per promotion and environment: the deploy stage's seconds (Triton's load, which localizes the whole
model folder from S3), the bytes under the model's prefix when that load ran (the uploaded version
included), the whole promotion's wall time and the part spent archiving (inside ``assemble``, plus
``retain`` when it ran).  Printed: the table, then the figures the issue asks for:

- deploy of the 12th promotion / deploy of the 2nd, per environment (target with keep = 2: <= 1.1x);
- bytes under the model prefix at the 12th load, per environment (about one window's worth);
- the archive step's share of the promotion's wall time (target < 10%).

    .venv/bin/python benchmarks/retention.py            # 12 promotions of 8 MB versions
    .venv/bin/python benchmarks/retention.py --quick    # 4 promotions of 1 MB versions (a smoke run)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.core.context import Options  # noqa: E402
from pipelines.core.reports import PromotionResult  # noqa: E402
from pipelines.devstack import local_s3, local_triton  # noqa: E402
from pipelines.promote.environments import environment  # noqa: E402
from pipelines.promote.runner import Promotion  # noqa: E402
from pipelines.storage import ensure_root, open_store  # noqa: E402
from registry.mlflow import MlflowRegistry  # noqa: E402
from registry.register import Candidate, register  # noqa: E402
from registry.settings import Settings  # noqa: E402

ENVIRONMENTS = {"keep2": 2, "off": 0}
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

VERSION_TAG = {tag}


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.astype(np.float32))]))
        return out
"""
CONFIG = """name: "bench"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@dataclass
class Run:
    """One promotion to one environment."""

    env: str
    version: int
    wall: float
    deploy: float
    archive: float
    load_bytes: int


def register_versions(registry: MlflowRegistry, work: Path, count: int, weights: int) -> list[str]:
    versions = []
    for tag in range(1, count + 1):
        folder = work / f"bench-{tag}"
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(CONFIG)
        (folder / "1" / "model.py").write_text(MODEL.format(tag=tag))
        (folder / "1" / "weights.bin").write_bytes(os.urandom(weights))
        versions.append(register(registry, Candidate("bench", folder / "1", folder / "config.pbtxt")).version)
    return versions


def model_bytes(store_uri: str) -> int:
    """Bytes under the model's prefix in the store (what a load localizes: every version there)."""
    store = open_store(store_uri)
    stamps = store.objects.object_stamps("bench/")
    return sum(int(stamp[0]) for stamp in stamps.values())


def archive_seconds(result: PromotionResult) -> float:
    """The archive step's time: its own stage (or, in older trees, the move inside assemble,
    reported by it) and retain's stage."""
    seconds = sum(s.seconds for s in result.stages if s.stage in ("archive", "retain"))
    for stage in result.stages:
        report = stage.report
        seconds += float(getattr(report, "archive_seconds", 0.0) or 0.0)
    return seconds


def promote(settings: Settings, registry: MlflowRegistry, env_name: str, version: str) -> Run:
    env = environment(settings, env_name)
    load_bytes: list[int] = []
    listing: list[float] = []

    def on_stage(stage: str, status: str, seconds: float, detail: str) -> None:
        if stage == "assemble":  # what the deploy's load finds under the model prefix
            began = time.perf_counter()
            load_bytes.append(model_bytes(env.store))
            listing.append(time.perf_counter() - began)

    promotion = Promotion(settings, env, registry, Options(skip_quality=True, on_stage=on_stage))
    began = time.perf_counter()
    result = promotion.run("bench", version)
    wall = time.perf_counter() - began - sum(listing)  # the benchmark's own listing left out
    assert result.ok, result
    deploy = sum(s.seconds for s in result.stages if s.stage == "deploy")
    return Run(env_name, int(version), wall, deploy, archive_seconds(result), load_bytes[0])


def print_table(runs: list[Run]) -> None:
    print(f"{'promotion':>9} {'env':>6} {'deploy s':>9} {'MB at load':>11} {'wall s':>7} {'archive s':>10}")
    for run in runs:
        print(
            f"{run.version:>9} {run.env:>6} {run.deploy:>9.2f} {run.load_bytes / 1e6:>11.1f} "
            f"{run.wall:>7.2f} {run.archive:>10.3f}"
        )


def summary(runs: list[Run], count: int, weights: int) -> None:
    for env in ENVIRONMENTS:
        mine = {r.version: r for r in runs if r.env == env}
        second, last = mine[2], mine[count]
        print(
            f"{env:>6}: deploy of promotion {count} {last.deploy:.2f} s vs promotion 2 {second.deploy:.2f} s "
            f"= {last.deploy / second.deploy:.2f}x; {last.load_bytes / 1e6:.1f} MB under the model prefix "
            f"at its load ({last.load_bytes / weights:.1f} versions' weights)"
        )
    # one sample each is at the mercy of a busy machine: the medians of the last three against
    # promotions 2-4, and keep2 against off at the same moment (the runs alternate)
    for env in ENVIRONMENTS:
        early = statistics.median(r.deploy for r in runs if r.env == env and 2 <= r.version <= 4)
        late = statistics.median(r.deploy for r in runs if r.env == env and r.version > count - 3)
        print(f"{env:>6}: median deploy of the last 3 / promotions 2-4 = {late / early:.2f}x")
    by_version = {(r.env, r.version): r for r in runs}
    last = [
        by_version[("keep2", v)].deploy / by_version[("off", v)].deploy for v in range(count - 2, count + 1)
    ]
    print(f"keep2 / off deploy over the last 3 promotions (same moments): {statistics.median(last):.2f}x")
    kept = [r for r in runs if r.env == "keep2" and r.version > 2]
    share = statistics.median(r.archive / r.wall for r in kept)
    worst = max(r.archive / r.wall for r in kept)
    print(
        f"keep2: archive step {100 * share:.1f}% of a promotion's wall time "
        f"(median; worst {100 * worst:.1f}%)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4 promotions of 1 MB versions (a smoke run)")
    parser.add_argument("--promotions", type=int, default=12, help="promotions per environment (>= 3)")
    parser.add_argument("--weights-mb", type=float, default=8.0, help="MB of weights per version")
    args = parser.parse_args()
    count, weights = (
        (4, 1 << 20) if args.quick else (max(3, args.promotions), int(args.weights_mb * (1 << 20)))
    )
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-retention-") as tmp:
        root = Path(tmp)
        for key, value in local_s3.CREDENTIALS.items():
            os.environ.setdefault(key, value)
        settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]})
        s3, s3_process = local_s3.start_s3(root / "moto.log")
        servers = []
        try:
            local_s3.create_bucket(s3.endpoint, "bench")
            sections = []
            for name, keep in ENVIRONMENTS.items():
                store = s3.store_uri("bench", name)
                ensure_root(store)
                info, process = local_triton.start_server(
                    store, root / f"triton-{name}", settings.backends_source
                )
                servers.append((info, process))
                sections.append(
                    f'[environments.{name}]\nstore = "{store}"\ntargets = ["{info.grpc_url}"]\n'
                    f"gpu = false\nkeep = {keep}\n"
                )
            (root / "mlreg.toml").write_text("".join(sections))
            registry = MlflowRegistry(settings)
            work = root / "work"
            work.mkdir()
            versions = register_versions(registry, work, count, weights)
            print(
                f"{count} promotions of a python model with "
                f"{weights / (1 << 20):.0f} MiB of weights per version"
            )
            runs = []
            for index, version in enumerate(versions):
                order = list(ENVIRONMENTS) if index % 2 == 0 else list(reversed(ENVIRONMENTS))
                for env_name in order:
                    runs.append(promote(settings, registry, env_name, version))
            print_table(sorted(runs, key=lambda r: (r.version, r.env)))
            summary(runs, count, weights)
        finally:
            for info, process in servers:
                local_triton.stop_pid(info.pid, info.shm_prefix, process=process)
            local_s3.stop_s3(s3.pid, s3_process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
