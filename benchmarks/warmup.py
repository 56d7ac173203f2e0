"""Load time of a version with and without its peak-batch warmup, side by side in one run (issue 34).

One tritonserver (the nvidia-pytriton binary, started as ``mlreg stack up`` starts it: 127.0.0.1,
its control API locked with ``MLREG_CONTROL_KEY``, generated for the run when unset) serves copies
of each model under other names:

- ``cold``: the registered config;
- ``warm``: the same config with ``peak_warmup``'s block (``batch_size = max_batch_size``, zeros);
- ``image`` (image_preprocess only): a declared warmup at max_batch_size whose input is one real
  PNG (``input_data_file`` in the model's ``warmup/`` folder): what a model that cannot take zeros
  declares instead (peak_warmup keeps a declared warmup).

The models: the template's python models ``table_data_preprocess`` and ``image_preprocess``
(max_batch_size 256) and ``small``, a light python model with max_batch_size 8.  Each load is
timed from the ``load`` call to its answer (Triton answers once the version is READY, after its
warmup, or refused); the model is unloaded, untimed, after each.  One untimed load of each first,
then ``--rounds`` rounds, the variants taking turns (cold, warm, then warm, cold: a busy machine
weighs on all alike).  A refused load is counted with its reason, its time being the time to the
refusal; a load that takes the server down (2.51 crashes, now and then, when a warmup sample
fails) is counted as ``crashed``, the server restarted and that variant not loaded again.

Figures on stdout, one a line: ``<model> <variant>: median|p90  <seconds> s`` and ``<model>
<variant> / cold (medians)  <ratio> x``; per-round values go to stderr.  ``--json``: one JSON
object instead (every load's seconds, medians, p90s, refusals, crashes).

    .venv/bin/python benchmarks/warmup.py --rounds 7
    .venv/bin/python benchmarks/warmup.py --rounds 3 --models small --json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.devstack import local_triton  # noqa: E402
from pipelines.triton.control import TritonControl, control_api_open  # noqa: E402
from pipelines.triton.control_key import KEY_ENV  # noqa: E402
from registry.contracts.config import parse_config  # noqa: E402
from registry.contracts.warmup import PEAK_NAME, peak_warmup  # noqa: E402
from registry.errors import TritonError  # noqa: E402
from registry.settings import Settings  # noqa: E402

TEMPLATE = ROOT / "model_repository_template"
MODELS = ("table_data_preprocess", "image_preprocess", "small")
SMALL_CONFIG = """name: "small"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
SMALL_MODEL = '''"""small: Y = 2 X, batched."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", 2 * x)]))
        return responses
'''
IMAGE_FILE = "image.png"
UNLOAD_TIMEOUT_S = 60.0


def p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile (with few rounds: the largest of up to 10)."""
    ordered = sorted(values)
    return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]


# -- the repository ---------------------------------------------------------------------------------


def source(model: str) -> tuple[str, str]:
    """(config.pbtxt, model.py) of ``model`` as registered."""
    if model == "small":
        return SMALL_CONFIG, SMALL_MODEL
    config = (TEMPLATE / model / "config.pbtxt").read_text()
    return config, (TEMPLATE / model / "1" / "model.py").read_text()


def renamed(config: str, model: str, variant: str) -> str:
    return config.replace(f'name: "{model}"', f'name: "{model}__{variant}"', 1)


def png() -> bytes:
    from PIL import Image  # lazy: only the image variant needs Pillow (the venv has it for the template)

    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def image_warmup(config: str) -> tuple[str, bytes]:
    """image_preprocess's config with a declared peak-batch warmup of one real PNG, and the PNG."""
    data = png()
    batch = parse_config(config).max_batch_size
    block = (
        f'model_warmup [ {{ name: "{PEAK_NAME}" batch_size: {batch} inputs {{ key: "image_preprocess_input" '
        f'value: {{ data_type: TYPE_UINT8 dims: [ {len(data)} ] input_data_file: "{IMAGE_FILE}" }} }} }} ]\n'
    )
    return config + block, data


def write_model(repo: Path, name: str, config: str, model_py: str, warmup_file: bytes = b"") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(model_py)
    (repo / name / "config.pbtxt").write_text(config)
    if warmup_file:
        (repo / name / "warmup").mkdir()
        (repo / name / "warmup" / IMAGE_FILE).write_bytes(warmup_file)


def build_repository(repo: Path, models: list[str]) -> dict[str, list[str]]:
    """Every variant of every model as its own model folder; model -> its variants."""
    variants: dict[str, list[str]] = {}
    for model in models:
        config, model_py = source(model)
        warm = peak_warmup(renamed(config, model, "warm"))
        if len(parse_config(warm).model_warmup) != 1:
            raise SystemExit(f"{model}: peak_warmup added no warmup (max_batch_size 0 or an ensemble?)")
        write_model(repo, f"{model}__cold", renamed(config, model, "cold"), model_py)
        write_model(repo, f"{model}__warm", warm, model_py)
        variants[model] = ["cold", "warm"]
        if model == "image_preprocess":
            declared, data = image_warmup(renamed(config, model, "image"))
            write_model(repo, f"{model}__image", declared, model_py, data)
            variants[model].append("image")
    return variants


# -- the server ---------------------------------------------------------------------------------------


class Server:
    """The local tritonserver, its control API locked to ``key``; restarted after a crash."""

    def __init__(self, repo: Path, state: Path, key: str) -> None:
        self.repo, self.state, self.key = repo, state, key
        self.starts = 0
        self.info: Any = None
        self.process: Any = None
        self.triton: TritonControl | None = None

    def start(self) -> TritonControl:
        self.starts += 1
        state = self.state / f"start-{self.starts}"
        backends = Settings.from_env().backends_source
        self.info, self.process = local_triton.start_server(self.repo, state, backends, control_key=self.key)
        if control_api_open(self.info.grpc_url) is not False:
            raise SystemExit("the server's control API takes keyless loads: it should be locked")
        self.triton = TritonControl(self.info.grpc_url, load_timeout=600)  # sends MLREG_CONTROL_KEY
        return self.triton

    def alive(self) -> bool:
        return self.info is not None and local_triton.pid_alive(self.info.pid)

    def stop(self) -> None:
        if self.triton is not None:
            self.triton.close()
        if self.info is not None:
            local_triton.stop_pid(self.info.pid, self.info.shm_prefix, process=self.process)
        self.info = self.triton = None


def unload(triton: TritonControl, name: str) -> None:
    """Unload ``name`` and wait until no version of it is READY, LOADING or UNLOADING."""
    triton.unload(name)
    deadline = time.monotonic() + UNLOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        if not set(triton.model_states().get(name, {}).values()) & {"READY", "UNLOADING", "LOADING"}:
            return
        time.sleep(0.05)
    raise SystemExit(f"{name} did not unload within {UNLOAD_TIMEOUT_S:.0f} s")


# -- measuring ----------------------------------------------------------------------------------------


class Bench:
    """Every load's seconds and outcome, per model and variant."""

    def __init__(self, server: Server, variants: dict[str, list[str]]) -> None:
        self.server = server
        self.variants = variants
        self.found: dict[str, dict[str, dict[str, Any]]] = {
            m: {v: {"seconds": [], "refused": [], "crashed": 0} for v in vs} for m, vs in variants.items()
        }

    def load(self, model: str, variant: str, timed: bool = True) -> float | None:
        """One load and unload of ``model``'s ``variant``; its seconds (None: not loaded any more)."""
        record = self.found[model][variant]
        if record["crashed"]:
            return None
        triton = self.server.triton
        assert triton is not None
        name = f"{model}__{variant}"
        began = time.perf_counter()
        refused = ""
        try:
            triton.load(name)
        except TritonError as exc:
            refused = exc.message
        seconds = time.perf_counter() - began
        if refused and not self.server.alive():
            record["crashed"] += 1
            record["refused"].append(f"the server crashed: {refused}")
            print(f"{name}: the server crashed during the load; restarting it", file=sys.stderr, flush=True)
            self.server.stop()
            self.server.start()
            return None
        unload(triton, name)
        if timed:
            record["seconds"].append(seconds)
            if refused:
                record["refused"].append(refused)
        return seconds

    def run(self, rounds: int) -> None:
        for model, variants in self.variants.items():  # page cache, the stub's first start
            for variant in variants:
                self.load(model, variant, timed=False)
        for round_ in range(rounds):
            for model, variants in self.variants.items():
                order = variants if round_ % 2 == 0 else variants[::-1]
                shown = []
                for variant in order:
                    seconds = self.load(model, variant)
                    shown.append(f"{variant} {'-' if seconds is None else f'{seconds:.2f} s'}")
                print(f"round {round_ + 1} {model}: {', '.join(shown)}", file=sys.stderr, flush=True)

    def summary(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for model, variants in self.found.items():
            out[model] = {v: figures(data) for v, data in variants.items()}
            cold = out[model]["cold"]["median_s"]
            for variant in variants:
                median = out[model][variant]["median_s"]
                out[model][variant]["ratio_to_cold"] = median / cold if median and cold else None
        return out


def figures(data: dict[str, Any]) -> dict[str, Any]:
    seconds = data["seconds"]
    return {
        "median_s": statistics.median(seconds) if seconds else None,
        "p90_s": p90(seconds) if seconds else None,
        "loads": len(seconds) + data["crashed"],
        "refused": len(data["refused"]),
        "crashed": data["crashed"],
        "reason": data["refused"][0][-600:] if data["refused"] else "",
        "seconds": [round(s, 4) for s in seconds],
    }


def print_figures(result: dict[str, dict[str, Any]]) -> None:
    for model, variants in result.items():
        for variant, data in variants.items():
            label = f"{model} {variant}"
            if data["median_s"] is not None:
                print(f"{label + ': median':<48} {data['median_s']:>8.2f} s", flush=True)
                print(f"{label + ': p90':<48} {data['p90_s']:>8.2f} s", flush=True)
            if data["refused"]:
                print(f"{label}: refused {data['refused']} of {data['loads']} ({data['crashed']} crashed)")
                print(f"    reason: {data['reason']}")
            if variant != "cold" and data["ratio_to_cold"] is not None:
                print(f"{label + ' / cold (medians)':<48} {data['ratio_to_cold']:>8.3f} x", flush=True)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed loads per variant and model (default 5)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="default: all")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout instead of lines")
    parser.add_argument("--keep", action="store_true", help="keep the state folder (the server's logs)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    return args


def main() -> int:
    args = arguments()
    key = os.environ.get(KEY_ENV) or secrets.token_urlsafe(24)
    os.environ[KEY_ENV] = key  # what TritonControl sends (pipelines/triton/control_key.py)
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-warmup-"))
    print(f"state under {work}", file=sys.stderr)
    server = Server(work / "repo", work / "state", key)
    try:
        variants = build_repository(work / "repo", args.models)
        version = server.start().server_metadata().get("version", "?")
        bench = Bench(server, variants)
        bench.run(args.rounds)
        result = bench.summary()
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(
            json.dumps(
                {"triton": version, "rounds": args.rounds, "server_starts": server.starts, "models": result}
            )
        )
    else:
        starts = f"{server.starts} server start(s)"
        print(f"warmup: tritonserver {version}, {args.rounds} round(s), seconds per load; {starts}")
        print_figures(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
