"""Triton's control key and the store's new checks, side by side in one run (issue 33).

(a) Promotions on a restricted tritonserver (started with ``control_key=``: every model-control
    call mlreg makes carries the key's gRPC header) vs an open one (no key, no header): two servers,
    each on its own local-folder store and its own environment, a light python-backend model
    (benchmarks/fleet.py's) swapped v1 <-> v2 on each, ``--rounds`` times, the two sides
    interleaved (A/B, then B/A: a busy machine weighs on both alike).  Median and p90 promotion
    seconds per side, the deploy + finalize stages (the calls that carry the header) and the ratio
    restricted / open.  Target: ~1.0 (the header costs nothing measurable).  Finer: a bare
    ``TritonControl.load`` of an unchanged, loaded model (a round trip, nothing reloaded),
    ``--loads`` times each, interleaved: the restricted server with the key, the open one without,
    and the open one with the key (the header alone, without the server's check).
(b) What the store's and the contracts' new checks cost, in-process on the built template: its 6
    models put into a local-folder store, then ``mlreg store verify``'s call (``check_version``,
    every file re-hashed), ``verify_version`` as a promotion calls it before Triton reads a version
    (digests the cache proves; ``drop_bytecode=True`` where the tree takes it: the Python bytecode
    caches removed), the same with a ``__pycache__/*.pyc`` planted beside each python model's
    model.py before every call (the old tree lists and skips it, the new removes it), and
    ``validate_path`` (``mlreg validate``; the new tree adds ``check_paths``).  The minimum of
    ``--repeat`` calls each, the four taking turns: on a shared 2-core machine their medians swing
    2-5x from one run to the next (``check_version`` starts a thread pool per call) while the
    minimum, the code's own cost, repeats within ~2%; the medians go to stderr.  An old-tree vs
    new-tree comparison: run it through compare.py, whose runs each use their own tree's code.
    Target: new / old <= 1.02.

Part (a) needs pipelines/triton/control_key.py: in a tree without it, (a) is skipped (a line on stderr)
and (b) runs alone.  Figures on stdout, one a line: ``<label>  <number> <unit>`` (s, ms, x);
per-round values go to stderr.  The old tree needs its own copy of this script (compare.py runs
each tree's own; (b) uses only APIs the old tree has too), and compare.py must know the name
(``BENCHMARKS``, and a ``RULES`` entry judging every ``(a)``/``(b)`` line in s, ms or x):

    .venv/bin/python benchmarks/control_key.py --rounds 6
    .venv/bin/python -m mlreg template build /tmp/ck-template --device cpu   # optional: shared by both
    cp benchmarks/control_key.py /tmp/mlreg-old/benchmarks/
    .venv/bin/python benchmarks/compare.py --old /tmp/mlreg-old --rounds 3 control_key \\
        --args control_key='--only verify --template /tmp/ck-template'
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet import CONFIG, MODEL, new_version  # noqa: E402  (benchmarks/fleet.py's light python model)

from pipelines.core.context import Options  # noqa: E402
from pipelines.devstack import local_triton  # noqa: E402
from pipelines.devstack.scratch import scratch_servers  # noqa: E402
from pipelines.promote.environments import environment  # noqa: E402
from pipelines.promote.runner import Promotion  # noqa: E402
from pipelines.storage import open_store  # noqa: E402
from pipelines.storage.base import Repository  # noqa: E402
from pipelines.triton.control import TritonControl  # noqa: E402
from registry.contracts.validate import validate_path  # noqa: E402
from registry.mlflow import MlflowRegistry  # noqa: E402
from registry.settings import Settings  # noqa: E402

SIDES = ("restricted", "open")
KEY_VARIABLES = ("MLREG_CONTROL_KEY", "MLREG_CONTROL_KEY_FILE")  # a key here would reach the open side
PYC = f"__pycache__/model.{sys.implementation.cache_tag}.pyc"  # planted beside each python model.py


def figure(label: str, value: float, unit: str) -> None:
    number = f"{value:.3f}" if unit in ("ms", "x") else f"{value:.2f}"
    print(f"{label:<60} {number:>9} {unit}", flush=True)


def p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile (with few rounds: the second largest of 10, the largest of 9)."""
    ordered = sorted(values)
    return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]


Timed = tuple[Callable[[], object], Callable[[], object]]  # (the call, what runs untimed before it)


def interleaved(calls: dict[str, Timed], repeat: int) -> dict[str, list[float]]:
    """Milliseconds of each call, ``repeat`` times, the calls taking turns (a burst of the
    machine's other work lands on all of them alike); one untimed call of each first."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call, before in calls.values():
        before()
        call()
    for _ in range(repeat):
        for name, (call, before) in calls.items():
            before()
            began = time.perf_counter()
            call()
            times[name].append(1000 * (time.perf_counter() - began))
    return times


# -- (b) verify_version and validate, in-process ---------------------------------------------------


def built_template(work: Path, given: str | None) -> Path:
    """The built template: ``given``, else built here in a child process (TensorFlow stays out)."""
    if given:
        return Path(given).resolve()
    out = work / "template"
    command = [sys.executable, "-m", "mlreg", "template", "build", str(out), "--device", "cpu"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"mlreg template build failed:\n{proc.stderr[-3000:]}")
    return out


def stored_template(template: Path, work: Path) -> tuple[Repository, dict[str, str], list[Path]]:
    """Every model of ``template`` as version 1 of a local-folder store: the store, each model's
    manifest digest, and where a bytecode cache is planted (beside each python model's model.py)."""
    root = work / "verify-store"
    store = open_store(root, digest_cache=work / "digests.json")
    digests: dict[str, str] = {}
    for model in sorted(p.name for p in template.iterdir() if (p / "config.pbtxt").is_file()):
        store.versions.put_version(model, "1", template / model / "1")
        manifest = store.versions.read_manifest(model, "1")
        assert manifest is not None
        digests[model] = manifest.digest
    planted = [f.parent / PYC for f in sorted(root.glob("*/1/model.py"))]
    return store, digests, planted


def store_verify(store: Repository, digests: dict[str, str]) -> Callable[[], None]:
    """``mlreg store verify``'s call: every file re-hashed, nothing changed."""

    def call() -> None:
        for model, digest in digests.items():
            store.versions.check_version(model, "1", digest, hashing="all").raise_if_bad()

    return call


def promotion_verify(store: Repository, digests: dict[str, str]) -> Callable[[], None]:
    """A promotion's call before Triton reads a version: digests the cache proves reused, and (a
    tree whose ``verify_version`` takes ``drop_bytecode``) the bytecode caches removed."""
    drops = "drop_bytecode" in inspect.signature(store.versions.verify_version).parameters
    extra = {"drop_bytecode": True} if drops else {}

    def call() -> None:
        for model, digest in digests.items():
            store.versions.verify_version(model, "1", digest, **extra)

    return call


def plant(paths: list[Path]) -> Callable[[], None]:
    def write() -> None:
        for path in paths:
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(b"\x00" * 2048)  # never run: verify only lists (old) or removes it (new)

    return write


def part_b(args: argparse.Namespace, work: Path) -> None:
    template = built_template(work, args.template)
    store, digests, planted = stored_template(template, work)
    report = validate_path(template)
    if report.errors:
        raise SystemExit(f"validate {template}: {report.summary()}")
    drops = "drop_bytecode" in inspect.signature(store.versions.verify_version).parameters
    print(f"(b) {len(digests)} models, {len(planted)} python; drop_bytecode: {drops}", file=sys.stderr)
    calls: dict[str, Timed] = {
        f"(b) store verify, all re-hashed, template ({len(digests)} models)": (
            store_verify(store, digests),
            lambda: None,
        ),
        "(b) verify_version as a promotion calls it (cached)": (
            promotion_verify(store, digests),
            lambda: None,
        ),
        "(b) verify_version as a promotion, __pycache__ planted": (
            promotion_verify(store, digests),
            plant(planted),
        ),
        "(b) mlreg validate <built template> (in-process)": (lambda: validate_path(template), lambda: None),
    }
    times = interleaved(calls, args.repeat)
    left = sum(p.exists() for p in planted)
    print(f"(b) bytecode caches left after the last verify: {left} of {len(planted)}", file=sys.stderr)
    for label, values in times.items():
        print(f"{label}: median {statistics.median(values):.3f} ms", file=sys.stderr)
        figure(f"{label}, min", min(values), "ms")


# -- (a) promotions on a restricted vs an open Triton ----------------------------------------------


def write_environments(root: Path, stores: dict[str, Path], urls: dict[str, str], key_file: Path) -> None:
    """One environment per side, each its own store and server; only 'restricted' names a key."""
    text = ""
    for side in SIDES:
        text += f'[environments.{side}]\nstore = "{stores[side]}"\ntargets = ["{urls[side]}"]\ngpu = false\n'
        text += f'control_key = "{key_file}"\n\n' if side == "restricted" else "\n"
    (root / "mlreg.toml").write_text(text)


def promote(settings: Settings, registry: MlflowRegistry, side: str, version: str) -> tuple[float, float]:
    """One promotion of ``bench`` to ``side``'s environment: wall seconds, deploy + finalize seconds."""
    env = environment(settings, side)
    began = time.perf_counter()
    promotion = Promotion(
        settings, env, registry, Options(skip_quality=True), scratch=scratch_servers(settings)
    )
    result = promotion.run("bench", version)
    wall = time.perf_counter() - began
    if not result.ok:
        raise SystemExit(f"the promotion of bench v{version} to {side} failed: {result.error}")
    return wall, sum(s.seconds for s in result.stages if s.stage in ("deploy", "finalize"))


def place_bare(store: Path) -> None:
    """``bare`` v1, hand-placed (no manifest): the model the bare loads reload, unchanged."""
    (store / "bare" / "1").mkdir(parents=True)
    (store / "bare" / "1" / "model.py").write_text(MODEL.format(tag=1))
    (store / "bare" / "config.pbtxt").write_text(CONFIG.replace('"bench"', '"bare"'))


@contextmanager
def servers(root: Path, settings: Settings, stores: dict[str, Path], key: str) -> Iterator[dict[str, str]]:
    """A tritonserver per side, the restricted one locked to ``key``; stopped on leaving."""
    started: list[tuple[Any, Any]] = []
    urls: dict[str, str] = {}
    try:
        for side in SIDES:
            locked = key if side == "restricted" else None
            info, process = local_triton.start_server(
                stores[side], root / f"triton-{side}", settings.backends_source, control_key=locked
            )
            started.append((info, process))
            urls[side] = info.grpc_url
        yield urls
    finally:
        with ThreadPoolExecutor(max(1, len(started))) as pool:  # SIGTERM takes 3-4 s each
            for info, process in started:
                pool.submit(local_triton.stop_pid, info.pid, info.shm_prefix, process=process)


def check_locks(urls: dict[str, str]) -> None:
    """The comparison means something only if one side refuses a keyless load and the other takes it."""
    from pipelines.triton.control import control_api_open  # new with the key: part_a checked this tree has it

    found = {side: control_api_open(urls[side]) for side in SIDES}
    print(f"(a) control API open without a key: {found}", file=sys.stderr)
    if found != {"restricted": False, "open": True}:
        raise SystemExit(f"expected the restricted server locked and the open one open, found {found}")


def bare_loads(urls: dict[str, str], key: Any, loads: int) -> dict[str, float]:
    """Median ms of ``TritonControl.load('bare')`` (loaded, unchanged: a round trip, nothing
    reloaded): the restricted server with the key, the open one with the key (the header alone,
    no check on the server) and without; interleaved, the order turning each time."""
    controls = {
        "restricted": TritonControl(urls["restricted"], key=key),
        "open, key sent": TritonControl(urls["open"], key=key),
        "open": TritonControl(urls["open"]),
    }
    assert controls["open"].key is None, "a key reached the open side's client"
    times: dict[str, list[float]] = {name: [] for name in controls}
    names = list(controls)
    try:
        for side in SIDES:
            controls[side].load("bare")  # the real load (a stub starts), untimed
            controls[side].wait_ready("bare", "1", timeout=120)
        for control in controls.values():
            control.load("bare")  # and one unchanged, untimed (each client's first call)
        for i in range(loads):
            for name in names[i % 3 :] + names[: i % 3]:
                began = time.perf_counter()
                controls[name].load("bare")
                times[name].append(1000 * (time.perf_counter() - began))
    finally:
        for control in controls.values():
            control.close()
    return {name: statistics.median(values) for name, values in times.items()}


def part_a(args: argparse.Namespace, work: Path) -> None:
    # a tree without the key (the old one, in compare.py) runs (b) alone; asked of the tree, not of
    # an import: the venv's editable finder would find the module in the checkout it was installed from
    if not (ROOT / "pipelines" / "control_key.py").is_file():
        print("(a) skipped: this tree has no pipelines/triton/control_key.py", file=sys.stderr)
        return
    from pipelines.triton.control_key import local_key  # new with the key: this tree has it (checked above)

    for variable in KEY_VARIABLES:
        os.environ.pop(variable, None)
    root = work / "a"
    settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]})
    key = local_key(root / "key")  # not under MLREG_HOME: the open side must find no key there
    stores = {side: root / f"store-{side}" for side in SIDES}
    for store in stores.values():
        store.mkdir(parents=True)
        place_bare(store)
    with servers(root, settings, stores, key.value) as urls:
        check_locks(urls)
        write_environments(root, stores, urls, Path(key.origin))
        assert environment(settings, "open").key(settings) is None, "the open side would send a key"
        registry = MlflowRegistry(settings)
        versions = [new_version(registry, root / "work", tag) for tag in (1, 2)]
        for side in SIDES:  # the first deployment, untimed
            promote(settings, registry, side, versions[0])
        walls: dict[str, list[float]] = {side: [] for side in SIDES}
        fleets: dict[str, list[float]] = {side: [] for side in SIDES}
        for round_ in range(args.rounds):
            version = versions[(round_ + 1) % 2]
            for side in SIDES if round_ % 2 == 0 else reversed(SIDES):
                wall, fleet = promote(settings, registry, side, version)
                walls[side].append(wall)
                fleets[side].append(fleet)
            print(
                f"(a) round {round_ + 1} (v{version}): "
                + ", ".join(f"{s} {walls[s][-1]:.2f} s (deploy+finalize {fleets[s][-1]:.2f})" for s in SIDES),
                file=sys.stderr,
            )
        loads = bare_loads(urls, key, args.loads)
    med = statistics.median
    figure("(a) promotion, restricted Triton (key sent): median", med(walls["restricted"]), "s")
    figure("(a) promotion, restricted Triton: p90", p90(walls["restricted"]), "s")
    figure("(a) promotion, open Triton (no key): median", med(walls["open"]), "s")
    figure("(a) promotion, open Triton: p90", p90(walls["open"]), "s")
    figure("(a) ratio restricted / open (medians)", med(walls["restricted"]) / med(walls["open"]), "x")
    figure("(a) deploy+finalize, restricted: median", med(fleets["restricted"]), "s")
    figure("(a) deploy+finalize, open: median", med(fleets["open"]), "s")
    figure(
        "(a) ratio deploy+finalize restricted / open", med(fleets["restricted"]) / med(fleets["open"]), "x"
    )
    figure("(a) TritonControl.load unchanged, restricted, key sent", loads["restricted"], "ms")
    figure("(a) TritonControl.load unchanged, open, key sent", loads["open, key sent"], "ms")
    figure("(a) TritonControl.load unchanged, open, no key", loads["open"], "ms")
    figure("(a) ratio load restricted+key / open+no key", loads["restricted"] / loads["open"], "x")
    figure("(a) ratio load open+key / open+no key (header)", loads["open, key sent"] / loads["open"], "x")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("promote", "verify"), help="run (a) promote or (b) verify alone")
    parser.add_argument("--rounds", type=int, default=8, help="(a): promotions per side (default 8)")
    parser.add_argument("--loads", type=int, default=40, help="(a): bare loads per side (default 40)")
    parser.add_argument("--repeat", type=int, default=200, help="(b): calls per figure (default 200)")
    parser.add_argument("--template", metavar="DIR", help="(b): a built template (default: build one)")
    args = parser.parse_args()
    if min(args.rounds, args.loads, args.repeat) < 1:
        parser.error("--rounds, --loads and --repeat must be >= 1")
    return args


def main() -> int:
    args = arguments()
    work = Path(tempfile.mkdtemp(prefix="mlreg-bench-control-key-"))
    print(f"state under {work}", file=sys.stderr)
    try:
        print(
            f"control_key: (a) {args.rounds} round(s), {args.loads} loads; (b) {args.repeat} calls",
            flush=True,
        )
        if args.only != "promote":
            part_b(args, work)
        if args.only != "verify":
            part_a(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
