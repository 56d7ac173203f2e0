"""``mlreg relay serve`` under load (issue 50's performance targets), on loopback, bounded.

A real relay process (``mlreg relay serve``, its durable queue, its store lock and record) in a
temporary project whose environment ``production`` follows ``champion`` and is deployed by a GitHub
``workflow_dispatch``, sent to a local stand-in of GitHub's API in this process (the stand-in marks
the promotion's start, and moves the environment's own alias as the CI run would).  A real embedded
MLflow registry holds the model and its versions; each alias move is written into it and delivered
as MLflow 3.17 delivers it (the same body, headers and HMAC signature; tests/integration/test_relay.py
delivers through a real ``mlflow server``).

Figures (one a line, ``<label>  <number> <unit>``):

- event to promotion start: from the POST of a delivery to the dispatch reaching the stand-in,
  median and max over ``--moves`` moves (target <= 2 s);
- the relay's memory: the process's peak RSS while it runs, sampled every 0.1 s (target <= 150 MB);
  then a second relay's once it ran the in-process promotion path (``mlreg promote``'s verb imports
  MLflow, tritonclient and the engine), on an environment whose one replica does not answer;
- ``--events`` deliveries at ``--rate`` a minute from 4 threads, a fifth of them replays of an
  earlier delivery id, each sent again on 429/5xx as MLflow does (3 retries, 1-2-4 s apart): how many new
  ones were not answered 202 and how many replays were not
  answered 409 (target 0 and 0), and the answer's median and p99 (those deliveries name versions the
  alias does not hold: each is queued, then found superseded -- the receiving path is what is loaded).

No baseline exists (nothing followed an alias before): the figures stand alone.

    timeout 600 .venv/bin/python benchmarks/relay.py [--moves 20] [--events 1000] [--rate 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from mlreg.relay.wire import payload, sign  # noqa: E402
from pipelines.devstack.local_triton import free_port  # noqa: E402
from registry.settings import Settings  # noqa: E402

SECRET = "bench-relay-secret"
MODEL, VERSIONS = "bench", 12
DISPATCHES: dict[str, float] = {}  # version -> when the first dispatch of it arrived
DB: Path = Path()
RETRIES, RETRIED = 3, (429, 500, 502, 503, 504)  # MLflow 3.17's delivery retries (urllib3 Retry)


class GitHubStandIn(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        version = body["inputs"]["version"]
        DISPATCHES.setdefault(version, time.perf_counter())
        set_alias(DB, "production", version)  # the CI run's promotion moves the environment's alias
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def set_alias(db: Path, alias: str, version: str) -> None:
    with sqlite3.connect(db, timeout=10) as conn:
        conn.execute("DELETE FROM registered_model_aliases WHERE name = ? AND alias = ?", (MODEL, alias))
        conn.execute(
            "INSERT INTO registered_model_aliases (name, alias, version) VALUES (?, ?, ?)",
            (MODEL, alias, int(version)),
        )


def make_registry(home: Path) -> Path:
    from registry.mlflow import MlflowRegistry

    registry = MlflowRegistry(Settings.from_env(env={"MLREG_HOME": str(home)}))
    registry.connection.client.create_registered_model(MODEL)
    for v in range(VERSIONS):
        registry.connection.client.create_model_version(MODEL, source=f"s3://bench/{MODEL}/{v + 1}")
    return home / "mlflow.db"


def deliver(url: str, version: str, delivery_id: str = "") -> tuple[int, float, str]:
    body = payload(MODEL, "champion", version)
    ident, stamp = delivery_id or str(uuid.uuid4()), str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "X-MLflow-Delivery-Id": ident,
        "X-MLflow-Timestamp": stamp,
        "X-MLflow-Signature": sign(SECRET.encode(), ident, stamp, body),
    }
    started = time.perf_counter()
    for attempt in range(1 + RETRIES):  # as MLflow sends: the same delivery again on 429/5xx
        try:
            request = urllib.request.Request(url, body, headers, method="POST")
            with urllib.request.urlopen(request, timeout=10) as answer:
                status = answer.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        if status not in RETRIED:
            break
        time.sleep(2**attempt)
    return status, time.perf_counter() - started, ident


def answers_of(answers: list[tuple[str, int, float]]) -> list[tuple[str, int]]:
    return [(kind, code) for kind, code, _ in answers]


def main() -> None:
    global DB
    parser = argparse.ArgumentParser()
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=1000.0, help="deliveries a minute")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        project, github = Path(tmp), ThreadingHTTPServer(("127.0.0.1", 0), GitHubStandIn)
        threading.Thread(target=github.serve_forever, daemon=True).start()
        home = project / ".mlreg"
        DB = make_registry(home)
        (project / "store").mkdir()
        port = free_port()
        (project / "mlreg.toml").write_text(
            f'[environments.production]\nstore = "{project / "store"}"\nfollows = "champion"\n\n'
            '[relay]\nsecret = "env:MLREG_RELAY_SECRET"\ninterval = 30\ndispatch_grace = 5\n\n'
            '[relay.environments.production]\naction = "dispatch"\nrepository = "acme/models"\n'
            f'token = "env:BENCH_GITHUB_TOKEN"\napi = "http://127.0.0.1:{github.server_address[1]}"\n'
        )
        env = {**os.environ, "MLREG_HOME": str(home), "MLREG_RELAY_SECRET": SECRET, "BENCH_GITHUB_TOKEN": "t"}
        env.pop("MLFLOW_TRACKING_URI", None)
        exe = str(Path(sys.executable).parent / "mlreg")
        relay = subprocess.Popen([exe, "relay", "serve", "--port", str(port)], cwd=project, env=env)
        try:
            run(relay, f"http://127.0.0.1:{port}", args)
        finally:
            relay.terminate()
            relay.wait(30)
            github.shutdown()
        promote_path_rss(project, env, exe)


def promote_path_rss(project: Path, env: dict[str, str], exe: str) -> None:
    """The relay's memory once it has run the in-process path (``mlreg promote``'s verb: MLflow,
    tritonclient, the engine imported), on an environment whose one replica does not answer."""
    (project / "mlreg.toml").write_text(
        f'[environments.production]\nstore = "{project / "store"}"\ntargets = ["127.0.0.1:{free_port()}"]\n'
        'follows = "champion"\n\n[relay]\nsecret = "env:MLREG_RELAY_SECRET"\ninterval = 600\n'
    )
    port = free_port()
    queue = project / ".mlreg" / "relay" / "queue.db"
    set_alias(DB, "production", "1")
    set_alias(DB, "champion", "3")  # before the start: its reconcile and the event agree
    relay = subprocess.Popen([exe, "relay", "serve", "--port", str(port)], cwd=project, env=env)
    process, peak = psutil.Process(relay.pid), 0
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        with sqlite3.connect(queue) as conn:
            before = conn.execute("SELECT MAX(seq) FROM jobs").fetchone()[0] or 0
        assert deliver(f"http://127.0.0.1:{port}/webhook", "3")[0] == 202
        state, note = "", ""
        while time.monotonic() < deadline and state in ("", "pending"):
            peak = max(peak, process.memory_info().rss)
            with sqlite3.connect(queue) as conn:
                row = conn.execute(
                    "SELECT state, note FROM jobs WHERE seq > ? AND version = '3' AND state != 'superseded'",
                    (before,),
                ).fetchone()
            state, note = (row[0], row[1]) if row else ("", "")
            time.sleep(0.1)
        peak = max(peak, process.memory_info().rss)
        print(
            f"relay_peak_rss_promote_path  {peak / 2**20:.1f} MB (the promotion ended {state}: {note[:160]})"
        )
    finally:
        relay.terminate()
        relay.wait(60)


def run(relay: subprocess.Popen[bytes], base: str, args: argparse.Namespace) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/healthz", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    process, peak, stop = psutil.Process(relay.pid), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], process.memory_info().rss)
            except psutil.Error:
                return
            stop.wait(0.1)

    threading.Thread(target=sample, daemon=True).start()
    latencies, current = [], "1"
    for i in range(args.moves):
        version = str(2 + i % (VERSIONS - 1)) if str(2 + i % (VERSIONS - 1)) != current else "1"
        DISPATCHES.pop(version, None)
        set_alias(DB, "champion", version)
        started = time.perf_counter()
        status, _, _ = deliver(f"{base}/webhook", version)
        assert status == 202, status
        limit = time.monotonic() + 10
        while version not in DISPATCHES and time.monotonic() < limit:
            time.sleep(0.005)
        assert version in DISPATCHES, f"move {i} to v{version} never dispatched"
        latencies.append(DISPATCHES[version] - started)
        current = version
    print(f"event_to_promotion_start_median  {statistics.median(latencies):.3f} s")
    print(f"event_to_promotion_start_max  {max(latencies):.3f} s")
    load(base, args, current)
    stop.set()
    print(f"relay_peak_rss  {peak[0] / 2**20:.1f} MB")


def load(base: str, args: argparse.Namespace, current: str) -> None:
    rng, sent, lock = random.Random(50), [], threading.Lock()
    answers: list[tuple[str, int, float]] = []  # (kind, status, seconds)
    gap = 60.0 / args.rate
    start = time.perf_counter()

    def worker(slots: range) -> None:
        for n in slots:
            wait = start + n * gap - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            with lock:
                replay = sent and rng.random() < 0.2
                ident = rng.choice(sent) if replay else ""
                version = str(rng.randint(1, VERSIONS))
            status, seconds, used = deliver(f"{base}/webhook", version, ident)
            with lock:
                answers.append(("replay" if replay else "new", status, seconds))
                if not replay:
                    sent.append(used)

    threads = [threading.Thread(target=worker, args=(range(k, args.events, 4),)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.events * gap + 120)
    elapsed = time.perf_counter() - start
    new = [a for a in answers if a[0] == "new"]
    replays = [a for a in answers if a[0] == "replay"]
    times = sorted(a[2] for a in answers)
    print(
        f"load_deliveries  {len(answers)} of {args.events} in {elapsed:.1f} s "
        f"({len(answers) / elapsed * 60:.0f}/min)"
    )
    counts = {
        (kind, code): sum(1 for a in answers if a[:2] == (kind, code))
        for kind, code in set(answers_of(answers))
    }
    print("load_statuses  " + ", ".join(f"{kind} {code}: {n}" for (kind, code), n in sorted(counts.items())))
    print(f"load_new_not_202  {sum(1 for a in new if a[1] != 202)} of {len(new)}")
    print(f"load_replays_not_409  {sum(1 for a in replays if a[1] != 409)} of {len(replays)}")
    print(f"load_answer_median  {statistics.median(times) * 1000:.1f} ms")
    print(f"load_answer_p99  {times[int(len(times) * 0.99) - 1] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
