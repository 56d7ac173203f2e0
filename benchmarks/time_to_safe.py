"""Time to safe (issue 49 item 5): how long an aborted promotion takes from the failing check's
decision to every replica serving the previous version again, as its verdict records it.

Stand-ins (``--sizes``, default 3,200): that many stand-in replicas (tests/standin_triton.py, in
this process, loopback; each load takes ``--load-delay`` s) on one local store, under
benchmarks/fleet_scale.py's policy (canary = 1, waves = [10, 50, 100], bake_seconds = 1,
max_parallel = N).  A first version is deployed; then each round promotes a new version whose
requests fail on one replica of the last wave (``failing``: the stand-in answers them with errors),
so the promotion fails after every replica moved (``verify``'s request to that replica: no bake
follows the last wave) and the undo puts all of them back.

``--real``: the same measurement on 3 REAL tritonservers (the nvidia-pytriton wheel's, started as
the tests start replicas: pipelines/devstack/local_triton.start_server per replica, bound to
127.0.0.1, their control API locked to a key) on one local store, with a light python-backend
model (benchmarks/fleet.py's, no TensorFlow).  The last replica is started with
``MLREG_BENCH_FAILING=1`` in its environment; every version after the first answers NaN there
(a real fault of a real model on a real server: verify's smoke request refuses non-finite values),
so each round's promotion fails in ``verify``, after every replica loaded the candidate.  Two
roll-outs, one after the other on the same servers (the environment's policy rewritten between):

- ``overlap``: no roll-out policy (the all-at-once deployer): each replica loads the candidate
  BESIDE the serving version (version_policy [old, new]; finalize would unload the old one), so the
  undo only unloads the candidate -- the previous version is still loaded: the issue's case
  ("p95 per replica <= 5 s when the previous version is still loaded (3 real replicas)");
- ``staged``: canary = 1, waves = [10, 50, 100], bake_seconds = 1, min_requests = 0 (no client
  traffic): each replica swaps straight to the candidate, so the undo RE-LOADS the previous version.

How many instances of version 1 (the previous version) each replica created during a round --
the model's ``initialize`` notes each instance it creates in ``r<i>/loads.txt`` (Triton 2.51's log
names no version on a load) -- is printed beside the figures: 0 in ``overlap`` (still loaded, not
re-loaded), 1 in ``staged``; the case measured is shown, not assumed.  So is when the candidate was
gone (Triton's log line "successfully unloaded 'bench' version V", after detection): Triton
unloads asynchronously, and the verdict's restore is when the config update that takes the
candidate out of the version policy returned (not measured here: what an unversioned request
reaches in between).  After every round
each replica must serve exactly version 1 again (READY, asked with the control key), else the
round fails.  The stand-ins (``--sizes``, default 3 with --real; ``--sizes ''`` for none)
run in the same invocation, side by side.

Each promotion is an ``mlreg promote --skip-quality --json`` process of its own, killed past
``--timeout`` s; the figures are read from its --json document's ``time_to_safe``
(pipelines/promote/verdicts.py: detection -> each touched replica's restore finished) and checked
against the fleet.  Every server started here is stopped on the way out (local_triton.stop_all).

What "the previous version still loaded" costs on the stand-ins: the staged roll-out swaps each
replica straight to the new version, so the undo re-loads the previous one; the stand-in charges
``--load-delay`` for every load, a re-load included, so these figures are those of a re-load.

Figures on stdout, one a line (``<label>  <number> <unit>``, medians of the rounds), the load
average (/proc/loadavg, 1 min) before and after each section beside them:

    .venv/bin/python benchmarks/time_to_safe.py --sizes 3,200 --rounds 2
    .venv/bin/python benchmarks/time_to_safe.py --real --rounds 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet import CONFIG, new_version  # noqa: E402
from fleet_scale import NAME, figure, scale_env, waves  # noqa: E402

from pipelines.devstack import local_triton  # noqa: E402
from pipelines.triton.control import TritonControl  # noqa: E402
from pipelines.triton.control_key import ControlKey  # noqa: E402
from registry.mlflow import MlflowRegistry  # noqa: E402
from registry.register import Candidate, register  # noqa: E402
from registry.settings import Settings  # noqa: E402
from tests.standin_triton import StandinFleet  # noqa: E402

TARGET_FLEET_S = 30.0  # the issue's: the whole 200-replica stand-in fleet back within 30 s
TARGET_REPLICA_S = 5.0  # the issue's: p95 per replica (3 real replicas)
REAL_REPLICAS = 3
FAILING_ENV = "MLREG_BENCH_FAILING"
LOADS_ENV = "MLREG_BENCH_LOADS"  # the file a server's model instances note their version in
PREVIOUS = "1"  # the version every round goes back to
# benchmarks/fleet.py's model, but answering NaN on the replica started with MLREG_BENCH_FAILING=1
# for every version after the first (verify's smoke request, pipelines/promote/stages.py, refuses
# it), and noting each instance it creates (a load of its version) in the server's MLREG_BENCH_LOADS
FAILING_MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils

VERSION_TAG = {tag}
FAILS = VERSION_TAG > 1 and os.environ.get("{failing}") == "1"


class TritonPythonModel:
    def initialize(self, args):
        if os.environ.get("{loads}"):
            with open(os.environ["{loads}"], "a") as loads:
                loads.write(f"{{VERSION_TAG}}\\n")

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().astype(np.float32)
            y = np.full_like(x, np.nan) if FAILS else x
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
"""
PROMOTE = "import sys; from mlreg.cli.main import main; sys.argv = ['mlreg', *sys.argv[1:]]; main()"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None, help="stand-in fleet sizes (default 3,200; 3 with --real)")
    parser.add_argument("--rounds", type=int, default=2, help="aborted promotions per case (default 2)")
    parser.add_argument("--load-delay", type=float, default=0.5, help="a stand-in's load, s (0.5)")
    parser.add_argument("--real", action="store_true", help="3 real tritonservers, overlap and staged")
    parser.add_argument("--timeout", type=float, default=300.0, help="one promotion's limit, s (300)")
    args = parser.parse_args()
    sizes = args.sizes if args.sizes is not None else ("3" if args.real else "3,200")
    args.sizes = [int(n) for n in sizes.split(",") if n.strip()]
    if min(args.sizes, default=3) < 3 or args.rounds < 1:
        parser.error("three or more replicas (a canary and two waves); rounds >= 1")
    return args


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


@dataclass
class Measured:
    """One ``mlreg promote --json`` process."""

    code: int
    wall: float
    document: dict[str, Any] = field(default_factory=dict)


def mlreg_promote(root: Path, env: str, version: str, key: str, timeout: float) -> Measured:
    """``mlreg promote bench --version V --env ENV --skip-quality --json``, killed past ``timeout``."""
    out = root / f"promote-{env}-{version}.json"
    environ = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    environ |= {"MLREG_HOME": str(root / ".mlreg"), "MLREG_CONTROL_KEY": key}
    args = ["promote", NAME, "--version", version, "--env", env, "--skip-quality", "--json"]
    began = time.perf_counter()
    with open(out, "w") as stdout, open(root / f"promote-{env}-{version}.err", "w") as stderr:
        try:
            code = subprocess.run(
                [sys.executable, "-c", PROMOTE, *args],
                cwd=ROOT,
                env=environ,
                stdout=stdout,
                stderr=stderr,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            raise SystemExit(f"mlreg promote {NAME} v{version} ({env}) ran past {timeout:g} s") from None
    text = out.read_text()
    document = json.loads(text[text.index("{") :]) if "{" in text else {}
    return Measured(code, time.perf_counter() - began, document)


def expect(measured: Measured, ok: bool, what: str) -> None:
    if (measured.code == 0) != ok:
        error = measured.document.get("error", "")
        raise SystemExit(f"{what}: exit {measured.code}, expected {'0' if ok else 'a failure'}: {error}")


def checked_safe(measured: Measured, size: int, what: str) -> dict[str, Any]:
    """The verdict's time to safe of an aborted promotion: every one of ``size`` replicas back."""
    expect(measured, False, f"{what}: the abort")
    safe: dict[str, Any] = measured.document.get("time_to_safe") or {}
    if safe.get("not_back") or len(safe.get("replicas") or {}) != size:
        raise SystemExit(
            f"{what}: the verdict names {len(safe.get('replicas') or {})} of {size} back: {safe}"
        )
    print(f"{what}: reason {measured.document.get('reason', '')[:160]}", file=sys.stderr)
    print(f"{what}: time to safe {safe}"[:400], file=sys.stderr)
    return safe


def summary(label: str, rounds: list[dict[str, Any]], target: str) -> None:
    """Medians of the rounds' p95 and whole-fleet figures; the pooled restores' p95 and max."""
    p95 = statistics.median(float(r["p95_replica_seconds"]) for r in rounds)
    whole = statistics.median(float(r["whole_fleet_seconds"]) for r in rounds)
    every = sorted(s for r in rounds for s in r["replicas"].values())
    pooled = every[max(1, math.ceil(len(every) * 0.95)) - 1]  # nearest rank, as the verdict's
    figure(f"{label} time to safe, whole fleet", whole, "s")
    figure(f"{label} time to safe, p95 per replica", p95, "s")
    figure(f"{label} time to safe, p95 of all {len(every)} restores", pooled, "s")
    figure(f"{label} time to safe, max per replica (all rounds)", every[-1], "s")
    figure(f"{label} replicas back (each round)", len(rounds[0]["replicas"]), "replicas")
    if target == "fleet":
        figure(f"{label} whole fleet / target {TARGET_FLEET_S:g} s", whole / TARGET_FLEET_S, "x")
    else:
        figure(f"{label} p95 per replica / target {TARGET_REPLICA_S:g} s", p95 / TARGET_REPLICA_S, "x")


# -- stand-ins ------------------------------------------------------------------------------------


def aborted(
    root: Path, fleet: StandinFleet, registry: MlflowRegistry, work: Path, args: argparse.Namespace, tag: int
) -> dict[str, Any]:
    """One promotion whose last replica's verify fails; its time to safe, checked against the fleet."""
    before = {r.grpc_url: r.ready(NAME) for r in fleet.replicas}
    version = new_version(registry, work, tag)
    failing = fleet.replica(waves(fleet.urls)[-1][-1])
    failing.failing.add((NAME, version))
    measured = mlreg_promote(root, "scale", version, args.key, args.timeout)
    failing.failing.clear()
    safe = checked_safe(measured, len(fleet.replicas), f"standin round {tag}")
    back = [r.grpc_url for r in fleet.replicas if r.ready(NAME) == before[r.grpc_url]]
    if len(back) != len(fleet.replicas):
        raise SystemExit(f"round {tag}: {len(back)} of {len(fleet.replicas)} serve what they served before")
    return safe


def size_of(size: int, args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix=f"mlreg-bench-safe-{size}-"))
    print(f"state under {root}", file=sys.stderr)
    settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]})
    store, work = root / "store", root / "work"
    store.mkdir()
    work.mkdir()
    load = load_average()
    with StandinFleet(store, size, load_delay=args.load_delay, metrics_interval=2.0, key=args.key) as fleet:
        metrics = {r.grpc_url: r.metrics_url for r in fleet.replicas}
        scale_env(root, {"scale": (store, fleet.urls, metrics, "")})
        registry = MlflowRegistry(settings)
        first = mlreg_promote(root, "scale", new_version(registry, work, 1), args.key, args.timeout)
        expect(first, True, "first deployment")
        rounds = [aborted(root, fleet, registry, work, args, index + 2) for index in range(args.rounds)]
    label = f"standin-{size}"
    summary(label, rounds, "fleet" if size >= 200 else "replica")
    figure(f"{label} load average (1 min) before, after", load, f"/ {load_average():.2f}", 2)


# -- real tritonservers (--real) ------------------------------------------------------------------


def register_failing(registry: MlflowRegistry, work: Path, tag: int) -> str:
    """Version ``tag`` of the bench model (FAILING_MODEL) registered in MLflow; its number."""
    folder = work / f"bench-{tag}"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(
        FAILING_MODEL.format(tag=tag, failing=FAILING_ENV, loads=LOADS_ENV)
    )
    return register(registry, Candidate(NAME, folder / "1", folder / "config.pbtxt")).version


@contextmanager
def server_environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` in os.environ while one server starts (start_server's server_env copies it)."""
    os.environ.update(values)
    try:
        yield
    finally:
        for name in values:
            os.environ.pop(name, None)


@contextmanager
def real_servers(
    root: Path, store: Path, settings: Settings, key: str
) -> Iterator[list[local_triton.ServerInfo]]:
    """REAL_REPLICAS tritonservers on ``store`` (control API locked to ``key``), each noting its
    model instances in ``r<i>/loads.txt``, the last one with FAILING_ENV=1; all stopped on the way
    out, whatever happens."""
    servers: list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]] = []
    try:
        for index in range(REAL_REPLICAS):
            state = root / f"r{index}"
            values = {LOADS_ENV: str(state / "loads.txt")}
            if index == REAL_REPLICAS - 1:
                values[FAILING_ENV] = "1"
            with server_environ(values):
                servers.append(
                    local_triton.start_server(store, state, settings.backends_source, control_key=key)
                )
        yield [info for info, _ in servers]
    finally:
        killed = local_triton.stop_all(servers)
        print(
            f"{len(servers)} tritonserver(s) stopped ({sum(killed)} killed after the grace)", file=sys.stderr
        )


def real_env(root: Path, store: Path, servers: Sequence[local_triton.ServerInfo], case: str) -> None:
    """mlreg.toml's environment ``real``: no roll-out policy (overlap), or the staged one."""
    if case == "staged":
        metrics = {s.grpc_url: s.metrics_url for s in servers}
        scale_env(root, {"real": (store, [s.grpc_url for s in servers], metrics, "min_requests = 0\n")})
        return
    targets = ", ".join(f'"{s.grpc_url}"' for s in servers)
    text = f'[environments.real]\nstore = "{store}"\ntargets = [{targets}]\ngpu = false\n'
    (root / "mlreg.toml").write_text(text)


def previous_loads(servers: Sequence[local_triton.ServerInfo]) -> list[int]:
    """How many instances of the previous version each replica created so far (FAILING_MODEL's
    initialize notes each one; Triton 2.51's log names no version on a load)."""
    counts = []
    for server in servers:
        loads = Path(server.log_path).parent / "loads.txt"
        lines = loads.read_text().split() if loads.exists() else []
        counts.append(lines.count(PREVIOUS))
    return counts


def unloaded_after(servers: Sequence[local_triton.ServerInfo], version: str, detected: str) -> list[float]:
    """Seconds from ``detected`` (the verdict's ISO time, UTC) to each replica's Triton log line
    "successfully unloaded 'bench' version V" (the candidate gone, not only out of the policy);
    the log's times are this machine's local time, without the year (taken from ``detected``)."""
    start = datetime.fromisoformat(detected)
    found = []
    for server in servers:
        line = f"successfully unloaded '{NAME}' version {version}"
        stamps = [
            t.split()[0:2]
            for t in Path(server.log_path).read_text(errors="replace").splitlines()
            if line in t
        ]
        times = [
            datetime.strptime(f"{start.year}{day[1:]} {clock}", "%Y%m%d %H:%M:%S.%f").astimezone(UTC)
            for day, clock in stamps
        ]
        later = [(t - start).total_seconds() for t in times if t >= start]
        found.append(min(later) if later else math.nan)
    return found


def serving(servers: Sequence[local_triton.ServerInfo], key: str) -> list[list[str]]:
    """The READY versions of the bench model on each replica (asked with the control key)."""
    found = []
    for server in servers:
        with TritonControl(server.grpc_url, key=ControlKey(key, "the benchmark")) as triton:
            states = triton.model_states().get(NAME, {})
        found.append(sorted((v for v, s in states.items() if s == "READY"), key=int))
    return found


@dataclass
class RealCase:
    """One roll-out's rounds on the real replicas."""

    rounds: list[dict[str, Any]] = field(default_factory=list)  # each verdict's time_to_safe
    reloads: list[int] = field(default_factory=list)  # per replica and round: previous version loads
    unloaded: list[float] = field(default_factory=list)  # per replica and round: candidate gone, s
    load: tuple[float, float] = (0.0, 0.0)  # load average before, after


def real_round(
    root: Path,
    servers: Sequence[local_triton.ServerInfo],
    version: str,
    args: argparse.Namespace,
    name: str,
    case: RealCase,
) -> None:
    """One aborted promotion on the real replicas: its time to safe, each replica's loads of the
    previous version during it and when the candidate was gone from each; every replica must serve
    exactly the previous version after."""
    what = f"real {name} round {len(case.rounds) + 1}"
    loads = previous_loads(servers)
    measured = mlreg_promote(root, "real", version, args.key, args.timeout)
    safe = checked_safe(measured, len(servers), what)
    deadline = time.monotonic() + 30.0  # Triton unloads asynchronously: its log line may come later
    while True:
        unloaded = unloaded_after(servers, version, safe["detected_at"])
        if not any(math.isnan(u) for u in unloaded) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    after = serving(servers, args.key)
    if after != [[PREVIOUS]] * len(servers):
        raise SystemExit(f"{what}: the replicas serve {after} after the undo, not v{PREVIOUS} each")
    reloads = [n - m for n, m in zip(previous_loads(servers), loads, strict=True)]
    print(
        f"{what}: promotion process {measured.wall:.2f} s; previous version loaded again {reloads}; "
        f"candidate v{version} unloaded {', '.join(f'{u:.2f}' for u in unloaded)} s after detection",
        file=sys.stderr,
    )
    case.rounds.append(safe)
    case.reloads.extend(reloads)
    case.unloaded.extend(unloaded)


def real(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="mlreg-bench-safe-real-"))
    print(f"state under {root}", file=sys.stderr)
    settings = Settings.from_env(env={"MLREG_HOME": str(root / ".mlreg"), "PATH": os.environ["PATH"]})
    store, work = root / "store", root / "work"
    store.mkdir()
    work.mkdir()
    cases = {"overlap": RealCase(), "staged": RealCase()}
    with real_servers(root, store, settings, args.key) as servers:
        registry = MlflowRegistry(settings)
        real_env(root, store, servers, "overlap")
        first = register_failing(registry, work, 1)
        if first != PREVIOUS:
            raise SystemExit(f"the first version registered is v{first}, not v{PREVIOUS}")
        expect(mlreg_promote(root, "real", first, args.key, args.timeout), True, "real: first deployment")
        tag = 1
        for name, case in cases.items():
            real_env(root, store, servers, name)
            before = load_average()
            for _ in range(args.rounds):
                tag += 1
                real_round(root, servers, register_failing(registry, work, tag), args, name, case)
            case.load = (before, load_average())
    for name, case in cases.items():
        label = f"real-{REAL_REPLICAS} {name}"
        summary(label, case.rounds, "replica")
        figure(f"{label} previous version loaded again per replica, max", max(case.reloads), "loads")
        figure(
            f"{label} candidate unloaded (Triton log), max per replica",
            max(case.unloaded, key=lambda u: math.inf if math.isnan(u) else u),
            "s",
        )
        figure(f"{label} load average (1 min) before, after", case.load[0], f"/ {case.load[1]:.2f}", 2)


def main() -> None:
    args = arguments()
    args.key = secrets.token_urlsafe(16)
    print(
        f"time_to_safe: medians of {args.rounds} aborted promotion(s) per case; stand-in load "
        f"{args.load_delay:g} s; {os.cpu_count()} CPU(s), load average {load_average():.2f}"
    )
    if args.real:
        real(args)
    for size in args.sizes:
        size_of(size, args)


if __name__ == "__main__":
    main()
