"""``python -m mlreg`` as a real, separate process, without paying its imports every time.

Each integration test that ran the CLI as a process paid ~3-4 s of CPU before mlreg did anything:
MLflow's import (~2 s), MlflowClient and its SQLAlchemy stores (~1 s), mlreg's own modules.  Here
one interpreter per pytest process (per xdist worker), started on first use, imports all of that
once and then only forks: each request becomes a child of that server -- a process of its own
(its own pid, session if asked, signals, file descriptors, environment, cwd, exit status) that runs
``mlreg/__main__.py`` as ``python -m mlreg`` does, with nothing run before it but the imports.

:func:`popen` and :func:`run` take the place of ``subprocess.Popen``/``subprocess.run`` of
``[sys.executable, "-m", "mlreg", ...]``; :class:`ForkedProcess` has the Popen surface the tests use
(pid, args, stdout/stderr text streams, poll, wait, returncode -- negative for a signal --,
send_signal, terminate, kill, communicate, ``with``).  MLREG_TEST_FRESH_CLI=1 makes every call a
fresh ``python -m mlreg`` instead (to compare the two, or for CI to fall back).  So does a request
whose environment differs from the server's in a variable read while importing (IMPORT_TIME_ENV):
that child could not be what a fresh interpreter would be.

How the child matches a fresh ``python -m mlreg`` (checked for this file, Dec 2026, MLflow 3.17):
- mlreg/, pipelines/ and registry/ read no environment variable, cwd, clock or pid at import (an
  AST walk of every module body, class body, default value and decorator): Settings, logging and
  MLflow's environment are set up per command, in the CLI's root callback and registry.mlflow;
  caches (functools.cache/lru_cache) start empty -- the server only imports, it calls nothing.
- MLflow configures its loggers when imported, from MLFLOW_LOGGING_LEVEL -- which the CLI's root
  callback sets before MLflow is first imported in a fresh process.  The child resets the loggers
  MLflow configures to their state before its import and configures them again, as its import
  would, at the first ``import mlflow...`` statement the command runs (``builtins.__import__``
  watched until then; an ``importlib.import_module`` of MLflow would not be seen -- mlreg has none).
- Other import-time reads of the environment by what the server imports (typer's TYPER_USE_RICH,
  numpy's, pandas', scipy's, protobuf's implementation, OpenTelemetry's propagators, MLflow's
  MLFLOW_CONFIGURE_LOGGING and its defaults computed from HOME) and interpreter start-up itself
  (PYTHON*, locale): listed in IMPORT_TIME_ENV; a request that differs there runs fresh.
- multiprocessing records the cwd at import (ORIGINAL_DIR): set to the request's; tempfile's cached
  folder is forgotten (TMPDIR read again); sys.path starts with the request's cwd, as ``-m`` makes
  it, then its PYTHONPATH's entries (one that differs from the server's runs fresh, unless it only
  adds the checkout in front: every first-party module the server imported comes from there);
  sys.argv[0] is mlreg/__main__.py (runpy); sys.stdin/out/err
  are new text streams on fds 0-2, buffered as a fresh interpreter buffers them (stdout line-buffered
  on a terminal only, stderr line-buffered); every other fd is closed (as Popen's close_fds).
- Signals: every disposition back to SIG_DFL, SIGPIPE and SIGXFSZ ignored and SIGINT ->
  KeyboardInterrupt, as Python's start-up makes them; SIGINT stays ignored where the caller's was
  (what a child inherits), unless ``interruptible``; no signal blocked.  faulthandler is enabled
  on the new stderr when PYTHONFAULTHANDLER is set (off otherwise).
- The end: SystemExit's code as the interpreter takes it (None 0, an int, anything else printed,
  1), an uncaught exception's traceback and exit 1, an uncaught KeyboardInterrupt kills the child
  with SIGINT (as Python 3.8+ does); then non-daemon threads are joined, atexit handlers run,
  stdout/stderr flushed (a failed flush: 120) and ``os._exit``.
What differs: the hash seed (PYTHONHASHSEED unset: one random seed for all children of a server,
not one each), native threads started by imports (OpenBLAS' pool from numpy, jemalloc's from
MLflow's dependencies -- fork-safe by their atfork handlers; the server asserts it runs no Python
thread besides its own before each fork), the process's command line (the server's), modules
the command would not have imported are already in sys.modules, and the end is ``os._exit`` after
atexit: objects still alive then get no ``__del__`` from module teardown (atexit's weakref
finalizers, logging.shutdown and the stdio flush do run).  A daemon thread still running at exit
races atexit's weakref.finalize sweep in both (seen once: "RuntimeError: dictionary changed size
during iteration" from weakref._exitfunc after a promotion refused by the ensemble's lock, in 1 of 2
full runs of test_promote here; which daemon thread made a finalizer then was not established --
threads that import MLflow in a fresh process find it imported here, so their timing differs).
"""

from __future__ import annotations

import contextlib
import json
import locale
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
FRESH_VARIABLE = "MLREG_TEST_FRESH_CLI"
SERVE = "import sys; from tests.integration.forkcli import serve"
START_SECONDS = 180.0  # the server's imports: ~3 s idle, far more on a loaded 2-core runner
ANSWER_SECONDS = 60.0  # a pid after a request, an acknowledgement
PRELOAD = (  # what `mlreg promote` and the other verbs import; an absent optional one is skipped
    "mlflow",
    "mlflow.tracking",
    "mlflow.store.model_registry.sqlalchemy_store",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.entities",
    "mlflow.artifacts",
    "mlflow.models",
    "mlflow.exceptions",
    "mlreg.cli.main",
    "registry.mlflow",
    "registry.mlflow.registry",
    "registry.mlflow.reads",
    "registry.mlflow.queries",
    "registry.contracts.validate",
    "registry.export",
    "mlreg.ops.context",
    "mlreg.ops.promote",
    "mlreg.ops.status",
    "mlreg.ops.versions",
    "pipelines.promote.runner",
    "pipelines.promote.environments",
    "pipelines.storage",
    "pipelines.storage.local",
    "pipelines.storage.s3",
    "pipelines.triton.control",
    "pipelines.checks.bake",
    "pipelines.ledger.recorder",
    "pipelines.ledger.receipts",
    "numpy",
    "tritonclient.grpc",
    "tritonclient.http",
    "tritonclient.utils",
    "google.protobuf",
    "boto3.s3.transfer",
    "botocore.config",
    "psutil",
    "yaml",
)
NEVER_PRELOADED = ("tensorflow", "keras", "tf2onnx", "torch")  # their import reads TF_* variables
IMPORT_TIME_ENV = (
    "HOME",
    "LANG",
    "LANGUAGE",
    "MLFLOW_CONFIGURE_LOGGING",
    "NPY_PROMOTION_STATE",
    "NUMPY_MADVISE_HUGEPAGE",
    "OTEL_PROPAGATORS",
    "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION",
    "SCIPY_ARRAY_API",
    "SCIPY_DEVICE",
    "TYPER_USE_RICH",
    "_TYPER_FORCE_DISABLE_TERMINAL",
)
IMPORT_TIME_PREFIXES = ("PYTHON", "LC_", "OPENBLAS_", "OMP_", "MKL_", "PANDAS_", "GRPC_")
_KEPT: list[Any] = []  # the server's own stdio objects, kept from the garbage collector in a child
MLFLOW_LOGGERS = ("mlflow", "sqlalchemy.engine", "alembic", "huey")  # what MLflow's import configures


def fresh() -> bool:
    """Every call a fresh ``python -m mlreg`` (MLREG_TEST_FRESH_CLI=1)."""
    return os.environ.get(FRESH_VARIABLE, "0") == "1"


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` read while the server started and imported (see IMPORT_TIME_ENV).
    PYTHONFAULTHANDLER is set up in each child; PYTHONPATH is compared by :func:`same_imports`."""
    return {
        k: v
        for k, v in env.items()
        if (k in IMPORT_TIME_ENV or k.startswith(IMPORT_TIME_PREFIXES))
        and k not in ("PYTHONFAULTHANDLER", "PYTHONPATH")
    }


def _entries(pythonpath: str | None) -> list[str]:
    """PYTHONPATH's entries, as start-up reads them (an empty one is the cwd)."""
    return pythonpath.split(os.pathsep) if pythonpath else []


_SERVER_PYTHONPATH = _entries(os.environ.get("PYTHONPATH"))  # as the server started (sys.path[1:])


def same_imports(env: Mapping[str, str], server: Mapping[str, str]) -> bool:
    """A fresh interpreter with ``env`` would import what the server imported, as it did: the same
    import-time variables, and a PYTHONPATH that is the server's or the checkout (the server's cwd,
    where every first-party module it imported comes from) before it."""
    if import_time_env(env) != import_time_env(server):
        return False
    asked, had = _entries(env.get("PYTHONPATH")), _entries(server.get("PYTHONPATH"))
    return asked == had or asked == [str(ROOT), *had]


# -- the server (in its own interpreter) -----------------------------------------------------------


def _send(conn: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(conn, [frame], list(fds))
    else:
        conn.sendall(frame)


def _recv_exact(conn: socket.socket, size: int, fds: list[int]) -> bytes:
    chunks, got = [], 0
    while got < size:
        if not fds:
            data, received, _, _ = socket.recv_fds(conn, size - got, 8)
            fds.extend(received)
        else:
            data = conn.recv(size - got)
        if not data:
            raise EOFError("the other end closed the connection")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One framed JSON message and the file descriptors that came with it."""
    fds: list[int] = []
    (size,) = struct.unpack("!I", _recv_exact(conn, 4, fds))
    message = json.loads(_recv_exact(conn, size, fds))
    return message, fds


def _preload(names: Sequence[str]) -> list[str]:
    """Import ``names``, skipping what is not installed; none of NEVER_PRELOADED may come along."""
    import importlib

    skipped = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            skipped.append(name)
    loaded = [name for name in NEVER_PRELOADED if name in sys.modules]
    assert not loaded, f"the fork server imported {loaded}: their import reads the environment"
    return skipped


def _reset_signals(sigint_ignored: bool) -> None:
    """Dispositions as a fresh ``python`` has them (Python's start-up: SIGPIPE and SIGXFSZ ignored,
    SIGINT -> KeyboardInterrupt unless inherited ignored), nothing blocked."""
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _stdio(env: Mapping[str, str]) -> None:
    """New sys.stdin/stdout/stderr on fds 0-2, as interpreter start-up makes them."""
    import io

    unbuffered = bool(env.get("PYTHONUNBUFFERED"))

    def stream(fd: int, mode: str, old: Any, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        buffered: Any = (
            raw
            if (unbuffered and mode == "w")
            else (io.BufferedWriter(raw) if mode == "w" else io.BufferedReader(raw))
        )
        return io.TextIOWrapper(
            buffered,
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=line,
            write_through=unbuffered and mode == "w",
        )

    _KEPT.extend([sys.stdin, sys.stdout, sys.stderr])  # collected, they would close fds 0-2
    sys.stdin = sys.__stdin__ = stream(0, "r", sys.__stdin__, False)
    sys.stdout = sys.__stdout__ = stream(1, "w", sys.__stdout__, os.isatty(1))
    sys.stderr = sys.__stderr__ = stream(2, "w", sys.__stderr__, True)


def _mlflow_logging_at_first_import() -> None:
    """MLflow's loggers as they were before its import, configured again as its import would at the
    first ``import mlflow...`` the command runs (the environment then: the CLI sets
    MLFLOW_LOGGING_LEVEL before that)."""
    import builtins
    import logging

    from mlflow.environment_variables import MLFLOW_CONFIGURE_LOGGING
    from mlflow.utils import logging_utils

    kept: dict[str, list[logging.Handler]] = {}
    for name in MLFLOW_LOGGERS:
        logger = logging.getLogger(name)
        # MLflow's import replaces these loggers' handlers; what other imports added after it (e.g.
        # alembic's NullHandler) stays, as it would after a fresh import of MLflow, then alembic
        kept[name] = [
            h
            for h in logger.handlers
            if getattr(h, "stream", None) is not logging_utils.MLFLOW_LOGGING_STREAM
        ]
        logger.handlers, logger.propagate = [], True
        logger.setLevel(logging.NOTSET)
    original = builtins.__import__

    def watching(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "mlflow" or name.startswith("mlflow."):
            builtins.__import__ = original
            if MLFLOW_CONFIGURE_LOGGING.get() is True:
                logging_utils._configure_mlflow_loggers(root_module_name="mlflow")
                for logger_name, handlers in kept.items():
                    logging.getLogger(logger_name).handlers.extend(handlers)
        return original(name, *args, **kwargs)

    builtins.__import__ = watching


def _exit_code(code: object) -> int:
    """What the interpreter exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _run_module(module: str, argv: Sequence[str]) -> None:
    """``python -m MODULE ARGV`` (mlreg) from its __main__ to its exit; never returns."""
    import atexit
    import runpy

    code, interrupted = 0, False
    sys.argv = ["-m", *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 1, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads joined, as at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _child(request: Mapping[str, Any], fds: Sequence[int]) -> None:
    """The forked child: made what ``python -m mlreg`` started by Popen would be, then run."""
    try:
        if request["new_session"]:
            os.setsid()
        _reset_signals(request["sigint_ignored"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target, inheritable=True)
        os.closerange(3, 65536)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        # what ``-m`` and PYTHONPATH put before the rest, as start-up does (same_imports allows ROOT)
        asked = [os.path.abspath(os.path.join(request["cwd"], e)) for e in _entries(env.get("PYTHONPATH"))]
        sys.path[: 1 + len(_SERVER_PYTHONPATH)] = [request["cwd"], *asked]
        import multiprocessing.process

        multiprocessing.process.ORIGINAL_DIR = request["cwd"]  # type: ignore[attr-defined]
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again (none of the imports cached it)
        _stdio(env)
        import faulthandler

        faulthandler.disable()
        if env.get("PYTHONFAULTHANDLER"):
            faulthandler.enable(file=sys.stderr, all_threads=True)
        if "mlflow" in sys.modules:
            _mlflow_logging_at_first_import()
    except BaseException:
        import traceback

        with contextlib.suppress(BaseException):
            os.write(2, f"forkcli: the child's set-up failed:\n{traceback.format_exc()}".encode())
        os._exit(70)
    _run_module(request["module"], request["argv"])


class _Server:
    """The accept loop: one connection a child; the child's pid, then its wait status once it
    ended (read with WNOWAIT: it is reaped only once the client closed, so its pid cannot be
    reused while the client may still signal it)."""

    def __init__(self, listener: socket.socket, parent: int) -> None:
        self.listener, self.parent = listener, parent
        self.children: dict[int, tuple[socket.socket, int]] = {}  # pidfd -> (connection, pid)
        self.ended: dict[socket.socket, tuple[int, float]] = {}  # connection -> (pid, reap by)

    def serve(self) -> None:
        while os.getppid() == self.parent:
            readable = [self.listener, *self.children, *self.ended]
            ready, _, _ = select.select(readable, [], [], 1.0)
            for item in ready:
                if item is self.listener:
                    self._accept()
                elif isinstance(item, int):
                    self._report(item)
                else:
                    self._reap(item)
            now = time.monotonic()
            for conn, (_, by) in list(self.ended.items()):
                if now > by:  # the client kept its end open: reap anyway
                    self._reap(conn)
        for pidfd, (_, pid) in self.children.items():  # pytest went away: so do its children
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.close(pidfd)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(ANSWER_SECONDS)
        try:
            request, fds = _receive(conn)
        except (OSError, EOFError, ValueError):
            conn.close()
            return
        assert threading.active_count() == 1, f"threads in the fork server: {threading.enumerate()}"
        pid = os.fork()
        if pid == 0:
            _child(request, fds)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (conn, pid)
        with contextlib.suppress(OSError):
            _send(conn, {"pid": pid})

    def _report(self, pidfd: int) -> None:
        conn, pid = self.children.pop(pidfd)
        os.close(pidfd)
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        assert result is not None
        status = result.si_status if result.si_code == os.CLD_EXITED else -result.si_status
        try:
            _send(conn, {"pid": pid, "returncode": status})
        except OSError:
            self._reap_pid(pid, conn)
            return
        self.ended[conn] = (pid, time.monotonic() + ANSWER_SECONDS)

    def _reap(self, conn: socket.socket) -> None:
        pid, _ = self.ended.pop(conn)
        self._reap_pid(pid, conn)

    @staticmethod
    def _reap_pid(pid: int, conn: socket.socket) -> None:
        os.waitpid(pid, 0)  # it ended: no wait
        conn.close()


def serve(path: str, ready_fd: int, preload: str) -> None:
    """The server's main: imports ``preload`` (names, comma-separated), then forks a child per
    request on the socket at ``path``."""
    skipped = _preload([name for name in preload.split(",") if name])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    os.write(ready_fd, (json.dumps({"skipped": skipped}) + "\n").encode())
    os.close(ready_fd)
    _Server(listener, os.getppid()).serve()


# -- the client (in the pytest process) ------------------------------------------------------------


class ForkServer:
    """A fork server for this pytest process: started on first use, stopped at exit (or ``stop``)."""

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        self.preload = tuple(preload)
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.path = ""
        self.env: dict[str, str] = {}

    def path_for(self, env: Mapping[str, str]) -> str | None:
        """The server's socket; None where ``env`` differs from the server's at import."""
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                self._start()
        return self.path if same_imports(env, self.env) else None

    def _start(self) -> None:
        folder = tempfile.mkdtemp(prefix="mlreg-forkcli-")
        path = os.path.join(folder, "socket")
        log = open(os.path.join(folder, "server.log"), "wb")
        read, write = os.pipe()
        env = dict(os.environ)
        env.pop("PYTHONFAULTHANDLER", None)
        command = f"{SERVE}; serve(sys.argv[1], {write}, sys.argv[2])"
        process = subprocess.Popen(
            [sys.executable, "-c", command, path, ",".join(self.preload)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(write,),
        )
        os.close(write)
        try:
            ready, _, _ = select.select([read], [], [], START_SECONDS)
            line = os.read(read, 65536) if ready else b""
        finally:
            os.close(read)
            log.close()
        if not line:
            process.kill()
            process.wait(30)
            raise RuntimeError(f"the mlreg fork server did not start: {Path(log.name).read_text()[-4000:]}")
        self.process, self.path, self.env = process, path, env
        import atexit

        atexit.register(self.stop)

    def stop(self) -> None:
        """The server killed (its running children are killed when it sees it is gone)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        if self.path:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)


SESSION = ForkServer()  # mlreg's: one per pytest process (each xdist worker its own)


class ForkedProcess:
    """A child of the fork server, seen as ``subprocess.Popen`` (text mode) shows a process."""

    def __init__(
        self,
        path: str,
        args: list[str],
        env: Mapping[str, str],
        cwd: str,
        *,
        module: str = "mlreg",
        start_new_session: bool = False,
        interruptible: bool = False,
        stdout: int | None = subprocess.PIPE,
        stderr: int | None = subprocess.PIPE,
    ) -> None:
        self.args, self.returncode = args, None
        self.stdin: IO[str] | None = None
        self.stdout: IO[str] | None = None
        self.stderr: IO[str] | None = None
        self._reads: dict[int, bytearray] = {}
        given, mine = [], []
        for target, option in ((1, stdout), (2, stderr)):
            if option == subprocess.PIPE:
                r, w = os.pipe()
                stream = open(r, encoding=locale.getpreferredencoding(False))
                setattr(self, "stdout" if target == 1 else "stderr", stream)
                given.append(w)
                mine.append(w)
            elif option == subprocess.STDOUT and target == 2:
                given.append(given[-1])
            elif option == subprocess.DEVNULL:
                w = os.open(os.devnull, os.O_WRONLY)
                given.append(w)
                mine.append(w)
            else:
                given.append(target if option is None else option)
        sigint = signal.getsignal(signal.SIGINT)
        request = {
            "module": module,
            "argv": args[3:],
            "env": dict(env),
            "cwd": cwd,
            "new_session": start_new_session,
            "sigint_ignored": sigint == signal.SIG_IGN and not interruptible,
        }
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.settimeout(ANSWER_SECONDS)
            self._conn.connect(path)
            _send(self._conn, request, [0, *given])
            answer, _ = _receive(self._conn)
        finally:
            for fd in mine:
                os.close(fd)
        self.pid: int = answer["pid"]

    # -- Popen's surface

    def poll(self) -> int | None:
        if self.returncode is None:
            self._answer(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; ``subprocess.TimeoutExpired`` after ``timeout`` (None: 24 hours, a
        deadline all the same)."""
        if self.returncode is None and not self._answer(86400.0 if timeout is None else timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped: the pid is still the child's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Everything left on stdout and stderr (None where not a pipe) and the exit, within
        ``timeout`` seconds (None: 24 hours) or ``subprocess.TimeoutExpired`` (call it again to
        go on reading, as with Popen)."""
        assert input is None, "the fork server's children read no input from the test"
        deadline = time.monotonic() + (86400.0 if timeout is None else timeout)
        streams = {s.fileno(): s for s in (self.stdout, self.stderr) if s is not None and not s.closed}
        for stream in streams.values():
            self._reads.setdefault(id(stream), bytearray())
        while streams:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            ready, _, _ = select.select(list(streams), [], [], left)
            for fd in ready:
                data = os.read(fd, 65536)
                if data:
                    self._reads[id(streams[fd])].extend(data)
                else:
                    streams.pop(fd).close()
        self.wait(max(0.0, deadline - time.monotonic()))
        return self._text(self.stdout), self._text(self.stderr)

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()

    # -- internals

    def _text(self, stream: IO[str] | None) -> str | None:
        """What ``communicate`` read from ``stream``, decoded as Popen decodes it."""
        if stream is None:
            return None
        data = bytes(self._reads.pop(id(stream), b""))
        encoding = getattr(stream, "encoding", None) or locale.getpreferredencoding(False)
        return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")

    def _answer(self, seconds: float) -> bool:
        """Wait at most ``seconds`` for the server's word that the child ended."""
        ready, _, _ = select.select([self._conn], [], [], seconds)
        if not ready:
            return False
        answer, _ = _receive(self._conn)
        self.returncode = answer["returncode"]
        self._conn.close()  # the server may reap it now
        return True


Process = subprocess.Popen[str] | ForkedProcess


def popen(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | Path = ROOT,
    start_new_session: bool = False,
    interruptible: bool = False,
    stdout: int | None = subprocess.PIPE,
    stderr: int | None = subprocess.PIPE,
) -> Process:
    """``python -m mlreg ARGS`` (``args`` without the interpreter): a child of the fork server, or a
    fresh interpreter under MLREG_TEST_FRESH_CLI=1 or where ``env`` differs at import time.
    ``interruptible``: SIGINT is a Ctrl-C in the child whatever this process inherited."""
    argv = [sys.executable, "-m", "mlreg", *args]
    path = None if fresh() else SESSION.path_for(env)
    if path is None:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            text=True,
            stdout=stdout,
            stderr=stderr,
            start_new_session=start_new_session,
            preexec_fn=_interruptible if interruptible else None,
        )
    return ForkedProcess(
        path,
        argv,
        env,
        str(cwd),
        start_new_session=start_new_session,
        interruptible=interruptible,
        stdout=stdout,
        stderr=stderr,
    )


def run(
    args: Sequence[str], *, env: Mapping[str, str], cwd: str | Path = ROOT, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(python -m mlreg ARGS, capture_output=True, text=True, timeout=...)`` through
    :func:`popen`: killed and ``TimeoutExpired`` after ``timeout`` seconds."""
    with contextlib.ExitStack() as stack:
        process = popen(args, env=env, cwd=cwd)
        stack.callback(_kill_if_running, process)
        out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.wait(timeout=60), out, err)


def _kill_if_running(process: Process) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(60)


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
