"""The install's last step: what mlreg needs imports, and the bytecode of what mlreg's processes
import is written once, here, instead of being compiled again by every process.

Neither installer writes bytecode (.ci/install.sh: uv never does, pip is told not to), and Python
writes it on import only where PYTHONDONTWRITEBYTECODE is unset.  Where it is set -- this machine
and CI set it for every process -- each process compiles, from source, every module it imports,
every time.  Measured on this 2-core machine (TensorFlow 2.21, MLflow 3.x, moto 5.2), CPU seconds
with no bytecode against with it: ``import tensorflow`` 17.7 against 4.9, ``import mlflow.server``
11.1 against 3.5, ``import mlflow`` with a client 5.1 against 1.8, moto's server with its S3
backend 2.5 against 0.6; pytest with xdist 1.1 against 0.2.  The suite starts such processes by
the hundred (MLflow servers and their uvicorn workers, moto, each test worker, the CLI's forks).

So this script, run by ``make install`` after the installer:

1. imports the packages mlreg needs (``CHECK``, in two processes side by side: a failed import
   fails the install, as before);
2. imports the entry points of the processes mlreg starts (``PROCESSES``: ``mlflow server`` and
   its uvicorn app, MLflow's SQL stores, moto's server and S3 backend) and those the test suite
   starts (pytest, xdist);
3. compiles the whole of the packages those processes load lazily, module by module, as requests
   or commands arrive (``WHOLE``: MLflow, moto, mlreg's own three and a few small ones; ~3,500
   files, ~10 s of CPU on two processes);
4. has pytest collect the suite once with bytecode writing on (``rewritten_tests``): pytest
   rewrites each test module's asserts and keeps the result beside it
   (``__pycache__/*-pytest-*.pyc``) only where bytecode may be written, so with
   PYTHONDONTWRITEBYTECODE set every pytest process (each xdist worker, each ``make unit``)
   rewrote all ~170 modules again, ~4.5 s of CPU a process (``--tests``: this step alone, as
   benchmarks/suite.py primes a tree),

with bytecode writing on whatever the environment says (``sys.dont_write_bytecode``), into each
package's own ``__pycache__``, as pip's default install would.  The rest of an installed package
is compiled by the first process that imports it, as before.  Timestamps stay the check: Python
compiles a module again if its source changed, so nothing here can serve stale code.
"""

from __future__ import annotations

import compileall
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time

# What mlreg needs, in two halves imported side by side (two processes: the imports are serial and
# most of this step's time): TensorFlow's side, then the rest.  A failed import fails the install.
CHECK = (
    ("tensorflow", "tf2onnx", "onnxruntime"),
    (
        "registry",
        "pipelines",
        "pytriton",
        "tritonclient.grpc",
        "mlflow",
        "boto3",
        "great_expectations",
        "moto",
    ),
)
PROCESSES = (
    "mlreg.cli.main",
    "mlflow.server",
    "mlflow.server.fastapi_app",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "mlflow.tracking",
    "uvicorn",
    "moto.server",
    "pytest",
    "xdist",
)
# Compiled whole: what those processes import lazily, as requests or commands arrive (MLflow, moto,
# mlreg's own three), and the small packages a run of the suite was found compiling at run time
# with all the above written (docker and GitPython through MLflow, rich's markdown, anyio, uvicorn's
# protocols, pytest's and xdist's plugins, the signing stack).  One not installed is passed over.
WHOLE = (
    "mlflow",
    "moto",
    "mlreg",
    "pipelines",
    "registry",
    "docker",
    "git",
    "gitdb",
    "smmap",
    "markdown_it",
    "mdurl",
    "anyio",
    "uvicorn",
    "h11",
    "execnet",
    "rich",
    "_pytest",
    "xdist",
    "typer",
    "dotenv",
    "platformdirs",
    # model signing (pipelines' signing, imported when a version is signed or verified): found
    # compiling at run time by a run of tests/unit
    "model_signing",
    "sigstore",
    "sigstore_models",
    "securesystemslib",
    "tuf",
    "rekor_types",
    "jwt",
    "in_toto_attestation",
    "rfc3161_client",
    "rfc8785",
)
DEADLINE_S = 900  # TensorFlow's half takes ~20 s here with nothing compiled
COLLECT_S = 300  # the suite's collection takes ~15 s here with nothing rewritten


# Folders whose files are copied into a Triton model repository, where the closed world refuses any
# entry it did not verify: the collection must leave no ``__pycache__`` there.  None is written today
# (no test module imports model code when it is collected); one that appears is this step's, and goes.
MODEL_FOLDERS = ("model_repository_template", "tests/fixtures")


def caches_under(root: str) -> set[str]:
    """The ``__pycache__`` folders under MODEL_FOLDERS of ``root``."""
    return {
        os.path.join(folder, name)
        for top in MODEL_FOLDERS
        for folder, names, _ in os.walk(os.path.join(root, top))
        for name in names
        if name == "__pycache__"
    }


def written_since(folder: str, start: float) -> bool:
    """``folder`` holds only bytecode (``.pyc`` files, nothing else), every file written at or after
    ``start``: what a collection begun then made, and nothing it did not."""
    entries = list(os.scandir(folder))
    return all(e.is_file(follow_symlinks=False) and e.name.endswith(".pyc") for e in entries) and all(
        e.stat(follow_symlinks=False).st_mtime >= start for e in entries
    )


def rewritten_tests(root: str) -> int:
    """pytest's rewritten form of every test module under ``root``/tests, kept (step 4): one
    ``pytest --collect-only`` in a child with bytecode writing on.  pytest reads a kept form only
    while the module's size and mtime match, so an edited test is rewritten again.  A collection
    error is pytest's to report when the suite runs: here it is said and passed over (exit 0).  A
    ``__pycache__`` under MODEL_FOLDERS that the collection made (absent before it, only bytecode
    written since it began) is removed; one not proven its own is named and left."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "--collect-only",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
    ]
    before = caches_under(root)
    start = time.time() - 1  # file times' granularity: a file written in the first second counts
    try:
        done = subprocess.run(
            [*argv, "tests"], cwd=root, env=env, capture_output=True, text=True, timeout=COLLECT_S
        )
    except subprocess.TimeoutExpired:
        sys.stderr.write(
            f"bytecode: collecting the tests took over {COLLECT_S} s; their rewrite is not kept\n"
        )
        done = None
    for found in sorted(caches_under(root) - before):
        if written_since(found, start):
            shutil.rmtree(found)
            sys.stderr.write(
                f"bytecode: removed {found}, written while collecting the tests (a model folder)\n"
            )
        else:
            sys.stderr.write(f"bytecode: {found} appeared in a model folder, not only this step's: left\n")
    if done is not None and done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines() or ["no output"]
        sys.stderr.write(f"bytecode: collecting the tests ended with exit {done.returncode}:\n")
        sys.stderr.write("".join(f"  {line}\n" for line in said[-5:]))
    return 0


def main(argv: list[str]) -> int:
    sys.dont_write_bytecode = False
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if argv == ["--tests"]:
        return rewritten_tests(os.getcwd())
    if argv == ["--half", "0"]:
        for name in CHECK[0]:
            importlib.import_module(name)  # its traceback says why, and the exit status fails the install
        return 0
    other = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--half", "0"])
    try:
        for name in CHECK[1]:
            importlib.import_module(name)
        for name in PROCESSES:
            try:
                importlib.import_module(name)
            except ImportError as exc:  # another release's layout: that process compiles as before
                sys.stderr.write(f"bytecode: {name} not imported ({exc}); it is compiled where it is used\n")
        from moto.backends import get_backend

        get_backend("s3")
        for name in WHOLE:
            spec = importlib.util.find_spec(name)
            for folder in (spec and spec.submodule_search_locations) or ():
                # quiet=2: a file that does not compile (a template, another Python's syntax) stays source
                compileall.compile_dir(folder, quiet=2, workers=0)
        rewritten_tests(os.getcwd())
        code = other.wait(timeout=DEADLINE_S)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    if code:
        sys.stderr.write(f"bytecode: importing {', '.join(CHECK[0])} failed (exit {code}; above)\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
