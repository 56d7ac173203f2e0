"""infra/compose and infra/k8s checked with the real tools, offline.

Kubernetes: every overlay rendered by ``kubectl kustomize`` (Debian's kubectl) and validated by
``kubernetes-validate --strict`` (bundled schemas); compose by ``check-jsonschema`` against the
compose specification. Then what the schemas cannot say: probes, resources, pinned images, no
credentials in the manifests, the headless Service that mlreg's fleet discovery reads, one list
of Triton's server arguments, the store initialised before Triton starts, and mlreg.toml
environments that name what the manifests deploy.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.triton import control_key
from tests.conftest import ROOT
from tests.integration.infra import (
    COMPOSE_DIR,
    INFRA,
    compose,
    env_example,
    image_pinned,
    interpolate,
    kubectl,
)

pytestmark = pytest.mark.integration

K8S = INFRA / "k8s"
OVERLAYS = ("dev", "staging", "production")
# the oldest minor the managed clouds still support, and the newest kubernetes-validate bundles
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|CREDENTIAL|CONTROL_KEY", re.IGNORECASE)


# --- helpers -------------------------------------------------------------------------------------


def venv_tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    if exe.is_file():
        return str(exe)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: pip install -e '.[dev]'")
    return found


@cache
def rendered(overlay: str) -> str:
    out = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def documents(overlay: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered(overlay)) if d]


def find(overlay: str, kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in documents(overlay) if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def config_map(overlay: str, prefix: str) -> dict[str, str]:
    [doc] = [
        d
        for d in documents(overlay)
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix + "-")
    ]
    return dict(doc["data"])


def pod_specs(overlay: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in documents(overlay):
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def flag_map(args: list[str]) -> dict[str, str | None]:
    """``--name=value`` arguments as {--name: value} (``None`` for a bare flag); a flag Triton takes
    several times (``--backend-config=<backend,>setting=value``) is keyed by its setting too."""
    flags: dict[str, str | None] = {}
    for arg in args:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name == "--backend-config":
                setting, _, value = value.rpartition("=")
                name = f"{name}:{setting}"
            flags[name] = value if eq else None
    return flags


# --- Kubernetes ----------------------------------------------------------------------------------


def strict_validation(version: str, *manifests: Path) -> subprocess.CompletedProcess[str]:
    """``kubernetes-validate --strict`` of ``manifests`` for Kubernetes ``version``: exit 0 only
    when every one of them passes."""
    return subprocess.run(
        [venv_tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, *map(str, manifests)],
        capture_output=True,
        text=True,
        timeout=300,  # ~3 s on an idle machine; 120 s ran out at load 25 (one manifest, a fresh venv)
        check=False,
    )


@pytest.fixture(scope="module")
def every_overlay_passes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Kubernetes version -> whether every overlay's manifest passes strict validation, from one
    validator run per version (its start-up, ~2 s of CPU, once rather than once per overlay)."""
    folder = tmp_path_factory.mktemp("overlays")
    manifests = []
    for overlay in OVERLAYS:
        manifests.append(folder / f"{overlay}.yaml")
        manifests[-1].write_text(rendered(overlay))

    @cache
    def passes(version: str) -> bool:
        return strict_validation(version, *manifests).returncode == 0

    return passes


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_and_passes_strict_schema_validation(
    overlay: str, version: str, tmp_path: Path, every_overlay_passes: Any
) -> None:
    if not every_overlay_passes(version):  # one of them fails: this overlay's own run says which
        manifest = tmp_path / f"{overlay}.yaml"
        manifest.write_text(rendered(overlay))
        out = strict_validation(version, manifest)
        assert out.returncode == 0, out.stdout + out.stderr
    kinds = {d["kind"] for d in documents(overlay)}
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Namespace"} <= kinds
    assert {d["metadata"].get("namespace") for d in documents(overlay) if d["kind"] != "Namespace"} == {
        f"mlreg-{overlay}"
    }


def test_strict_validation_rejects_a_misspelt_field(tmp_path: Path) -> None:
    """The validator is really strict: the same manifest with one field misspelt fails."""
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(rendered("staging").replace("readinessProbe:", "readinesProbe:"))
    out = subprocess.run(
        [venv_tool("kubernetes-validate"), "--strict", "--quiet", str(manifest)],
        capture_output=True,
        text=True,
        timeout=300,  # as strict_validation's
        check=False,
    )
    assert out.returncode != 0
    assert "'readinesProbe' was unexpected" in out.stdout + out.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_triton_has_probes_gpu_metrics_and_runs_as_non_root(overlay: str) -> None:
    deployment = find(overlay, "Deployment", "triton")
    template = deployment["spec"]["template"]
    # beside it only the trace-shipper sidecar (issue 35: captured requests to the captures prefix)
    containers = {c["name"]: c for c in template["spec"]["containers"]}
    assert set(containers) == {"triton", "trace-shipper"}
    triton, shipper = containers["triton"], containers["trace-shipper"]
    assert {"name": "traces", "mountPath": "/traces"} in triton["volumeMounts"]
    assert {"name": "traces", "mountPath": "/traces"} in shipper["volumeMounts"]
    assert triton["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert triton[probe]["httpGet"]["port"] == "http"
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert triton["resources"]["requests"]["nvidia.com/gpu"] == "1"
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in template["spec"]["volumes"])
    mounts = {m["mountPath"] for m in triton["volumeMounts"]}
    assert "/dev/shm" in mounts


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_requests_a_memory_limit_and_a_pinned_image(overlay: str) -> None:
    for workload, spec in pod_specs(overlay):
        for container in containers(spec):
            where = f"{overlay}: {workload}/{container['name']}"
            assert image_pinned(container["image"]), where
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), where
            assert container.get("securityContext", {}).get("allowPrivilegeEscalation") is False, where
        for container in spec["containers"]:
            assert {"livenessProbe", "readinessProbe"} <= set(container), f"{workload}/{container['name']}"
        assert spec["securityContext"]["runAsNonRoot"] is True, workload


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_credentials_in_the_manifests(overlay: str) -> None:
    docs = documents(overlay)
    assert not [d for d in docs if d["kind"] == "Secret"], "Secrets are created out of band"
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            for key, value in doc["data"].items():
                assert not SECRET_NAME.search(key), (doc["metadata"]["name"], key)
                assert "@" not in value or "$(" in value, (key, value)  # no user:password@host
    for workload, spec in pod_specs(overlay):
        for container in containers(spec):
            for env in container.get("env", []):
                if SECRET_NAME.search(env["name"]):
                    assert "secretKeyRef" in env.get("valueFrom", {}), (workload, env["name"])
            for ref in container.get("envFrom", []):
                assert set(ref) == {"secretRef"} or set(ref) == {"configMapRef"}
            for arg in [*container.get("args", []), *container.get("command", [])]:
                # credentials reach a command line only as $(VAR) from a Secret-backed variable
                assert not re.search(r"://[^/$\s]+:[^/$\s]+@", arg), (workload, arg)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_headless_service_selects_exactly_the_triton_pods(overlay: str) -> None:
    deployment = find(overlay, "Deployment", "triton")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    headless = find(overlay, "Service", "triton-replicas")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    selector = headless["spec"]["selector"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    # no other workload's pods carry those labels
    for doc in documents(overlay):
        if doc["kind"] in ("Deployment", "StatefulSet") and doc["metadata"]["name"] != "triton":
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert not selector.items() <= labels.items(), doc["metadata"]["name"]
    grpc = {p["name"]: p for p in headless["spec"]["ports"]}["grpc"]
    assert (grpc["port"], grpc["targetPort"]) == (8001, "grpc")
    clients = find(overlay, "Service", "triton")
    assert clients["spec"]["type"] == "ClusterIP"
    assert clients["spec"]["selector"] == selector
    pdb = find(overlay, "PodDisruptionBudget", "triton")
    assert pdb["spec"]["selector"]["matchLabels"] == selector


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_store_is_initialised_before_triton_starts(overlay: str) -> None:
    spec = find(overlay, "Deployment", "triton")["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    [triton] = [c for c in spec["containers"] if c["name"] == "triton"]
    assert init["command"] == ["mlreg", "store", "init", "--store", "$(MLREG_STORE)"]
    assert flag_map(triton["args"])["--model-repository"] == "$(MLREG_STORE)"
    for container in (init, triton):
        [store] = [e for e in container["env"] if e["name"] == "MLREG_STORE"]
        assert store["valueFrom"]["configMapKeyRef"]["name"].startswith("mlreg-store-")
    assert config_map(overlay, "mlreg-store")["MLREG_STORE"] == f"s3://mlreg-models/{overlay}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_promotion_job_template_runs_mlreg_with_tritons_credentials(overlay: str) -> None:
    """infra/k8s/base/promote-job.yaml: CI's `kubectl create job --from=cronjob/mlreg-promote`."""
    cron = find(overlay, "CronJob", "mlreg-promote")
    assert cron["spec"]["suspend"] is True  # a template, never scheduled
    job = cron["spec"]["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    spec = job["template"]["spec"]
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == ("triton", False)
    assert spec["securityContext"]["runAsNonRoot"] is True
    [mlreg] = spec["containers"]
    assert image_pinned(mlreg["image"])
    [store_init] = find(overlay, "Deployment", "triton")["spec"]["template"]["spec"]["initContainers"]
    assert mlreg["image"] == store_init["image"]  # the mlreg image (infra/compose/mlreg.Dockerfile)
    script = " ".join(mlreg["args"])
    assert 'mlreg promote --from-alias "$MLREG_FROM_ALIAS" --env "${MLREG_NAMESPACE#mlreg-}" --json' in script
    env = {e["name"]: e for e in mlreg["env"]}
    assert env["MLREG_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["MLFLOW_TRACKING_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-token"
    assert env["AWS_DEFAULT_REGION"]["valueFrom"]["configMapKeyRef"]["name"].startswith("mlreg-store-")
    assert mlreg["envFrom"] == [{"secretRef": {"name": "mlreg-s3", "optional": True}}]  # as Triton's
    mounts = {m["mountPath"]: m for m in mlreg["volumeMounts"]}
    assert mounts["/work/mlreg.toml"]["subPath"] == "mlreg.toml"
    assert env["MLREG_HOME"]["value"] == "/work/.mlreg"  # mlreg.toml is read beside MLREG_HOME
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/work/mlreg.toml"]["name"]]["configMap"]["name"] == "mlreg-config"
    assert mlreg["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"cpu", "memory"} <= set(mlreg["resources"]["requests"])
    role = find(overlay, "Role", "mlreg-promote-launcher")
    verbs = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert ("jobs", "create") in verbs
    assert not {v for r in role["rules"] for v in r["verbs"]} & {"delete", "update", "patch", "*"}
    # every environment it can be launched in is one mlreg.toml (infra/k8s) names
    environments = tomllib.loads((ROOT / "infra" / "k8s" / "mlreg.toml").read_text())["environments"]
    assert overlay in environments


def test_production_scales_on_queue_time_and_uses_irsa() -> None:
    hpa = find("production", "HorizontalPodAutoscaler", "triton")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "triton"}
    [metric] = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "triton_queue_avg_time_us"
    assert hpa["spec"]["minReplicas"] == find("production", "Deployment", "triton")["spec"]["replicas"]
    for account in ("triton", "mlflow"):
        annotations = find("production", "ServiceAccount", account)["metadata"]["annotations"]
        assert annotations["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    assert not [d for d in documents("staging") if d["kind"] == "HorizontalPodAutoscaler"]


def test_dev_runs_postgresql_in_the_namespace_for_mlflow() -> None:
    postgres = find("dev", "StatefulSet", "postgres")
    assert postgres["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    assert (
        config_map("dev", "mlflow-config")["DB_HOST"]
        == find("dev", "Service", "postgres")["metadata"]["name"]
    )
    for overlay in ("staging", "production"):
        assert not [d for d in documents(overlay) if d["kind"] == "StatefulSet"]
        assert config_map(overlay, "mlflow-config")["DB_HOST"].endswith(".example.internal")


def test_mlflow_runs_the_compose_server_on_postgresql_with_s3_artifacts() -> None:
    [container] = find("staging", "Deployment", "mlflow")["spec"]["template"]["spec"]["containers"]
    flags = flag_map(container["args"])
    assert (
        flags["--backend-store-uri"]
        == "postgresql+psycopg2://$(DB_USER):$(DB_PASSWORD)@$(DB_HOST):$(DB_PORT)/$(DB_NAME)"
    )
    assert "--serve-artifacts" in flags
    assert config_map("staging", "mlflow-config")["ARTIFACTS_DESTINATION"].startswith("s3://")
    command = compose()["services"]["mlflow"]["command"]
    compose_flags = {a for a in command if a.startswith("--")}
    assert compose_flags == set(flags), "compose and Kubernetes run MLflow with the same options"


# --- one list of Triton's server arguments -------------------------------------------------------


def compose_triton_args() -> list[str]:
    command = compose()["services"]["triton"]["command"]
    assert command[0] == "tritonserver"
    return list(command[1:])


def k8s_triton_args(overlay: str) -> list[str]:
    spec = find(overlay, "Deployment", "triton")["spec"]["template"]["spec"]
    [triton] = [c for c in spec["containers"] if c["name"] == "triton"]
    assert triton["command"] == ["tritonserver"]
    return list(triton["args"])


RESTRICTION_FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")


def test_triton_server_arguments_agree_across_launcher_compose_and_kubernetes() -> None:
    from pipelines.devstack import local_triton

    fleet = flag_map(list(local_triton.FLEET_SERVER_ARGS))
    assert fleet["--model-control-mode"] == "explicit"
    assert fleet["--load-model"] == "*"
    assert fleet["--strict-readiness"] == "true"
    deployed = {"compose": flag_map(compose_triton_args())}
    deployed.update({overlay: flag_map(k8s_triton_args(overlay)) for overlay in OVERLAYS})
    for where, flags in deployed.items():
        assert {k: flags.get(k) for k in fleet} == fleet, where
        # the control API locked on both protocols with the key of a variable, never a value
        # (compose's read from .env: .env.example's placeholder here, its absence refused below)
        variable = "$(MLREG_CONTROL_KEY)" if where != "compose" else "CHANGE-ME"
        for flag in RESTRICTION_FLAGS:
            value = flags.get(flag) or ""
            assert value.startswith(f"{control_key.RESTRICTED}:{control_key.HEADER}={variable}"), (
                where,
                flag,
            )
    # compose and every overlay differ only in where the repository is and how the key is read
    shapes = {
        where: {k: v for k, v in f.items() if k not in ("--model-repository", *RESTRICTION_FLAGS)}
        for where, f in deployed.items()
    }
    assert len({tuple(sorted(s.items())) for s in shapes.values()}) == 1, shapes
    # the local launcher: the same control arguments, departing only where LOCAL_DEPARTURES says
    install = local_triton.TritonInstall(Path("tritonserver"), (), Path("python"), Path("stub"))
    local = flag_map(local_triton.server_command(install, "/repo", Path("/backends"), (1, 2, 3), "p_", "K"))
    for flag in RESTRICTION_FLAGS:  # the local stack's key (MLREG_HOME/control.key): the same restriction
        assert local.pop(flag) == f"{control_key.RESTRICTED}:{control_key.HEADER}=K", flag
    for flag, value in fleet.items():
        if flag in local_triton.LOCAL_DEPARTURES:
            expected = local_triton.LOCAL_DEPARTURES[flag]
            if expected is None:
                assert flag not in local, flag
            elif not expected.startswith("<"):
                assert local[flag] == expected, flag
            else:
                assert flag in local, flag
        else:
            assert local.get(flag) == value, flag


# --- compose -------------------------------------------------------------------------------------


def test_compose_file_passes_the_compose_specification_schema(tmp_path: Path) -> None:
    tool = venv_tool("check-jsonschema")
    ok = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(COMPOSE_DIR / "compose.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "compose.yaml"
    bad.write_text((COMPOSE_DIR / "compose.yaml").read_text().replace("shm_size:", "shm_sise:"))
    refused = subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1
    assert "'shm_sise' was unexpected" in refused.stdout


def test_compose_triton_reserves_a_gpu_and_starts_after_the_store_init() -> None:
    services = compose()["services"]
    triton = services["triton"]
    [device] = triton["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert "/v2/health/ready" in " ".join(triton["healthcheck"]["test"])
    assert triton["user"] == "1000:1000"  # non-root, like the Kubernetes pods
    assert triton["depends_on"]["store-init"]["condition"] == "service_completed_successfully"
    init = services["store-init"]
    assert init["command"][:4] == ["mlreg", "store", "init", "--store"]
    assert init["command"][4] == flag_map(compose_triton_args())["--model-repository"]
    assert init["depends_on"]["buckets"]["condition"] == "service_completed_successfully"
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, service in services.items():
        assert image_pinned(service["image"]), name
        if service.get("restart") != "no":
            assert "healthcheck" in service, name
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)  # published on loopback unless set


def test_compose_takes_every_credential_from_the_environment() -> None:
    raw = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())
    for name, service in raw["services"].items():
        env = service.get("environment", {})
        for key, value in env.items():
            if SECRET_NAME.search(key):
                assert str(value).startswith("${"), (name, key)
                assert ":?" in str(value), (name, key)  # refuses to start without it
    example = env_example()
    for key, value in example.items():
        if SECRET_NAME.search(key):
            assert value.startswith("CHANGE-ME"), key
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD: set POSTGRES_PASSWORD in .env"):
        interpolate(raw["services"]["postgres"], {})
    with pytest.raises(KeyError, match="MLREG_CONTROL_KEY: set MLREG_CONTROL_KEY in .env"):
        interpolate(raw["services"]["triton"], {k: v for k, v in example.items() if k != "MLREG_CONTROL_KEY"})


def test_pinned_images_match_the_versions_mlreg_is_tested_with() -> None:
    import mlflow

    from pipelines.checks.runtime_tables import CONTAINERS, HAZARDS
    from pipelines.promote.convert import TF_BACKEND_LAST

    services = compose()["services"]
    assert services["mlflow"]["image"] == f"mlreg-mlflow:{mlflow.__version__}"
    assert services["mlflow"]["build"]["args"]["MLFLOW_VERSION"] == mlflow.__version__
    dockerfile = (COMPOSE_DIR / "mlflow.Dockerfile").read_text()
    assert f"ARG MLFLOW_VERSION={mlflow.__version__}" in dockerfile
    assert "psycopg2" in dockerfile
    assert "boto3" in dockerfile
    for path in sorted(COMPOSE_DIR.glob("*.Dockerfile")):
        args = dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), re.MULTILINE))
        for base in re.findall(r"^FROM (\S+)", path.read_text(), re.MULTILINE):
            image = re.sub(r"\$\{(\w+)\}", lambda m, known=args: known[m.group(1)], base)
            assert image_pinned(image), (path.name, image)
    # container 26.07 = Triton 2.71.0, the first release past every hazard of the runtime gate's table
    # (after 25.02 = 2.55, the last with the TensorFlow backend: SavedModels are served as ONNX)
    assert services["triton"]["image"] == "nvcr.io/nvidia/tritonserver:26.07-py3"
    release, _ = CONTAINERS[services["triton"]["image"].split(":")[1].removesuffix("-py3")]
    assert release == (2, 71, 0)
    assert [h.id for h in HAZARDS if release < h.fixed_in] == []
    assert TF_BACKEND_LAST == (2, 55)
    k8s_images = {c["image"] for o in OVERLAYS for _, spec in pod_specs(o) for c in containers(spec)}
    assert services["triton"]["image"] in k8s_images
    assert f"registry.example.com/mlreg/mlflow:{mlflow.__version__}" in k8s_images
    assert services["postgres"]["image"] in k8s_images


# --- mlreg's environments ------------------------------------------------------------------------


def test_k8s_environments_discover_the_headless_service_and_serve_the_overlay_store(tmp_path: Path) -> None:
    data = tomllib.loads((K8S / "mlreg.toml").read_text())["environments"]
    assert set(data) == set(OVERLAYS)
    for overlay, env in data.items():
        headless = find(overlay, "Service", "triton-replicas")
        grpc = {p["name"]: p["port"] for p in headless["spec"]["ports"]}["grpc"]
        namespace = headless["metadata"]["namespace"]
        assert env["discover"] == f"dns:{headless['metadata']['name']}.{namespace}.svc.cluster.local:{grpc}"
        assert env["store"] == config_map(overlay, "mlreg-store")["MLREG_STORE"]
        assert env["alias"] == overlay
    envs = load_with_mlreg(K8S / "mlreg.toml", tmp_path)
    assert {name: envs[name].store for name in OVERLAYS} == {n: e["store"] for n, e in data.items()}
    # the runtime gate refuses a known-bad Triton in staging and production; dev notes it
    policies = {name: envs[name].setting("runtime").policy for name in OVERLAYS}
    assert policies == {"dev": "note", "staging": "refuse", "production": "refuse"}
    assert {envs[name].setting("runtime").store for name in OVERLAYS} == {"s3"}


def test_compose_environment_targets_the_published_ports(tmp_path: Path) -> None:
    env = tomllib.loads((COMPOSE_DIR / "mlreg.toml").read_text())["environments"]["production"]
    services = compose()["services"]
    repository = flag_map(compose_triton_args())["--model-repository"] or ""
    assert repository.startswith("s3://minio:9000/")
    # the same bucket/prefix, reached from the host through MinIO's published port
    assert env["store"] == repository.replace("s3://minio:9000/", "s3://127.0.0.1:9000/")
    assert "127.0.0.1:9000:9000" in services["minio"]["ports"]
    [target] = env["targets"]
    assert f"{target}:8001" in services["triton"]["ports"]
    envs = load_with_mlreg(COMPOSE_DIR / "mlreg.toml", tmp_path)
    assert envs["production"].targets == ("127.0.0.1:8001",)
    runtime = envs["production"].setting("runtime")  # the runtime gate: a known-bad Triton refused
    assert (runtime.policy, runtime.store, runtime.frontends) == ("refuse", "s3", {"grpc", "http"})


def load_with_mlreg(toml: Path, tmp_path: Path) -> dict[str, Any]:
    """The environments as mlreg itself reads them (a project whose mlreg.toml is ``toml``)."""
    from pipelines.promote.environments import load_environments
    from registry.settings import Settings

    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(toml, project / "mlreg.toml")
    settings = Settings.from_env(env={"MLREG_HOME": str(project / ".mlreg")}, cwd=project)
    return dict(load_environments(settings))


def test_the_store_init_command_the_infra_runs_exists() -> None:
    from mlreg.cli.main import app
    from tests.cli import CliRunner

    result = CliRunner().invoke(app, ["store", "init", "--help"])
    assert result.exit_code == 0, result.output
    assert "--store" in result.output


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_relay_binds_its_own_address_and_reads_its_secret_from_a_secret(overlay: str) -> None:
    """Issue 50: `mlreg relay serve` on the pod's address (never 0.0.0.0), its webhook secret from the
    Secret mlreg-relay, its Service on its pods alone; compose publishes it on loopback unless set."""
    from mlreg.cli.main import app
    from tests.cli import CliRunner

    spec = find(overlay, "Deployment", "mlreg-relay")["spec"]["template"]["spec"]
    [relay] = spec["containers"]
    assert relay["command"][:3] == ["mlreg", "relay", "serve"]
    options = dict(zip(relay["command"][3::2], relay["command"][4::2], strict=True))
    assert options == {"--host": "$(POD_IP)", "--port": "8086"}
    env = {e["name"]: e.get("valueFrom", e.get("value")) for e in relay["env"]}
    assert env["POD_IP"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["MLREG_RELAY_SECRET"] == {"secretKeyRef": {"name": "mlreg-relay", "key": "webhook-secret"}}
    assert relay["readinessProbe"]["httpGet"]["path"] == "/healthz"
    service = find(overlay, "Service", "mlreg-relay")
    labels = find(overlay, "Deployment", "mlreg-relay")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert "triton" not in str(service["spec"]["selector"])
    compose_relay = compose()["services"]["relay"]
    assert compose_relay["ports"] == ["127.0.0.1:8086:8086"]
    assert compose_relay["command"][:3] == ["mlreg", "relay", "serve"]
    result = CliRunner().invoke(app, ["relay", "serve", "--help"])  # the command the infra runs exists
    assert result.exit_code == 0, result.output
    assert "--host" in result.output
    assert "--port" in result.output


# --- the deployed arguments on a real tritonserver -----------------------------------------------


def test_compose_triton_arguments_start_a_real_server_on_an_initialised_s3_store(
    s3_server: Any, tmp_path: Path
) -> None:
    """The wheel's tritonserver (2.51; the container's 2.55 takes the same options) started with
    compose's arguments on a fresh S3 prefix that `mlreg store init` prepared, holding one pushed
    model: it starts (strict readiness: ready), and --load-model=* loads the model, not the
    store's root marker or anything else at the root; its control API answers only with the key."""
    from mlreg.cli.main import app
    from pipelines.devstack import local_s3, local_triton
    from pipelines.storage import open_store
    from pipelines.storage.push import push_path
    from registry.settings import Settings
    from tests.cli import CliRunner
    from tests.conftest import TEMPLATE

    local_s3.create_bucket(s3_server.endpoint, "infra-fleet")
    uri = s3_server.store_uri("infra-fleet", "production")
    init = CliRunner().invoke(app, ["store", "init", "--store", uri])
    assert init.exit_code == 0, init.output
    push_path(open_store(uri), TEMPLATE / "table_data_preprocess")

    install = local_triton.locate_triton()
    env = local_triton.server_env(install)
    backends = local_triton.build_backend_dir(install, Settings.from_env().backends_source, tmp_path / "b")
    http, grpc, metrics = local_triton.three_free_ports()
    ports = {"--http-port": http, "--grpc-port": grpc, "--metrics-port": metrics}
    args = [
        f"--model-repository={uri}" if a.startswith("--model-repository=") else a
        for a in compose_triton_args()
        if a.partition("=")[0] not in ports
    ]
    # this machine only: ports, loopback addresses, the CPU backends, no GPU metrics
    args += [f"{flag}={port}" for flag, port in ports.items()]
    args += [f"--{kind}-address=127.0.0.1" for kind in ("http", "grpc", "metrics")]
    args += [f"--backend-directory={backends}", "--allow-gpu-metrics=false"]
    shm = f"mlreg_infra_{grpc}_"
    args.append(f"--backend-config=python,shm-region-prefix-name={shm}")
    log = tmp_path / "triton.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(install.server), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 120
        while not local_triton.http_ok(f"{base}/v2/health/ready"):
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        index_url = f"{base}/v2/repository/index"
        with pytest.raises(urllib.error.HTTPError) as refused:  # compose's key locks the control API
            urllib.request.urlopen(urllib.request.Request(index_url, data=b"{}", method="POST"), timeout=10)
        refused.value.close()
        assert refused.value.code == 403
        key = {control_key.HEADER: env_example()["MLREG_CONTROL_KEY"]}
        with urllib.request.urlopen(
            urllib.request.Request(index_url, data=b"{}", headers=key, method="POST"), timeout=10
        ) as response:
            index = json.loads(response.read())
        assert [(m["name"], m.get("version"), m.get("state")) for m in index] == [
            ("table_data_preprocess", "1", "READY")
        ]
    finally:
        local_triton.stop_pid(process.pid, shm, process=process)
