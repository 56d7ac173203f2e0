"""The closed-world check's cost: verification with and without it, side by side in one run.

Issue 44's target: the closed-world check on the template and on a 1,000-file model folder costs
at most 1.05x today's verification (one listing of the model folder, digests cached as now).

What is timed, on a local-folder store (what Triton reads directly), the calls taking turns
``--repeat`` times (a burst of the machine's other work lands on both alike), medians compared:

1. **The template**: every model of the built template stored as version 1 (``--template PATH``, or
   the template built here with the unit tests' stand-in exports: same files and layout, no
   TensorFlow); ``check_version(model, "1", digest)`` for each, as a promotion verifies before a
   load (digests the cache proves reused), ``closed_world`` on (today's code path) vs off (the
   version folder alone: what verification was before).
2. **A 1,000-file model folder**: one version of ``--files`` small files (4 KiB each, in 10
   subfolders), the same two calls.
3. The same two folders with every file re-hashed (``hashing="all"``, ``mlreg store verify``'s call).

Prints one JSON line per figure and the ratios; exit 0 always (a benchmark reports, the reader
judges the target).

    .venv/bin/python benchmarks/closed_world.py [--repeat 60] [--files 1000] [--template PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.storage import Repository, open_store  # noqa: E402

Call = Callable[[], None]


def built_template(work: Path, given: str | None) -> Path:
    """``given``, else the template built by ``registry.template.build`` with stand-in exports."""
    if given:
        return Path(given).resolve()
    from registry import template  # lazy: the template builder (onnx for the stand-ins)
    from tests.unit import standins  # lazy: the stand-in exporters (no TensorFlow)

    out = work / "template"
    template.run_exporter = standins.run_exporter  # type: ignore[assignment]
    template.build(ROOT / "model_repository_template", out, device="cpu")
    return out


def store_template(template: Path, store: Repository) -> dict[str, str]:
    digests = {}
    for model in sorted(p.name for p in template.iterdir() if (p / "config.pbtxt").is_file()):
        store.versions.put_version(
            model, "1", template / model / "1", config=template / model / "config.pbtxt"
        )
        store.session.write_config(model, (template / model / "config.pbtxt").read_text())
        manifest = store.versions.read_manifest(model, "1")
        assert manifest is not None
        digests[model] = manifest.digest
    return digests


def store_many(work: Path, store: Repository, files: int) -> dict[str, str]:
    folder = work / "many" / "many_files" / "1"
    for i in range(files):
        path = folder / f"part{i % 10}" / f"file{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(4096))
    config = folder.parent / "config.pbtxt"
    config.write_text('name: "many_files"\nbackend: "python"\n')
    store.versions.put_version("many_files", "1", folder, config=config)
    store.session.write_config("many_files", config.read_text())
    manifest = store.versions.read_manifest("many_files", "1")
    assert manifest is not None
    return {"many_files": manifest.digest}


def checker(store: Repository, digests: dict[str, str], closed: bool, hashing: str) -> Call:
    def call() -> None:
        for model, digest in digests.items():
            store.versions.check_version(model, "1", digest, hashing, closed_world=closed).raise_if_bad()

    return call


def interleaved(calls: dict[str, Call], repeat: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()  # one untimed call each: caches warm alike
    for _ in range(repeat):
        for name, call in calls.items():
            began = time.perf_counter()
            call()
            times[name].append(1000 * (time.perf_counter() - began))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=60)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--template", default=None, help="a built template (default: built here, stand-ins)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlreg-bench-closed-") as tmp:
        work = Path(tmp)
        store = open_store(work / "store", digest_cache=work / "digests.json")
        template = store_template(built_template(work, args.template), store)
        many = store_many(work, store, args.files)
        cases = {
            f"template ({len(template)} models), cached": (template, "changed"),
            f"{args.files}-file model folder, cached": (many, "changed"),
            f"template ({len(template)} models), re-hashed": (template, "all"),
            f"{args.files}-file model folder, re-hashed": (many, "all"),
        }
        calls = {}
        for label, (digests, hashing) in cases.items():
            calls[f"{label}: version folder only (before)"] = checker(store, digests, False, hashing)
            calls[f"{label}: closed world (now)"] = checker(store, digests, True, hashing)
        times = interleaved(calls, args.repeat)
    for label in cases:
        before = statistics.median(times[f"{label}: version folder only (before)"])
        now = statistics.median(times[f"{label}: closed world (now)"])
        print(
            json.dumps(
                {
                    "case": label,
                    "before_ms": round(before, 3),
                    "closed_world_ms": round(now, 3),
                    "ratio": round(now / before, 3),
                    "repeat": args.repeat,
                }
            )
        )


if __name__ == "__main__":
    main()
