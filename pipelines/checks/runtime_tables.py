"""The runtime gate's tables (pipelines/checks/runtime.py): known-bad Triton releases, the map from
NVIDIA's containers to server versions, and what each release's ONNX Runtime can load.

Every row names where it was confirmed, and holds only what was confirmed there (2026-12-06):

- ``server@vX``: the tag of github.com/triton-inference-server/server; a fix "in 2.70.0" means its
  commit is reachable from tag v2.70.0 and not from the tag before (``git tag --contains``).
- ``psirt/NNNN``: NVIDIA's security bulletin NNNN (github.com/NVIDIA/product-security, the
  bulletin's "Affected Versions / Updated Version" table).
- ``build.py@vX``: server/build.py's ``TRITON_VERSION_MAP`` at tag vX (server version -> container
  -> ONNX Runtime it builds); ``compat.md@r26.08``: server/docs/introduction/compatibility.md on
  branch r26.08 ("ONNX Runtime Versions", NVIDIA's own table).
- ``ort-docs``: onnxruntime.ai/docs/reference/compatibility.md (ONNX Runtime <= 1.20);
  ``measured``: a model with a given IR version / opset loaded by that onnxruntime wheel from PyPI
  on this machine (the highest that loads, the next refused at load).

Add a row only with its source; a release or runtime this file does not hold is judged
"inconclusive", never passed.
"""

from __future__ import annotations

from dataclasses import dataclass

Release = tuple[int, int, int]  # a Triton server version (2, 70, 0); containers are "26.06"

SEVERITIES = ("low", "medium", "high", "critical")  # in rising order
STORES = ("local", "s3")
FRONTENDS = ("grpc", "http", "sagemaker", "vertex")  # the ones a hazard row may name


@dataclass(frozen=True)
class Hazard:
    """A known fault of Triton releases before ``fixed_in``, for replicas that match ``stores`` and
    ``frontends`` (empty: any)."""

    id: str
    what: str
    sources: tuple[str, ...]
    fixed_in: Release
    severity: str
    stores: frozenset[str] = frozenset()
    frontends: frozenset[str] = frozenset()

    def affects(self, version: Release, store: str, frontends: frozenset[str]) -> bool:
        return (
            version < self.fixed_in
            and (not self.stores or store in self.stores or store == "unknown")
            and (not self.frontends or bool(self.frontends & frontends))
        )


def _h(
    id: str,
    what: str,
    sources: tuple[str, ...],
    fixed_in: Release,
    severity: str,
    stores: tuple[str, ...] = (),
    frontends: tuple[str, ...] = (),
) -> Hazard:
    return Hazard(id, what, sources, fixed_in, severity, frozenset(stores), frozenset(frontends))


HAZARDS: tuple[Hazard, ...] = (
    _h(
        "s3-sigpipe",
        "a replica loading from S3 can be killed without a log line (exit 141, SIGPIPE) on its first "
        "S3 call after ~300 s idle (S3 drops idle keep-alive connections; a slow load leaves one idle)",
        ("server#8767", "server#8768 (in server@v2.70.0, not v2.69.0)"),
        (2, 70, 0),
        "high",
        stores=("s3",),
    ),
    _h(
        "sagemaker-restricted-api",
        "the SageMaker frontend served model load/unload/list without the --http-restricted-api check",
        ("server#8686", "server#8693 (its r26.03 cherry-pick, in server@v2.67.0; v2.66.0 has no check)"),
        (2, 67, 0),
        "high",
        frontends=("sagemaker",),
    ),
    _h(
        "vertex-restricted-api",
        "the Vertex AI frontend served model control without the HTTP restricted-API config",
        ("server#8680 (in server@v2.67.0, not v2.66.0)",),
        (2, 67, 0),
        "high",
        frontends=("vertex",),
    ),
    _h(
        "sagemaker-mme-invoke",
        "the SageMaker multi-model /invoke route ran inference without the 'inference' API restriction",
        ("server#8833 (in server@v2.71.0, not v2.70.0)",),
        (2, 71, 0),
        "medium",
        frontends=("sagemaker",),
    ),
    _h(
        "load-file-overflow",
        "an HTTP load whose base64 'file:' override is over INT_MAX overflows its decoding (DoS)",
        ("server#7787 (in server@v2.53.0, not v2.52.0)", "psirt/5612 CVE-2024-53880 (fixed in 24.12)"),
        (2, 53, 0),
        "medium",
        frontends=("http",),
    ),
    _h(
        "psirt-5687-python-backend-chain",
        "python backend out-of-bounds write/read and shared-memory leak: a chained remote code execution",
        ("psirt/5687", "CVE-2025-23319", "CVE-2025-23320", "CVE-2025-23334"),
        (2, 59, 1),
        "high",
    ),
    _h(
        "psirt-5687-critical",
        "stack overflows from crafted (HTTP) requests: remote code execution (CVSS 9.8 / 9.1)",
        ("psirt/5687", "CVE-2025-23310", "CVE-2025-23311", "CVE-2025-23317"),
        (2, 59, 1),
        "critical",
    ),
    _h(
        "psirt-5691",
        "python backend remote code execution through the model name of the model control APIs (CVSS 9.8)",
        ("psirt/5691", "CVE-2025-23316", "CVE-2025-23328", "CVE-2025-23329"),
        (2, 60, 0),
        "critical",
    ),
    _h(
        "psirt-5723",
        "a stack overflow from extra-large payloads (denial of service)",
        ("psirt/5723", "CVE-2025-33202"),
        (2, 61, 0),
        "high",
    ),
    _h(
        "psirt-5734",
        "extra-large payloads and unchecked quantities crash the server (denial of service)",
        ("psirt/5734", "CVE-2025-33201", "CVE-2025-33211"),
        (2, 62, 0),
        "high",
    ),
    _h(
        "psirt-5790",
        "SageMaker HTTP server exception, internal state corruption, compressed-payload exhaustion (DoS)",
        ("psirt/5790", "CVE-2025-33238", "CVE-2025-33254", "CVE-2026-24158"),
        (2, 65, 0),
        "high",
    ),
    _h(
        "psirt-5816",
        "malformed requests and headers crash the server; a model config upload discloses information",
        (
            "psirt/5816",
            "CVE-2026-24146",
            "CVE-2026-24147",
            "CVE-2026-24173",
            "CVE-2026-24174",
            "CVE-2026-24175",
        ),
        (2, 66, 0),
        "high",
    ),
    _h(
        "psirt-5828",
        "authentication bypass (CVSS 9.8: code execution), path traversal and integer overflow",
        (
            "psirt/5828",
            "CVE-2026-24206",
            "CVE-2026-24207",
            "CVE-2026-24208",
            "CVE-2026-24209",
            "CVE-2026-24210",
        ),
        (2, 67, 0),
        "critical",
    ),
    _h(
        "psirt-5848",
        "highly compressed data and a use-after-free crash the server (denial of service)",
        ("psirt/5848", "CVE-2026-24264", "CVE-2026-24266"),
        (2, 68, 0),
        "high",
    ),
    _h(
        "psirt-5875-authorization",
        "missing authorization: information disclosure, data tampering, denial of service",
        ("psirt/5875", "CVE-2026-47625"),
        (2, 68, 0),
        "high",
    ),
    _h(
        "psirt-5853",
        "an authentication bypass through an alternative path, resource exhaustion, stack overflow",
        ("psirt/5853", "CVE-2026-47476", "CVE-2026-47477", "CVE-2026-47478", "CVE-2026-47481"),
        (2, 69, 0),
        "high",
    ),
    _h(
        "psirt-5865",
        "path traversal (CVSS 9.8) and absolute path traversal to code execution",
        (
            "psirt/5865",
            "CVE-2026-47627",
            "CVE-2026-47606",
            "CVE-2026-47628",
            "CVE-2026-47629",
            "CVE-2026-47630",
        ),
        (2, 70, 0),
        "critical",
    ),
    _h(
        "psirt-5875-iteration",
        "excessive iteration from a request (denial of service)",
        ("psirt/5875", "CVE-2026-16497"),
        (2, 71, 0),
        "high",
    ),
)

# container -> (server version, ONNX Runtime it ships): build.py@v<server> for the first two,
# compat.md@r26.08 for the third (build.py@v2.49.0 says 1.19.0 for 24.08 where NVIDIA's table says
# 1.18.1: both load IR 10 / opset 21, so the gate's answer is the same; the published table is kept)
CONTAINERS: dict[str, tuple[Release, str]] = {
    "24.04": ((2, 45, 0), "1.17.3"),
    "24.05": ((2, 46, 0), "1.18.0"),
    "24.06": ((2, 47, 0), "1.18.0"),
    "24.07": ((2, 48, 0), "1.18.1"),
    "24.08": ((2, 49, 0), "1.18.1"),
    "24.09": ((2, 50, 0), "1.19.2"),
    "24.10": ((2, 51, 0), "1.19.2"),
    "24.11": ((2, 52, 0), "1.19.2"),
    "24.12": ((2, 53, 0), "1.20.1"),
    "25.01": ((2, 54, 0), "1.20.1"),
    "25.02": ((2, 55, 0), "1.20.1"),
    "25.03": ((2, 56, 0), "1.21.0"),
    "25.04": ((2, 57, 0), "1.21.0"),
    "25.05": ((2, 58, 0), "1.22.0"),
    "25.06": ((2, 59, 0), "1.22.0"),
    "25.07": ((2, 59, 1), "1.22.0"),
    "25.08": ((2, 60, 0), "1.23.0"),
    "25.09": ((2, 61, 0), "1.23.0"),
    "25.10": ((2, 62, 0), "1.23.1"),
    "25.11": ((2, 63, 0), "1.23.2"),
    "25.12": ((2, 64, 0), "1.23.2"),
    "26.01": ((2, 65, 0), "1.23.2"),
    "26.02": ((2, 66, 0), "1.24.1"),
    "26.03": ((2, 67, 0), "1.24.2"),
    "26.04": ((2, 68, 0), "1.24.4"),
    "26.05": ((2, 69, 0), "1.24.4"),
    "26.06": ((2, 70, 0), "1.24.4"),
    "26.07": ((2, 71, 0), "1.27.0"),
    "26.08": ((2, 72, 0), "1.28.0"),
}


@dataclass(frozen=True)
class OrtLimits:
    """The newest ONNX a runtime loads: IR version, ai.onnx (default domain) and ai.onnx.ml opsets."""

    ir: int
    opset: int
    ml_opset: int
    source: str


_DOCS = "ort-docs + measured"  # IR and opset as documented and measured; ai.onnx.ml measured (docs: 4)
_MEASURED = "measured"  # no published table past ONNX Runtime 1.20

# ONNX Runtime (major, minor) -> what it loads (measured: 1.17.3, 1.18.0, 1.18.1, 1.19.2, 1.20.1, 1.21.0,
# 1.22.0, 1.23.0-1.23.2, 1.24.1/1.24.2/1.24.4, 1.27.0, 1.28.0 -- every release a container ships; the
# patch releases of one minor release agreed)
ORT_LIMITS: dict[tuple[int, int], OrtLimits] = {
    (1, 17): OrtLimits(9, 20, 4, "ort-docs + measured"),
    (1, 18): OrtLimits(10, 21, 5, _DOCS),
    (1, 19): OrtLimits(10, 21, 5, _DOCS),
    (1, 20): OrtLimits(10, 21, 5, _DOCS),
    (1, 21): OrtLimits(10, 22, 5, _MEASURED),
    (1, 22): OrtLimits(10, 22, 5, _MEASURED),
    (1, 23): OrtLimits(11, 23, 5, _MEASURED),
    (1, 24): OrtLimits(13, 25, 5, _MEASURED),
    (1, 27): OrtLimits(13, 26, 5, _MEASURED),
    (1, 28): OrtLimits(13, 26, 5, _MEASURED),
}

# the TensorFlow backend ships in containers up to 25.02 (2.55) and in none after (NVIDIA deprecated it
# in 25.03: infra/README.md, pipelines/promote/convert.py TF_BACKEND_LAST); the TensorFlow version each
# of those backends embeds is not in this table: a SavedModel's version is recorded, not compared
TF_BACKEND_LAST: Release = (2, 55, 0)


def container_of(version: Release) -> str | None:
    """The NGC container tag (``YY.MM``) that ships Triton ``version``."""
    return next((c for c, (v, _) in CONTAINERS.items() if v == version), None)


def first_container_from(version: Release) -> str | None:
    """The first container whose server is at least ``version``: what an upgrade names."""
    return next((c for c, (v, _) in CONTAINERS.items() if v >= version), None)


def release_text(version: Release) -> str:
    container = container_of(version)
    text = ".".join(str(p) for p in version)
    return f"{text} (container {container})" if container else text
