"""Triton's model-control and inference API over gRPC, with a timeout on every call.

``InferenceServerException`` is translated into ``TritonError`` here and nowhere
else; UNAVAILABLE (server starting, restarting) is retried with backoff -- except Triton's refusal
of a call without the control key (also UNAVAILABLE), which is final (pipelines/triton/control_key.py),
and a refused connection (nothing listens at the address: a replica down, a wrong port), also
final: retrying it would only wait (see ``NOTHING_LISTENS``).
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from pipelines.triton.control_key import REFUSED, ControlKey, control_key
from registry.errors import TritonError

if TYPE_CHECKING:
    import numpy as np  # annotations only: numpy (~0.15 s) is not imported by the read-only verbs

log = logging.getLogger(__name__)
T = TypeVar("T")

_REQUESTS = itertools.count(1)


class RequestNonce:
    """The secret that starts the id of every request one promotion sends (made when it starts:
    ``Promotion.run``), never a guessable prefix -- a client sending ``mlreg-<n>`` ids is an
    ordinary client to the shadow replay, which leaves out only the ids carrying this promotion's
    nonce (pipelines/checks/capture.read_captures).  Never shown: not in ``repr``, logs or runs."""

    def __init__(self) -> None:
        self.prefix = f"mlreg-{secrets.token_hex(16)}-"

    def __repr__(self) -> str:
        return "RequestNonce(<secret>)"

    def request_id(self) -> str:
        return f"{self.prefix}{next(_REQUESTS)}"


_UNBOUND = RequestNonce()  # requests sent outside a promotion (``mlreg predict``): their own secret
RETRY_STATUSES = {"StatusCode.UNAVAILABLE"}
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)
# gRPC's UNAVAILABLE for a TCP connection the host refused: nothing listens there.  Final, not
# retried: the channel answers any call within its reconnect backoff (1 s, then 1.6 s, ...) with the
# same cached failure, so the retries above only made every call to a dead replica last 3.7 s.
NOTHING_LISTENS = "connection refused"


class TritonControl:
    """One Triton server, addressed by its gRPC URL (``host:port``)."""

    def __init__(
        self, url: str, timeout: float = 30.0, load_timeout: float = 300.0, key: ControlKey | None = None
    ) -> None:
        """``key``: what unlocks the replica's control API (None: ``MLREG_CONTROL_KEY`` or
        ``MLREG_CONTROL_KEY_FILE`` when set, else no header)."""
        import tritonclient.grpc as grpcclient  # lazy: tritonclient's gRPC stack, ~0.3 s

        self.url = url
        self.timeout = timeout
        self.load_timeout = load_timeout
        self.key = key if key is not None else control_key()
        self.nonce: RequestNonce | None = None  # the promotion's, set by whoever connects for it
        self._headers = self.key.grpc_headers() if self.key else None
        self._grpc = grpcclient
        self._client = grpcclient.InferenceServerClient(url=url)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TritonControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what: str, fn: Callable[[], T], *, model: str | None = None, retry: bool = True) -> T:
        from tritonclient.utils import InferenceServerException  # lazy: tritonclient's gRPC stack, ~0.3 s

        delays = list(RETRY_DELAYS) if retry else []
        while True:
            try:
                return fn()
            except InferenceServerException as exc:
                status = str(exc.status() or "")
                message = exc.message() or ""
                if REFUSED in message:
                    raise refused(self.url, self.key, what, model) from None
                if status in RETRY_STATUSES and delays and NOTHING_LISTENS not in message.lower():
                    time.sleep(delays.pop(0))
                    continue
                raise translated(self.url, what, exc, model) from exc

    # -- health ---------------------------------------------------------------------------------

    def is_live(self) -> bool:
        return bool(
            self._call(
                "live check",
                lambda: self._client.is_server_live(headers=self._headers, client_timeout=self.timeout),
            )
        )

    def server_metadata(self) -> dict[str, Any]:
        meta = self._call(
            "server metadata",
            lambda: self._client.get_server_metadata(
                headers=self._headers, as_json=True, client_timeout=self.timeout
            ),
        )
        return dict(meta)

    # -- model control --------------------------------------------------------------------------

    def repository_index(self) -> list[dict[str, Any]]:
        index = self._call(
            "repository index",
            lambda: self._client.get_model_repository_index(
                headers=self._headers, as_json=True, client_timeout=self.timeout
            ),
        )
        return list(index.get("models", []))

    def load(self, model: str, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) ``model``; returns once Triton says it is loaded, or raises.  ``files``
        (``file:<version>/<path>`` -> bytes, with ``config``): the model from these files instead of
        the repository (the quality gate's private candidate).

        Triton often answers a failed load with a generic "failed to poll from model
        repository"; the model's real reason is then read from the repository index.
        """
        log.info("loading %s on %s", model, self.url)
        try:
            self._call(
                "load",
                lambda: self._client.load_model(
                    model,
                    headers=self._headers,
                    config=config,
                    files=dict(files) if files else None,
                    client_timeout=self.load_timeout,
                ),
                model=model,
                retry=False,
            )
        except TritonError as exc:
            if exc.context.get("status") == "StatusCode.DEADLINE_EXCEEDED":
                raise self._past_deadline(model, policy_versions(config)) from None
            reason = self._load_reason(model, policy_versions(config), exc.message)
            if reason:
                exc.message = f"{exc.message} (server's reason: {reason})"
            raise

    def queue_load(self, model: str, config: str, wait: float) -> bool:
        """Send a load of ``model`` with ``config`` and wait at most ``wait`` s for its answer: True
        when it finished, False when it is still running or queued.  Triton 2.51 runs a model's
        loads one after the other and goes on with a load whose caller stopped waiting (measured:
        a load queued behind a late one ran once it ended), so a load sent behind a pending one
        lands after it.  Raises on any other answer (a refusal, an unreachable replica)."""
        try:
            self._call(
                "load",
                lambda: self._client.load_model(
                    model, headers=self._headers, config=config, client_timeout=wait
                ),
                model=model,
                retry=False,
            )
        except TritonError as exc:
            if exc.context.get("status") == "StatusCode.DEADLINE_EXCEEDED":
                return False
            raise
        return True

    def _past_deadline(self, model: str, versions: tuple[str, ...]) -> TritonError:
        """A load that did not finish within ``load_timeout``: which version Triton is still
        loading (the reasons the index keeps for other versions are stale, never quoted)."""
        try:
            states = self.model_states().get(model, {})
        except TritonError:
            states = {}
        loading = sorted((v for v, s in states.items() if s == "LOADING" and v), key=int)
        still = f"v{','.join(loading)} is still LOADING" if loading else "it may still be loading"
        wanted = f" v{','.join(versions)}" if versions else ""
        return TritonError(
            f"{self.url}: the load of {model}{wanted} did not finish within {self.load_timeout:.0f}s; "
            f"{still}",
            fix=f"read that replica's log for why {model} does not finish loading (an initialize that "
            "never returns, a warmup too long?), or raise load_timeout in mlreg.toml for a model that "
            "loads slowly; Triton keeps loading it: the rollback queues the load of what served behind it",
            status="load-deadline",
            model=model,
            url=self.url,
        )

    def _load_reason(self, model: str, versions: tuple[str, ...], said: str) -> str:
        """Why this load failed, from the repository index: only the reasons of the ``versions`` it
        loads (a version that failed earlier stays UNAVAILABLE in the index with its own, stale
        reason).  Loading the store's config (``versions`` unknown): a reason Triton's answer
        already quotes is this load's, and nothing is added; else the model's own reason (a config
        it could not read), else every version's."""
        found = self._unavailable(model)
        if versions:
            return _joined(r for v, r in found if v in versions)
        if any(r in said for _, r in found):
            return ""
        return _joined([r for v, r in found if not v] or [r for _, r in found])

    def unavailable_reason(self, model: str, versions: Collection[str] = ()) -> str:
        """The repository index's reason for ``model`` (its ``versions``, when given) not being
        READY ("" when unknown)."""
        return _joined(r for v, r in self._unavailable(model) if not versions or v in versions)

    def _unavailable(self, model: str) -> list[tuple[str, str]]:
        """(version, reason) of every entry of ``model`` in the repository index that is not READY."""
        try:
            index = self.repository_index()
        except TritonError:
            return []
        return [
            (str(m.get("version", "")), str(m.get("reason", "")))
            for m in index
            if m.get("name") == model and m.get("state") != "READY" and m.get("reason")
        ]

    def model_states(self) -> dict[str, dict[str, str]]:
        """model -> version -> state (READY, UNAVAILABLE, LOADING, UNLOADING)."""
        states: dict[str, dict[str, str]] = {}
        for entry in self.repository_index():
            states.setdefault(entry["name"], {})[entry.get("version", "")] = entry.get("state", "")
        return states

    def wait_ready(self, model: str, version: str = "", timeout: float = 120.0) -> None:
        """Poll until ``model`` (``version``) is READY; raise with the server's reason otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.is_ready(model, version):
                return
            state = self.model_states().get(model, {})
            current = state.get(version) if version else next(iter(state.values()), None)
            if current == "UNAVAILABLE":
                reason = self.unavailable_reason(model, (version,) if version else ()) or "no reason given"
                raise TritonError(
                    f"{self.url}: model '{model}' version {version or 'latest'} is UNAVAILABLE: {reason}",
                    fix="read the server log",
                    model=model,
                    url=self.url,
                )
            time.sleep(0.2)
        raise TritonError(
            f"{self.url}: model '{model}' was not READY within {timeout:.0f}s",
            fix="read the server log; the load may still be running",
            model=model,
        )

    def model_config(self, model: str) -> dict[str, Any]:
        result = self._call(
            "model config",
            lambda: self._client.get_model_config(
                model, headers=self._headers, as_json=True, client_timeout=self.timeout
            ),
            model=model,
        )
        return dict(result.get("config", {}))

    def unload(self, model: str, unload_dependents: bool = False) -> None:
        self._call(
            "unload",
            lambda: self._client.unload_model(
                model, headers=self._headers, unload_dependents=unload_dependents, client_timeout=self.timeout
            ),
            model=model,
        )

    def is_ready(self, model: str, version: str = "") -> bool:
        return bool(
            self._call(
                "readiness",
                lambda: self._client.is_model_ready(
                    model, version, headers=self._headers, client_timeout=self.timeout
                ),
                model=model,
            )
        )

    def statistics(self, model: str = "") -> list[dict[str, Any]]:
        stats = self._call(
            "statistics",
            lambda: self._client.get_inference_statistics(
                model, headers=self._headers, as_json=True, client_timeout=self.timeout
            ),
            model=model or None,
        )
        return list(stats.get("model_stats", []))

    # -- inference ------------------------------------------------------------------------------

    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: list[str], version: str = ""
    ) -> dict[str, np.ndarray]:
        from tritonclient.utils import np_to_triton_dtype  # lazy: tritonclient's gRPC stack, ~0.3 s

        tensors = []
        for name, array in inputs.items():
            tensor = self._grpc.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        requested = [self._grpc.InferRequestedOutput(name) for name in outputs]
        request_id = (self.nonce or _UNBOUND).request_id()  # mlreg's own: never read back as a capture
        result = self._call(
            "inference",
            lambda: self._client.infer(
                model,
                tensors,
                model_version=version,
                request_id=request_id,
                outputs=requested,
                headers=self._headers,
                client_timeout=self.timeout,
            ),
            model=model,
            retry=False,
        )
        return {name: result.as_numpy(name) for name in outputs}

    # -- trace (the shadow replay's capture: pipelines/checks/capture.py) ----------------------------

    def trace_settings(self, model: str, settings: Mapping[str, Any] | None = None) -> dict[str, list[str]]:
        """``model``'s trace settings after applying ``settings`` (None: read them only)."""
        options = {"headers": self._headers, "as_json": True, "client_timeout": self.timeout}
        if settings is None:
            call = partial(self._client.get_trace_settings, model, **options)
        else:
            call = partial(self._client.update_trace_settings, model, dict(settings), **options)
        found = self._call("trace settings", call, model=model)
        return {k: list(v.get("value", [])) for k, v in (found.get("settings") or {}).items()}


def refused(url: str, key: ControlKey | None, what: str, model: str | None) -> TritonError:
    """Triton refused the call for want of the right key: final, never retried, no key shown."""
    if key is None:
        fix = (
            "set MLREG_CONTROL_KEY (or MLREG_CONTROL_KEY_FILE, or the environment's control_key in "
            "mlreg.toml) to the replica's control key"
        )
    else:
        fix = f"{key} is not this replica's: set the replica's key there"
    return TritonError(
        f"replica {url} refused the {what} call: not authorised",
        fix=fix,
        status="unauthorised",
        model=model,
        url=url,
    )


def translated(url: str, what: str, exc: Any, model: str | None) -> TritonError:
    """``InferenceServerException`` ``exc`` of call ``what`` to ``url`` as a TritonError with a fix:
    the one translation point of Triton's errors."""
    status = str(exc.status() or "")
    message = exc.message() or str(exc)
    where = f"{url}" + (f" model '{model}'" if model else "")
    if status == "StatusCode.UNAVAILABLE":
        fix = "check that tritonserver runs and listens there ('mlreg stack status')"
    elif status == "StatusCode.DEADLINE_EXCEEDED":
        fix = "the server did not answer in time; read its log, or raise MLREG_TRITON_TIMEOUT"
    elif "failed to poll from model repository" in message or "failed to load" in message:
        fix = "run 'mlreg validate' on the repository and read the server log for the reason"
    else:
        fix = "read the server log for details"
    return TritonError(f"{what} failed on {where}: {message}", fix=fix, status=status, model=model, url=url)


def server_report(url: str, timeout: float = 10.0, key: ControlKey | None = None) -> dict[str, Any]:
    """Version and model states of one server; an unreachable server is reported, not raised."""
    try:
        with TritonControl(url, timeout=timeout, key=key) as triton:
            meta = triton.server_metadata()
            return {
                "url": url,
                "version": meta.get("version", "?"),
                "extensions": meta.get("extensions", []),
                "models": triton.model_states(),
            }
    except TritonError as exc:
        return {"url": url, "error": exc.message}


PROBE_PREFIX = "__mlreg_probe_"  # + 32 fresh random hex digits per probe (``probe_name``)


def probe_name() -> str:
    """A model name nobody can know beforehand (128 random bits): what the open-control probe
    unloads, so that it can never touch a model someone loaded, or planted in the store, by name."""
    return f"{PROBE_PREFIX}{secrets.token_hex(16)}__"


def control_api_open(url: str, timeout: float = 5.0) -> bool | None:
    """Whether ``url``'s model-control API takes calls from anyone (no key): the probe is an
    *unload* of a fresh unguessable name (``probe_name``), which reads nothing from the model
    repository and loads nothing -- so no folder planted in the store can make the probe run code.
    Triton 2.51 answers it (tests/integration/test_security.py): success on an open replica (an
    unknown name unloads as nothing to do), "This protocol is restricted" on a locked one, before
    it looks.  None when the answer tells neither (unreachable, model control off, another error)."""
    import tritonclient.grpc as grpcclient  # lazy: tritonclient's gRPC stack, ~0.3 s
    from tritonclient.utils import InferenceServerException  # lazy: tritonclient's gRPC stack, ~0.3 s

    client = grpcclient.InferenceServerClient(url=url)
    try:
        client.unload_model(probe_name(), client_timeout=timeout)
    except InferenceServerException as exc:
        return False if REFUSED in (exc.message() or "") else None
    finally:
        client.close()
    return True  # an unload without the key was taken: open


def policy_versions(config: str | None) -> tuple[str, ...]:
    """The versions a load's config (JSON) names in ``version_policy.specific``; () when it sends
    none (the store's config is loaded) or names no specific versions."""
    try:
        specific = json.loads(config or "{}")["version_policy"]["specific"]
        return tuple(str(int(v)) for v in specific["versions"])  # int64: a string in proto's JSON
    except (ValueError, KeyError, TypeError):
        return ()


def _joined(reasons: Iterable[str]) -> str:
    return "; ".join(dict.fromkeys(r for r in reasons if r))
